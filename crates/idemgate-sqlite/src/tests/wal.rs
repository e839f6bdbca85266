//! The write-ahead log stays bounded.

use super::*;

/// The size of the write-ahead log of the database at `path` (0 while there is none).
fn wal_bytes(path: &Path) -> u64 {
    std::fs::metadata(wal_path(path)).map_or(0, |m| m.len())
}

/// Reserves and completes `count` records with bodies of `body` bytes, one after the other,
/// and returns the largest the log of the database at `path` was after any of them.
async fn largest_wal_while_writing(
    store: &SqliteStore,
    path: &Path,
    count: usize,
    body: usize,
) -> u64 {
    let mut largest = 0;
    for i in 0..count {
        let k = key(&format!("k{i}"));
        let lease = acquire(store, &k).await;
        store
            .complete(
                &k,
                lease,
                &Outcome::success(vec![b'x'; body]),
                Duration::from_secs(3600),
            )
            .await
            .unwrap();
        largest = largest.max(wal_bytes(path));
    }
    largest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_stays_bounded_under_many_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // NORMAL only spares the fsyncs; the log is written and checkpointed the same way.
    let opts = SqliteOptions {
        durability: Durability::Normal,
        ..manual()
    };
    let limit = opts.wal_limit;
    let store = SqliteStore::open(&path, opts).unwrap();
    let wal_size = || wal_bytes(&path);
    // A reader that keeps taking snapshots, as duplicates and `keys list` do.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                store.list(&ListFilter::default()).await.unwrap();
            }
        })
    };
    let largest = largest_wal_while_writing(&store, &path, 2000, 1024).await;
    stop.store(true, Ordering::Relaxed);
    reader.await.unwrap();
    eprintln!("the largest WAL was {largest} bytes (limit {limit})");
    // Before the bound, the log grew without end while the reader kept taking snapshots
    // (40 MB in this test), and SQLite's default alone let it reach 1000 pages (4 MiB).
    assert!(
        largest <= 3 * limit,
        "the WAL reached {largest} bytes (limit {limit})"
    );
    // Idle, the writer empties it.
    let deadline = Instant::now() + Duration::from_secs(30);
    acquire(&store, &key("last")).await;
    while wal_size() > limit / 4 {
        assert!(
            Instant::now() < deadline,
            "the WAL kept {} bytes while idle",
            wal_size()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_checkpoint_the_log_themselves_once_it_reaches_the_limit() {
    // The writer's WAL hook replaces SQLite's own, so it must run the commits' checkpoint
    // itself. Without it the log would reach the limit and then grow until the writer's
    // rarer RESTART, up to half again past it.
    //
    // The log passes the limit by the pages of the commit that reached it: up to five since
    // schema version 6 (the row's page, the key's and the two partial indexes', a parent now
    // and then), more than a quarter of the smallest limit (64 KiB, 16 pages), so the test
    // runs at 256 KiB, where a quarter is 16 pages.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let opts = SqliteOptions {
        durability: Durability::Normal,
        wal_limit: 4 * MIN_WAL_LIMIT,
        ..manual()
    };
    let limit = opts.wal_limit;
    let store = SqliteStore::open(&path, opts).unwrap();
    let largest = largest_wal_while_writing(&store, &path, 400, 512).await;
    assert!(
        largest > limit,
        "the writes never reached the limit ({largest} bytes), so it was not tested"
    );
    eprintln!("the largest WAL was {largest} bytes (limit {limit})");
    assert!(
        largest <= limit + limit / 4,
        "the WAL reached {largest} bytes (limit {limit})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_limit_set_in_the_url_bounds_the_log() {
    // Far below the default, so that the log would outgrow it many times over if the URL's
    // limit did not reach the store.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let url = format!(
        "sqlite://{}?durability=normal&wal_limit=128KiB",
        path.display()
    );
    let store = SqliteStore::connect_with(&url, manual()).unwrap();
    let limit = store.options().wal_limit;
    assert_eq!(limit, 128 << 10);
    let largest = largest_wal_while_writing(&store, &path, 400, 1024).await;
    eprintln!("the largest WAL was {largest} bytes (limit {limit})");
    assert!(
        largest > limit / 2,
        "the writes never came near the limit ({largest} bytes), so it was not tested"
    );
    assert!(
        largest <= limit + limit / 4,
        "the WAL reached {largest} bytes (limit {limit})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_writer_empties_the_log_once_a_reader_that_kept_it_lets_go() {
    // A reader in the log when the writer falls idle makes its checkpoint fail. The writer
    // must try again rather than sleep until the next write, which may never come.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let opts = SqliteOptions {
        durability: Durability::Normal,
        wal_limit: MIN_WAL_LIMIT,
        ..manual()
    };
    let quarter = opts.wal_limit / 4;
    let store = SqliteStore::open(&path, opts).unwrap();
    // Every write through the thread, which then checkpoints once idle.
    store.inner.shared.inline_off.store(true, Ordering::SeqCst);
    let reader = raw(&path);
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM idemgate_record", [], |r| r.get(0))
        .unwrap();
    // Past a quarter of the limit, short of what makes a busy writer wait for the reader.
    largest_wal_while_writing(&store, &path, 2, 1024).await;
    let grown = wal_bytes(&path);
    assert!(
        grown > quarter && grown < 2 * MIN_WAL_LIMIT,
        "the log holds {grown} bytes"
    );
    // The writer has tried, after the last batch, while the reader was in the log.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store
        .inner
        .hooks
        .idle_checkpoint_tried
        .load(Ordering::SeqCst)
    {
        assert!(Instant::now() < deadline, "the writer never fell idle");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(wal_bytes(&path) > quarter, "emptied with a reader in it");
    reader.execute_batch("COMMIT").unwrap();
    while wal_bytes(&path) > quarter {
        assert!(
            Instant::now() < deadline,
            "the log kept {} bytes after the reader let go",
            wal_bytes(&path)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
