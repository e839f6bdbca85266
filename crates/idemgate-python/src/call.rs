//! What the two halves of a call are made of: the engine's `Call` from Python's arguments, what
//! `begin` hands back (a `Ticket`, `None` or a replay's `Result`), the `Ticket` itself (its lease
//! kept by the engine's lease keeper while the function runs) and what `finish` is told. The
//! halves themselves, sync and async, are methods of `Engine` (engine.rs): PyO3 takes one
//! `#[pymethods]` block a class (without its `multiple-pymethods` feature), and each is a few
//! lines over the pieces here. The pieces are free functions and `PyTicket`'s own, never
//! `impl Engine` blocks, so that engine.rs imports this module and not the other way round.

use std::sync::{Arc, Mutex};

use idemgate::{Begun, Call, EngineError, IdempotencyKey, TenantId, Ticket, ToolName};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::answer::{answer_of, engine_error, value_of};
use crate::keys::ArgsText;
use crate::shared::Shared;

/// Permission to run one call's side effect: the reserved record and its lease, renewed by the
/// engine's lease keeper until `finish`.
#[pyclass(frozen, module = "idemgate._native", name = "Ticket")]
pub(crate) struct PyTicket {
    pub(crate) ticket: Ticket,
    shared: Arc<Shared>,
    /// The lease kept alive while the function runs; `None` once finished.
    lease: Mutex<Option<u64>>,
    /// The call's spans (exported when the OTEL_* variables ask), ended by `finish`.
    pub(crate) trace: Arc<idemgate_trace::SplitCall>,
}

impl PyTicket {
    fn stop_heartbeat(&self) -> bool {
        match self.lease.lock().map(|mut l| l.take()) {
            Ok(Some(id)) => {
                self.shared.leases.drop_lease(id);
                true
            }
            _ => false,
        }
    }

    /// The ticket of a `finish`, its lease no longer kept; raises if it was finished already.
    pub(crate) fn finishing<'a>(ticket: &'a Bound<'_, PyTicket>) -> PyResult<&'a PyTicket> {
        let t = ticket.get();
        if !t.stop_heartbeat() {
            return Err(PyRuntimeError::new_err(
                "this ticket was already finished: report each call's outcome once",
            ));
        }
        Ok(t)
    }
}

impl Drop for PyTicket {
    fn drop(&mut self) {
        self.stop_heartbeat();
    }
}

#[pymethods]
impl PyTicket {
    /// The idempotency key naming the record (a `fallback-…` key under the fallback window).
    #[getter]
    fn key(&self) -> &str {
        self.ticket.key.key.as_str()
    }
    /// `explicit` or `fallback`.
    #[getter]
    fn rule(&self) -> String {
        self.ticket.rule.to_string()
    }
    /// The record's fence.
    #[getter]
    fn fence(&self) -> u64 {
        self.ticket.lease.fence
    }
    /// The W3C `traceparent` to hand to what the function calls: idemgate's `idemgate.effect`
    /// span when traces are exported, else the caller's own context; `None` without either.
    #[getter]
    fn traceparent(&self) -> Option<String> {
        let trace = self.trace.outgoing()?;
        Some(trace.traceparent().to_owned())
    }
    /// The downstream key of the action: the record's 64-hex digest (SHA-256 of tenant, tool and
    /// key), what `idemgate mcp` fills a tool's `idempotency_key` argument with.
    #[getter]
    fn digest(&self) -> String {
        idemgate::key::hex(&self.ticket.key.digest())
    }
    fn __repr__(&self) -> String {
        format!(
            "Ticket({}, fence {})",
            self.ticket.key, self.ticket.lease.fence
        )
    }
}

/// What `begin` gives Python: a ticket, `None` to pass through, or the `Result` of a replay (or its
/// exception).
pub(crate) fn begun(
    py: Python<'_>,
    shared: &Arc<Shared>,
    (begun, trace): Traced<Begun>,
) -> PyResult<Py<PyAny>> {
    trace.begun(&begun);
    match begun {
        Err(e) => Err(engine_error(py, &e)),
        Ok(Begun::PassThrough) => Ok(py.None()),
        // Observe mode's duplicate runs as a pass-through: the record it duplicates holds the
        // observation, and nothing is recorded of this run.
        Ok(Begun::Observed { would, key }) => Ok(Py::new(
            py,
            PyObserved {
                would: would.label(),
                digest: key.map(|k| idemgate::key::hex(&k.digest())),
            },
        )?
        .into_any()),
        // A replay: its `Result` at once (a stored failure raises `Failed`).
        Ok(Begun::Answered(answer)) => answer_of(py, answer)?.result_with(py, None),
        Ok(Begun::Execute(ticket)) => {
            let lease = shared.leases.hold(&ticket);
            let t = PyTicket {
                ticket,
                shared: Arc::clone(shared),
                lease: Mutex::new(Some(lease)),
                trace,
            };
            Ok(Py::new(py, t)?.into_any())
        }
    }
}

/// What `begin(..., value=True)` gives Python: as [`begun`], but a replay's stored value instead of its
/// `Result` (a stored failure raises `Failed` all the same), and [`passed_through`] to pass
/// through (`None` is a value a replay may give).
pub(crate) fn begun_value(
    py: Python<'_>,
    shared: &Arc<Shared>,
    (result, trace): Traced<Begun>,
) -> PyResult<Py<PyAny>> {
    match result {
        Ok(Begun::PassThrough) => {
            trace.begun(&result);
            Ok(passed_through(py)?.clone_ref(py))
        }
        Ok(Begun::Answered(answer)) => {
            trace.finished(&answer);
            value_of(py, answer)
        }
        other => begun(py, shared, (other, trace)),
    }
}

