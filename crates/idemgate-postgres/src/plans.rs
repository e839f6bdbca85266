//! The operator's frequent queries are served by the partial indexes of migration 7, as
//! PostgreSQL's planner says (`EXPLAIN`) on a table of some thousands of analyzed rows in a
//! schema of the test's own on the shared test server: a plan that reads the whole table fails.

use idemgate_core::{
    IdempotencyKey, Key, ListCursor, ListFilter, State, TenantId, Timestamp, ToolName,
};
use tokio_postgres::types::ToSql;

use crate::{ListQuery, PgOptions, PgStore, Sql};

fn url() -> String {
    std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The plan of `sql` with `params`, one line per row of EXPLAIN.
async fn plan(
    client: &tokio_postgres::Client,
    sql: &str,
    params: &[Box<dyn ToSql + Sync + Send>],
) -> String {
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| &**p as _).collect();
    client
        .query(&format!("EXPLAIN {sql}"), &refs)
        .await
        .unwrap_or_else(|e| panic!("EXPLAIN {sql}: {e}"))
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_served_by(plan: &str, index: &str, what: &str) {
    assert!(plan.contains(index), "{what}: {index} is not used:\n{plan}");
    assert!(
        !plan.contains("Seq Scan on idemgate_records"),
        "{what}: reads the whole table:\n{plan}"
    );
}

#[tokio::test]
async fn unknown_listings_and_purges_are_served_by_the_partial_indexes() {
    let schema = format!("idemgate_plans_{}", &IdempotencyKey::mint().as_str()[4..16]);
    let options = PgOptions {
        schema: schema.clone(),
        pool_size: 2,
        listen: false,
        ..PgOptions::default()
    };
    let store = PgStore::connect_with(&url(), options)
        .await
        .unwrap_or_else(|e| panic!("the test Postgres at {}: {e}", url()));
    let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let table = format!("\"{schema}\".idemgate_records");
    // 20,000 completed rows of one tenant, kept for a day, and 40 in flight or unknown: the shape
    // of a store in use, analyzed as autovacuum would.
    client
        .batch_execute(&format!(
            "INSERT INTO {table} (tenant, tool, key, fingerprint, fence, token, created_at, state, \
             lease_until, since, completed_at, expires_at, retain_until, outcome_kind, \
             outcome_body) \
             SELECT 'acme', 'charge', 'k' || i, decode(repeat('00', 32), 'hex'), 1, \
             decode(repeat('00', 16), 'hex'), 1800000000000 + i, \
             CASE WHEN i % 500 = 0 THEN 2 WHEN i % 500 = 1 THEN 0 ELSE 1 END, \
             CASE WHEN i % 500 = 1 THEN 1800000000000 + i END, \
             CASE WHEN i % 500 = 0 THEN 1800000000000 + i END, \
             CASE WHEN i % 500 > 1 THEN 1800000000000 + i END, \
             CASE WHEN i % 500 > 1 THEN 1900000000000 + i END, \
             CASE WHEN i % 500 > 1 THEN 1900000000000 + i END, \
             CASE WHEN i % 500 > 1 THEN 0 END, \
             CASE WHEN i % 500 > 1 THEN '\\x7b7d'::bytea END \
             FROM generate_series(1, 20000) AS i; \
             ANALYZE {table};"
        ))
        .await
        .unwrap();
    let sql = Sql::new(&schema);
    let cursor = ListCursor {
        created_at: Timestamp::from_millis(1_800_000_000_100),
        key: Key::new(
            TenantId::new("acme").unwrap(),
            ToolName::new("charge").unwrap(),
            IdempotencyKey::new("k100").unwrap(),
        ),
    };
    for state in [State::Unknown, State::InFlight] {
        for (what, filter) in [
            ("every tenant", ListFilter::default()),
            (
                "a tenant",
                ListFilter {
                    tenant: Some(TenantId::new("acme").unwrap()),
                    ..ListFilter::default()
                },
            ),
            (
                "a later page",
                ListFilter {
                    tenant: Some(TenantId::new("acme").unwrap()),
                    after: Some(cursor.clone()),
                    ..ListFilter::default()
                },
            ),
        ] {
            let filter = ListFilter {
                state: Some(state),
                ..filter
            };
            let (list, params) = ListQuery::of(&filter).fill(&sql.list, 101);
            assert_served_by(
                &plan(&client, &list, &params).await,
                "idemgate_records_unsettled",
                &format!("{state} records of {what}"),
            );
            let (count, params) = ListQuery::of(&filter).fill(&sql.count, 10_000);
            assert_served_by(
                &plan(&client, &count, &params).await,
                "idemgate_records_unsettled",
                &format!("the count of {state} records of {what}"),
            );
        }
    }
    assert_served_by(
        &plan(&client, &sql.purge, &[]).await,
        "idemgate_records_purge_due",
        "a purge",
    );
    drop(store);
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}
