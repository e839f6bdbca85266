//! Answers as Python sees them: the `Answer` of a call that ended with a result, the package's
//! `Result` built from it, and the exception of every other ending and every refusal, its class
//! (in `idemgate.errors`, shared with the HTTP client) chosen by one exhaustive match on
//! [`Verdict`], its problem document the kit's.

use idemgate::{Answer, Decision, EngineError, Key, OutcomeKind, StoreError, Verdict};
use idemgate_kit::{Door, Explanation, Payload, Problem, Resolve};
use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};
use pyo3::IntoPyObjectExt as _;

/// The engine's answer to a call that ended with a result (executed, replayed, passed through or
/// not applied); every other ending is an exception.
#[pyclass(frozen, module = "idemgate._native", name = "Answer")]
pub(crate) struct PyAnswer {
    /// The verdict's label (`executed`, `replayed`, `pass_through`, `not_applied`).
    #[pyo3(get)]
    verdict: &'static str,
    /// Whether this call ran the side effect.
    #[pyo3(get)]
    executed: bool,
    /// Whether this is a stored outcome, replayed.
    #[pyo3(get)]
    replayed: bool,
    /// When the outcome was recorded, in milliseconds since the epoch (store clock).
    #[pyo3(get)]
    executed_at_ms: Option<i64>,
    /// Until when it is replayed, in milliseconds since the epoch.
    #[pyo3(get)]
    expires_at_ms: Option<i64>,
    /// `explicit` or `fallback`: which rule named the record.
    #[pyo3(get)]
    rule: Option<String>,
    /// The idempotency key of the record.
    #[pyo3(get)]
    key: Option<String>,
    /// Whether the outcome is a stored failure.
    #[pyo3(get)]
    failed: bool,
    /// The stored outcome's content kind (`json`, `command`, `http`, `mcp_tool_result`).
    #[pyo3(get)]
    content: Option<&'static str>,
    /// The outcome as JSON text (see `idemgate_kit::Payload::to_json`).
    #[pyo3(get)]
    value_json: Option<String>,
    /// `stored` or `journaled` when this call recorded an outcome.
    #[pyo3(get)]
    recording: Option<&'static str>,
    /// What a not-applied tool said.
    #[pyo3(get)]
    message: Option<String>,
}

#[pymethods]
impl PyAnswer {
    /// The package's `Result` of this answer, with the stored value (a replay); a stored failure
    /// raises `Failed(value, replayed=...)`.
    fn stored_result(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.result_with(py, None)
    }

    /// The package's `Result` of this answer, with `value`, what the function returned (a stored
    /// failure raises `Failed` all the same).
    fn result(&self, py: Python<'_>, value: Py<PyAny>) -> PyResult<Py<PyAny>> {
        self.result_with(py, Some(value))
    }

    fn __repr__(&self) -> String {
        format!(
            "Answer(verdict={:?}, key={:?}, rule={:?}, failed={}, value_json={:?})",
            self.verdict, self.key, self.rule, self.failed, self.value_json
        )
    }
}

