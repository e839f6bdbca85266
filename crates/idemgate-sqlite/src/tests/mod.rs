//! The SQLite store's own tests, beside the conformance suite every store runs (tests/).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Instant;

use idemgate_core::{
    Fingerprint, IdempotencyKey, ManualClock, OutcomeKind, RecordState, TenantId, ToolName,
};
use rusqlite::OptionalExtension;

use super::*;
use crate::options::{UrlOptions, MAX_WAL_LIMIT};

mod clock;
mod plans;
mod purge;
mod schema;
mod upkeep;
mod wake;
mod wal;
mod writer;

fn key(name: &str) -> Key {
    Key::new(
        TenantId::new("acme").unwrap(),
        ToolName::new("send_invoice").unwrap(),
        IdempotencyKey::new(name).unwrap(),
    )
}

fn reservation(key: &Key) -> Reservation {
    Reservation::new(
        key.clone(),
        Fingerprint::of_bytes(b"args"),
        Duration::from_secs(60),
    )
}

fn manual() -> SqliteOptions {
    SqliteOptions {
        clock: Arc::new(ManualClock::new(Timestamp::from_millis(1_800_000_000_000))),
        ..SqliteOptions::default()
    }
}

/// A store at `path` on a manual clock that starts at `start`.
fn open_at(path: &Path, start: Timestamp) -> (SqliteStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(start));
    let opts = SqliteOptions {
        clock: clock.clone(),
        ..SqliteOptions::default()
    };
    (SqliteStore::open(path, opts).unwrap(), clock)
}

/// A new file at `path` as schema `version` left it, and a raw connection to it.
fn raw_at_version(path: &Path, version: i64) -> Connection {
    let conn = raw(path);
    for sql in crate::schema::migrations_to(version) {
        conn.execute_batch(sql).unwrap();
    }
    conn.pragma_update(None, "application_id", APPLICATION_ID)
        .unwrap();
    conn.pragma_update(None, "user_version", version).unwrap();
    conn
}

fn raw(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

async fn acquire(store: &SqliteStore, key: &Key) -> Lease {
    match store.reserve(&reservation(key)).await.unwrap() {
        Claim::Acquired(lease) => lease,
        Claim::Existing(rec) => panic!("expected to acquire {key}, found {rec:?}"),
    }
}

/// The writer held after it takes its next task (see [`Held::release_as_one_batch`]).
struct Held<'a> {
    store: &'a SqliteStore,
    guard: tokio::sync::MutexGuard<'a, ()>,
    arrived: u64,
}

async fn hold(store: &SqliteStore) -> Held<'_> {
    // Every write goes through the thread from now on, so that the held batch can form.
    store.inner.shared.inline_off.store(true, Ordering::SeqCst);
    let guard = store.inner.hooks.gate.lock().await;
    let arrived = store.inner.hooks.arrived.load(Ordering::SeqCst);
    Held {
        store,
        guard,
        arrived,
    }
}

impl Held<'_> {
    /// Waits until the writer took one task and `queued` more wait behind it, then lets them
    /// all go as one batch.
    async fn release_as_one_batch(self, queued: usize) {
        let hooks = &self.store.inner.hooks;
        let tx = self.store.inner.tx.as_ref().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let waiting = tx.max_capacity() - tx.capacity();
            if hooks.arrived.load(Ordering::SeqCst) > self.arrived && waiting == queued {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the batch never formed: {waiting} queued"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(self.guard);
    }
}

#[test]
fn urls_name_files() {
    let p = |u: &str| parse_url(u).unwrap().0;
    assert_eq!(
        p("sqlite:///var/lib/idemgate.db"),
        Path::new("/var/lib/idemgate.db")
    );
    assert_eq!(
        p("sqlite:/var/lib/idemgate.db"),
        Path::new("/var/lib/idemgate.db")
    );
    assert_eq!(p("sqlite://idemgate.db"), Path::new("idemgate.db"));
    assert_eq!(p("sqlite:data/idemgate.db"), Path::new("data/idemgate.db"));
    assert_eq!(
        parse_url("sqlite:///x.db?busy_timeout=250ms&durability=normal").unwrap(),
        (
            PathBuf::from("/x.db"),
            UrlOptions {
                busy_timeout: Some(Duration::from_millis(250)),
                durability: Some(Durability::Normal),
                wal_limit: None,
            }
        )
    );
    assert_eq!(
        parse_url("sqlite:///x.db").unwrap().1,
        UrlOptions::default()
    );
    let e = parse_url("sqlite:///x.db?durability=off").unwrap_err();
    assert!(e.to_string().contains("durability=\"off\""), "{e}");
    for bad in [
        "postgres://x",
        "sqlite:",
        "sqlite://",
        "sqlite://x.db?mode=ro",
        "x.db",
    ] {
        let e = parse_url(bad).unwrap_err();
        assert!(
            matches!(&e, StoreError::Misconfigured(m) if m.starts_with("failed to parse")),
            "{bad}: {e}"
        );
    }
}

#[test]
fn url_options_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("opts.db");
    let url = format!("sqlite://{}?synchronous=off", path.display());
    let e = SqliteStore::connect(&url).unwrap_err();
    assert!(
        matches!(&e, StoreError::Misconfigured(m)
            if m.contains("\"synchronous\"")
                && m.contains("the options are busy_timeout, durability, wal_limit")),
        "{e}"
    );
    assert!(!path.exists(), "a refused URL must not create its file");
}

