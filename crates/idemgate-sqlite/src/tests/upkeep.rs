//! The bookkeeping of schema version 8 (upkeep.rs): the listings of unsettled records and the
//! purge horizon agree with a reading of every row, whatever the order of calls, settlings,
//! purges, rows freed at the top and rows numbered anew.

use std::collections::{BTreeSet, HashMap};

use super::*;

/// A small deterministic generator (xorshift), so that a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Runs `f` in a write transaction of `conn`.
fn in_transaction<T>(conn: &Connection, f: impl FnOnce(&Connection) -> T) -> T {
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let out = f(conn);
    conn.execute_batch("COMMIT").unwrap();
    out
}

/// The names of the records whose view is `state`, by the listing under test and by a reading of
/// every record.
async fn listed(store: &SqliteStore, state: State) -> (BTreeSet<String>, BTreeSet<String>) {
    let names = |records: Vec<Record>| -> BTreeSet<String> {
        records
            .into_iter()
            .filter(|r| r.state_name() == state)
            .map(|r| r.key.key.as_str().to_owned())
            .collect()
    };
    let by_mark = store
        .list(&ListFilter {
            state: Some(state),
            ..ListFilter::default()
        })
        .await
        .unwrap();
    let counted = store
        .count(
            &ListFilter {
                state: Some(state),
                ..ListFilter::default()
            },
            10_000,
        )
        .await
        .unwrap();
    assert_eq!(counted, by_mark.len(), "the count of {state} records");
    let every = store.list(&ListFilter::default()).await.unwrap();
    (names(by_mark), names(every))
}

