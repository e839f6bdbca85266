//! `Engine`: the handle Python holds on one engine over one store, with its runtime, its journal
//! flusher and its lease keeper; its opening and closing, and every method Python calls on it.
//! The methods stay in this one `#[pymethods]` block (PyO3 takes one a class without its
//! `multiple-pymethods` feature) and are thin: the halves of a call are made of call.rs's pieces,
//! answers in answer.rs, and the runtime's bridging in runtime.rs (its `OnRuntime`, implemented
//! here). Those modules never name `Engine`: what they need of it is `Shared` (shared.rs), so
//! the imports run one way, from this module down.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemgate::{
    Answer, AnyStore, FileJournal, IdempotencyKey, JournalFlusher, Key, TenantId, ToolName,
};
use idemgate_kit::leases::keep_leases;
use idemgate_kit::records::viewed;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::runtime::Runtime;
use tracing::Instrument as _;

use crate::answer::{engine_error, open_error, reply, settled};
use crate::call::{begun, begun_value, effect, new_call, PyTicket};
use crate::policy::Policy;
use crate::runtime::{stop, OnRuntime, ToPython};
use crate::shared::Shared;
use crate::verifier::PyVerifier;

/// How often the journal of unconfirmed outcomes is flushed into the store.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// The engine over one store (see `Engine.open`).
#[pyclass(frozen, weakref, module = "idemgate._native", name = "Engine")]
pub(crate) struct Engine {
    pub(crate) shared: Arc<Shared>,
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

/// How a `finish` answers Python: the `Answer`, or (`quiet`) `None` for an answer that is a
/// result; any other ending raises its exception either way.
fn answered(quiet: bool) -> ToPython<Answer> {
    match quiet {
        true => |py, _, answer| settled(py, &answer).map(|()| py.None()),
        false => |py, _, answer| reply(py, answer),
    }
}

impl Engine {
    /// A call's spans, under the caller's context when it sent a valid one.
    fn trace(
        &self,
        tool: &str,
        call_id: Option<&str>,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> Arc<idemgate_trace::SplitCall> {
        let door = idemgate_trace::Door::Python;
        let tenant = self.shared.tenant.as_str();
        let split =
            idemgate_trace::SplitCall::start(door, tenant, tool, call_id, traceparent, tracestate);
        Arc::new(split)
    }

    /// The engine's call of `tool` in this engine's tenant, named under `policy` ([`new_call`]).
    fn call_of(
        &self,
        py: Python<'_>,
        tool: &str,
        key: Option<&str>,
        args: &Bound<'_, PyAny>,
        scope: Option<&str>,
        policy: &Policy,
    ) -> PyResult<idemgate::Call> {
        let tenant = &self.shared.tenant;
        new_call(py, tenant, tool, key, args, scope, &policy.0.identity)
    }

    /// The record name of `(tool, key)` in this engine's tenant; bad names are `ValueError`s.
    fn key_named(&self, tool: &str, key: &str) -> PyResult<Key> {
        Ok(Key::new(
            self.shared.tenant.clone(),
            ToolName::new(tool).map_err(|e| PyValueError::new_err(e.to_string()))?,
            IdempotencyKey::new(key).map_err(|e| PyValueError::new_err(e.to_string()))?,
        ))
    }
}

/// The runtime's bridge (runtime.rs) runs the engine's futures over what its tasks share, while
/// the engine is open.
impl OnRuntime for Engine {
    fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
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
        // Traces, when the OTEL_* variables ask: set up (or refused, by name) before any call.
        idemgate_trace::install_for_process("idemgate").map_err(PyRuntimeError::new_err)?;
        let (url, journal_dir) = idemgate::store_and_journal(url, journal.as_deref())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let runtime = crate::runtime::start(worker_threads)?;
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
            in_process_store: matches!(engine.store().unsealed(), AnyStore::Memory(_)),
            engine,
            tenant,
            handle: runtime.handle().clone(),
            leases: Arc::default(),
        });
        let engine = Arc::downgrade(&shared.engine);
        runtime.spawn(keep_leases(Arc::downgrade(&shared.leases), move |ticket| {
            if let Some(engine) = engine.upgrade() {
                tokio::spawn(async move {
                    let _ = engine.heartbeat(&ticket).await;
                });
            }
        }));
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

    /// Whether this process exports idemgate's spans (the OTEL_* variables point at a
    /// collector): the package then passes its current span's context to `begin`.
    #[staticmethod]
    fn tracing() -> PyResult<bool> {
        idemgate_trace::install_for_process("idemgate").map_err(PyRuntimeError::new_err)
    }

