//! The operator's frequent queries read only what they serve, as SQLite's own query planner says
//! (`EXPLAIN QUERY PLAN`): the listings of unsettled records the rows from the settled mark on and
//! those its log names (schema version 8), by row id; a plan that scans the table fails.

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

/// Every step of `plan` that reads the table searches it by row id (`rowid>?` for the rows from
/// the mark on, `rowid=?` for those the log names), or by its key for the row that the mark
/// names; none scans it.
fn assert_reads_by_row_id(plan: &[String], what: &str) {
    for wanted in ["(rowid>?)", "(rowid=?)"] {
        assert!(
            plan.iter().any(|step| step
                .starts_with("SEARCH idemgate_record USING INTEGER PRIMARY KEY")
                && step.contains(wanted)),
            "{what}: no search {wanted}: {plan:#?}"
        );
    }
    for step in plan {
        assert!(
            !step.starts_with("SCAN idemgate_record") && !step.starts_with("SCAN r"),
            "{what}: scans the table: {plan:#?}"
        );
    }
}

#[tokio::test]
async fn unknown_and_in_flight_listings_read_the_rows_above_the_mark_and_the_log() {
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
            assert_reads_by_row_id(
                &plan(&conn, &sql, &params),
                &format!("{state} records of {what}"),
            );
            let (count_sql, count_params) = count_sql(&filter, now, 10_000).unwrap();
            assert_reads_by_row_id(
                &plan(&conn, &count_sql, &count_params),
                &format!("the count of {state} records of {what}"),
            );
        }
    }
}

#[tokio::test]
async fn a_purge_reads_the_horizon_and_then_ranges_of_row_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let _store = SqliteStore::open(&path, manual()).unwrap();
    let conn = raw(&path);
    // Nothing due: the one row of the horizon, and not the table.
    let due = plan(
        &conn,
        crate::upkeep::PURGE_DUE_NOW_SQL,
        &[Value::Integer(1)],
    );
    assert!(
        due.iter().all(|step| !step.contains("idemgate_record")),
        "{due:#?}"
    );
    // A pass: every statement reads its range of row ids, never the whole table.
    let (after, last, now) = (Value::Integer(0), Value::Integer(4096), Value::Integer(1));
    for (what, sql, params) in [
        (
            "the deletion",
            crate::upkeep::purge_delete_sql(),
            vec![after.clone(), last.clone(), now.clone()],
        ),
        (
            "the compaction",
            crate::upkeep::purge_compact_sql(),
            vec![after.clone(), last.clone(), now],
        ),
        (
            "the earliest due time left",
            crate::upkeep::purge_earliest_sql(),
            vec![after, last],
        ),
    ] {
        let steps = plan(&conn, &sql, &params);
        assert!(
            steps
                .iter()
                .any(|s| s.contains("INTEGER PRIMARY KEY (rowid>? AND rowid<?)")),
            "{what}: {steps:#?}"
        );
        assert!(
            steps.iter().all(|s| !s.starts_with("SCAN")),
            "{what}: {steps:#?}"
        );
    }
}
