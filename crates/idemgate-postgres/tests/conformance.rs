//! The Postgres store passes the conformance suite against the shared server on loopback
//! (`IDEMGATE_TEST_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`), each
//! behaviour in a schema of its own, dropped when it ends.

/// The shared test server, in a schema of the fixture's own, reserving by `reserve_path`.
///
/// A schema of its own, because the behaviours running at once would otherwise purge each
/// other's records (a purge is schema-wide): a reopened record is gone at once, and its key,
/// reserved again, starts its fence at 1, which a behaviour waiting for the fence to grow takes
/// for a fence that failed to.
async fn fixture(
    reserve_path: idemgate_postgres::ReservePath,
) -> idemgate_conformance::Fixture<idemgate_postgres::PgStore> {
    let url = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!(
        "idemgate_conformance_v{}_{}",
        idemgate_postgres::SCHEMA_VERSION,
        &idemgate_core::IdempotencyKey::mint().as_str()[4..16]
    );
    let options = idemgate_postgres::PgOptions {
        schema: schema.clone(),
        pool_size: 8,
        reserve_path,
        ..idemgate_postgres::PgOptions::default()
    };
    match idemgate_postgres::PgStore::connect_with(&url, options).await {
        Ok(store) => {
            idemgate_conformance::Fixture::real(store).then_drop(move || drop_schema(url, schema))
        }
        Err(e) => panic!(
            "failed to connect to the test Postgres at {url}: {e}\nstart it with: \
             pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start \
             (or point IDEMGATE_TEST_POSTGRES_URL at one)"
        ),
    }
}

/// Drops `schema` on the server at `url`, on a thread and runtime of its own (the fixture may
/// be dropped inside its test's runtime, which cannot be blocked on).
fn drop_schema(url: String, schema: String) {
    use std::time::Duration;
    let dropped = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        // Bounded: a server that stops answering, or a session holding the schema's locks,
        // leaves the schema behind rather than hanging the test.
        let dropping = async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            let driven = tokio::spawn(conn);
            let dropped = client
                .batch_execute(&format!(
                    "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                ))
                .await;
            drop(client);
            let _ = driven.await;
            dropped
        };
        runtime.block_on(async { tokio::time::timeout(Duration::from_secs(30), dropping).await })
    })
    .join();
    // Not a failure of the behaviour: the schema is left behind, and says so.
    match dropped {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => eprintln!("could not drop the test schema: {e}"),
        Ok(Err(_)) => eprintln!("dropping the test schema took over 30 s"),
        Err(_) => eprintln!("dropping the test schema panicked"),
    }
}

// Every reservation path gives the same answers: the suite and the model run on each.
// Server clocks cannot be moved, so the model runs without clock moves and with long leases.
mod adaptive {
    use idemgate_postgres::ReservePath::Adaptive;
    idemgate_conformance::store_conformance!(super::fixture(Adaptive));
    idemgate_conformance::store_model_test!(super::fixture(Adaptive), cases = 64);
}

mod insert_first {
    use idemgate_postgres::ReservePath::InsertFirst;
    idemgate_conformance::store_conformance!(super::fixture(InsertFirst));
    idemgate_conformance::store_model_test!(super::fixture(InsertFirst), cases = 64);
}

mod read_first {
    use idemgate_postgres::ReservePath::ReadFirst;
    idemgate_conformance::store_conformance!(super::fixture(ReadFirst));
    idemgate_conformance::store_model_test!(super::fixture(ReadFirst), cases = 64);
}

// Sealed (keys stored as HMACs, outcomes encrypted), the store answers the same.
mod sealed {
    use idemgate_postgres::ReservePath::Adaptive;
    use idemgate_seal::testing;
    idemgate_conformance::store_conformance!(async {
        super::fixture(Adaptive)
            .await
            .map(testing::sealed)
            .listing_keys_as(testing::stored_name)
    });
}