impl PyAnswer {
    /// Builds the `Result` (every call that answers with one goes through here, so it is built
    /// natively: in Python, reading the fields and filling the frozen dataclass cost as much as
    /// the engine's whole replay).
    pub(crate) fn result_with(
        &self,
        py: Python<'_>,
        value: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let kit = ResultKit::get(py)?;
        let value = match value {
            Some(v) if !self.failed => v,
            _ => self.stored(py, kit)?,
        };
        let time = |ms: Option<i64>| -> PyResult<Py<PyAny>> {
            match ms {
                Some(ms) => Ok(kit.time_of_ms.call1(py, (ms,))?),
                None => Ok(py.None()),
            }
        };
        let fields = PyDict::new(py);
        fields.set_item(intern!(py, "value"), value)?;
        fields.set_item(intern!(py, "executed"), self.executed)?;
        fields.set_item(intern!(py, "replayed"), self.replayed)?;
        fields.set_item(intern!(py, "executed_at"), time(self.executed_at_ms)?)?;
        fields.set_item(intern!(py, "expires_at"), time(self.expires_at_ms)?)?;
        let label = |s: Option<&str>| s.map(|s| label(py, s));
        fields.set_item(intern!(py, "rule"), label(self.rule.as_deref()))?;
        fields.set_item(intern!(py, "key"), self.key.as_deref())?;
        fields.set_item(intern!(py, "verdict"), label(Some(self.verdict)))?;
        fields.set_item(intern!(py, "content"), label(self.content))?;
        fields.set_item(intern!(py, "recording"), label(self.recording))?;
        // A frozen dataclass: its fields set at once, past its __setattr__, as its __init__ does
        // one by one.
        let result = kit.new.call1(py, (&kit.class,))?;
        kit.set
            .call1(py, (&result, intern!(py, "__dict__"), fields))?;
        Ok(result)
    }
}

impl PyAnswer {
    /// The stored value, as `json.loads` reads it (`None` without an outcome); a stored failure
    /// raises `Failed(value, replayed=...)` instead.
    fn stored(&self, py: Python<'_>, kit: &ResultKit) -> PyResult<Py<PyAny>> {
        let stored = match &self.value_json {
            Some(text) => kit.stored_value(py, text)?,
            None => py.None(),
        };
        if self.failed {
            let kwargs = PyDict::new(py);
            kwargs.set_item(intern!(py, "replayed"), self.replayed)?;
            let e = kit.failed.bind(py).call((stored,), Some(&kwargs))?;
            return Err(PyErr::from_value(e));
        }
        Ok(stored)
    }
}

/// The value of an answer that is a result, without its `Result` (what `@idempotent` returns of
/// a replay): the stored value; a stored failure raises `Failed`, any other ending its exception,
/// exactly as [`PyAnswer::result_with`] would.
pub(crate) fn value_of(py: Python<'_>, answer: Answer) -> PyResult<Py<PyAny>> {
    answer_of(py, answer)?.stored(py, ResultKit::get(py)?)
}

/// Nothing for an answer that is a result, the exception of any other ending (as [`reply`]
/// raises it): for a caller that keeps the function's own value and discards the answer (a
/// decorated function's `finish`), so neither an `Answer` nor its stored JSON is made.
pub(crate) fn settled(py: Python<'_>, answer: &Answer) -> PyResult<()> {
    let verdict = Verdict::of_answer(answer);
    if exception_class(verdict).is_none() {
        return Ok(());
    }
    let explanation = Explanation::of_answer(answer);
    Err(exception(
        py,
        &explanation.problem(&door(&explanation.record_name())),
    ))
}

/// A label of an answer as a Python string: the ones every answer carries are interned, made once.
fn label<'py>(py: Python<'py>, s: &str) -> Bound<'py, PyString> {
    let interned = match s {
        "executed" => intern!(py, "executed"),
        "replayed" => intern!(py, "replayed"),
        "pass_through" => intern!(py, "pass_through"),
        "not_applied" => intern!(py, "not_applied"),
        "explicit" => intern!(py, "explicit"),
        "fallback" => intern!(py, "fallback"),
        "json" => intern!(py, "json"),
        "stored" => intern!(py, "stored"),
        "journaled" => intern!(py, "journaled"),
        other => return PyString::new(py, other),
    };
    interned.clone()
}

