//! The writer: batches, writes run inline or on its thread, failures kept to their own write.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_race_and_one_acquires() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    // Two stores, two writer threads and two write connections: as two processes would be.
    let stores = [
        SqliteStore::open(&path, SqliteOptions::default()).unwrap(),
        SqliteStore::open(&path, SqliteOptions::default()).unwrap(),
    ];
    let k = key("shared");
    let mut tasks = Vec::new();
    for i in 0..32 {
        let store = stores[i % 2].clone();
        let r = reservation(&k);
        tasks.push(tokio::spawn(async move { store.reserve(&r).await }));
    }
    let mut acquired = 0;
    for t in tasks {
        match t.await.unwrap().unwrap() {
            Claim::Acquired(_) => acquired += 1,
            Claim::Existing(rec) => assert_eq!(rec.state_name(), State::InFlight),
        }
    }
    assert_eq!(acquired, 1);
    for store in &stores {
        assert!(store.get(&k).await.unwrap().is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_share_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
    let before = store.writer_stats();
    let held = hold(&store).await;
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.reserve(&reservation(&key(&format!("k{i}")))).await })
        })
        .collect();
    held.release_as_one_batch(63).await;
    for t in tasks {
        assert!(matches!(t.await.unwrap().unwrap(), Claim::Acquired(_)));
    }
    let after = store.writer_stats();
    assert_eq!(after.batches - before.batches, 1, "{after:?}");
    assert_eq!(after.operations - before.operations, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_group_on_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.reserve(&reservation(&key(&format!("k{i}")))).await })
        })
        .collect();
    for t in tasks {
        assert!(matches!(t.await.unwrap().unwrap(), Claim::Acquired(_)));
    }
    let stats = store.writer_stats();
    assert_eq!(stats.operations, 64);
    assert!(
        stats.batches < 32,
        "64 concurrent writes took {} commits",
        stats.batches
    );
}

/// Writes a record, then fails at the SQL level: the record must go with it.
fn write_then_break(conn: &Connection, now: Now) -> Result<((), bool), StoreError> {
    let rec = StoredRecord {
        key: key("phantom"),
        fingerprint: Fingerprint::of_bytes(b"x"),
        fence: 1,
        token: idemgate_core::LeaseToken(7),
        created_at: now.wall,
        scope: None,
        state: RecordState::Unknown { since: now.wall },
    };
    row::apply(conn, &rec.key.clone(), None, Change::Put(rec), now)?;
    conn.execute(
        "UPDATE idemgate_record SET token = x'00' WHERE key = 'phantom'",
        [],
    )
    .during(Stage::Write, || "break a check constraint")?;
    Ok(((), true))
}

/// The name of the thread a write runs on.
async fn writing_thread(store: &SqliteStore) -> Option<String> {
    store
        .write(|_, _| Ok((std::thread::current().name().map(str::to_owned), false)))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_writer_lets_the_caller_write_on_its_own_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
    let before = store.writer_stats();
    let thread = writing_thread(&store).await;
    assert_ne!(thread.as_deref(), Some("idemgate-sqlite-writer"));
    assert_eq!(store.writer_stats().batches - before.batches, 1);
    // Held, the thread is busy with a batch: callers queue behind it.
    store.inner.shared.inline_off.store(true, Ordering::SeqCst);
    let thread = writing_thread(&store).await;
    assert_eq!(thread.as_deref(), Some("idemgate-sqlite-writer"));
}

#[tokio::test]
async fn a_current_thread_runtime_leaves_writes_to_the_writer_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
    // Unless the call is the only one in flight (the MCP proxy's lone call) and the writer is
    // idle (as it is before its first batch): then it writes on its own thread, which nothing
    // else is waiting for.
    let caller = std::thread::current().name().map(str::to_owned);
    let thread = idemgate_core::caller::alone(|| true, writing_thread(&store)).await;
    assert_eq!(thread, caller);
    assert_ne!(thread.as_deref(), Some("idemgate-sqlite-writer"));
    let thread = writing_thread(&store).await;
    assert_eq!(thread.as_deref(), Some("idemgate-sqlite-writer"));
    let thread = idemgate_core::caller::alone(|| false, writing_thread(&store)).await;
    assert_eq!(thread.as_deref(), Some("idemgate-sqlite-writer"));
}

