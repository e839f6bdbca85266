//! Calls whose Redis round trips Node's own loop carries (`idemgate::redis::CarriedLink`): the
//! package connects a `net.Socket` of its own (clients/node/carried.cjs) and hands the link's
//! bytes back and forth, and a call waiting for a reply there is parked here, not spawned on the
//! runtime. When the reply comes in, the package polls the call again on Node's thread
//! (`resume`). A round trip then costs Node's own write, wake-up and read: no hand-off to a
//! runtime thread and back, which on a busy machine waits for a core each way.
//!
//! A parked call woken by anything else (a timer of the runtime's, a racing call's settling),
//! that is, not while the package hands replies in, has the package told through a threadsafe
//! function (`carriedOnWake`), at most one call of it pending at a time: the package then asks
//! for the woken calls and resumes them.

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use idemgate::caller::{on_loop, without_blocking};
use idemgate::redis::{CarriedAddress, CarriedLink};
use napi::bindgen_prelude::{within_runtime_if_available, Either3};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Env, Error, Result, Status};
use napi_derive::napi;

use crate::engine::Reply;

/// A call's work to its reply's JSON text.
pub(crate) type Work = Pin<Box<dyn Future<Output = Result<String>> + Send>>;

/// The package's function that resumes woken calls (weak: it keeps no process alive).
type WakeJs = ThreadsafeFunction<(), (), (), Status, false, true>;

/// The calls waiting for a reply on the loop's connection, by the number the package holds.
#[derive(Default)]
pub(crate) struct Parked {
    calls: Mutex<HashMap<u32, Work>>,
    wakes: Arc<Wakes>,
    next: AtomicU32,
}

/// The parked calls woken since the package last asked, and how to tell it of one woken
/// elsewhere than while it hands replies in.
#[derive(Default)]
struct Wakes {
    woken: Mutex<Vec<u32>>,
    /// Dropped when the package is done with the link (`carried_stop_waking`): the function
    /// holds the package's link, which holds this engine, so while it is held the engine is
    /// never collected.
    js: Mutex<Option<WakeJs>>,
    /// A call of `js` is pending: the next wake needs none.
    told: AtomicBool,
}

thread_local! {
    /// Node's thread is handing replies (or a lost connection) in: the calls they wake are
    /// returned to the package right after, so it needs no telling.
    static HANDING_IN: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (the link taking replies in, on Node's thread) marked as `HANDING_IN`.
pub(crate) fn handing_in<T>(f: impl FnOnce() -> T) -> T {
    let before = HANDING_IN.with(|h| h.replace(true));
    let out = f();
    HANDING_IN.with(|h| h.set(before));
    out
}

/// Notes a parked call as woken, for the package to poll it on Node's thread.
struct Note {
    id: u32,
    wakes: Arc<Wakes>,
}

impl Wake for Note {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Ok(mut woken) = self.wakes.woken.lock() {
            woken.push(self.id);
        }
        if HANDING_IN.with(Cell::get) || self.wakes.told.swap(true, Ordering::AcqRel) {
            return;
        }
        let held = self.wakes.js.lock();
        if let Some(js) = held.as_ref().ok().and_then(|js| js.as_ref()) {
            js.call((), ThreadsafeFunctionCallMode::NonBlocking);
        }
    }
}

impl Parked {
    /// Polls `work` on Node's thread: its reply when done; parked under a number when it waits
    /// for a reply the loop carries; else (it waits for something else: a racing call, a
    /// timer) on the runtime, as a promise. `id` is the number it was parked under before.
    pub(crate) fn drive<'env>(
        &self,
        env: &'env Env,
        mut work: Work,
        id: Option<u32>,
    ) -> Result<Reply<'env>> {
        let id = id.unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed));
        let waker = Waker::from(Arc::new(Note {
            id,
            wakes: Arc::clone(&self.wakes),
        }));
        let (polled, awaits) = within_runtime_if_available(|| {
            without_blocking(|| on_loop(|| work.as_mut().poll(&mut Context::from_waker(&waker))))
        });
        match polled {
            Poll::Ready(reply) => reply.map(Either3::A),
            Poll::Pending if awaits => {
                let mut calls = self
                    .calls
                    .lock()
                    .map_err(|_| Error::from_reason("the parked calls' lock is poisoned"))?;
                calls.insert(id, work);
                Ok(Either3::C(id))
            }
            Poll::Pending => env.spawn_future(work).map(Either3::B),
        }
    }

    /// Polls the parked call `id` again (see `drive`); `None` if no call is parked under it.
    pub(crate) fn resume<'env>(&self, env: &'env Env, id: u32) -> Result<Option<Reply<'env>>> {
        let work = self
            .calls
            .lock()
            .ok()
            .and_then(|mut calls| calls.remove(&id));
        work.map(|work| self.drive(env, work, Some(id))).transpose()
    }

    /// Tells the package of calls woken elsewhere than while it hands replies in through `js`.
    pub(crate) fn on_wake(&self, js: Option<WakeJs>) {
        if let Ok(mut held) = self.wakes.js.lock() {
            *held = js;
        }
    }

    /// The parked calls woken since the last time, each once.
    pub(crate) fn woken(&self) -> Vec<u32> {
        self.wakes.told.store(false, Ordering::Release);
        let mut woken = self
            .wakes
            .woken
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default();
        woken.sort_unstable();
        woken.dedup();
        woken
    }
}

/// Where the package connects the loop's socket, and how long it waits.
#[napi(object)]
pub struct CarriedTarget {
    /// The TCP host (none for a Unix socket).
    pub host: Option<String>,
    /// The TCP port.
    pub port: Option<u32>,
    /// The Unix socket's path.
    pub path: Option<String>,
    /// How long a reply may take before the connection is given up, in ms (none: no limit).
    pub response_timeout_ms: Option<f64>,
    /// How long connecting may take, in ms (none: no limit).
    pub connect_timeout_ms: Option<f64>,
}

impl CarriedTarget {
    pub(crate) fn of(link: &CarriedLink) -> CarriedTarget {
        let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        let (host, port, path) = match link.address() {
            CarriedAddress::Tcp { host, port } => {
                (Some(host.clone()), Some(u32::from(*port)), None)
            }
            CarriedAddress::Unix(path) => (None, None, Some(path.display().to_string())),
        };
        CarriedTarget {
            host,
            port,
            path,
            response_timeout_ms: ms(link.response_timeout()),
            connect_timeout_ms: ms(link.connect_timeout()),
        }
    }
}

/// What the package read from the loop's socket did: the parked calls to resume, and, when the
/// bytes broke the link (not RESP, a reply nobody waited for), why: the package closes the
/// socket.
#[napi(object)]
pub struct CarriedRead {
    /// The parked calls to resume.
    pub woken: Vec<u32>,
    /// Why the link broke, if it did.
    pub broken: Option<String>,
}
