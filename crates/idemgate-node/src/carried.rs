//! Calls whose Redis round trips Node's own loop carries (`idemgate::redis::CarriedLink`): the
//! package connects a `net.Socket` of its own (clients/node/carried.cjs) and hands the link's
//! bytes back and forth, and a call waiting for a reply there is parked here, not spawned on the
//! runtime. When the reply comes in, the package polls the call again on Node's thread
//! (`resume`). A round trip then costs Node's own write, wake-up and read: no hand-off to a
//! runtime thread and back, which on a busy machine waits for a core each way.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use idemgate::caller::{on_loop, without_blocking};
use idemgate::redis::{CarriedAddress, CarriedLink};
use napi::bindgen_prelude::{within_runtime_if_available, Either3};
use napi::{Env, Result};
use napi_derive::napi;

use crate::engine::Reply;

/// A call's work to its reply's JSON text.
pub(crate) type Work = Pin<Box<dyn Future<Output = Result<String>> + Send>>;

/// The calls waiting for a reply on the loop's connection, by the number the package holds.
#[derive(Default)]
pub(crate) struct Parked {
    calls: Mutex<HashMap<u32, Work>>,
    /// The parked calls woken since the package last asked (a reply came in for them).
    woken: Arc<Mutex<Vec<u32>>>,
    next: AtomicU32,
}

/// Notes a parked call as woken, for the package to poll it on Node's thread.
struct Note {
    id: u32,
    woken: Arc<Mutex<Vec<u32>>>,
}

impl Wake for Note {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Ok(mut woken) = self.woken.lock() {
            woken.push(self.id);
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
            woken: Arc::clone(&self.woken),
        }));
        let (polled, awaits) = within_runtime_if_available(|| {
            without_blocking(|| on_loop(|| work.as_mut().poll(&mut Context::from_waker(&waker))))
        });
        match polled {
            Poll::Ready(reply) => reply.map(Either3::A),
            Poll::Pending if awaits => {
                if let Ok(mut calls) = self.calls.lock() {
                    calls.insert(id, work);
                }
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

    /// The parked calls woken since the last time, each once.
    pub(crate) fn woken(&self) -> Vec<u32> {
        let mut woken = self
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
            CarriedAddress::Unix(path) => (None, None, Some(path.clone())),
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
