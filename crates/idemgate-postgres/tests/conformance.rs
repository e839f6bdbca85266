//! The Postgres store passes the conformance suite against the shared server on loopback
//! (`IDEMGATE_TEST_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`), in schema
//! `idemgate_test_vN` (N the schema version, so that checkouts of other versions never meet).

/// The shared test server, in schema `idemgate_test_vN`, reserving by `reserve_path`.
async fn fixture(
    reserve_path: idemgate_postgres::ReservePath,
) -> idemgate_conformance::Fixture<idemgate_postgres::PgStore> {
    let url = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let options = idemgate_postgres::PgOptions {
        schema: format!("idemgate_test_v{}", idemgate_postgres::SCHEMA_VERSION),
        pool_size: 8,
        reserve_path,
        ..idemgate_postgres::PgOptions::default()
    };
    match idemgate_postgres::PgStore::connect_with(&url, options).await {
        Ok(store) => idemgate_conformance::Fixture::real(store),
        Err(e) => panic!(
            "failed to connect to the test Postgres at {url}: {e}\nstart it with: \
             pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start \
             (or point IDEMGATE_TEST_POSTGRES_URL at one)"
        ),
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
