//! Purging: expired records deleted batch by batch, tombstones kept without their outcome.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_expired_completions_in_batches_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open(&path, manual()).unwrap();
    let now = 1_800_000_000_000_i64;
    // Rows straight into the table, three batches' worth of expired ones: completed and past its tombstone
    // (every fourth row; every other one of them written before schema version 4, without
    // `retain_until`, so gone at its `expires_at`), completed and not yet expired, unknown
    // (kept whatever its age), and completed past its ttl within its tombstone (kept, with
    // its outcome's body dropped).
    let rows = 4 * 3 * PURGE_BATCH + 17;
    let conn = raw(&path);
    conn.execute_batch("BEGIN").unwrap();
    let (mut expired, mut tombstones) = (0, 0);
    for i in 0..rows {
        let completed = |expires_at: i64, retain_until: Option<i64>| {
            (
                row::COMPLETED,
                Some(expires_at),
                retain_until,
                Some(now - 10),
                None,
                Some(0),
                Some(b"x".to_vec()),
            )
        };
        let (state, expires_at, retain_until, completed_at, since, kind, body) = match i % 4 {
            0 if i % 8 == 0 => completed(now - 1, None),
            0 => completed(now - 60_000, Some(now - 1)),
            1 => completed(now + 60_000, Some(now + 60_000)),
            2 => (
                row::UNKNOWN,
                None,
                None,
                None,
                Some(now - 86_400_000),
                None,
                None,
            ),
            _ => completed(now - 1, Some(now + 60_000)),
        };
        expired += u64::from(i % 4 == 0);
        tombstones += i64::from(i % 4 == 3);
        conn.execute(
            "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, \
             created_at, state, lease_until, since, completed_at, expires_at, outcome_kind, \
             outcome_body, retain_until) \
             VALUES ('t', 'tool', ?1, ?2, 1, ?3, ?4, ?5, NULL, ?6, ?7, ?8, ?9, ?10, ?11)",
            rusqlite::params![
                format!("k{i}"),
                [0u8; 32].as_slice(),
                [0u8; 16].as_slice(),
                now - 100,
                state,
                since,
                completed_at,
                expires_at,
                kind,
                body,
                retain_until
            ],
        )
        .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
    let batches = store.writer_stats().batches;
    assert_eq!(store.purge_expired().await.unwrap(), expired);
    // One write transaction per batch of rows, not one for the whole table.
    assert!(store.writer_stats().batches - batches >= 4);
    // Rows of the table where `condition` holds (of `?1`, a completed row's state, and
    // `?2`, now).
    let count = |condition: &str| -> i64 {
        conn.query_row(
            &format!(
                "SELECT count(*) FROM idemgate_record \
                 WHERE (?1 IS NOT NULL AND ?2 IS NOT NULL) AND {condition}"
            ),
            (row::COMPLETED, now),
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(count("1") as u64, rows as u64 - expired);
    // Past the ttl, only the tombstones are left, every one of them without its body.
    let past_ttl = "state = ?1 AND expires_at <= ?2";
    assert_eq!(count(past_ttl), tombstones);
    assert_eq!(
        count(&format!(
            "{past_ttl} AND retain_until > ?2 AND outcome_body = x''"
        )),
        tombstones
    );
    // The rest keep theirs.
    assert_eq!(
        count("state = ?1 AND expires_at > ?2 AND outcome_body = x'78'"),
        (rows + 2) / 4
    );
    // Nothing left to do is one read, and no write transaction.
    let batches = store.writer_stats().batches;
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    assert_eq!(store.writer_stats().batches, batches);
    assert_eq!(
        store
            .list(&ListFilter {
                state: Some(State::Expired),
                ..ListFilter::default()
            })
            .await
            .unwrap()
            .len() as i64,
        tombstones
    );
}

#[tokio::test]
async fn purge_drops_the_outcome_of_a_tombstone_and_deletes_it_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let start = Timestamp::from_millis(1_800_000_000_000);
    let (store, clock) = open_at(&path, start);
    let (ttl, tombstone) = (Duration::from_secs(60), Duration::from_secs(3600));
    let k = key("kept");
    let lease = acquire(&store, &k).await;
    let keep = Keep { ttl, tombstone };
    let done = store
        .complete_at(&k, lease, &Outcome::failed(b"result".to_vec()), keep, None)
        .await
        .unwrap();
    assert_eq!(done.expires_at, start.plus(ttl));
    // Another completed at once, without a tombstone.
    let plain = key("plain");
    let plain_lease = acquire(&store, &plain).await;
    store
        .complete(&plain, plain_lease, &Outcome::success(b"p".to_vec()), ttl)
        .await
        .unwrap();
    let conn = raw(&path);
    let stored = |name: &str| {
        conn.query_row(
            "SELECT state, expires_at, retain_until, outcome_kind, outcome_body \
             FROM idemgate_record WHERE key = ?1",
            [name],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Vec<u8>>(4)?,
                ))
            },
        )
        .optional()
        .unwrap()
    };
    let expires = start.plus(ttl).as_millis();
    let retain = start.plus(tombstone).as_millis();
    let row_with = |body: &[u8]| (row::COMPLETED, expires, Some(retain), 1, body.to_vec());
    assert_eq!(stored("kept"), Some(row_with(b"result")));
    // Without a tombstone, retain_until is written too, equal to expires_at.
    assert_eq!(stored("plain").unwrap().2, Some(expires));
    // Within the ttl, purging leaves both as they are.
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    assert_eq!(stored("kept"), Some(row_with(b"result")));

    clock.advance(ttl);
    let tombstone_view = RecordState::Expired {
        completed_at: done.completed_at,
        expired_at: done.expires_at,
        retain_until: Timestamp::from_millis(retain),
    };
    let state = |rec: Option<Record>| rec.map(|r| r.state);
    assert_eq!(
        state(store.get(&k).await.unwrap()),
        Some(tombstone_view.clone())
    );
    // Past the ttl, the record without a tombstone goes (the only one counted), and the
    // tombstone stays without its body; what callers see of it does not change.
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert_eq!(stored("plain"), None);
    assert_eq!(stored("kept"), Some(row_with(b"")));
    assert_eq!(state(store.get(&k).await.unwrap()), Some(tombstone_view));
    assert!(matches!(
        store.reserve(&reservation(&k)).await.unwrap(),
        Claim::Existing(rec) if rec.state_name() == State::Expired && rec.fence == lease.fence
    ));
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    assert_eq!(stored("kept"), Some(row_with(b"")));

    // Past the tombstone, it goes too, and the key is free at the next fence.
    clock.set(Timestamp::from_millis(retain));
    assert_eq!(store.get(&k).await.unwrap(), None);
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert_eq!(stored("kept"), None);
    assert!(matches!(
        store.reserve(&reservation(&k)).await.unwrap(),
        Claim::Acquired(_)
    ));
}
