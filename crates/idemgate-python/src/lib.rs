//! `idemgate._native`: the idemgate engine in-process for Python, the native half of the `idemgate`
//! package (clients/python; built by maturin). One engine, not a port: the same policies, keys,
//! fingerprints, answers, journal and stores as every other front door, and the same stored-outcome
//! format (`idemgate_kit::Payload::Json`), so a record written from Python is replayed by
//! `idemgate exec`/`serve`/`mcp` and vice versa.
//!
//! The engine owns a small multi-thread tokio runtime. A call is split in two around the Python
//! function: `Engine.begin` reserves the key (store I/O with the GIL released), the function runs
//! on the caller's thread with the GIL while a task on the runtime renews the lease, and
//! `Engine.finish` records what it reported. The `_async` variants run the same halves on the
//! runtime and hand the answer to a Python callback, which the Python side turns into an asyncio
//! future, so the event loop never blocks on the store. The memory store has no I/O: there each
//! half is first polled on the caller's thread with the GIL held, and answered at once when it
//! finishes in that poll (`Engine::run`, `Engine::answer_async`).
//!
//! How an answer reaches Python (a result, or which exception class) is decided by one exhaustive
//! match on [`Verdict`](idemgate::Verdict) (`exception_class`); the classes themselves live in
//! `idemgate.errors`, shared with the HTTP client.
//!
//! The modules, one concern each: `engine` the `Engine` handle, its opening and its methods;
//! `call` the pieces of a call's two halves (`begin`, `finish`) and the `Ticket`; `answer` answers
//! and the exceptions they map to; `runtime` the tokio runtime and the bridge to Python threads
//! and awaitables; `policy` `Policy`; `verifier` verifiers written in Python; `keys` keys and
//! fingerprints; `command` the `idemgate` command line, for the script a `pip install` puts on
//! PATH. The lease keeper and the operator's view of records are the kit's
//! (`idemgate_kit::leases`, `idemgate_kit::records`), shared with the Node package.

use pyo3::prelude::*;

mod answer;
mod call;
mod command;
mod engine;
mod keys;
mod policy;
mod runtime;
#[cfg(test)]
mod test_support;
mod verifier;

use answer::PyAnswer;
use call::PyTicket;
use command::run_command;
use engine::Engine;
use keys::{
    check_key, derive_key, fingerprint, fingerprint_args, invocation_scope, mint_key, name_action,
};
use policy::Policy;

/// The native half of the `idemgate` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<Policy>()?;
    m.add_class::<PyTicket>()?;
    m.add_class::<PyAnswer>()?;
    m.add_function(wrap_pyfunction!(derive_key, m)?)?;
    m.add_function(wrap_pyfunction!(name_action, m)?)?;
    m.add_function(wrap_pyfunction!(invocation_scope, m)?)?;
    m.add_function(wrap_pyfunction!(mint_key, m)?)?;
    m.add_function(wrap_pyfunction!(check_key, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint_args, m)?)?;
    m.add_function(wrap_pyfunction!(run_command, m)?)?;
    m.add(
        "PASSED_THROUGH",
        call::passed_through(m.py())?.clone_ref(m.py()),
    )?;
    Ok(())
}
