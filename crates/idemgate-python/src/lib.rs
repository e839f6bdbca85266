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
//! match on [`Verdict`] (`exception_class`); the classes themselves live in `idemgate.errors`,
//! shared with the HTTP client.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use idemgate::{
    Answer, AnyStore, Begun, Call, Decision, Effect, EngineError, FileJournal, IdempotencyKey,
    JournalFlusher, Key, OutcomeKind, StoreError, TenantId, Ticket, ToolKind, ToolName, ToolPolicy,
    UnknownPolicy, Verdict,
};
use idemgate_kit::Payload;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt as _;
use tokio::runtime::{Handle, Runtime};

/// How often the journal of unconfirmed outcomes is flushed into the store.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// The problem type URIs, as the HTTP gateway names them.
const PROBLEM_PREFIX: &str = "https://idemgate.dev/problems/";

/// What the engine's tasks share.
struct Shared {
    engine: Arc<idemgate::Engine<AnyStore>>,
    tenant: TenantId,
    /// The store keeps its records in this process (`memory:`): its futures finish without I/O,
    /// so a call is first polled on the caller's thread with the GIL held (see `Engine::run`).
    in_process_store: bool,
    handle: Handle,
    leases: Leases,
}

/// How often the lease keeper looks for leases due a heartbeat.
const KEEPER_TICK: Duration = Duration::from_millis(50);

/// The leases of the functions running now, renewed by one keeper task: registering a call is a
/// map insert, not a task of its own, so a function that returns at once costs no wake-up.
#[derive(Default)]
struct Leases {
    next: std::sync::atomic::AtomicU64,
    live: Mutex<std::collections::HashMap<u64, (Ticket, tokio::time::Instant)>>,
}

impl Leases {
    fn hold(&self, ticket: &Ticket) -> u64 {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let due = tokio::time::Instant::now() + ticket.lease_for / 3;
        if let Ok(mut live) = self.live.lock() {
            live.insert(id, (ticket.clone(), due));
        }
        id
    }

    fn drop_lease(&self, id: u64) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(&id);
        }
    }

    /// The leases due a heartbeat now, each due again a third of its lease later.
    fn due(&self) -> Vec<Ticket> {
        let now = tokio::time::Instant::now();
        let Ok(mut live) = self.live.lock() else {
            return Vec::new();
        };
        live.values_mut()
            .filter(|(_, due)| *due <= now)
            .map(|(ticket, due)| {
                *due = now + ticket.lease_for / 3;
                ticket.clone()
            })
            .collect()
    }
}

/// Renews every live lease when it is due, each heartbeat in a task of its own (a slow store
/// delays no other lease). Runs until the runtime shuts down.
async fn keep_leases(shared: std::sync::Weak<Shared>) {
    let mut ticks = tokio::time::interval(KEEPER_TICK);
    loop {
        ticks.tick().await;
        let Some(s) = shared.upgrade() else { return };
        for ticket in s.leases.due() {
            let engine = Arc::clone(&s.engine);
            s.handle.spawn(async move {
                let _ = engine.heartbeat(&ticket).await;
            });
        }
    }
}

/// The engine over one store (see `Engine.open`).
#[pyclass(frozen, weakref, module = "idemgate._native", name = "Engine")]
struct Engine {
    shared: Arc<Shared>,
    url: String,
    journal: Option<PathBuf>,
    /// Taken by `close` (or the drop); calls go through `shared.handle` while `closed` is unset.
    runtime: Mutex<Option<Runtime>>,
    flusher: Mutex<Option<JournalFlusher>>,
    closed: AtomicBool,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.close();
    }
}

/// How long stopping an engine waits for its runtime's threads.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Stops an engine's runtime. Off the runtime's own threads it waits (up to [`STOP_WAIT`], the
/// GIL released so that a worker waiting for it can finish) until no worker runs: an async answer
/// still on its way into Python when the interpreter starts shutting down aborts the process
/// (`PyGILState_Release`, exit 134), or kills the worker mid-task (a crash). On one of the
/// runtime's own threads it cannot wait, and leaves the workers to stop in the background.
fn stop(runtime: Runtime) {
    if Handle::try_current().is_ok() {
        runtime.shutdown_background();
        return;
    }
    Python::attach(|py| py.detach(|| runtime.shutdown_timeout(STOP_WAIT)));
}

/// How one tool's calls are treated (`idemgate_core::ToolPolicy`); durations in seconds.
#[pyclass(frozen, module = "idemgate._native", name = "Policy")]
#[derive(Clone)]
struct Policy(ToolPolicy);

