//! The operator's frequent queries are served by the partial indexes of schema version 6, as
//! SQLite's own query planner says (`EXPLAIN QUERY PLAN`): a plan that scans the table fails.

use idemgate_core::{ListCursor, SystemClock};

use super::*;

/// The plan of `sql` with `params`, one line per step.
fn plan(conn: &Connection, sql: &str, params: &[Value]) -> Vec<String> {
    conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map(rusqlite::params_from_iter(params), |r| {
            r.get::<_, String>(3)
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// Every step of `plan` that reads the table searches it through `index` (or by row id, as a
/// purge does for the rows the index found), and none scans it.
fn assert_served_by(plan: &[String], index: &str, what: &str) {
    assert!(
        plan.iter()
            .any(|step| step.contains(&format!("USING INDEX {index} ("))),
        "{what}: {index} is not used: {plan:#?}"
    );
    for step in plan {
        assert!(
            !step.starts_with("SCAN idemgate_record"),
            "{what}: scans the table: {plan:#?}"
        );
        if step.starts_with("SEARCH idemgate_record") {
            assert!(
                step.contains(index) || step.contains("INTEGER PRIMARY KEY (rowid=?)"),
                "{what}: searches otherwise: {plan:#?}"
            );
        }
    }
}

#[tokio::test]
async fn unknown_and_in_flight_listings_search_the_unsettled_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let _store = SqliteStore::open(&path, manual()).unwrap();
    let conn = raw(&path);
    let now = SystemClock.read();
    let tenant = TenantId::new("acme").unwrap();
    let cursor = ListCursor {
        created_at: now.wall,
        key: key("order-1"),
    };
    for state in [State::Unknown, State::InFlight] {
        for (what, filter) in [
            ("every tenant", ListFilter::default()),
            (
                "a tenant and tool",
                ListFilter {
                    tenant: Some(tenant.clone()),
                    tool: Some(ToolName::new("send_invoice").unwrap()),
                    ..ListFilter::default()
                },
            ),
            (
                "a later page",
                ListFilter {
                    tenant: Some(tenant.clone()),
                    after: Some(cursor.clone()),
                    limit: 101,
                    ..ListFilter::default()
                },
            ),
        ] {
            let filter = ListFilter {
                state: Some(state),
                ..filter
            };
            let (sql, params) = list_sql(&filter, now);
            assert_served_by(
                &plan(&conn, &sql, &params),
                "idemgate_record_unsettled",
                &format!("{state} records of {what}"),
            );
            let (count_sql, count_params) = count_sql(&filter, now, 10_000).unwrap();
            assert_served_by(
                &plan(&conn, &count_sql, &count_params),
                "idemgate_record_unsettled",
                &format!("the count of {state} records of {what}"),
            );
        }
    }
}

#[tokio::test]
async fn a_purge_finds_its_rows_through_the_purge_due_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let _store = SqliteStore::open(&path, manual()).unwrap();
    let conn = raw(&path);
    let now = Value::Integer(1_800_000_000_000);
    let batch = Value::Integer(PURGE_BATCH);
    for (what, sql, params) in [
        ("the look for rows due", purge_due_sql(), vec![now.clone()]),
        (
            "the deletion",
            purge_delete_sql(),
            vec![now.clone(), batch.clone()],
        ),
        ("the compaction", purge_compact_sql(), vec![now, batch]),
    ] {
        assert_served_by(
            &plan(&conn, &sql, &params),
            "idemgate_record_purge_due",
            what,
        );
    }
}