/// A result of `begin` with the call's spans.
pub(crate) type Traced<T> = (Result<T, EngineError>, Arc<idemgate_trace::SplitCall>);

/// `idemgate._native.Observed`: what `begin` answers in observe mode (shadow mode) for a call
/// enforce mode would have answered without running: run it, nothing is recorded of it; `would`
/// is the verdict enforce mode would have given (`replayed`, `in_flight`, `key_reused`...).
/// (`begin(..., value=True)` answers `PASSED_THROUGH` for it.)
#[pyclass(frozen, module = "idemgate._native", name = "Observed")]
pub(crate) struct PyObserved {
    #[pyo3(get)]
    would: &'static str,
    /// The downstream key of the record the call was named by (`current_key()` in the
    /// function), when it was named.
    #[pyo3(get)]
    digest: Option<String>,
}

/// `idemgate._native.PASSED_THROUGH`: what `begin(..., value=True)` answers for a read or a naturally
/// idempotent tool (run it, nothing is recorded); an object of its own, made once.
pub(crate) fn passed_through(py: Python<'_>) -> PyResult<&'static Py<PyAny>> {
    static PASSED_THROUGH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    PASSED_THROUGH.get_or_try_init(py, || {
        Ok(py.import("builtins")?.getattr("object")?.call0()?.unbind())
    })
}

/// What the function reported, from Python's words; the error is the message of the
/// `ValueError` it raises.
pub(crate) use idemgate_kit::reported_effect as effect;

/// The engine's call in `tenant`: `args` (any Python value; `None`: no arguments) fingerprinted as its
/// JSON text `json.dumps(args, default=repr)` would be (see [`ArgsText`]), made in
/// `scope` (`Call::scope`: a call without key is joined by the fallback window only to
/// identical calls of the same scope), and, without a key, named by the tool's `identity`
/// fields of those arguments when it has them all (`Call::identity`).
pub(crate) fn new_call(
    py: Python<'_>,
    tenant: &TenantId,
    tool: &str,
    key: Option<&str>,
    args: &Bound<'_, PyAny>,
    scope: Option<&str>,
    identity: &[String],
) -> PyResult<Call> {
    // In the order the checks always ran: what `json.dumps` raises, the tool, the key, then
    // arguments the engine cannot read.
    let text = if args.is_none() {
        None
    } else {
        Some(ArgsText::of(args)?)
    };
    let call = || -> Result<Call, EngineError> {
        let mut call = Call::new(tenant.clone(), ToolName::new(tool)?);
        if let Some(key) = key {
            call = call.key(IdempotencyKey::explicit(key)?);
        }
        if let Some(text) = &text {
            call = call.fingerprint(text.fingerprint()?);
            if key.is_none() {
                call = call.identity(text.text().as_bytes(), identity);
            }
        }
        if let Some(scope) = scope {
            call = call.scope(scope);
        }
        Ok(call)
    };
    call().map_err(|e| engine_error(py, &e))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::test_support::{memory_engine, ticket};
    use idemgate::Effect;
    use idemgate_kit::Payload;

    /// The spans of a call made where no pipeline is installed (disabled).
    fn untraced() -> Arc<idemgate_trace::SplitCall> {
        let door = idemgate_trace::Door::Python;
        Arc::new(idemgate_trace::SplitCall::start(
            door, "t", "tool", None, None, None,
        ))
    }

    #[tokio::test]
    async fn a_ticket_lets_its_lease_go_once() {
        // What makes a second `finish` of one ticket raise, and what stops its heartbeats.
        let shared = memory_engine().await;
        let t = ticket(&shared, "k-once", Duration::from_secs(30)).await;
        let lease = shared.leases.hold(&t);
        let t = PyTicket {
            ticket: t,
            shared: Arc::clone(&shared),
            lease: Mutex::new(Some(lease)),
            trace: untraced(),
        };
        assert_eq!(shared.leases.held(), 1);
        assert!(t.stop_heartbeat());
        assert_eq!(shared.leases.held(), 0);
        assert!(!t.stop_heartbeat());
    }

    #[tokio::test]
    async fn a_pass_through_is_told_by_an_object_of_its_own() {
        // `None` is a value a replay may give, so `begin(..., value=True)` cannot say "pass through" by it.
        let shared = memory_engine().await;
        Python::initialize();
        Python::attach(|py| {
            let pass = || (Ok(Begun::PassThrough), untraced());
            let first = begun_value(py, &shared, pass()).unwrap();
            let again = begun_value(py, &shared, pass()).unwrap();
            assert!(first.is(&again));
            assert!(!first.is_none(py));
        });
    }

    #[tokio::test]
    async fn a_recorded_outcome_settles_quietly() {
        // `finish(..., quiet=True)`: nothing for an answer that is a result (the refusals raise as `finish`'s,
        // which needs the package's exception classes: the pytest suite covers those).
        let shared = memory_engine().await;
        let t = ticket(&shared, "k-quiet", Duration::from_secs(30)).await;
        let body = Payload::json_text(r#"{"n":1}"#).unwrap().encode();
        let answer = shared.engine.finish(&t, Effect::Success(body)).await;
        Python::initialize();
        Python::attach(|py| assert!(crate::answer::settled(py, &answer).is_ok()));
    }

    #[tokio::test]
    async fn a_dropped_ticket_lets_its_lease_go() {
        let shared = memory_engine().await;
        let t = ticket(&shared, "k-drop", Duration::from_secs(30)).await;
        let lease = shared.leases.hold(&t);
        drop(PyTicket {
            ticket: t,
            shared: Arc::clone(&shared),
            lease: Mutex::new(Some(lease)),
            trace: untraced(),
        });
        assert_eq!(shared.leases.held(), 0);
    }
}