#[pymethods]
impl Policy {
    #[new]
    #[pyo3(signature = (kind = "write", ttl = 86400.0, lease = 30.0, wait = 5.0, fallback_window = None, on_unknown = "block"))]
    fn new(
        kind: &str,
        ttl: f64,
        lease: f64,
        wait: f64,
        fallback_window: Option<f64>,
        on_unknown: &str,
    ) -> PyResult<Self> {
        Ok(Policy(ToolPolicy {
            kind: kind.parse::<ToolKind>().map_err(PyValueError::new_err)?,
            ttl: seconds("ttl", ttl)?,
            lease: seconds("lease", lease)?,
            wait: seconds("wait", wait)?,
            fallback_window: fallback_window
                .map(|w| seconds("fallback_window", w))
                .transpose()?,
            on_unknown: on_unknown
                .parse::<UnknownPolicy>()
                .map_err(PyValueError::new_err)?,
        }))
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
            "Policy(kind={:?}, ttl={}, lease={}, wait={}, fallback_window={}, on_unknown={:?})",
            self.kind(),
            self.ttl(),
            self.lease(),
            self.wait(),
            self.fallback_window()
                .map_or_else(|| "None".to_owned(), |w| w.to_string()),
            self.on_unknown()
        )
    }
}

fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|e| PyValueError::new_err(format!("{what} must be a number of seconds >= 0: {e}")))
}

