//! The engine's phase spans as a layer listening to `idemgate.trace` sees them, for the phases the
//! door tests cannot provoke on purpose: a duplicate's wait for the call in flight, and an outcome
//! journaled when the store refuses it, then flushed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate_core::faulty::{Fault, FaultyStore, Op};
use idemgate_core::{
    Begun, Call, Decision, Effect, Engine, IdempotencyKey, MemoryStore, Recording, Settings,
    TenantId, ToolName, ToolPolicy,
};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A span's name and its parent's.
type Opened = (String, Option<String>);

/// Every span opened, with its parent's name.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Opened>>>);

impl Seen {
    fn has(&self, name: &str) -> bool {
        self.0.lock().unwrap().iter().any(|(n, _)| n == name)
    }

    fn parent_of(&self, name: &str) -> Option<String> {
        let seen = self.0.lock().unwrap();
        let (_, parent) = seen.iter().find(|(n, _)| n == name).expect(name);
        parent.clone()
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Seen {
    fn on_new_span(&self, _: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a span just opened");
        let parent = span.parent().map(|p| p.name().to_owned());
        self.0
            .lock()
            .unwrap()
            .push((span.name().to_owned(), parent));
    }
}

/// Runs `test` on a one-thread runtime whose spans `Seen` records (idemgate's only).
fn traced<F: std::future::Future<Output = ()>>(test: impl FnOnce(Seen) -> F) -> Seen {
    let seen = Seen::default();
    let only_ours = tracing_subscriber::filter::filter_fn(|m| m.target() == idemgate_trace::TARGET);
    let subscriber = tracing_subscriber::registry().with(seen.clone().with_filter(only_ours));
    let _default = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(test(seen.clone()));
    seen
}

fn call() -> Call {
    Call::new(
        TenantId::new("acme").unwrap(),
        ToolName::new("charge").unwrap(),
    )
    .key(IdempotencyKey::explicit("order-1").unwrap())
}

#[test]
fn a_duplicate_waits_inside_its_reservation_then_replays() {
    let seen = traced(|seen| async move {
        let engine = Arc::new(Engine::new(MemoryStore::new()));
        let policy = ToolPolicy {
            wait: Duration::from_secs(30),
            ..ToolPolicy::default()
        };
        let Begun::Execute(ticket) = engine.begin(call(), &policy).await.unwrap() else {
            panic!("the first call runs");
        };
        let (e2, p2) = (Arc::clone(&engine), policy.clone());
        let duplicate = tokio::spawn(async move { e2.begin(call(), &p2).await });
        // The duplicate is waiting once its wait span opened: only then does the first finish.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !seen.has("idemgate.wait") {
            assert!(Instant::now() < deadline, "the duplicate never waited");
            tokio::task::yield_now().await;
        }
        engine
            .finish(&ticket, Effect::Success(b"{\"charged\":1}".to_vec()))
            .await;
        let Begun::Answered(answer) = duplicate.await.unwrap().unwrap() else {
            panic!("the duplicate does not run");
        };
        assert!(matches!(answer.decision, Decision::Replayed { .. }));
    });
    assert_eq!(
        seen.parent_of("idemgate.wait").as_deref(),
        Some("idemgate.reserve")
    );
    assert_eq!(
        seen.parent_of("idemgate.replay").as_deref(),
        Some("idemgate.reserve")
    );
}

#[test]
fn an_outcome_the_store_refuses_is_journaled_then_flushed() {
    let seen = traced(|_| async move {
        let store = FaultyStore::new(MemoryStore::new());
        let engine = Engine::new(store.clone()).with_settings(Settings {
            finish_attempts: 2,
            finish_backoff: Duration::from_millis(1),
            ..Settings::default()
        });
        store.always(Op::Complete, Fault::Refuse);
        let answer = engine
            .call(call(), || async { Effect::Success(b"{}".to_vec()) })
            .await
            .unwrap();
        assert!(matches!(
            answer.decision,
            Decision::Executed {
                recording: Recording::Journaled,
                ..
            }
        ));
        store.heal();
        let flushed = engine.flush_journal().await.unwrap();
        assert_eq!(flushed.applied, 1);
    });
    assert_eq!(
        seen.parent_of("idemgate.effect"),
        None,
        "a call without a door span is a root"
    );
    assert_eq!(
        seen.parent_of("idemgate.journal").as_deref(),
        Some("idemgate.complete")
    );
    assert_eq!(seen.parent_of("idemgate.flush"), None);
}