#[test]
fn wal_limit_is_read_from_the_url_in_bytes_kib_or_mib() {
    let limit = |u: &str| parse_url(u).map(|(_, o)| o.wal_limit);
    assert_eq!(
        limit("sqlite:///x.db?wal_limit=4MiB").unwrap(),
        Some(4 << 20)
    );
    assert_eq!(
        limit("sqlite:///x.db?wal_limit=512KiB").unwrap(),
        Some(512 << 10)
    );
    assert_eq!(
        limit("sqlite:///x.db?wal_limit=1048576").unwrap(),
        Some(1 << 20)
    );
    assert_eq!(
        limit("sqlite:///x.db?wal_limit=64KiB").unwrap(),
        Some(MIN_WAL_LIMIT)
    );
    assert_eq!(
        limit("sqlite:///x.db?wal_limit=256MiB").unwrap(),
        Some(MAX_WAL_LIMIT)
    );
    for bad in [
        "",
        "4MB",
        "4 MiB",
        "-1",
        "1.5MiB",
        "63KiB",
        "257MiB",
        "99999999999999999999MiB",
    ] {
        let e = limit(&format!("sqlite:///x.db?wal_limit={bad}")).unwrap_err();
        assert!(
            matches!(&e, StoreError::Misconfigured(m)
                if m.contains(&format!("wal_limit={bad:?}")) && m.contains("at least 64KiB")),
            "{bad}: {e}"
        );
    }
}

#[test]
fn connect_opens_the_named_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("via-url.db");
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display())).unwrap();
    assert_eq!(store.path(), path);
    assert!(path.exists());
    assert!(format!("{store:?}").contains("via-url.db"));
}

#[test]
fn missing_directory_is_refused_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("idemgate.db");
    let e = SqliteStore::open(&path, SqliteOptions::default()).unwrap_err();
    assert!(
        matches!(&e, StoreError::Misconfigured(m) if m.contains("does not exist")),
        "{e}"
    );
    assert!(!dir.path().join("missing").exists());
    let e = SqliteStore::open(":memory:", SqliteOptions::default()).unwrap_err();
    assert!(matches!(e, StoreError::Misconfigured(_)), "{e}");
}

/// Node's thread polls a call's future once, inside the runtime's context but on no worker,
/// before handing it to the runtime: a lone write that would run inline there (a commit
/// waiting on the disk) is queued for the writer's thread instead.
#[test]
fn a_caller_that_must_not_block_never_writes_inline() {
    use std::task::{Context, Poll, Waker};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = rt
        .block_on(async { SqliteStore::open(dir.path().join("db"), SqliteOptions::default()) })
        .unwrap();
    let _in_runtime = rt.enter();
    let first_poll = |name: &str, must_not_block: bool| {
        let r = reservation(&key(name));
        let mut reserve = Box::pin(store.reserve(&r));
        let mut poll = || {
            reserve
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
        };
        let ready = if must_not_block {
            idemgate_core::caller::without_blocking(poll)
        } else {
            poll()
        };
        let claim = match ready {
            Poll::Ready(claim) => Some(claim),
            Poll::Pending => None,
        };
        let done = claim.is_some();
        let claim = claim.unwrap_or_else(|| rt.block_on(reserve));
        assert!(matches!(claim, Ok(Claim::Acquired(_))), "{claim:?}");
        done
    };
    // Unmarked, an idle writer's write runs on the caller's thread in its first poll (the
    // writer's thread may be busy a moment after opening: tried until it is idle).
    assert!(
        (0..200).any(|i| first_poll(&format!("inline-{i}"), false)),
        "an idle writer never ran a write inline"
    );
    for i in 0..20 {
        assert!(
            !first_poll(&format!("queued-{i}"), true),
            "a caller that must not block wrote inline"
        );
    }
}

#[tokio::test]
async fn read_only_files_refuse_writes_and_recover_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idemgate.db");
    let k = key("kept");
    let store = SqliteStore::open(&path, manual()).unwrap();
    acquire(&store, &k).await;
    drop(store);
    // Read-only for root too; the directory stays writable, as for a file of another owner.
    let read_only = idemgate_conformance::tmpfs::Immutable::set(&path);
    let store = SqliteStore::open(&path, manual()).unwrap();
    assert_eq!(
        store.get(&k).await.unwrap().unwrap().state_name(),
        State::InFlight
    );
    let e = store.reserve(&reservation(&key("new"))).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Unavailable(m) if m.contains("readonly")),
        "{e}"
    );
    let e = store.probe_write().await.unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");

    // Fixed by an operator while the store runs: the next write goes through.
    read_only.lift();
    store.probe_write().await.unwrap();
    acquire(&store, &key("new")).await;
}

#[tokio::test]
async fn dropping_the_last_clone_stops_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open(&path, manual()).unwrap();
    let clone = store.clone();
    acquire(&clone, &key("k")).await;
    drop(store);
    drop(clone);
    // The writer closed its connection: the last close checkpoints and removes the WAL.
    assert!(!dir.path().join("db-wal").exists());
}

/// Many processes (here: threads, each with its own connections) opening one new file at
/// once: each open waits for the others' locks instead of failing with "database is locked".
#[test]
fn sixteen_stores_opening_one_new_file_at_once_all_open() {
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("race-{round}.db"));
        let barrier = Arc::new(std::sync::Barrier::new(16));
        let opened: Vec<_> = (0..16)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteStore::open(&path, SqliteOptions::default()).map(drop)
                })
            })
            .collect();
        for t in opened {
            if let Err(e) = t.join().unwrap() {
                panic!("round {round}: {e}");
            }
        }
    }
}