/// Permission to run one call's side effect: the reserved record and its lease, renewed by the
/// engine's lease keeper until `finish`.
#[pyclass(frozen, module = "idemgate._native", name = "Ticket")]
struct PyTicket {
    ticket: Ticket,
    shared: Arc<Shared>,
    /// The lease kept alive while the function runs; `None` once finished.
    lease: Mutex<Option<u64>>,
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

/// The engine's answer to a call that ended with a result (executed, replayed, passed through or
/// not applied); every other ending is an exception.
#[pyclass(frozen, module = "idemgate._native", name = "Answer")]
struct PyAnswer {
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
    fn result_with(&self, py: Python<'_>, value: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        let kit = ResultKit::get(py)?;
        let value = match value {
            Some(v) if !self.failed => v,
            _ => {
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
                stored
            }
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
fn open_error(py: Python<'_>, url: &str, e: &StoreError) -> PyErr {
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
    exception(py, Verdict::StoreUnavailable, message, Vec::new())
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

/// The exception for a verdict: `idemgate.errors.engine_error(...)` builds it, as the HTTP client
/// builds one from a problem document (same `status`, `type`, `title` and `problem` members).
fn exception(
    py: Python<'_>,
    verdict: Verdict,
    message: String,
    problem: Vec<(&'static str, Py<PyAny>)>,
) -> PyErr {
    let Some(class) = exception_class(verdict) else {
        return PyRuntimeError::new_err(format!("{verdict} is not an error"));
    };
    let build = || -> PyResult<PyErr> {
        let doc = PyDict::new(py);
        let (name, title) = verdict.problem();
        doc.set_item("type", format!("{PROBLEM_PREFIX}{name}"))?;
        doc.set_item("title", title)?;
        doc.set_item("status", verdict.http_status())?;
        doc.set_item("detail", &message)?;
        doc.set_item("verdict", verdict.label())?;
        for (k, v) in problem {
            doc.set_item(k, v)?;
        }
        let e = py
            .import("idemgate.errors")?
            .getattr("engine_error")?
            .call1((class, message.clone(), verdict.http_status(), doc))?;
        Ok(PyErr::from_value(e))
    };
    build().unwrap_or_else(|e| e)
}

fn engine_error(py: Python<'_>, e: &EngineError) -> PyErr {
    let mut problem = Vec::new();
    if let EngineError::KeyReuse {
        key,
        rule,
        first_seen,
    } = e
    {
        problem.push(("key", key.key.as_str().into_pyobject_or_none(py)));
        problem.push(("rule", rule.to_string().into_pyobject_or_none(py)));
        problem.push((
            "first_seen",
            first_seen.to_string().into_pyobject_or_none(py),
        ));
    }
    exception(py, Verdict::of_error(e), e.to_string(), problem)
}

/// Turns a value into a Python object (no conversion here can fail).
trait IntoPy {
    fn into_pyobject_or_none(self, py: Python<'_>) -> Py<PyAny>;
}

impl<T> IntoPy for T
where
    T: for<'py> IntoPyObject<'py>,
{
    fn into_pyobject_or_none(self, py: Python<'_>) -> Py<PyAny> {
        self.into_py_any(py).unwrap_or_else(|_| py.None())
    }
}

/// The Python form of an answer: a [`PyAnswer`], or the verdict's exception.
fn reply(py: Python<'_>, answer: Answer) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, answer_of(py, answer)?)?.into_any())
}

/// The answer as Python sees it, or the exception it raises.
fn answer_of(py: Python<'_>, answer: Answer) -> PyResult<PyAnswer> {
    let verdict = Verdict::of_answer(&answer);
    let key = answer.key.as_ref().map(|k| k.key.as_str().to_owned());
    let rule = answer.rule.map(|r| r.to_string());
    // The record's full name, for messages only: not written out for an answer that is a result.
    let record_name = || answer.key.as_ref().map(Key::to_string).unwrap_or_default();
    if exception_class(verdict).is_some() {
        let record = record_name();
        let mut problem = vec![
            ("key", key.clone().into_pyobject_or_none(py)),
            ("rule", rule.clone().into_pyobject_or_none(py)),
        ];
        let message = match &answer.decision {
            Decision::InFlight { since, retry_after } => {
                problem.push(("since", since.to_string().into_pyobject_or_none(py)));
                problem.push((
                    "retry_after",
                    retry_after.as_secs_f64().into_pyobject_or_none(py),
                ));
                format!(
                    "another call holds {record} (since {since}) and did not finish within the wait bound; retry in {}s",
                    retry_after.as_secs()
                )
            }
            Decision::Unknown {
                since,
                fence,
                ran_here,
                message,
                ..
            } => {
                problem.push(("since", since.to_string().into_pyobject_or_none(py)));
                problem.push(("fence", fence.into_pyobject_or_none(py)));
                problem.push(("ran_here", ran_here.into_pyobject_or_none(py)));
                problem.push(("message", message.clone().into_pyobject_or_none(py)));
                format!(
                    "the outcome of {record} is unknown since {since} (fence {}): the side effect may or may not have happened, so it is not run again; resolve it with `idemgate keys resolve`{}",
                    fence,
                    message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default()
                )
            }
            Decision::NotApplied { message, .. } => message.clone(),
            Decision::Executed {
                recording: idemgate::Recording::LeaseLost,
                ..
            } => format!(
                "the function ran, but outlived its lease on {record} and another call took the record over: the record holds the other call's outcome"
            ),
            Decision::Executed {
                recording: idemgate::Recording::Unrecorded(why),
                ..
            } => format!(
                "the function ran, but its outcome for {record} was recorded neither in the store nor in the journal ({why}); the record turns unknown when its lease ends"
            ),
            other => format!("{record}: {other:?}"),
        };
        return Err(exception(py, verdict, message, problem));
    }
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
        _ => {}
    }
    if let Some(outcome) = outcome {
        out.failed = outcome.kind == OutcomeKind::Failed;
        let payload = Payload::of(&outcome).map_err(|e| {
            exception(
                py,
                Verdict::BadRequest,
                format!(
                    "the stored outcome of {} cannot be read: {e}",
                    record_name()
                ),
                Vec::new(),
            )
        })?;
        out.content = Some(payload.content());
        out.value_json = Some(Box::<str>::from(payload.to_json()).into_string());
    }
    Ok(out)
}

/// What `begin` gives Python: a ticket, `None` to pass through, or the `Result` of a replay (or its
/// exception).
fn begun(
    py: Python<'_>,
    shared: &Arc<Shared>,
    begun: Result<Begun, EngineError>,
) -> PyResult<Py<PyAny>> {
    match begun {
        Err(e) => Err(engine_error(py, &e)),
        Ok(Begun::PassThrough) => Ok(py.None()),
        // A replay: its `Result` at once (a stored failure raises `Failed`).
        Ok(Begun::Answered(answer)) => answer_of(py, answer)?.result_with(py, None),
        Ok(Begun::Execute(ticket)) => {
            let lease = shared.leases.hold(&ticket);
            let t = PyTicket {
                ticket,
                shared: Arc::clone(shared),
                lease: Mutex::new(Some(lease)),
            };
            Ok(Py::new(py, t)?.into_any())
        }
    }
}

/// The fingerprint of a call's arguments: the one of their JSON text `json.dumps(args,
/// default=repr)` (what the package passed before, and what a user can reproduce), read from the
/// Python value directly when it is made of plain JSON types (exactly `dict` with `str` keys,
/// `list`, `tuple`, `str`, `int` within 64 bits, finite `float`, `bool`, `None`), which saves
/// writing and re-parsing that text. Anything else (subclasses, other types, big integers, NaN,
/// lone surrogates, nesting beyond `MAX_DEPTH`) takes the text path itself, so both paths give
/// the same fingerprint or the same error.
fn fingerprint_of(
    args: &Bound<'_, PyAny>,
) -> PyResult<Result<idemgate::Fingerprint, idemgate::CanonicalError>> {
    if let Some(value) = plain_json(args, 0) {
        return Ok(Ok(idemgate::Fingerprint::of_json(&value)));
    }
    static DUMPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = args.py();
    let dumps = DUMPS.get_or_try_init(py, || {
        py.import("json")?.getattr("dumps").map(Bound::unbind)
    })?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("default", py.import("builtins")?.getattr("repr")?)?;
    let text = dumps.call(py, (args,), Some(&kwargs))?;
    let text = text.bind(py).cast::<PyString>()?.to_str()?;
    Ok(idemgate::Fingerprint::of_json_text(text.as_bytes()))
}

/// A Python value of plain JSON types as a JSON value, or `None` when it holds anything else
/// (see [`fingerprint_of`]; exact types only, as `json.dumps` writes subclasses its own way).
fn plain_json(v: &Bound<'_, PyAny>, depth: usize) -> Option<serde_json::Value> {
    use serde_json::Value;
    if depth > idemgate::canonical::MAX_DEPTH {
        return None;
    }
    if v.is_none() {
        return Some(Value::Null);
    }
    if let Ok(s) = v.cast_exact::<PyString>() {
        return s.to_str().ok().map(|s| Value::String(s.to_owned()));
    }
    if let Ok(b) = v.cast_exact::<PyBool>() {
        return Some(Value::Bool(b.is_true()));
    }
    if let Ok(i) = v.cast_exact::<PyInt>() {
        return match i.extract::<i64>() {
            Ok(i) => Some(i.into()),
            Err(_) => i.extract::<u64>().ok().map(Into::into),
        };
    }
    if let Ok(f) = v.cast_exact::<PyFloat>() {
        return serde_json::Number::from_f64(f.value()).map(Value::Number);
    }
    if let Ok(d) = v.cast_exact::<PyDict>() {
        let mut map = serde_json::Map::new();
        for (k, item) in d.iter() {
            let k = k.cast_exact::<PyString>().ok()?.to_str().ok()?;
            map.insert(k.to_owned(), plain_json(&item, depth + 1)?);
        }
        return Some(Value::Object(map));
    }
    let array = |items: &mut dyn Iterator<Item = Bound<'_, PyAny>>| {
        items
            .map(|item| plain_json(&item, depth + 1))
            .collect::<Option<_>>()
            .map(Value::Array)
    };
    if let Ok(l) = v.cast_exact::<PyList>() {
        return array(&mut l.iter());
    }
    if let Ok(t) = v.cast_exact::<PyTuple>() {
        return array(&mut t.iter());
    }
    None
}

/// What the function reported, from Python's words.
fn effect(kind: &str, body: &str) -> PyResult<Effect> {
    let json = |body: &str| {
        Payload::json_text(body)
            .map(|p| p.encode())
            .map_err(|e| PyValueError::new_err(e.to_string()))
    };
    Ok(match kind {
        "success" => Effect::Success(json(body)?),
        "failed" => Effect::Failed(json(body)?),
        "not_applied" => Effect::not_applied(body),
        "ambiguous" => Effect::Ambiguous(body.to_owned()),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown effect {other:?}: expected success, failed, not_applied or ambiguous"
            )))
        }
    })
}

/// Makes an engine future's output Python's (`begun`, `reply`).
type ToPython<T> = fn(Python<'_>, &Arc<Shared>, T) -> PyResult<Py<PyAny>>;

/// Hands an async result to Python: `done(True, value)` or `done(False, exception)`.
fn settle(py: Python<'_>, done: &Py<PyAny>, result: PyResult<Py<PyAny>>) {
    let (ok, value) = match result {
        Ok(v) => (true, v),
        Err(e) => (false, e.into_value(py).into_any()),
    };
    if let Err(e) = done.call1(py, (ok, value)) {
        e.write_unraisable(py, None);
    }
}

impl Engine {
    /// The engine's call: `args` (any Python value; `None`: no arguments) fingerprinted as its
    /// JSON text `json.dumps(args, default=repr)` would be (see [`fingerprint_of`]), made in
    /// `scope` (`Call::scope`: a call without key is joined by the fallback window only to
    /// identical calls of the same scope).
    fn call(
        &self,
        py: Python<'_>,
        tool: &str,
        key: Option<&str>,
        args: &Bound<'_, PyAny>,
        scope: Option<&str>,
    ) -> PyResult<Call> {
        // In the order the checks always ran: what `json.dumps` raises, the tool, the key, then
        // arguments the engine cannot read.
        let fingerprint = if args.is_none() {
            None
        } else {
            Some(fingerprint_of(args)?)
        };
        let call = || -> Result<Call, EngineError> {
            let mut call = Call::new(self.shared.tenant.clone(), ToolName::new(tool)?);
            if let Some(key) = key {
                call = call.key(IdempotencyKey::explicit(key)?);
            }
            if let Some(fingerprint) = fingerprint {
                call = call.fingerprint(fingerprint?);
            }
            if let Some(scope) = scope {
                call = call.scope(scope);
            }
            Ok(call)
        };
        call().map_err(|e| engine_error(py, &e))
    }

    /// Runs one of the engine's futures to its end. On the in-process store the future is first
    /// polled right here, with the GIL held: it almost always finishes in that poll (no I/O), and
    /// releasing the GIL and handing the thread to the runtime's `block_on` would cost more than
    /// the engine's work. A future that must wait (a duplicate waiting for a call in flight) and
    /// every future of a store with I/O run in `block_on` with the GIL released.
    fn run<F>(&self, py: Python<'_>, future: F) -> PyResult<F::Output>
    where
        F: Future + Send,
        F::Output: Send,
    {
        let runtime = self.runtime()?;
        let mut future = std::pin::pin!(future);
        if self.shared.in_process_store {
            let _in_runtime = runtime.enter();
            if let Poll::Ready(out) = future
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
            {
                return Ok(out);
            }
        }
        Ok(py.detach(|| runtime.block_on(future)))
    }

    /// Runs one of the engine's futures for an async caller and hands `done(ok, value)` what
    /// `answer` makes of its output. On the in-process store the future is first polled right
    /// here (as in [`Engine::run`]) and, when it finishes, `done` is called at once on this
    /// thread, the event loop's; otherwise it runs on the runtime and `done` is called from a
    /// runtime thread.
    fn answer_async<F>(
        &self,
        py: Python<'_>,
        future: F,
        answer: ToPython<F::Output>,
        done: Py<PyAny>,
    ) -> PyResult<()>
    where
        F: Future + Send + 'static,
        F::Output: Send,
    {
        let runtime = self.runtime()?;
        let mut future = Box::pin(future);
        if self.shared.in_process_store {
            let polled = {
                let _in_runtime = runtime.enter();
                future
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
            };
            if let Poll::Ready(out) = polled {
                settle(py, &done, answer(py, &self.shared, out));
                return Ok(());
            }
        }
        let shared = Arc::clone(&self.shared);
        runtime.spawn(async move {
            let out = future.await;
            // Not into an interpreter that is shutting down: the answer has nobody left to go to.
            Python::try_attach(|py| {
                let value = answer(py, &shared, out);
                settle(py, &done, value);
            });
        });
        Ok(())
    }

    fn ticket<'a>(ticket: &'a Bound<'_, PyTicket>) -> PyResult<&'a PyTicket> {
        let t = ticket.get();
        if !t.stop_heartbeat() {
            return Err(PyRuntimeError::new_err(
                "this ticket was already finished: report each call's outcome once",
            ));
        }
        Ok(t)
    }

    fn runtime(&self) -> PyResult<&Handle> {
        match self.closed.load(Ordering::Acquire) {
            true => Err(PyRuntimeError::new_err("the engine is closed")),
            false => Ok(&self.shared.handle),
        }
    }
}

#[pymethods]
impl Engine {
    /// Opens the store at `url` (`sqlite:///path`, `postgres://…`, `redis://…`, `memory:`; default:
    /// the SQLite file every `idemgate` command uses) with a durable journal beside it (`journal`,
    /// else where the command line keeps it), for `tenant`, on a runtime of `worker_threads`.
    /// Raises `StoreMisconfigured` for a URL or store set up wrong, `StoreUnavailable` for a store
    /// that cannot be reached (see [`open_error`]). `verifiers` maps tool names to their
    /// verifier (see [`PyVerifier`]), asked when a call finds the tool's record unknown under the
    /// policy `on_unknown = "verify"`.
    #[staticmethod]
    #[pyo3(signature = (url = None, *, journal = None, tenant = "default", worker_threads = 2, verifiers = None))]
    fn open(
        py: Python<'_>,
        url: Option<&str>,
        journal: Option<PathBuf>,
        tenant: &str,
        worker_threads: usize,
        verifiers: Option<std::collections::HashMap<String, Py<PyAny>>>,
    ) -> PyResult<Self> {
        let tenant = TenantId::new(tenant).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let (url, journal_dir) = idemgate::store_and_journal(url, journal.as_deref())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads.max(1))
            .thread_name("idemgate")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("failed to start a runtime: {e}")))?;
        let store = py
            .detach(|| runtime.block_on(AnyStore::connect(&url)))
            .map_err(|e| open_error(py, &url, &e))?;
        let mut engine = idemgate::Engine::new(store);
        for (tool, verify) in verifiers.unwrap_or_default() {
            engine = engine.with_verifier(tool, Arc::new(PyVerifier(Arc::new(verify))));
        }
        let mut journal = None;
        if engine.store().is_durable() {
            let file = FileJournal::open(&journal_dir).map_err(|e| {
                PyRuntimeError::new_err(format!(
                    "failed to open journal {}: {e}",
                    journal_dir.display()
                ))
            })?;
            engine = engine.with_journal(Arc::new(file));
            journal = Some(journal_dir);
        }
        let engine = Arc::new(engine);
        let flusher = {
            let _in_runtime = runtime.enter();
            engine.spawn_journal_flusher(FLUSH_EVERY)
        };
        let shared = Arc::new(Shared {
            in_process_store: matches!(engine.store(), AnyStore::Memory(_)),
            engine,
            tenant,
            handle: runtime.handle().clone(),
            leases: Leases::default(),
        });
        runtime.spawn(keep_leases(Arc::downgrade(&shared)));
        Ok(Engine {
            shared,
            url,
            journal,
            runtime: Mutex::new(Some(runtime)),
            flusher: Mutex::new(Some(flusher)),
            closed: AtomicBool::new(false),
        })
    }

