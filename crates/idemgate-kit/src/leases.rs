//! The leases of calls whose function runs outside the engine's runtime (a Python or JavaScript
//! function, between the engine's `begin` and `finish`), and the one keeper task that renews
//! them: registering a call is a map insert, not a task of its own, so a function that returns
//! at once costs no wake-up of the runtime.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use idemgate_core::Ticket;
use tokio::time::Instant;

/// How often the lease keeper looks for leases due a heartbeat.
pub const KEEPER_TICK: Duration = Duration::from_millis(50);

/// The leases of the functions running now, each due a heartbeat a third of its lease after the
/// last one.
#[derive(Default)]
pub struct Leases {
    next: AtomicU64,
    live: Mutex<HashMap<u64, (Ticket, Instant)>>,
}

impl Leases {
    /// Keeps `ticket`'s lease alive until [`Leases::drop_lease`] with the id returned.
    pub fn hold(&self, ticket: &Ticket) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let due = Instant::now() + ticket.lease_for / 3;
        if let Ok(mut live) = self.live.lock() {
            live.insert(id, (ticket.clone(), due));
        }
        id
    }

    /// Stops renewing the lease held as `id`; true if it was held.
    pub fn drop_lease(&self, id: u64) -> bool {
        self.live
            .lock()
            .map(|mut live| live.remove(&id).is_some())
            .unwrap_or(false)
    }

    /// The leases due a heartbeat now, each due again a third of its lease later.
    pub fn due(&self) -> Vec<Ticket> {
        let now = Instant::now();
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

    /// How many leases are held now.
    pub fn held(&self) -> usize {
        self.live.lock().map(|l| l.len()).unwrap_or(0)
    }
}

/// Hands every lease to `beat` when it is due (the door spawns the engine's heartbeat for it, so
/// that a slow store delays no other lease). Runs until the leases are dropped.
pub async fn keep_leases(leases: Weak<Leases>, mut beat: impl FnMut(Ticket)) {
    let mut ticks = tokio::time::interval(KEEPER_TICK);
    loop {
        ticks.tick().await;
        let Some(leases) = leases.upgrade() else {
            return;
        };
        for ticket in leases.due() {
            beat(ticket);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use idemgate_core::{
        Begun, Call, Engine, IdempotencyKey, MemoryStore, TenantId, ToolName, ToolPolicy,
    };
    use tokio::time::advance;

    use super::*;

    async fn ticket(engine: &Engine<MemoryStore>, key: &str, lease: Duration) -> Ticket {
        let call = Call::new(TenantId::new("t").unwrap(), ToolName::new("send").unwrap())
            .key(IdempotencyKey::explicit(key).unwrap());
        let policy = ToolPolicy {
            lease,
            ..ToolPolicy::default()
        };
        match engine.begin(call, &policy).await.unwrap() {
            Begun::Execute(t) => t,
            _ => panic!("a fresh key executes"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_due_a_heartbeat_every_third_of_it() {
        let engine = Engine::new(MemoryStore::new());
        let t = ticket(&engine, "k-due", Duration::from_secs(30)).await;
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
        assert!(leases.drop_lease(id));
        assert!(!leases.drop_lease(id), "a lease is dropped once");
        advance(Duration::from_secs(10)).await;
        assert!(leases.due().is_empty());
        assert_eq!(leases.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn each_lease_is_due_on_its_own_clock() {
        let engine = Engine::new(MemoryStore::new());
        let short = ticket(&engine, "k-short", Duration::from_secs(3)).await;
        let long = ticket(&engine, "k-long", Duration::from_secs(300)).await;
        let leases = Leases::default();
        leases.hold(&short);
        leases.hold(&long);
        advance(Duration::from_secs(1)).await;
        let due = leases.due();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].key, short.key);
    }

    #[tokio::test(start_paused = true)]
    async fn the_keeper_beats_due_leases_and_stops_when_they_are_gone() {
        let engine = Engine::new(MemoryStore::new());
        let t = ticket(&engine, "k-keep", Duration::from_millis(300)).await;
        let leases = Arc::new(Leases::default());
        leases.hold(&t);
        let beats = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&beats);
        let keeper = tokio::spawn(keep_leases(Arc::downgrade(&leases), move |t| {
            seen.lock().unwrap().push(t.lease);
        }));
        advance(KEEPER_TICK * 3).await;
        tokio::task::yield_now().await;
        assert_eq!(*beats.lock().unwrap(), vec![t.lease], "due after 100 ms");
        drop(leases);
        advance(KEEPER_TICK * 2).await;
        tokio::time::timeout(KEEPER_TICK, keeper)
            .await
            .expect("the keeper ends")
            .unwrap();
    }
}
