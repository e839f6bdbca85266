//! The engine's tokio runtime, and the bridge between its futures and Python: a future run to
//! its end for a caller that waits (the GIL released), or run for an async caller with its answer
//! handed to a Python callback, which the Python side turns into an asyncio future. On the
//! in-process store a future is first polled on the caller's thread with the GIL held, since it
//! almost always finishes there.
//!
//! The bridge is the trait [`OnRuntime`], which `Engine` (engine.rs) implements by saying what
//! its tasks share and whether it is closed: this module knows only [`Shared`], so the imports
//! run one way (engine.rs uses the bridge; the bridge never names `Engine`).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::runtime::{Handle, Runtime};

use crate::shared::Shared;

/// Starts an engine's runtime: `worker_threads` workers (at least one), with the timers and I/O
/// that the stores and the lease keeper use.
pub(crate) fn start(worker_threads: usize) -> PyResult<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads.max(1))
        .thread_name("idemgate")
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("failed to start a runtime: {e}")))
}

/// How long stopping an engine waits for its runtime's threads.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Stops an engine's runtime. Off the runtime's own threads it waits (up to [`STOP_WAIT`], the
/// GIL released so that a worker waiting for it can finish) until no worker runs: an async answer
/// still on its way into Python when the interpreter starts shutting down aborts the process
/// (`PyGILState_Release`, exit 134), or kills the worker mid-task (a crash). On one of the
/// runtime's own threads it cannot wait, and leaves the workers to stop in the background.
pub(crate) fn stop(runtime: Runtime) {
    if Handle::try_current().is_ok() {
        runtime.shutdown_background();
        return;
    }
    Python::attach(|py| py.detach(|| runtime.shutdown_timeout(STOP_WAIT)));
}

/// Makes an engine future's output Python's (`begun`, `reply`).
pub(crate) type ToPython<T> = fn(Python<'_>, &Arc<Shared>, T) -> PyResult<Py<PyAny>>;

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

/// The engine's futures on its runtime, for what owns the runtime (the Python `Engine`): it says
/// what its tasks share and whether it was closed, and gets the two ways to run a future.
pub(crate) trait OnRuntime {
    /// What the engine's tasks share, the runtime's handle among it.
    fn shared(&self) -> &Arc<Shared>;

    /// Whether the engine was closed (its runtime stopped, or stopping).
    fn closed(&self) -> bool;

    /// Runs one of the engine's futures to its end. On the in-process store the future is first
    /// polled right here, with the GIL held: it almost always finishes in that poll (no I/O), and
    /// releasing the GIL and handing the thread to the runtime's `block_on` would cost more than
    /// the engine's work. A future that must wait (a duplicate waiting for a call in flight) and
    /// every future of a store with I/O run in `block_on` with the GIL released, this thread
    /// marked as a waiting caller (`idemgate::caller::waiting`).
    fn run<F>(&self, py: Python<'_>, future: F) -> PyResult<F::Output>
    where
        F: Future + Send,
        F::Output: Send,
    {
        let runtime = handle(self)?;
        let mut future = std::pin::pin!(future);
        if self.shared().in_process_store {
            let _in_runtime = runtime.enter();
            if let Poll::Ready(out) = future
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
            {
                return Ok(out);
            }
        }
        // The GIL released, this thread only waits: a store that can do the call's I/O right
        // here (Redis, on its own connection per thread) saves a trip through the runtime's
        // threads per round trip.
        Ok(py.detach(|| idemgate::caller::waiting(|| runtime.block_on(future))))
    }

    /// Runs one of the engine's futures for an async caller and hands `done(ok, value)` what
    /// `answer` makes of its output. On the in-process store the future is first polled right
    /// here (as in [`OnRuntime::run`]) and, when it finishes, `done` is called at once on this
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
        let runtime = handle(self)?;
        let mut future = Box::pin(future);
        if self.shared().in_process_store {
            let polled = {
                let _in_runtime = runtime.enter();
                future
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
            };
            if let Poll::Ready(out) = polled {
                settle(py, &done, answer(py, self.shared(), out));
                return Ok(());
            }
        }
        let shared = Arc::clone(self.shared());
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
}

/// The runtime's handle while the engine is open.
fn handle<E: OnRuntime + ?Sized>(engine: &E) -> PyResult<&Handle> {
    match engine.closed() {
        true => Err(PyRuntimeError::new_err("the engine is closed")),
        false => Ok(&engine.shared().handle),
    }
}
