//! Shared setup: an engine over a fault-injecting memory store on a manual clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idemgate_core::faulty::{Fault, FaultyStore, Op};
use idemgate_core::{
    Answer, Call, Effect, Engine, IdempotencyKey, Key, ManualClock, MemoryJournal, MemoryStore,
    Policies, Settings, TenantId, Timestamp, ToolName, ToolPolicy,
};
use tokio::sync::Notify;

pub(crate) type TestStore = FaultyStore<MemoryStore>;

pub(crate) struct Rig {
    pub(crate) engine: Arc<Engine<TestStore>>,
    pub(crate) store: TestStore,
    pub(crate) clock: ManualClock,
    pub(crate) journal: Arc<MemoryJournal>,
}

pub(crate) const LEASE: Duration = Duration::from_secs(30);

pub(crate) fn rig(policies: Policies) -> Rig {
    let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
    let store = FaultyStore::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let journal = Arc::new(MemoryJournal::new());
    let engine = Engine::new(store.clone())
        .with_policies(policies)
        .with_journal(journal.clone())
        .with_clock(Arc::new(clock.clone()))
        .with_settings(Settings {
            finish_attempts: 3,
            finish_backoff: Duration::from_millis(5),
            max_poll: Duration::from_millis(50),
            ..Settings::default()
        });
    Rig {
        engine: Arc::new(engine),
        store,
        clock,
        journal,
    }
}

pub(crate) fn default_rig() -> Rig {
    rig(Policies::new().with_default(ToolPolicy {
        lease: LEASE,
        ..ToolPolicy::default()
    }))
}

pub(crate) fn call(tenant: &str, tool: &str, key: Option<&str>, args: serde_json::Value) -> Call {
    let c = Call::new(TenantId::new(tenant).unwrap(), ToolName::new(tool).unwrap()).args(&args);
    match key {
        Some(k) => c.key(IdempotencyKey::new(k).unwrap()),
        None => c,
    }
}

pub(crate) fn key(tenant: &str, tool: &str, key: &str) -> Key {
    Key::new(
        TenantId::new(tenant).unwrap(),
        ToolName::new(tool).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

/// Counts executions of a side effect.
#[derive(Clone, Default)]
pub(crate) struct Counter(Arc<AtomicUsize>);

impl Counter {
    pub(crate) fn effect(&self, e: Effect) -> impl std::future::Future<Output = Effect> {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::ready(e)
    }

    pub(crate) fn bump(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A call on `acme`/`charge`/`k` that outlives its lease (heartbeats cannot reach the store), a
/// second call that takes the record over after the lease ran out and completes it (`taker`),
/// then the first one reporting its own outcome (`zombie`) too late. The rig's tools must retry
/// after unknown. Returns the two answers, taker's first. The first call is known to hold the
/// record before the clock moves: its side effect says so, so that no sleep has to outwait it.
pub(crate) async fn a_zombie_outlived_by_its_taker(r: &Rig) -> (Answer, Answer) {
    r.store.always(Op::Heartbeat, Fault::Refuse);
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (s, g) = (started.clone(), gate.clone());
    let engine = r.engine.clone();
    let zombie = tokio::spawn(async move {
        engine
            .call(
                call("acme", "charge", Some("k"), serde_json::json!(1)),
                || async move {
                    s.notify_one();
                    g.notified().await;
                    Effect::Success(b"zombie".to_vec())
                },
            )
            .await
            .unwrap()
    });
    started.notified().await;
    r.clock.advance(LEASE + Duration::from_secs(1));
    let taker = r
        .engine
        .call(
            call("acme", "charge", Some("k"), serde_json::json!(1)),
            || async { Effect::Success(b"taker".to_vec()) },
        )
        .await
        .unwrap();
    gate.notify_one();
    (taker, zombie.await.unwrap())
}