/// Why a store did not open, as Python is told (the URL without its password): a URL or a store
/// set up wrong (`StoreError::Misconfigured`: no such scheme, a URL its store cannot read or an
/// option it does not know, a SQLite file in a missing directory, a Redis without persistence,
/// a newer schema) raises `StoreMisconfigured`, a `ValueError` (retrying cannot help); anything
/// else `StoreUnavailable` (the store could not be reached; nothing ran, retrying is safe).
pub(crate) fn open_error(py: Python<'_>, url: &str, e: &StoreError) -> PyErr {
    let message = format!("failed to open store {}: {e}", idemgate::redact_url(url));
    if let StoreError::Misconfigured(_) = e {
        let class = py
            .import("idemgate.errors")
            .and_then(|m| m.getattr("StoreMisconfigured"));
        return match class.and_then(|c| c.call1((message,))) {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        };
    }
    exception(py, &Problem::new(Verdict::StoreUnavailable, message))
}

/// What a `Result` is built with, from the package (`idemgate.engine`, `idemgate.errors`), looked
/// up once.
struct ResultKit {
    /// `idemgate.engine.Result`, a frozen dataclass.
    class: Py<PyAny>,
    /// `object.__new__` and `object.__setattr__`.
    new: Py<PyAny>,
    set: Py<PyAny>,
    /// `idemgate.engine._time_of_ms`: a datetime of milliseconds since the epoch (cached).
    time_of_ms: Py<PyAny>,
    /// The json module's scanner (`JSONDecoder().scan_once`) and `json.loads`.
    scan: Py<PyAny>,
    loads: Py<PyAny>,
    /// `idemgate.errors.Failed`.
    failed: Py<PyAny>,
}

impl ResultKit {
    fn get(py: Python<'_>) -> PyResult<&'static ResultKit> {
        static KIT: PyOnceLock<ResultKit> = PyOnceLock::new();
        KIT.get_or_try_init(py, || {
            let engine = py.import("idemgate.engine")?.into_any();
            let object = py.import("builtins")?.getattr("object")?;
            let json = py.import("json")?.into_any();
            let attr = |m: &Bound<'_, PyAny>, name: &str| m.getattr(name).map(Bound::unbind);
            Ok::<_, PyErr>(ResultKit {
                class: attr(&engine, "Result")?,
                new: attr(&object, "__new__")?,
                set: attr(&object, "__setattr__")?,
                time_of_ms: attr(&engine, "_time_of_ms")?,
                scan: json
                    .getattr("decoder")?
                    .getattr("JSONDecoder")?
                    .call0()?
                    .getattr("scan_once")?
                    .unbind(),
                loads: attr(&json, "loads")?,
                failed: attr(&py.import("idemgate.errors")?.into_any(), "Failed")?,
            })
        })
    }

    /// `json.loads(text)`: the scanner alone when it reads the whole text (what the engine hands
    /// back has no white space around the value), else `json.loads` itself, which gives the same
    /// value or raises the same error.
    fn stored_value(&self, py: Python<'_>, text: &str) -> PyResult<Py<PyAny>> {
        let text = PyString::new(py, text);
        if let Ok(scanned) = self.scan.call1(py, (&text, 0)) {
            let (value, end): (Py<PyAny>, usize) = scanned.extract(py)?;
            if end == text.len()? {
                return Ok(value);
            }
        }
        self.loads.call1(py, (text,))
    }
}

/// The Python exception class (in `idemgate.errors`) of a verdict, or `None` when the answer is a
/// result. Exhaustive on purpose: a new verdict is a compile error here, as at every other door.
fn exception_class(verdict: Verdict) -> Option<&'static str> {
    match verdict {
        Verdict::Execute | Verdict::Executed | Verdict::Replayed | Verdict::PassedThrough => None,
        Verdict::NotApplied => Some("NotApplied"),
        Verdict::LeaseLost => Some("LeaseLost"),
        Verdict::Unrecorded | Verdict::JournalFailed => Some("OutcomeNotRecorded"),
        Verdict::InFlight => Some("InFlight"),
        Verdict::Unknown => Some("OutcomeUnknown"),
        Verdict::Expired => Some("OutcomeExpired"),
        Verdict::KeyRequired => Some("KeyRequired"),
        Verdict::KeyReused => Some("KeyReused"),
        Verdict::BadRequest => Some("BadRequest"),
        Verdict::StoreUnavailable => Some("StoreUnavailable"),
        Verdict::QuotaExceeded => Some("QuotaExceeded"),
        Verdict::RateLimited => Some("RateLimited"),
        Verdict::NotFound => Some("NotFound"),
        Verdict::NotResolvable => Some("NotResolvable"),
    }
}