/// The mark in force (0 when it no longer holds) and the one stored.
fn mark(conn: &Connection) -> (i64, i64) {
    conn.query_row(
        &format!(
            "SELECT {}, settled_below FROM idemgate_upkeep",
            crate::upkeep::SETTLED_BELOW
        ),
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

/// The invariants themselves, read in SQL: every row not completed is from the mark on or in the
/// log, and the horizon is no later than any completed row's due time.
fn assert_invariants(conn: &Connection, step: usize) {
    let hidden: i64 = conn
        .query_row(
            &format!(
                "SELECT count(*) FROM idemgate_record WHERE state <> 1 \
                 AND NOT {}",
                crate::upkeep::unsettled_rows()
            ),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        hidden, 0,
        "step {step}: unsettled rows below the mark, unlogged"
    );
    let (horizon, earliest): (i64, Option<i64>) = conn
        .query_row(
            &format!(
                "SELECT purge_horizon, (SELECT min({}) FROM idemgate_record WHERE state = 1) \
                 FROM idemgate_upkeep",
                crate::upkeep::PURGE_DUE
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    if let Some(earliest) = earliest {
        assert!(
            horizon <= earliest,
            "step {step}: horizon {horizon} after the earliest due time {earliest}"
        );
    }
}

/// Numbers every row anew from 1, in their order, as a `.dump` read back into a new file does:
/// the rows are inserted before the triggers exist, and the bookkeeping is copied as it was.
fn renumber(conn: &Connection) {
    in_transaction(conn, |c| {
        let triggers: Vec<(String, String)> = c
            .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        for (name, _) in &triggers {
            c.execute_batch(&format!("DROP TRIGGER {name}")).unwrap();
        }
        c.execute_batch(
            "CREATE TEMP TABLE copy AS SELECT * FROM idemgate_record ORDER BY rowid; \
             DELETE FROM idemgate_record; \
             INSERT INTO idemgate_record SELECT * FROM copy ORDER BY rowid; \
             DROP TABLE copy;",
        )
        .unwrap();
        for (_, sql) in &triggers {
            c.execute_batch(sql).unwrap();
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsettled_listings_and_the_horizon_hold_through_any_order_of_events() {
    for seed in [0x9E37_79B9_7F4A_7C15_u64, 0xD1B5_4A32_D192_ED03, 42] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let (store, clock) = open_at(&path, Timestamp::from_millis(1_800_000_000_000));
        let conn = raw(&path);
        let mut rng = Rng(seed);
        let mut held: HashMap<String, Lease> = HashMap::new();
        let mut seen = [0usize; 10];
        for step in 0..700 {
            let name = format!("k{}", rng.below(40));
            let k = key(&name);
            let op = rng.below(10);
            seen[op as usize] += 1;
            match op {
                0..=2 => {
                    if let Claim::Acquired(lease) = store.reserve(&reservation(&k)).await.unwrap() {
                        held.insert(name, lease);
                    }
                }
                3 => {
                    if let Some(lease) = held.remove(&name) {
                        let ttl = Duration::from_secs(1 + rng.below(100));
                        let tombstone = Duration::from_secs(rng.below(2) * 200);
                        let outcome = if rng.below(4) == 0 {
                            Outcome::success(Vec::new())
                        } else {
                            Outcome::success(b"done".to_vec())
                        };
                        // A lease that ran out meanwhile may be refused; either way is fine.
                        let _ = store
                            .complete_at(&k, lease, &outcome, Keep { ttl, tombstone }, None)
                            .await;
                    }
                }
                4 => {
                    if let Some(lease) = held.remove(&name) {
                        let _ = store.mark_unknown(&k, lease).await;
                    }
                }
                5 => {
                    if let Some(lease) = held.remove(&name) {
                        let _ = store.release(&k, lease).await;
                    }
                }
                6 => in_transaction(&conn, |c| crate::upkeep::settle(c).unwrap()),
                7 => clock.advance(Duration::from_secs(rng.below(40))),
                8 => {
                    let before = store.purge_expired().await.unwrap();
                    let now = clock.now().as_millis();
                    let due: i64 = conn
                        .query_row(
                            &format!(
                                "SELECT count(*) FROM idemgate_record WHERE state = 1 \
                                 AND {} <= ?1",
                                crate::upkeep::PURGE_DUE
                            ),
                            [now],
                            |r| r.get(0),
                        )
                        .unwrap();
                    assert_eq!(due, 0, "step {step}: rows due after a purge of {before}");
                }
                _ => {
                    // The newest row goes (a row id at the top is free again, and the next
                    // insert may reuse one below the mark), or every row is numbered anew, as a
                    // `.dump` read back does.
                    if rng.below(2) == 0 {
                        conn.execute(
                            "DELETE FROM idemgate_record WHERE rowid = \
                             (SELECT max(rowid) FROM idemgate_record)",
                            [],
                        )
                        .unwrap();
                    } else {
                        renumber(&conn);
                    }
                }
            }
            assert_invariants(&conn, step);
            for state in [State::Unknown, State::InFlight] {
                let (by_mark, every) = listed(&store, state).await;
                assert_eq!(
                    by_mark, every,
                    "seed {seed:#x}, step {step}: {state} records"
                );
            }
        }
        // Every kind of event happened, and the log was used.
        assert!(seen.iter().all(|&n| n > 20), "{seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_that_does_not_own_the_horizon_purges_and_leaves_it_to_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let start = Timestamp::from_millis(1_800_000_000_000);
    let (store, clock) = open_at(&path, start);
    let conn = raw(&path);
    let horizon = || -> i64 {
        conn.query_row("SELECT purge_horizon FROM idemgate_upkeep", [], |r| {
            r.get(0)
        })
        .unwrap()
    };
    let complete = |name: &'static str, ttl: u64| {
        let store = store.clone();
        async move {
            let k = key(name);
            let lease = acquire(&store, &k).await;
            store
                .complete(
                    &k,
                    lease,
                    &Outcome::success(b"ok".to_vec()),
                    Duration::from_secs(ttl),
                )
                .await
                .unwrap();
        }
    };
    // Nothing completed: nothing due, ever.
    assert_eq!(horizon(), i64::MAX);
    complete("old", 10).await;
    assert_eq!(horizon(), start.plus(Duration::from_secs(10)).as_millis());
    // A later due time does not move it.
    complete("later", 500).await;
    assert_eq!(horizon(), start.plus(Duration::from_secs(10)).as_millis());
    clock.advance(Duration::from_secs(20));
    let now = clock.now().as_millis();

    // Another pass owns the horizon: this one purges, and leaves the horizon to it.
    let other = in_transaction(&conn, |c| crate::upkeep::purge_begin(c, now).unwrap()).unwrap();
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert_eq!(horizon(), start.plus(Duration::from_secs(10)).as_millis());
    // A completion while the other pass runs, due before anything it saw.
    complete("meanwhile", 5).await;
    // The owner ends having seen only "later": the horizon is the earlier of the two.
    let later = start.plus(Duration::from_secs(500)).as_millis();
    in_transaction(&conn, |c| {
        crate::upkeep::purge_end(c, &other, later).unwrap()
    });
    assert_eq!(horizon(), now + 5_000);

    // An owner that stopped renewing is taken over once its hold ends; its end then moves
    // nothing.
    let stalled = in_transaction(&conn, |c| crate::upkeep::purge_begin(c, now).unwrap()).unwrap();
    clock.advance(Duration::from_millis(
        u64::try_from(crate::upkeep::PURGE_OWNER_FOR_MS).unwrap() + 1,
    ));
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert_eq!(horizon(), later);
    in_transaction(&conn, |c| crate::upkeep::purge_end(c, &stalled, 0).unwrap());
    assert_eq!(horizon(), later);
    // Nothing due is one read, and no write transaction.
    let batches = store.writer_stats().batches;
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    assert_eq!(store.writer_stats().batches, batches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_settles_the_mark_as_calls_come() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open(&path, manual()).unwrap();
    let conn = raw(&path);
    let in_force = || mark(&conn).0;
    assert_eq!(in_force(), 0);
    // One call left unknown at the start, then fresh calls until the writer settled.
    let lost = key("lost");
    let lease = acquire(&store, &lost).await;
    store.mark_unknown(&lost, lease).await.unwrap();
    let calls = crate::upkeep::SETTLE_EVERY / 2 + 1;
    for i in 0..calls {
        let k = key(&format!("call-{i}"));
        let lease = acquire(&store, &k).await;
        store
            .complete(
                &k,
                lease,
                &Outcome::success(b"ok".to_vec()),
                Duration::from_secs(60),
            )
            .await
            .unwrap();
    }
    assert!(in_force() > 1, "the mark did not move: {}", in_force());
    let logged: i64 = conn
        .query_row("SELECT count(*) FROM idemgate_unsettled", [], |r| r.get(0))
        .unwrap();
    assert_eq!(logged, 1);
    let (by_mark, every) = listed(&store, State::Unknown).await;
    assert_eq!(by_mark, every);
    assert_eq!(by_mark, BTreeSet::from(["lost".to_owned()]));
}

#[tokio::test]
async fn a_version_7_database_opens_with_its_unsettled_records_logged_and_its_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idemgate.db");
    let now = 1_800_000_000_000_i64;
    let conn = raw_at_version(&path, 7);
    // Two thousand completions, an unknown outcome among the first and a call in flight among
    // the last; the earliest due time is a tombstone's end.
    conn.execute_batch("BEGIN").unwrap();
    for i in 0..2000_i64 {
        let (state, since, lease_until) = match i {
            3 => (2, Some(now - 1), None),
            1990 => (0, None, Some(now + 60_000)),
            _ => (1, None, None),
        };
        let completed = state == 1;
        let body: Option<&[u8]> = completed.then_some(if i == 7 { b"" } else { b"ok" });
        conn.execute(
            "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, \
             created_at, state, lease_until, since, completed_at, expires_at, outcome_kind, \
             outcome_body, retain_until) VALUES ('acme', 'send_invoice', ?1, zeroblob(32), 1, \
             zeroblob(16), 1000, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            rusqlite::params![
                format!("k{i}"),
                state,
                lease_until,
                since,
                completed.then_some(now),
                completed.then_some(now + 100_000 + i),
                completed.then_some(0),
                body,
                completed.then_some(now + 200_000 + i),
            ],
        )
        .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
    drop(conn);

    let (store, _clock) = open_at(&path, Timestamp::from_millis(now));
    let conn = raw(&path);
    let (mark, logged, horizon): (i64, i64, i64) = conn
        .query_row(
            &format!(
                "SELECT {}, (SELECT count(*) FROM idemgate_unsettled), purge_horizon \
                 FROM idemgate_upkeep",
                crate::upkeep::SETTLED_BELOW
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    // Settled at the opening: both unsettled rows below the mark, in the log.
    assert_eq!((mark, logged), (2001, 2));
    // k0's expiry, before k7's tombstone end (its outcome is empty, so it is due at its end).
    assert_eq!(horizon, now + 100_000);
    let (unknown, _) = listed(&store, State::Unknown).await;
    assert_eq!(unknown, BTreeSet::from(["k3".to_owned()]));
    let (in_flight, _) = listed(&store, State::InFlight).await;
    assert_eq!(in_flight, BTreeSet::from(["k1990".to_owned()]));
}

#[tokio::test]
async fn the_mark_moves_when_its_row_is_deleted_and_keeps_holding() {
    // The newest row is the one the mark names. Released (deleted), its row id is free again;
    // the mark moves to the newest row left rather than counting as 0 (which would make every
    // listing read every row), and the key reserved again lands above it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open(&path, manual()).unwrap();
    let conn = raw(&path);
    acquire(&store, &key("first")).await;
    let newest = key("newest");
    let lease = acquire(&store, &newest).await;
    in_transaction(&conn, |c| crate::upkeep::settle(c).unwrap());
    assert_eq!(mark(&conn), (3, 3));
    store.release(&newest, lease).await.unwrap();
    assert_eq!(mark(&conn), (2, 2), "the mark holds, below the row left");
    acquire(&store, &newest).await;
    let (by_mark, every) = listed(&store, State::InFlight).await;
    assert_eq!(by_mark, every);
    assert_eq!(
        by_mark,
        BTreeSet::from(["first".to_owned(), "newest".to_owned()])
    );
}

#[tokio::test]
async fn a_row_written_by_hand_below_the_mark_is_logged() {
    // Rows the store inserts always land above the mark (a row id after the newest); one
    // written by hand with its own row id may not, and the trigger on inserts logs it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open(&path, manual()).unwrap();
    let conn = raw(&path);
    for name in ["a", "b", "c"] {
        acquire(&store, &key(name)).await;
    }
    conn.execute("DELETE FROM idemgate_record WHERE key = 'b'", [])
        .unwrap();
    in_transaction(&conn, |c| crate::upkeep::settle(c).unwrap());
    conn.execute(
        "INSERT INTO idemgate_record (rowid, tenant, tool, key, fingerprint, fence, token, \
         created_at, state, since) VALUES (2, 'acme', 'send_invoice', 'by-hand', zeroblob(32), \
         1, zeroblob(16), 1000, 2, 1000)",
        [],
    )
    .unwrap();
    let (by_mark, every) = listed(&store, State::Unknown).await;
    assert_eq!(by_mark, every);
    assert_eq!(by_mark, BTreeSet::from(["by-hand".to_owned()]));
}
