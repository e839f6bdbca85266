//! Waking waiters: this store's commits, and another process's.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_wake_waiters_early() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
    let k = key("watched");
    let started = Instant::now();
    let mark = store.change_mark(&k);
    let mut waiter = std::pin::pin!(store.wait_changed(&k, mark, Duration::from_secs(30)));
    // The first poll registers the waiter, so the commit cannot run ahead of it. (A spawned
    // waiter and a sleep before the commit lost that race on a loaded machine, and the
    // waiter then slept the whole 30 s.)
    std::future::poll_fn(|cx| {
        assert!(
            waiter.as_mut().poll(cx).is_pending(),
            "woke before any commit"
        );
        std::task::Poll::Ready(())
    })
    .await;
    acquire(&store, &k).await;
    // Notified while not being polled: it is ready at once.
    waiter.await;
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(10), "waited {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_between_a_waiters_look_and_its_wait_wakes_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("db"), manual()).unwrap();
    let k = key("watched");
    let lease = acquire(&store, &k).await;
    // The waiter's mark, then its look: in flight.
    let mark = store.change_mark(&k);
    let seen = store.get(&k).await.unwrap().unwrap();
    assert!(matches!(seen.state, RecordState::InFlight { .. }));
    // The completion commits before the waiter starts waiting.
    let outcome = Outcome::success(b"done".to_vec());
    store
        .complete(&k, lease, &outcome, Duration::from_secs(60))
        .await
        .unwrap();
    // Woken by the commit, not by the end of its 30 s.
    let started = Instant::now();
    store.wait_changed(&k, mark, Duration::from_secs(30)).await;
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(10), "waited {waited:?}");
    // Without a commit since its mark, a wait lasts its whole timeout.
    let mark = store.change_mark(&k);
    let started = Instant::now();
    store
        .wait_changed(&k, mark, Duration::from_millis(50))
        .await;
    assert!(started.elapsed() >= Duration::from_millis(50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_of_another_processes_commits_without_its_poll() {
    // Two stores on one file stand for two processes: neither hears the other's writer.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let other = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    let this = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    // Far longer than the test may take: a waiter woken only by its timeout fails it.
    let long = Duration::from_secs(30);
    let wait_on = |k: Key| {
        let this = this.clone();
        let mark = this.change_mark(&k);
        tokio::spawn(async move {
            this.wait_changed(&k, mark, long).await;
            Instant::now()
        })
    };

    // The first change of the log that this store can tell is not its own: the other store
    // commits until it does (its first commits may land while the watcher has yet to take a
    // quiet look). Pacing only: the test waits for the waiter, however long that takes.
    let k = key("first");
    let lease = acquire(&other, &k).await;
    let waiter = wait_on(k.clone());
    let started = Instant::now();
    let outcome = Outcome::success(b"done".to_vec());
    other.complete(&k, lease, &outcome, long).await.unwrap();
    let mut n = 0;
    while !waiter.is_finished() {
        assert!(started.elapsed() < Duration::from_secs(10), "never woken");
        acquire(&other, &key(&format!("pace-{n}"))).await;
        n += 1;
        tokio::time::sleep(crate::wake::TICK * 2).await;
    }

    // From then on, the other process's next commit wakes a waiter by itself.
    let k = key("second");
    let lease = acquire(&other, &k).await;
    // A waiter under way (one woken early by the tail of the pacing commits is replaced).
    let waiter = loop {
        let waiter = wait_on(k.clone());
        while !this.inner.changes.waiting() && !waiter.is_finished() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the waiter never waited"
            );
            tokio::task::yield_now().await;
        }
        if !waiter.is_finished() {
            break waiter;
        }
    };
    let completed = Instant::now();
    other.complete(&k, lease, &outcome, long).await.unwrap();
    let woken = waiter.await.unwrap().duration_since(completed);
    assert!(
        woken < Duration::from_secs(10),
        "woken {woken:?} after the commit"
    );
}