    /// Stops the engine's runtime and waits (up to 5 s, with the GIL released) for its threads
    /// to finish what they are doing, an async answer on its way to Python included (see
    /// [`stop`]; dropping the engine does the same). Later calls raise `RuntimeError`. The
    /// package calls it for every engine still open when the interpreter exits, before it starts
    /// shutting down.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        drop(self.flusher.lock().ok().and_then(|mut f| f.take()));
        let runtime = self.runtime.lock().ok().and_then(|mut r| r.take());
        if let Some(runtime) = runtime {
            stop(runtime);
        }
    }

    /// The store's URL.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// The journal directory (`None` for the memory store).
    #[getter]
    fn journal(&self) -> Option<PathBuf> {
        self.journal.clone()
    }

    /// The tenant whose records these are.
    #[getter]
    fn tenant(&self) -> &str {
        self.shared.tenant.as_str()
    }

    /// Decides whether a call may run now: a `Ticket` (run the function, then `finish`), `None`
    /// (a read or naturally idempotent tool: run it, nothing is recorded) or the package's
    /// `Result` (a replay; a stored failure raises `Failed`); in-flight, unknown, key-reused and
    /// other refusals raise. Waits up to the policy's
    /// `wait` for a racing call, with the GIL released. `scope`: where the call was made (a
    /// conversation); the fallback window joins only identical calls of one scope.
    #[pyo3(signature = (tool, key, args, policy, *, scope = None))]
    fn begin(
        &self,
        py: Python<'_>,
        tool: &str,
        key: Option<&str>,
        args: &Bound<'_, PyAny>,
        policy: &Policy,
        scope: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let call = self.call(py, tool, key, args, scope)?;
        let result = self.run(py, self.shared.engine.begin(call, &policy.0))?;
        begun(py, &self.shared, result)
    }

    /// Records what the function reported (`success`/`failed` with its JSON text,
    /// `not_applied`/`ambiguous` with a message) and answers; an outcome that could not be
    /// recorded or a lost lease raises.
    fn finish(
        &self,
        py: Python<'_>,
        ticket: &Bound<'_, PyTicket>,
        effect_kind: &str,
        body: &str,
    ) -> PyResult<Py<PyAny>> {
        let reported = effect(effect_kind, body)?;
        let t = Self::ticket(ticket)?;
        let answer = self.run(py, self.shared.engine.finish(&t.ticket, reported))?;
        reply(py, answer)
    }

    /// As `begin`, on the engine's runtime: calls `done(ok, value)` (from a runtime thread, with
    /// the GIL) with what `begin` returns or raises.
    #[pyo3(signature = (tool, key, args, policy, done, *, scope = None))]
    #[allow(clippy::too_many_arguments)] // Python's signature: each is one of its arguments
    fn begin_async(
        &self,
        py: Python<'_>,
        tool: &str,
        key: Option<&str>,
        args: &Bound<'_, PyAny>,
        policy: &Policy,
        done: Py<PyAny>,
        scope: Option<&str>,
    ) -> PyResult<()> {
        let call = self.call(py, tool, key, args, scope)?;
        let policy = policy.0.clone();
        let engine = Arc::clone(&self.shared.engine);
        self.answer_async(
            py,
            async move { engine.begin(call, &policy).await },
            begun,
            done,
        )
    }

    /// As `finish`, on the engine's runtime: calls `done(ok, value)`.
    fn finish_async(
        &self,
        py: Python<'_>,
        ticket: &Bound<'_, PyTicket>,
        effect_kind: &str,
        body: &str,
        done: Py<PyAny>,
    ) -> PyResult<()> {
        let reported = effect(effect_kind, body)?;
        Self::ticket(ticket)?;
        let ticket = ticket.get().ticket.clone();
        let engine = Arc::clone(&self.shared.engine);
        self.answer_async(
            py,
            async move { engine.finish(&ticket, reported).await },
            |py, _, answer| reply(py, answer),
            done,
        )
    }

    /// The record a call is judged by, as `Engine::key_for` names it: a dict with `tenant`,
    /// `tool`, `key`, `rule`, `ttl` (seconds) and `digest` (hex), or `None` for reads and naturally
    /// idempotent tools.
    #[pyo3(signature = (tool, key, args, policy, *, scope = None))]
    fn key_for<'py>(
        &self,
        py: Python<'py>,
        tool: &str,
        key: Option<&str>,
        args: &Bound<'_, PyAny>,
        policy: &Policy,
        scope: Option<&str>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let call = self.call(py, tool, key, args, scope)?;
        let named = self
            .shared
            .engine
            .key_for(&call, &policy.0)
            .map_err(|e| engine_error(py, &e))?;
        let Some(named) = named else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("tenant", named.key.tenant.as_str())?;
        d.set_item("tool", named.key.tool.as_str())?;
        d.set_item("key", named.key.key.as_str())?;
        d.set_item("rule", named.rule.to_string())?;
        d.set_item("ttl", named.ttl.as_secs_f64())?;
        d.set_item("digest", idemgate::key::hex(&named.key.digest()))?;
        Ok(Some(d))
    }

    /// The record of `(tool, key)` as JSON text (the shape `idemgate keys show --json` prints
    /// from), or `None`.
    fn record(&self, py: Python<'_>, tool: &str, key: &str) -> PyResult<Option<String>> {
        let name = Key::new(
            self.shared.tenant.clone(),
            ToolName::new(tool).map_err(|e| PyValueError::new_err(e.to_string()))?,
            IdempotencyKey::new(key).map_err(|e| PyValueError::new_err(e.to_string()))?,
        );
        let record = self
            .run(py, self.shared.engine.get(&name))?
            .map_err(|e| engine_error(py, &e))?;
        record.as_ref().map(record_view).transpose()
    }

    /// This tenant's records, oldest first, as JSON texts (`record`'s shape): only `tool`'s,
    /// only those in `state` (`in_flight`, `completed`, `unknown`), at most `limit` (0: all).
    #[pyo3(signature = (tool = None, state = None, limit = 0))]
    fn records(
        &self,
        py: Python<'_>,
        tool: Option<&str>,
        state: Option<&str>,
        limit: usize,
    ) -> PyResult<Vec<String>> {
        let filter = idemgate::ListFilter {
            tenant: Some(self.shared.tenant.clone()),
            tool: tool
                .map(ToolName::new)
                .transpose()
                .map_err(|e| PyValueError::new_err(e.to_string()))?,
            state: state
                .map(str::parse::<idemgate::State>)
                .transpose()
                .map_err(PyValueError::new_err)?,
            scope: None,
            limit,
        };
        let records = self
            .run(py, self.shared.engine.list(&filter))?
            .map_err(|e| engine_error(py, &e))?;
        records.iter().map(record_view).collect()
    }

    /// Resolves the unknown record of `(tool, key)` as an operator decided, if its fence is still
    /// `fence`: `completed` with `result` (JSON text; `failed`: a terminal failure), stored for
    /// `ttl` seconds and marked as an operator's resolution, or `release` (it did not happen: the
    /// next call runs). The record after, as `record` shows it (`None` once released); raises
    /// `NotFound`, `NotResolvable` (not unknown, or its fence moved on) or `StoreUnavailable`.
    #[pyo3(signature = (tool, key, fence, resolution, result = None, failed = false, ttl = 86400.0))]
    #[allow(clippy::too_many_arguments)] // Python's signature: each is one of its arguments
    fn resolve(
        &self,
        py: Python<'_>,
        tool: &str,
        key: &str,
        fence: u64,
        resolution: &str,
        result: Option<&str>,
        failed: bool,
        ttl: f64,
    ) -> PyResult<Option<String>> {
        let name = Key::new(
            self.shared.tenant.clone(),
            ToolName::new(tool).map_err(|e| PyValueError::new_err(e.to_string()))?,
            IdempotencyKey::new(key).map_err(|e| PyValueError::new_err(e.to_string()))?,
        );
        let resolution = match (resolution, result) {
            ("completed", Some(text)) => idemgate::Resolution::Completed {
                // Marked, so that replays say an operator resolved it then, not that it ran then.
                outcome: Payload::json_text(text)
                    .map_err(|e| PyValueError::new_err(format!("invalid result: {e}")))?
                    .into_resolution(if failed {
                        OutcomeKind::Failed
                    } else {
                        OutcomeKind::Success
                    }),
                ttl: seconds("ttl", ttl)?,
            },
            ("completed", None) => {
                return Err(PyValueError::new_err(
                    "resolution \"completed\" needs the result the side effect had",
                ))
            }
            ("release", None) => idemgate::Resolution::Release,
            ("release", Some(_)) => {
                return Err(PyValueError::new_err(
                    "resolution \"release\" takes no result: nothing happened",
                ))
            }
            (other, _) => {
                return Err(PyValueError::new_err(format!(
                    "unknown resolution {other:?}: expected \"completed\" or \"release\""
                )))
            }
        };
        let after = self
            .run(
                py,
                self.shared
                    .engine
                    .resolve(&name, fence, resolution, None, None),
            )?
            .map_err(|e| engine_error(py, &e))?;
        after.as_ref().map(record_view).transpose()
    }

    /// Replays journaled outcomes into the store now: `(applied, superseded, pending)`.
    fn flush_journal(&self, py: Python<'_>) -> PyResult<(usize, usize, usize)> {
        let report = self
            .run(py, self.shared.engine.flush_journal())?
            .map_err(|e| engine_error(py, &e))?;
        Ok((report.applied, report.superseded, report.pending))
    }

    fn __repr__(&self) -> String {
        format!(
            "Engine({:?}, tenant={:?})",
            self.url,
            self.shared.tenant.as_str()
        )
    }
}

