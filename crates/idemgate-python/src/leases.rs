//! The leases of the functions running now, and the one task on the engine's runtime that renews
//! them: a Python function runs on the caller's thread, with the GIL, between `Engine.begin` and
//! `Engine.finish`, so its lease is kept alive from outside it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemgate::Ticket;

use crate::engine::Shared;

/// How often the lease keeper looks for leases due a heartbeat.
const KEEPER_TICK: Duration = Duration::from_millis(50);

/// The leases of the functions running now, renewed by one keeper task: registering a call is a
/// map insert, not a task of its own, so a function that returns at once costs no wake-up.
#[derive(Default)]
pub(crate) struct Leases {
    next: std::sync::atomic::AtomicU64,
    live: Mutex<std::collections::HashMap<u64, (Ticket, tokio::time::Instant)>>,
}

impl Leases {
    pub(crate) fn hold(&self, ticket: &Ticket) -> u64 {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let due = tokio::time::Instant::now() + ticket.lease_for / 3;
        if let Ok(mut live) = self.live.lock() {
            live.insert(id, (ticket.clone(), due));
        }
        id
    }

    pub(crate) fn drop_lease(&self, id: u64) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(&id);
        }
    }

    /// The leases due a heartbeat now, each due again a third of its lease later.
    pub(crate) fn due(&self) -> Vec<Ticket> {
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
pub(crate) async fn keep_leases(shared: std::sync::Weak<Shared>) {
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

#[cfg(test)]
impl Leases {
    /// How many leases are kept now.
    pub(crate) fn held(&self) -> usize {
        self.live.lock().map(|l| l.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::advance;

    use super::*;
    use crate::test_support::{memory_engine, ticket};

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_due_a_heartbeat_every_third_of_it() {
        let shared = memory_engine().await;
        let t = ticket(&shared, "k-due", Duration::from_secs(30)).await;
        let leases = Leases::default();
        let id = leases.hold(&t);
        assert!(leases.due().is_empty());
        advance(Duration::from_secs(9)).await;
        assert!(leases.due().is_empty());
        advance(Duration::from_secs(1)).await;
        let due = leases.due();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].lease, t.lease);
        assert!(
            leases.due().is_empty(),
            "due again a third later, not at once"
        );
        advance(Duration::from_secs(10)).await;
        assert_eq!(leases.due().len(), 1);
        leases.drop_lease(id);
        advance(Duration::from_secs(10)).await;
        assert!(leases.due().is_empty());
        assert_eq!(leases.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn each_lease_is_due_on_its_own_clock() {
        let shared = memory_engine().await;
        let short = ticket(&shared, "k-short", Duration::from_secs(3)).await;
        let long = ticket(&shared, "k-long", Duration::from_secs(300)).await;
        let leases = Leases::default();
        leases.hold(&short);
        leases.hold(&long);
        advance(Duration::from_secs(1)).await;
        let due = leases.due();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].key, short.key);
    }

    #[tokio::test(start_paused = true)]
    async fn the_keeper_stops_when_the_engine_is_gone() {
        let shared = memory_engine().await;
        let keeper = tokio::spawn(keep_leases(Arc::downgrade(&shared)));
        advance(KEEPER_TICK * 3).await;
        assert!(!keeper.is_finished());
        drop(shared);
        advance(KEEPER_TICK * 2).await;
        tokio::time::timeout(KEEPER_TICK, keeper)
            .await
            .expect("the keeper ends")
            .unwrap();
    }
}