/// The exception of a problem document: `idemgate.errors.engine_error(...)` builds it, as the HTTP
/// client builds one from a gateway's (the same `status`, `type`, `title` and members), with the
/// detail as its message and the words for a model as `for_model`.
fn exception(py: Python<'_>, problem: &Problem) -> PyErr {
    let Some(class) = exception_class(problem.verdict) else {
        return PyRuntimeError::new_err(format!("{} is not an error", problem.verdict));
    };
    let build = || -> PyResult<PyErr> {
        let doc = PyDict::new(py);
        for (name, value) in problem.document() {
            doc.set_item(name, member(py, &value)?)?;
        }
        let e = py
            .import("idemgate.errors")?
            .getattr("engine_error")?
            .call1((class, &problem.detail, problem.status(), doc))?;
        Ok(PyErr::from_value(e))
    };
    build().unwrap_or_else(|e| e)
}

/// A member of a problem document as Python reads it: the kit's members are JSON scalars.
fn member(py: Python<'_>, value: &serde_json::Value) -> PyResult<Py<PyAny>> {
    use serde_json::Value;
    Ok(match value {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_py_any(py)?,
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_py_any(py)?,
            (None, Some(u)) => u.into_py_any(py)?,
            (None, None) => n.as_f64().into_py_any(py)?,
        },
        Value::String(s) => s.into_py_any(py)?,
        Value::Array(_) | Value::Object(_) => {
            ResultKit::get(py)?.stored_value(py, &value.to_string())?
        }
    })
}

/// The exception of an engine error: the kit's problem document of its refusal.
pub(crate) fn engine_error(py: Python<'_>, e: &EngineError) -> PyErr {
    let explanation = Explanation::of_error(e);
    exception(py, &explanation.problem(&door(&explanation.record_name())))
}

/// The Python form of an answer: a [`PyAnswer`], or the verdict's exception.
pub(crate) fn reply(py: Python<'_>, answer: Answer) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, answer_of(py, answer)?)?.into_any())
}

/// The answer as Python sees it, or the exception it raises.
pub(crate) fn answer_of(py: Python<'_>, answer: Answer) -> PyResult<PyAnswer> {
    settled(py, &answer)?;
    let verdict = Verdict::of_answer(&answer);
    let key = answer.key.as_ref().map(|k| k.key.as_str().to_owned());
    let rule = answer.rule.map(|r| r.to_string());
    // The record's full name, for messages only: not written out for an answer that is a result.
    let record_name = || answer.key.as_ref().map(Key::to_string).unwrap_or_default();
    let mut out = PyAnswer {
        verdict: verdict.label(),
        executed: answer.executed_here(),
        replayed: false,
        executed_at_ms: None,
        expires_at_ms: None,
        rule,
        key,
        failed: false,
        content: None,
        value_json: None,
        recording: None,
        message: None,
    };
    let outcome = answer.outcome();
    match answer.decision {
        Decision::Executed {
            executed_at,
            expires_at,
            recording,
            ..
        } => {
            out.executed_at_ms = Some(executed_at.as_millis());
            out.expires_at_ms = Some(expires_at.as_millis());
            out.recording = Some(recording.name());
        }
        Decision::Replayed {
            executed_at,
            expires_at,
            ..
        } => {
            out.replayed = true;
            out.executed_at_ms = Some(executed_at.as_millis());
            out.expires_at_ms = Some(expires_at.as_millis());
        }
        Decision::NotApplied {
            message, recording, ..
        } => {
            out.message = Some(message);
            out.recording = Some(recording.name());
        }
        // A pass-through has only its outcome; in-flight, unknown and expired answers raised
        // above.
        Decision::PassedThrough { .. }
        | Decision::InFlight { .. }
        | Decision::Unknown { .. }
        | Decision::Expired { .. } => {}
    }
    if let Some(outcome) = outcome {
        out.failed = outcome.kind == OutcomeKind::Failed;
        let payload = Payload::of(&outcome).map_err(|e| {
            let why = format!(
                "the stored outcome of {} cannot be read: {e}",
                record_name()
            );
            exception(py, &Problem::new(Verdict::BadRequest, why))
        })?;
        out.content = Some(payload.content());
        out.value_json = Some(Box::<str>::from(payload.to_json()).into_string());
    }
    Ok(out)
}

