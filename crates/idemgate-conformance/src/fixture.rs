//! What the behaviours run against: a store under test with a way to move its clock
//! ([`Fixture`]), the leases and TTLs they use, and keys of a fresh tenant each. A leaf of its
//! own, so that the behaviours (and the model test) import it and the crate root only re-exports.

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::{
    Clock, IdempotencyKey, Key, ManualClock, Store, TenantId, Timestamp, ToolName,
};

/// A store under test and a way to move its clock.
#[derive(Debug)]
pub struct Fixture<S> {
    /// The store.
    pub store: S,
    /// How time passes for it.
    pub time: TimeTravel,
    /// How the store lists a record reserved under a key: as that key, unless the store keeps
    /// keys in another form (a sealed store lists their HMACs).
    pub listed_as: ListedAs,
    /// What to undo when the fixture goes (see [`Fixture::then_drop`]).
    pub teardown: Teardown,
}

/// Work that runs when it is dropped: what a fixture leaves behind on a shared server (a schema
/// of its own), undone when the behaviour ends, whether it passed or panicked.
#[derive(Default)]
pub struct Teardown(Option<Box<dyn FnOnce() + Send + Sync>>);

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(undo) = self.0.take() {
            undo();
        }
    }
}

impl std::fmt::Debug for Teardown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Teardown(…)"
        } else {
            "Teardown(none)"
        })
    }
}

/// How a store lists the key of a record ([`Fixture::listing_keys_as`]).
#[derive(Clone)]
pub struct ListedAs(Arc<dyn Fn(&Key) -> Key + Send + Sync>);

impl Default for ListedAs {
    fn default() -> Self {
        ListedAs(Arc::new(Key::clone))
    }
}

impl std::fmt::Debug for ListedAs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListedAs(…)")
    }
}

/// How the suite makes time pass.
#[derive(Clone, Debug)]
pub enum TimeTravel {
    /// The store judges time by this clock; the suite moves it by hand.
    Manual(ManualClock),
    /// The store judges time by a server's clock; the suite sleeps (briefly: leases in the suite
    /// are a few hundred milliseconds).
    Real,
}

impl<S: Store> Fixture<S> {
    /// A store on a manual clock: `build` gets the clock to judge time by.
    pub fn manual(build: impl FnOnce(Arc<dyn Clock>) -> S) -> Self {
        let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
        let store = build(Arc::new(clock.clone()));
        Fixture {
            store,
            time: TimeTravel::Manual(clock),
            listed_as: ListedAs::default(),
            teardown: Teardown::default(),
        }
    }

    /// A store that judges time by a server's clock.
    pub fn real(store: S) -> Self {
        Fixture {
            store,
            time: TimeTravel::Real,
            listed_as: ListedAs::default(),
            teardown: Teardown::default(),
        }
    }

    /// The same store under another wrapper (a sealed store over it), keeping the clock.
    pub fn map<T: Store>(self, wrap: impl FnOnce(S) -> T) -> Fixture<T> {
        Fixture {
            store: wrap(self.store),
            time: self.time,
            listed_as: self.listed_as,
            teardown: self.teardown,
        }
    }

    /// The same fixture, running `undo` when it is dropped (after the store: fields drop in
    /// order), to remove what it made on a shared server. `undo` runs on the thread that drops
    /// the fixture, possibly inside a runtime: it must not need one of its caller's.
    pub fn then_drop(mut self, undo: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.teardown = Teardown(Some(Box::new(undo)));
        self
    }

    /// The same fixture, for a store that lists the record of `key` as `listed(key)`.
    pub fn listing_keys_as(mut self, listed: impl Fn(&Key) -> Key + Send + Sync + 'static) -> Self {
        self.listed_as = ListedAs(Arc::new(listed));
        self
    }

    /// How the store lists the record reserved under `key`.
    pub fn listed(&self, key: &Key) -> Key {
        (self.listed_as.0)(key)
    }

    /// Lets `d` pass for the store.
    pub async fn pass(&self, d: Duration) {
        match &self.time {
            TimeTravel::Manual(clock) => clock.advance(d),
            TimeTravel::Real => tokio::time::sleep(d).await,
        }
    }
}

/// The lease used by behaviours that let it run out.
pub const SHORT_LEASE: Duration = Duration::from_millis(300);

/// Longer than [`SHORT_LEASE`], with margin for server clocks and scheduling.
pub const PAST_SHORT_LEASE: Duration = Duration::from_millis(700);

/// A lease no behaviour outlives.
pub const LONG_LEASE: Duration = Duration::from_secs(600);

/// A TTL no behaviour outlives.
pub const LONG_TTL: Duration = Duration::from_secs(3600);

/// A key under a fresh random tenant, so behaviours never see each other's records.
pub fn fresh_key(tool: &str) -> Key {
    let tenant = IdempotencyKey::mint();
    Key::new(
        TenantId::new(&tenant.as_str()[4..20]).expect("valid tenant"),
        ToolName::new(tool).expect("valid tool"),
        IdempotencyKey::new("order-42").expect("valid key"),
    )
}