/// A record as JSON text, the shape `idemgate keys show --json` prints from, with the outcome as
/// every door shows it: its kind and its content as JSON, not raw bytes.
fn record_view(record: &idemgate::Record) -> PyResult<String> {
    let mut view =
        serde_json::to_value(record).map_err(|e| PyValueError::new_err(e.to_string()))?;
    if let (idemgate::RecordState::Completed { outcome, .. }, Some(o)) =
        (&record.state, view.get_mut("outcome"))
    {
        if let Ok(payload) = Payload::of(outcome) {
            o["content"] = payload.content().into();
            o["body"] =
                serde_json::from_str(payload.to_json().get()).unwrap_or(serde_json::Value::Null);
        }
    }
    Ok(view.to_string())
}

/// A tool's verifier written in Python: `verify(tool, key, downstream_key)`, called when a call
/// finds the tool's record unknown (the function may or may not have done its work) under the
/// policy `on_unknown = "verify"`, typically to look the side effect up downstream by its key.
/// It says what happened in the words of a tool function: it returns the result the side effect
/// had (JSON data: stored and replayed), raises `Failed(result)` (a terminal failure, stored),
/// `NotApplied` (it did not happen: the call runs now) or `MaybeApplied` (still cannot tell: the
/// record stays unknown); any other exception leaves it unknown too, its message recorded.
struct PyVerifier(Arc<Py<PyAny>>);