/// How the package's exceptions name things.
fn door(record: &str) -> Door<'_> {
    Door {
        effect: "the function",
        record,
        resolve: Resolve::Python,
        repeat: "call it again with a new key",
        add_key: "pass key=",
        discreet: false,
    }
}

#[cfg(test)]
mod tests {
    use idemgate::{Fingerprint, IdempotencyKey, KeyRule, State, TenantId, Timestamp, ToolName};

    use super::*;

    fn key() -> Key {
        Key::new(
            TenantId::new("default").unwrap(),
            ToolName::new("send_email").unwrap(),
            IdempotencyKey::explicit("k1").unwrap(),
        )
    }

    #[test]
    fn every_exception_class_is_one_of_idemgate_errors() {
        // `idemgate.errors.engine_error` looks the class up by this name in its module.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../clients/python/src/idemgate/errors.py"
        );
        let errors = std::fs::read_to_string(path).unwrap();
        for verdict in Verdict::ALL {
            if let Some(class) = exception_class(verdict) {
                assert!(
                    errors.contains(&format!("\nclass {class}(")),
                    "{verdict:?}: no class {class} in idemgate/errors.py"
                );
            }
        }
    }

    #[test]
    fn only_the_verdicts_of_a_result_raise_nothing() {
        let results: Vec<Verdict> = Verdict::ALL
            .into_iter()
            .filter(|v| exception_class(*v).is_none())
            .collect();
        assert_eq!(
            results,
            [
                Verdict::Execute,
                Verdict::Executed,
                Verdict::Replayed,
                Verdict::PassedThrough
            ]
        );
    }

    #[test]
    fn each_engine_error_raises_the_exception_of_its_kind() {
        let cases = [
            (
                EngineError::KeyRequired {
                    tool: "send_email".into(),
                },
                "KeyRequired",
            ),
            (
                EngineError::KeyReuse {
                    key: key(),
                    rule: KeyRule::Explicit,
                    first_seen: Timestamp::from_millis(1),
                },
                "KeyReused",
            ),
            (
                IdempotencyKey::explicit("").map(|_| ()).unwrap_err().into(),
                "BadRequest",
            ),
            (
                Fingerprint::of_json_text(b"{")
                    .map(|_| ())
                    .unwrap_err()
                    .into(),
                "BadRequest",
            ),
            (
                EngineError::ReserveFailed(StoreError::Unavailable("down".into())),
                "StoreUnavailable",
            ),
            (EngineError::Store(StoreError::LeaseLost), "LeaseLost"),
            (
                EngineError::Store(StoreError::Corrupt("bad".into())),
                "StoreUnavailable",
            ),
            (EngineError::NotFound { key: key() }, "NotFound"),
            (
                EngineError::NotResolvable {
                    key: key(),
                    state: State::Completed,
                    fence: 2,
                },
                "NotResolvable",
            ),
            (
                EngineError::Journal("disk full".into()),
                "OutcomeNotRecorded",
            ),
        ];
        for (error, class) in cases {
            assert_eq!(
                exception_class(Verdict::of_error(&error)),
                Some(class),
                "{error}"
            );
        }
    }
}