    /// Sends the spans ended so far to the collector (the package calls it at exit).
    #[staticmethod]
    fn flush_traces(py: Python<'_>) {
        py.detach(idemgate_trace::flush_process);
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
    ///
    /// `value=True`, for a caller that returns a replay's value and not its `Result`
    /// (`@idempotent`): a replay answers its stored value itself and a pass-through
    /// `PASSED_THROUGH` (`None` is a value a replay may give); the rest is the same. Saves
    /// building the `Result` (its times, labels and dataclass).
    ///
    /// `traceparent`/`tracestate`: the caller's W3C trace context (the package passes its
    /// OpenTelemetry current span's); `call_id`: the model's tool call id, for the call's span;
    /// `within_observed`: the call runs inside the function of an observed call of the same
    /// tool (the window inside a call id's record), so it is not observed again.
    #[pyo3(signature = (tool, key, args, policy, *, scope = None, value = false, traceparent = None, tracestate = None, call_id = None, within_observed = false))]
    #[allow(clippy::too_many_arguments)] // Python's signature: each is one of its arguments
    fn begin(
        &self,
        py: Python<'_>,
        tool: &str,
        key: Option<&str>,
        args: &Bound<'_, PyAny>,
        policy: &Policy,
        scope: Option<&str>,
        value: bool,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
        call_id: Option<&str>,
        within_observed: bool,
    ) -> PyResult<Py<PyAny>> {
        let call = self
            .call_of(py, tool, key, args, scope, policy)?
            .within_observed(within_observed);
        let trace = self.trace(tool, call_id, traceparent, tracestate);
        let begin = self.shared.engine.begin(call, &policy.0);
        let result = self.run(py, begin.instrument(trace.span()))?;
        match value {
            true => begun_value(py, &self.shared, (result, trace)),
            false => begun(py, &self.shared, (result, trace)),
        }
    }

    /// Records what the function reported (`success`/`failed` with its JSON text,
    /// `not_applied`/`ambiguous` with a message) and answers; an outcome that could not be
    /// recorded or a lost lease raises. `quiet=True`, for a caller that keeps the function's
    /// value and discards the answer (`@idempotent`, and the recording of an exception the
    /// function raised): `None` instead of an `Answer`, the same exceptions.
    #[pyo3(signature = (ticket, effect_kind, body, *, quiet = false))]
    fn finish(
        &self,
        py: Python<'_>,
        ticket: &Bound<'_, PyTicket>,
        effect_kind: &str,
        body: &str,
        quiet: bool,
    ) -> PyResult<Py<PyAny>> {
        let reported = effect(effect_kind, body).map_err(PyValueError::new_err)?;
        let t = PyTicket::finishing(ticket)?;
        t.trace.effect_done();
        let finish = self.shared.engine.finish(&t.ticket, reported);
        let answer = self.run(py, finish.instrument(t.trace.span()))?;
        t.trace.finished(&answer);
        answered(quiet)(py, &self.shared, answer)
    }

    /// As `begin`, on the engine's runtime: calls `done(ok, value)` (from a runtime thread, with
    /// the GIL) with what `begin` returns or raises (`value=True`: as `begin(..., value=True)`).
    #[pyo3(signature = (tool, key, args, policy, done, *, scope = None, value = false, traceparent = None, tracestate = None, call_id = None, within_observed = false))]
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
        value: bool,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
        call_id: Option<&str>,
        within_observed: bool,
    ) -> PyResult<()> {
        let call = self
            .call_of(py, tool, key, args, scope, policy)?
            .within_observed(within_observed);
        let policy = policy.0.clone();
        let engine = Arc::clone(&self.shared.engine);
        let trace = self.trace(tool, call_id, traceparent, tracestate);
        self.answer_async(
            py,
            async move {
                let span = trace.span();
                (engine.begin(call, &policy).instrument(span).await, trace)
            },
            if value { begun_value } else { begun },
            done,
        )
    }