impl idemgate::Verifier for PyVerifier {
    fn verify<'a>(&'a self, key: &'a Key) -> idemgate::ProbeFuture<'a> {
        let verify = Arc::clone(&self.0);
        let (tool, k) = (key.tool.to_string(), key.key.as_str().to_owned());
        let downstream = idemgate::key::hex(&key.digest());
        Box::pin(async move {
            // On a thread of its own: a verifier asks another system and blocks while it does,
            // and it must not hold up the runtime's few workers (nor wait for the GIL on one).
            tokio::task::spawn_blocking(move || {
                Python::attach(|py| probe(py, verify.bind(py).call1((tool, k, downstream))))
            })
            .await
            .map_err(|e| format!("the verifier did not finish: {e}"))?
        })
    }
}

/// What a verifier's return or exception says (see [`PyVerifier`]).
fn probe(py: Python<'_>, answer: PyResult<Bound<'_, PyAny>>) -> Result<idemgate::Probe, String> {
    let applied =
        |kind: OutcomeKind, value: &Bound<'_, PyAny>| -> Result<idemgate::Probe, String> {
            let text: String = py
                .import("idemgate.engine")
                .and_then(|m| m.getattr("_json_text"))
                .and_then(|f| f.call1((value,)))
                .and_then(|t| t.extract())
                .map_err(|e| format!("the verifier's result is not JSON: {e}"))?;
            let payload = Payload::json_text(&text).map_err(|e| e.to_string())?;
            Ok(idemgate::Probe::Applied(idemgate::Outcome {
                kind,
                body: payload.encode(),
            }))
        };
    let raised = match answer {
        Ok(value) => return applied(OutcomeKind::Success, &value),
        Err(e) => e.into_value(py).into_bound(py),
    };
    let class = |name: &str| py.import("idemgate.errors").and_then(|m| m.getattr(name));
    let is = |name: &str| {
        class(name)
            .and_then(|c| raised.is_instance(&c))
            .unwrap_or(false)
    };
    if is("NotApplied") {
        Ok(idemgate::Probe::NotApplied)
    } else if is("Failed") {
        let result = raised
            .getattr("result")
            .map_err(|e| format!("Failed without a result: {e}"))?;
        applied(OutcomeKind::Failed, &result)
    } else if is("MaybeApplied") {
        Ok(idemgate::Probe::Unknown)
    } else {
        Err(raised.to_string())
    }
}

