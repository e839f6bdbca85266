#![doc = include_str!("../README.md")]

use pyo3::prelude::*;

mod answer;
mod call;
mod command;
mod engine;
mod keys;
mod policy;
mod runtime;
mod shared;
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
    m.add_class::<call::PyObserved>()?;
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
    // The problem types' base is written once, in the kit; `idemgate.errors` reads it from here.
    m.add("PROBLEM_TYPE_BASE", idemgate_kit::PROBLEM_TYPE_BASE)?;
    Ok(())
}
