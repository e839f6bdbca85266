//! A TCP proxy between gateways and their store that injects the faults of a flaky link: latency,
//! connections closed mid-query, connections cut right after a request was sent (so the server
//! runs and commits it while the client never hears back), and a blackhole (a dropped link: bytes
//! are held, nothing is refused, until it heals). Loopback only, std only.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// What the proxy does to the traffic; changed at any time with [`FaultProxy::set`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Faults {
    /// Each forwarded chunk waits up to this long (uniformly at random).
    pub(crate) max_latency: Duration,
    /// Per mille of forwarded chunks at which both connections are closed, mid-query.
    pub(crate) reset_per_mille: u32,
    /// Per mille of client requests after which both connections are closed as soon as the
    /// request reached the server: it runs (and commits); the answer is lost.
    pub(crate) cut_after_send_per_mille: u32,
    /// Hold every byte (both directions) until this is turned off.
    pub(crate) blackhole: bool,
}

/// Counts of the faults injected.
#[derive(Debug, Default)]
pub(crate) struct Injected {
    pub(crate) resets: AtomicU64,
    pub(crate) cuts_after_send: AtomicU64,
    pub(crate) connections: AtomicU64,
}

pub(crate) struct FaultProxy {
    pub(crate) port: u16,
    faults: Arc<Mutex<Faults>>,
    pub(crate) injected: Arc<Injected>,
    stop: Arc<AtomicBool>,
}

/// A small xorshift generator: the proxy needs cheap randomness, not a crate.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn per_mille(&mut self, p: u32) -> bool {
        p > 0 && self.next() % 1000 < u64::from(p)
    }
    fn up_to(&mut self, d: Duration) -> Duration {
        let ms = d.as_millis() as u64;
        if ms == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(self.next() % (ms + 1))
    }
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `target_port` on loopback.
    pub(crate) fn start(target_port: u16, faults: Faults) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let faults = Arc::new(Mutex::new(faults));
        let injected = Arc::new(Injected::default());
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (faults, injected, stop) = (faults.clone(), injected.clone(), stop.clone());
            thread::spawn(move || {
                for (n, client) in listener.incoming().enumerate() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target_port)) else {
                        continue;
                    };
                    injected.connections.fetch_add(1, Ordering::Relaxed);
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let link = Arc::new(Link {
                        client,
                        server,
                        faults: faults.clone(),
                        injected: injected.clone(),
                        closed: AtomicBool::new(false),
                    });
                    let seed = 0x9E37_79B9_7F4A_7C15 ^ (n as u64).wrapping_mul(0x1000_0001);
                    for to_server in [true, false] {
                        let link = link.clone();
                        thread::spawn(move || {
                            link.pump(to_server, Rng::new(seed ^ u64::from(to_server)))
                        });
                    }
                }
            });
        }
        FaultProxy {
            port,
            faults,
            injected,
            stop,
        }
    }

    pub(crate) fn set(&self, faults: Faults) {
        *self.faults.lock().unwrap() = faults;
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the stop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// One proxied connection: the client's and the server's side.
struct Link {
    client: TcpStream,
    server: TcpStream,
    faults: Arc<Mutex<Faults>>,
    injected: Arc<Injected>,
    closed: AtomicBool,
}

impl Link {
    fn faults(&self) -> Faults {
        *self.faults.lock().unwrap()
    }

    /// Closes both sides (std cannot send an RST: SO_LINGER has no stable setter; a shutdown
    /// mid-query is what the peers see of a reset either way).
    fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        for s in [&self.client, &self.server] {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn pump(&self, to_server: bool, mut rng: Rng) {
        let (mut from, mut to) = if to_server {
            (&self.client, &self.server)
        } else {
            (&self.server, &self.client)
        };
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut f = self.faults();
            // A dropped link: hold the bytes until it heals (the peer's connection stays open).
            while f.blackhole && !self.closed.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(20));
                f = self.faults();
            }
            thread::sleep(rng.up_to(f.max_latency));
            if rng.per_mille(f.reset_per_mille) {
                self.injected.resets.fetch_add(1, Ordering::Relaxed);
                self.close();
                return;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
            if to_server && rng.per_mille(f.cut_after_send_per_mille) {
                // Give the server the moment it needs to read the request whole, then cut:
                // it runs the statement; the client hears nothing back.
                thread::sleep(Duration::from_millis(5));
                self.injected
                    .cuts_after_send
                    .fetch_add(1, Ordering::Relaxed);
                self.close();
                return;
            }
        }
        self.close();
    }
}