/// A stable key for one step of one run: `IdempotencyKey::derive(run_id, step)`.
#[pyfunction]
fn derive_key(run_id: &str, step: &str) -> String {
    IdempotencyKey::derive(run_id, step).as_str().to_owned()
}

/// A fresh random key: `IdempotencyKey::mint()`.
#[pyfunction]
fn mint_key() -> String {
    IdempotencyKey::mint().as_str().to_owned()
}

/// Checks a caller's key (`IdempotencyKey::explicit`); raises `ValueError` with the reason.
#[pyfunction]
fn check_key(key: &str) -> PyResult<String> {
    IdempotencyKey::explicit(key)
        .map(|k| k.as_str().to_owned())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The fingerprint (hex SHA-256 of the canonical JSON) of JSON text, integers kept exact.
#[pyfunction]
fn fingerprint(args: &str) -> PyResult<String> {
    idemgate::Fingerprint::of_json_text(args.as_bytes())
        .map(|f| f.to_hex())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The fingerprint of a call's arguments given as a Python value, as the engine takes them: the
/// one of `json.dumps(args, default=repr)`.
#[pyfunction]
fn fingerprint_args(args: &Bound<'_, PyAny>) -> PyResult<String> {
    fingerprint_of(args)?
        .map(|f| f.to_hex())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The native half of the `idemgate` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<Policy>()?;
    m.add_class::<PyTicket>()?;
    m.add_class::<PyAnswer>()?;
    m.add_function(wrap_pyfunction!(derive_key, m)?)?;
    m.add_function(wrap_pyfunction!(mint_key, m)?)?;
    m.add_function(wrap_pyfunction!(check_key, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint_args, m)?)?;
    Ok(())
}
