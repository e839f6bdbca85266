//! `Policy`: how one tool's calls are treated, as Python gives it (durations in seconds).

use idemgate::{Mode, ToolKind, ToolPolicy, UnknownPolicy};
use idemgate_kit::records::seconds;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// How one tool's calls are treated (`idemgate_core::ToolPolicy`); durations in seconds.
#[pyclass(frozen, module = "idemgate._native", name = "Policy")]
#[derive(Clone)]
pub(crate) struct Policy(pub(crate) ToolPolicy);

#[pymethods]
impl Policy {
    #[new]
    #[pyo3(signature = (kind = "write", ttl = 86400.0, lease = 30.0, wait = 5.0, fallback_window = None, on_unknown = "block", tombstone = 2592000.0, identity = None, mode = "enforce"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        kind: &str,
        ttl: f64,
        lease: f64,
        wait: f64,
        fallback_window: Option<f64>,
        on_unknown: &str,
        tombstone: f64,
        identity: Option<Vec<String>>,
        mode: &str,
    ) -> PyResult<Self> {
        let mut p = tool_policy(kind, ttl, lease, wait, fallback_window, on_unknown)
            .map_err(PyValueError::new_err)?;
        p.tombstone = seconds("tombstone", tombstone).map_err(PyValueError::new_err)?;
        p.identity =
            identity_fields(identity.unwrap_or_default()).map_err(PyValueError::new_err)?;
        p.mode = mode.parse::<Mode>().map_err(PyValueError::new_err)?;
        Ok(Policy(p))
    }
    /// `enforce`, or `observe` (shadow mode): every call runs, and what enforce mode would have
    /// done is recorded in the history of the record a call duplicates.
    #[getter]
    fn mode(&self) -> String {
        self.0.mode.to_string()
    }
    /// The arguments that name the tool's action (names or JSON pointers): the fallback window
    /// compares only these, so a reworded re-plan within it is the same action.
    #[getter]
    fn identity(&self) -> Vec<String> {
        self.0.identity.clone()
    }
    /// `read`, `write` or `natural_idempotent`.
    #[getter]
    fn kind(&self) -> String {
        self.0.kind.to_string()
    }
    /// How long a completed outcome is kept and replayed, in seconds.
    #[getter]
    fn ttl(&self) -> f64 {
        self.0.ttl.as_secs_f64()
    }
    /// How long after a call ran its record is remembered, in seconds: a retry past the ttl
    /// and within this raises `OutcomeExpired` instead of running again (0: none).
    #[getter]
    fn tombstone(&self) -> f64 {
        self.0.tombstone.as_secs_f64()
    }
    /// How long a reservation holds without a heartbeat, in seconds.
    #[getter]
    fn lease(&self) -> f64 {
        self.0.lease.as_secs_f64()
    }
    /// How long a duplicate waits for an in-flight call before `InFlight`, in seconds.
    #[getter]
    fn wait(&self) -> f64 {
        self.0.wait.as_secs_f64()
    }
    /// When set, calls without a key are deduplicated by (tool, arguments) for this many seconds.
    #[getter]
    fn fallback_window(&self) -> Option<f64> {
        self.0.fallback_window.map(|w| w.as_secs_f64())
    }
    /// `block`, `verify` or `retry`.
    #[getter]
    fn on_unknown(&self) -> String {
        self.0.on_unknown.to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "Policy(kind={:?}, ttl={}, lease={}, wait={}, fallback_window={}, on_unknown={:?}, tombstone={}, identity={:?}, mode={:?})",
            self.kind(),
            self.ttl(),
            self.lease(),
            self.wait(),
            self.fallback_window()
                .map_or_else(|| "None".to_owned(), |w| w.to_string()),
            self.on_unknown(),
            self.tombstone(),
            self.0.identity,
            self.mode()
        )
    }
}

/// Identity fields as given, each a non-empty name or pointer.
fn identity_fields(fields: Vec<String>) -> Result<Vec<String>, String> {
    match fields.iter().find(|f| f.is_empty() || f.as_str() == "/") {
        Some(bad) => Err(format!(
            "identity: {bad:?} names no argument (give argument names or JSON pointers like \"/order/id\")"
        )),
        None => Ok(fields),
    }
}

/// The policy of `Policy(...)`'s arguments, each checked in their order; the error is the message
/// of the `ValueError` it raises. Apart from `Policy.__new__` so that it can be tested without an
/// interpreter.
fn tool_policy(
    kind: &str,
    ttl: f64,
    lease: f64,
    wait: f64,
    fallback_window: Option<f64>,
    on_unknown: &str,
) -> Result<ToolPolicy, String> {
    Ok(ToolPolicy {
        kind: kind.parse::<ToolKind>()?,
        ttl: seconds("ttl", ttl)?,
        lease: seconds("lease", lease)?,
        wait: seconds("wait", wait)?,
        fallback_window: fallback_window
            .map(|w| seconds("fallback_window", w))
            .transpose()?,
        on_unknown: on_unknown.parse::<UnknownPolicy>()?,
        tombstone: ToolPolicy::default().tombstone,
        identity: Vec::new(),
        mode: Mode::Enforce,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_python_defaults_are_the_engines() {
        // `Policy()`'s defaults in its signature (and in _native.pyi) against the engine's own.
        let p = tool_policy("write", 86400.0, 30.0, 5.0, None, "block").unwrap();
        assert_eq!(p, ToolPolicy::default());
    }

    #[test]
    fn every_argument_is_read() {
        let p = tool_policy("natural_idempotent", 0.25, 1.5, 0.0, Some(60.0), "verify").unwrap();
        assert_eq!(p.kind, ToolKind::NaturalIdempotent);
        assert_eq!(p.ttl, Duration::from_millis(250));
        assert_eq!(p.lease, Duration::from_millis(1500));
        assert_eq!(p.wait, Duration::ZERO);
        assert_eq!(p.fallback_window, Some(Duration::from_secs(60)));
        assert_eq!(p.on_unknown, UnknownPolicy::Verify);
        let p = tool_policy("read", 1.0, 1.0, 1.0, None, "retry").unwrap();
        assert_eq!(
            (p.kind, p.on_unknown),
            (ToolKind::Read, UnknownPolicy::Retry)
        );
    }

    #[test]
    fn a_duration_that_is_no_number_of_seconds_is_named() {
        for (bad, what) in [
            ([-1.0, 30.0, 5.0, 60.0], "ttl"),
            ([86400.0, f64::NAN, 5.0, 60.0], "lease"),
            ([86400.0, 30.0, f64::INFINITY, 60.0], "wait"),
            ([86400.0, 30.0, 5.0, -0.5], "fallback_window"),
        ] {
            let e =
                tool_policy("write", bad[0], bad[1], bad[2], Some(bad[3]), "block").unwrap_err();
            assert!(
                e.starts_with(&format!("{what} must be a number of seconds >= 0: ")),
                "{what}: {e}"
            );
        }
    }

    #[test]
    fn unknown_words_are_refused_and_the_first_bad_argument_is_the_one_told() {
        let kind = tool_policy("delete", -1.0, 30.0, 5.0, None, "shrug").unwrap_err();
        assert!(kind.contains("delete"), "{kind}");
        let on_unknown = tool_policy("write", 1.0, 30.0, 5.0, None, "shrug").unwrap_err();
        assert!(on_unknown.contains("shrug"), "{on_unknown}");
        let ttl = tool_policy("write", -1.0, 30.0, 5.0, None, "shrug").unwrap_err();
        assert!(ttl.starts_with("ttl "), "{ttl}");
    }
}