#[tokio::test]
async fn a_failing_write_alone_keeps_its_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
    let before = store.writer_stats();
    let e = store.write(write_then_break).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Unavailable(m) if m.contains("check constraint")),
        "{e}"
    );
    assert!(store.get(&key("phantom")).await.unwrap().is_none());
    // The transaction was closed: the next write commits on its own.
    assert!(matches!(
        store.reserve(&reservation(&key("a"))).await.unwrap(),
        Claim::Acquired(_)
    ));
    assert!(store.get(&key("a")).await.unwrap().is_some());
    assert_eq!(store.writer_stats().batches - before.batches, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_write_does_not_fail_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
    let held_key = key("held");
    let lease = acquire(&store, &held_key).await;
    let stolen = Lease {
        fence: lease.fence + 1,
        ..lease
    };
    let before = store.writer_stats();

    let held = hold(&store).await;
    let s = store.clone();
    let good_a = tokio::spawn(async move { s.reserve(&reservation(&key("a"))).await });
    let s = store.clone();
    let broken = tokio::spawn(async move { s.write(write_then_break).await });
    let s = store.clone();
    let hk = held_key.clone();
    let lost = tokio::spawn(async move {
        s.complete(
            &hk,
            stolen,
            &Outcome::success(b"x".to_vec()),
            Duration::from_secs(60),
        )
        .await
    });
    let s = store.clone();
    let good_b = tokio::spawn(async move { s.reserve(&reservation(&key("b"))).await });
    held.release_as_one_batch(3).await;

    assert!(matches!(good_a.await.unwrap().unwrap(), Claim::Acquired(_)));
    assert!(matches!(good_b.await.unwrap().unwrap(), Claim::Acquired(_)));
    let e = broken.await.unwrap().unwrap_err();
    assert!(
        matches!(&e, StoreError::Unavailable(m) if m.contains("check constraint")),
        "{e}"
    );
    assert!(matches!(lost.await.unwrap(), Err(StoreError::LeaseLost)));
    let after = store.writer_stats();
    // The completion's first try found the lease not holding the row; in a batch, its
    // transition ran there at once and refused it.
    assert_eq!(
        after.batches - before.batches,
        1,
        "one batch held all four writes"
    );
    assert!(store.get(&key("a")).await.unwrap().is_some());
    assert!(store.get(&key("b")).await.unwrap().is_some());
    assert!(store.get(&key("phantom")).await.unwrap().is_none());
    let rec = store.get(&held_key).await.unwrap().unwrap();
    assert_eq!(rec.state_name(), State::InFlight);
}

#[tokio::test]
async fn unreadable_rows_are_corrupt_and_only_for_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open(&path, manual()).unwrap();
    let conn = raw(&path);
    conn.pragma_update(None, "ignore_check_constraints", true)
        .unwrap();
    conn.execute(
        "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, created_at, state) \
         VALUES ('acme', 'send_invoice', 'bad', zeroblob(32), 1, zeroblob(16), 0, 7)",
        [],
    )
    .unwrap();
    let bad = key("bad");
    assert!(matches!(store.get(&bad).await, Err(StoreError::Corrupt(_))));
    let e = store.reserve(&reservation(&bad)).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt(m) if m.contains("state 7")),
        "{e}"
    );
    assert!(matches!(
        store.list(&ListFilter::default()).await,
        Err(StoreError::Corrupt(_))
    ));
    acquire(&store, &key("good")).await;
}

#[tokio::test]
async fn a_lock_held_past_busy_timeout_is_unavailable_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let opts = SqliteOptions {
        busy_timeout: Duration::from_millis(100),
        ..manual()
    };
    let store = SqliteStore::open(&path, opts).unwrap();
    let k = key("locked");
    acquire(&store, &k).await;

    // Another "process" holds the write lock.
    let other = raw(&path);
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let e = store.reserve(&reservation(&key("next"))).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Unavailable(m) if m.contains("locked")),
        "{e}"
    );
    assert!(started.elapsed() >= Duration::from_millis(90));
    // WAL: readers do not wait for the writer.
    assert!(store.get(&k).await.unwrap().is_some());
    other.execute_batch("ROLLBACK").unwrap();
    acquire(&store, &key("next")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_write_after_a_batch_that_panicked_halfway_is_committed_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open(&path, manual()).unwrap();
    // A write that panics inside its batch's transaction, which SQLite keeps open.
    let s = store.clone();
    let panicked = tokio::spawn(async move {
        s.write(|_: &Connection, _: Now| -> Result<((), bool)> { panic!("a bug in a write") })
            .await
    })
    .await;
    assert!(panicked.is_err());
    // The next lone reservation is refused (and the one after it acquires), or acquires: either
    // way what it acknowledged is committed, never taken into the transaction left open.
    let k = key("after-panic");
    let claim = match store.reserve(&reservation(&k)).await {
        Ok(claim) => claim,
        Err(_) => store.reserve(&reservation(&k)).await.unwrap(),
    };
    assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
    let seen: i64 = raw(&path)
        .query_row(
            "SELECT count(*) FROM idemgate_record WHERE key = 'after-panic'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(seen, 1, "acknowledged but not committed");
}
