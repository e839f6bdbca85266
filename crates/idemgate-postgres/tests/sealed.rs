//! A sealed Postgres store keeps neither results nor keys in clear in its table.

use idemgate_seal::testing;

use crate::support::{connect, fresh_key, raw_client, schema, url};

/// Every row of `tenant`, each read as text (as `pg_dump` or a `SELECT *` would show it).
async fn dump(tenant: &str) -> Vec<u8> {
    let client = raw_client(&url()).await;
    let rows = client
        .query(
            &format!(
                "SELECT r::text FROM \"{}\".idemgate_records r WHERE tenant = $1",
                schema()
            ),
            &[&tenant],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one record of {tenant}");
    rows.iter()
        .flat_map(|row| row.get::<_, String>(0).into_bytes())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_shows_neither_the_result_nor_the_key() {
    let (plain_tenant, sealed_tenant) = (fresh_key("t", "k").tenant, fresh_key("t", "k").tenant);
    testing::write_secret_record(&connect().await, plain_tenant.as_str()).await;
    testing::write_secret_record(&testing::sealed(connect().await), sealed_tenant.as_str()).await;
    testing::assert_dump_hides_secrets(
        &dump(plain_tenant.as_str()).await,
        &dump(sealed_tenant.as_str()).await,
    );
}