    /// As `finish`, on the engine's runtime: calls `done(ok, value)` (`quiet=True`: as
    /// `finish(..., quiet=True)`, `None` for an answer that is a result).
    #[pyo3(signature = (ticket, effect_kind, body, done, *, quiet = false))]
    fn finish_async(
        &self,
        py: Python<'_>,
        ticket: &Bound<'_, PyTicket>,
        effect_kind: &str,
        body: &str,
        done: Py<PyAny>,
        quiet: bool,
    ) -> PyResult<()> {
        let reported = effect(effect_kind, body).map_err(PyValueError::new_err)?;
        PyTicket::finishing(ticket)?;
        let (trace, ticket) = (Arc::clone(&ticket.get().trace), ticket.get().ticket.clone());
        trace.effect_done();
        let engine = Arc::clone(&self.shared.engine);
        self.answer_async(
            py,
            async move {
                let answer = engine
                    .finish(&ticket, reported)
                    .instrument(trace.span())
                    .await;
                trace.finished(&answer);
                answer
            },
            answered(quiet),
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
        let call = self.call_of(py, tool, key, args, scope, policy)?;
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
        d.set_item("ttl", named.keep.ttl.as_secs_f64())?;
        d.set_item("digest", idemgate::key::hex(&named.key.digest()))?;
        Ok(Some(d))
    }

    /// The record of `(tool, key)` as JSON text (the shape `idemgate keys show --json` prints
    /// from), or `None`.
    fn record(&self, py: Python<'_>, tool: &str, key: &str) -> PyResult<Option<String>> {
        let name = self.key_named(tool, key)?;
        let engine = &self.shared.engine;
        let view = self
            .run(py, async {
                match engine.get(&name).await? {
                    Some(record) => viewed(engine, &record).await.map(Some),
                    None => Ok(None),
                }
            })?
            .map_err(|e| engine_error(py, &e))?;
        Ok(view.map(|v| v.to_string()))
    }

    /// This tenant's records, oldest first, as JSON texts (`record`'s shape): only `tool`'s,
    /// only those in `state` (`in_flight`, `completed`, `unknown`), only those made in `scope`,
    /// at most `limit` (0: all).
    #[pyo3(signature = (tool = None, state = None, limit = 0, scope = None))]
    fn records(
        &self,
        py: Python<'_>,
        tool: Option<&str>,
        state: Option<&str>,
        limit: usize,
        scope: Option<&str>,
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
            scope: scope.map(Into::into),
            limit,
            ..idemgate::ListFilter::default()
        };
        let engine = &self.shared.engine;
        let views = self
            .run(py, async {
                let mut views = Vec::new();
                for record in engine.list(&filter).await? {
                    views.push(viewed(engine, &record).await?.to_string());
                }
                Ok(views)
            })?
            .map_err(|e| engine_error(py, &e))?;
        Ok(views)
    }

    /// Resolves the unknown record of `(tool, key)` as an operator decided, if its fence is still
    /// `fence`: `completed` with `result` (JSON text; `failed`: a terminal failure), stored for
    /// `ttl` seconds and marked as an operator's resolution, or `release` (it did not happen: the
    /// next call runs). The record after, as `record` shows it (`None` once released); raises
    /// `NotFound`, `NotResolvable` (not unknown, or its fence moved on) or `StoreUnavailable`.
    /// `by` and `reason` go into the audit log.
    #[pyo3(signature = (tool, key, fence, resolution, result = None, failed = false, ttl = 86400.0, by = None, reason = None))]
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
        by: Option<&str>,
        reason: Option<&str>,
    ) -> PyResult<Option<String>> {
        let name = self.key_named(tool, key)?;
        let tombstone = self.shared.engine.policies().get(tool).tombstone;
        let resolution =
            idemgate_kit::records::resolution(resolution, result, failed, ttl, tombstone)
                .map_err(PyValueError::new_err)?;
        let engine = &self.shared.engine;
        let after = self
            .run(py, async {
                match engine.resolve(&name, fence, resolution, by, reason).await? {
                    Some(record) => viewed(engine, &record).await.map(Some),
                    None => Ok(None),
                }
            })?
            .map_err(|e| engine_error(py, &e))?;
        Ok(after.map(|v| v.to_string()))
    }

    /// Reopens the completed or unknown record of `(tool, key)` at `fence`, so the next call runs
    /// the action again; `by` and `reason` go into the audit log. Returns the state it had
    /// (`completed` or `unknown`); raises `NotFound`, `NotResolvable` (in flight, or its fence
    /// moved on) or `StoreUnavailable`.
    #[pyo3(signature = (tool, key, fence, by = None, reason = None))]
    fn reopen(
        &self,
        py: Python<'_>,
        tool: &str,
        key: &str,
        fence: u64,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> PyResult<String> {
        let name = self.key_named(tool, key)?;
        let was = self
            .run(py, self.shared.engine.reopen(&name, fence, by, reason))?
            .map_err(|e| engine_error(py, &e))?;
        Ok(was.to_string())
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
