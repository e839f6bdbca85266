//! Standard output that a closed pipe cannot turn into a panic: `idemgate token new | head -n1`
//! closes the pipe after the first line, and `println!` would panic on the second.

use std::io::Write as _;

/// The exit code of a process whose output pipe closed (128 + SIGPIPE), as shells report it.
const BROKEN_PIPE: i32 = 141;

/// Writes one line.
pub(crate) fn line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| out.write_all(b"\n"));
    done(written.and_then(|()| out.flush()));
}

/// Writes bytes as they are.
pub(crate) fn bytes(b: &[u8]) {
    let mut out = std::io::stdout().lock();
    done(out.write_all(b).and_then(|()| out.flush()));
}

/// Writes what `write` writes, buffered: for output too large to build first (`scan --json`).
pub(crate) fn stream(write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>) {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = write(&mut out);
    done(written.and_then(|()| out.flush()));
}

/// Ends the process quietly when the reader went away; other write errors are ignored as a
/// closed terminal is (what was to be recorded is recorded already).
fn done(written: std::io::Result<()>) {
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(BROKEN_PIPE);
        }
    }
}
