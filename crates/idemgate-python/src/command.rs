//! The `idemgate` command line in-process: a `pip install` of the package puts an `idemgate`
//! script on PATH (`[project.scripts]`), so `"command": "idemgate"` in an MCP configuration and
//! `uvx --from idemgate idemgate mcp -- ...` work without cargo. The wheel holds one native module,
//! not a second binary, so the script calls the command's own entry point here: the same parser,
//! the same commands, the same exit codes as the binary cargo builds.

use pyo3::prelude::*;

/// Runs `idemgate` with `argv` (the program's name first, as `sys.argv` has it) and returns its
/// exit code. The GIL is released for the whole run: the command may serve for hours (`serve`,
/// `mcp`), and nothing in it calls back into Python.
#[pyfunction]
pub(crate) fn run_command(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| idemgate_cli::run_from(argv))
}
