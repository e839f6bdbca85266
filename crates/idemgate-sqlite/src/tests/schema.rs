//! The file's schema: its versions, upgrades from older ones, and the settings of connections.

use super::*;

#[tokio::test]
async fn records_carry_only_their_key_and_calls_write_no_other_index() {
    // Each index is written by the calls whose rows it holds (see schema_v2.sql and
    // schema_v8.sql): besides the key, none. The operator's questions are answered from the
    // bookkeeping of version 8, kept by triggers that a fresh call passes without writing.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let _store = SqliteStore::open(&path, manual()).unwrap();
    let names = |kind: &str| -> Vec<String> {
        raw(&path)
            .prepare("SELECT name FROM sqlite_master WHERE type = ?1 ORDER BY name")
            .unwrap()
            .query_map([kind], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    assert_eq!(names("index"), ["sqlite_autoindex_idemgate_record_1"]);
    assert_eq!(
        names("table"),
        ["idemgate_record", "idemgate_unsettled", "idemgate_upkeep"]
    );
    assert_eq!(
        names("trigger"),
        [
            "idemgate_record_due_insert",
            "idemgate_record_due_update",
            "idemgate_record_mark_deleted",
            "idemgate_record_unsettled_insert",
            "idemgate_record_unsettled_update"
        ]
    );
}

#[tokio::test]
async fn reopening_keeps_records_and_the_schema_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idemgate.db");
    let k = key("order-1");
    let store = SqliteStore::open(&path, manual()).unwrap();
    let lease = acquire(&store, &k).await;
    // An empty body must come back empty, not missing.
    store
        .complete(
            &k,
            lease,
            &Outcome::failed(Vec::new()),
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
    drop(store);

    let store = SqliteStore::open(&path, manual()).unwrap();
    let rec = store
        .get(&k)
        .await
        .unwrap()
        .expect("the record survives reopening");
    match rec.state {
        RecordState::Completed { outcome, .. } => {
            assert_eq!(outcome.kind, OutcomeKind::Failed);
            assert!(outcome.body.is_empty());
        }
        other => panic!("expected completed, found {other:?}"),
    }
    let conn = raw(&path);
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'idemgate_record'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 1);
}

#[tokio::test]
async fn a_version_2_database_opens_upgraded_with_its_records_and_keeps_scopes_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idemgate.db");
    // The file as version 2 left it, with one completed record.
    let conn = raw_at_version(&path, 2);
    conn.execute(
        "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, created_at, \
         state, completed_at, expires_at, outcome_kind, outcome_body) \
         VALUES ('acme', 'send_invoice', 'old', zeroblob(32), 3, zeroblob(16), 1000, 1, 2000, ?1, 0, x'6f6b')",
        [i64::MAX],
    )
    .unwrap();
    drop(conn);

    let store = SqliteStore::open(&path, manual()).unwrap();
    let old = store
        .get(&key("old"))
        .await
        .unwrap()
        .expect("the old record");
    assert_eq!((old.fence, old.scope), (3, None));
    let new = key("new");
    let r = reservation(&new).with_scope(Some("conversation:7".into()));
    assert!(matches!(
        store.reserve(&r).await.unwrap(),
        Claim::Acquired(_)
    ));
    let rec = store.get(&new).await.unwrap().unwrap();
    assert_eq!(rec.scope.as_deref(), Some("conversation:7"));
    let version: i64 = raw(&path)
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
}

#[tokio::test]
async fn a_version_3_database_opens_upgraded_and_its_completions_keep_no_tombstone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idemgate.db");
    let now = 1_800_000_000_000_i64;
    // The file as version 3 left it: one completion still replayed, one past its ttl.
    let conn = raw_at_version(&path, 3);
    for (name, fence, expires_at) in [("live", 3, now + 60_000), ("gone", 5, now - 1)] {
        conn.execute(
            "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, \
             created_at, state, completed_at, expires_at, outcome_kind, outcome_body, scope) \
             VALUES ('acme', 'send_invoice', ?1, zeroblob(32), ?2, zeroblob(16), 1000, 1, \
             2000, ?3, 0, x'6f6b', 'conversation:1')",
            rusqlite::params![name, fence, expires_at],
        )
        .unwrap();
    }
    drop(conn);

    let (store, clock) = open_at(&path, Timestamp::from_millis(now));
    let conn = raw(&path);
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    // The upgrade rewrote no row: the old ones have no retain_until.
    let unset: i64 = conn
        .query_row(
            "SELECT count(*) FROM idemgate_record WHERE retain_until IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(unset, 2);
    // Read as kept until expires_at, as they were: the live one is replayed, the other
    // counts as absent and is neither listed nor reported expired.
    let live = store
        .get(&key("live"))
        .await
        .unwrap()
        .expect("the live record");
    assert_eq!(
        (live.fence, live.scope.as_deref(), live.state),
        (
            3,
            Some("conversation:1"),
            RecordState::Completed {
                outcome: Outcome::success(b"ok".to_vec()),
                completed_at: Timestamp::from_millis(2000),
                expires_at: Timestamp::from_millis(now + 60_000),
                retain_until: Timestamp::from_millis(now + 60_000),
            }
        )
    );
    assert_eq!(store.get(&key("gone")).await.unwrap(), None);
    let listed = |state| {
        let store = store.clone();
        async move {
            let filter = ListFilter {
                state,
                ..ListFilter::default()
            };
            let recs = store.list(&filter).await.unwrap();
            recs.into_iter()
                .map(|r| r.key.key.as_str().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(None).await, ["live"]);
    assert_eq!(listed(Some(State::Completed)).await, ["live"]);
    assert!(listed(Some(State::Expired)).await.is_empty());
    match store.reserve(&reservation(&key("gone"))).await.unwrap() {
        Claim::Acquired(lease) => assert_eq!(lease.fence, 6),
        other => panic!("expected to acquire the expired key, found {other:?}"),
    }
    // Past its ttl the live one is gone at once, without a tombstone, and purging deletes it.
    clock.advance(Duration::from_secs(60));
    assert_eq!(store.get(&key("live")).await.unwrap(), None);
    assert!(listed(Some(State::Expired)).await.is_empty());
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    let left: i64 = conn
        .query_row("SELECT count(*) FROM idemgate_record", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 1, "the new reservation of the other key");
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idemgate.db");
    drop(SqliteStore::open(&path, manual()).unwrap());
    raw(&path)
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let e = SqliteStore::open(&path, manual()).unwrap_err();
    assert!(
        matches!(&e, StoreError::Misconfigured(m) if m.contains("newer than this version")),
        "{e}"
    );
}

#[tokio::test]
async fn durability_is_set_on_the_write_connection() {
    let dir = tempfile::tempdir().unwrap();
    for (durability, expected) in [(Durability::Full, 2), (Durability::Normal, 1)] {
        let opts = SqliteOptions {
            durability,
            ..manual()
        };
        let store = SqliteStore::open(dir.path().join(format!("{durability:?}.db")), opts).unwrap();
        let (synchronous, mode) = store
            .write(|conn, _| {
                let s: i64 = conn
                    .pragma_query_value(None, "synchronous", |r| r.get(0))
                    .unwrap();
                let m: String = conn
                    .pragma_query_value(None, "journal_mode", |r| r.get(0))
                    .unwrap();
                Ok(((s, m), false))
            })
            .await
            .unwrap();
        assert_eq!(synchronous, expected, "{durability:?}");
        assert_eq!(mode, "wal");
    }
    assert_eq!(SqliteOptions::default().durability, Durability::Full);
}
