//! How many pages a fresh call writes to the write-ahead log: reserves and completes 3,000
//! records (a 200-byte result each) one after the other, then 3,000 more from 16 callers at once
//! (whose writes share commits), and prints the log's growth per call in frames (a page and its
//! 24-byte header). The log is not checkpointed meanwhile (`wal_limit` 256 MiB), so its growth is
//! every page written. `with-v6-indexes` creates the partial indexes of schema version 6 (which
//! version 8 replaced with bookkeeping a call does not write) first, to show what they cost
//! (docs/STORES.md).
//!
//! Usage: `cargo run --release -p idemgate-sqlite --example wal_frames_per_call [-- with-v6-indexes]`

use std::path::Path;
use std::time::Duration;

use idemgate_core::{
    Claim, Fingerprint, IdempotencyKey, Key, Outcome, Reservation, Store as _, TenantId, ToolName,
};
use idemgate_sqlite::{Durability, SqliteOptions, SqliteStore};

/// Calls of each round.
const CALLS: usize = 3000;
/// A WAL frame: a 4 KiB page and its header.
const FRAME: f64 = 4096.0 + 24.0;

fn wal_bytes(db: &Path) -> u64 {
    std::fs::metadata(format!("{}-wal", db.display())).map_or(0, |m| m.len())
}

async fn call(store: &SqliteStore, name: String) {
    let key = Key::new(
        TenantId::new("t").expect("tenant"),
        ToolName::new("tool").expect("tool"),
        IdempotencyKey::new(name).expect("key"),
    );
    let r = Reservation::new(
        key.clone(),
        Fingerprint::of_bytes(b"x"),
        Duration::from_secs(60),
    );
    let Claim::Acquired(lease) = store.reserve(&r).await.expect("reserve") else {
        panic!("{key} was taken");
    };
    store
        .complete(
            &key,
            lease,
            &Outcome::success(vec![b'x'; 200]),
            Duration::from_secs(3600),
        )
        .await
        .expect("complete");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let with_v6 = std::env::args().nth(1).as_deref() == Some("with-v6-indexes");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("db");
    let opts = SqliteOptions {
        durability: Durability::Normal,
        wal_limit: 256 << 20,
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open(&db, opts).expect("open");
    if with_v6 {
        let v6 = include_str!("../src/schema_v6.sql");
        rusqlite::Connection::open(&db)
            .and_then(|c| c.execute_batch(v6))
            .expect("create the indexes of version 6");
    }
    // A table of some depth first, so that the measured calls write what they write in use.
    for i in 0..CALLS {
        call(&store, format!("warm-{i}")).await;
    }
    let label = if with_v6 {
        "with version 6's indexes"
    } else {
        "schema version 8"
    };
    let (bytes, commits) = (wal_bytes(&db), store.writer_stats().batches);
    for i in 0..CALLS {
        call(&store, format!("one-{i}")).await;
    }
    println!(
        "{label}, one caller: {:.2} frames per call ({} commits for {CALLS} calls)",
        (wal_bytes(&db) - bytes) as f64 / FRAME / CALLS as f64,
        store.writer_stats().batches - commits
    );
    let (bytes, commits) = (wal_bytes(&db), store.writer_stats().batches);
    let callers: Vec<_> = (0..16)
        .map(|c| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..CALLS / 16 {
                    call(&store, format!("many-{c}-{i}")).await;
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("a caller");
    }
    let calls = CALLS / 16 * 16;
    println!(
        "{label}, 16 callers: {:.2} frames per call ({} commits for {calls} calls)",
        (wal_bytes(&db) - bytes) as f64 / FRAME / calls as f64,
        store.writer_stats().batches - commits
    );
}
