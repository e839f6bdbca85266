//! The Postgres store passes the conformance suite against the shared server on loopback
//! (`IDEMGATE_TEST_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`), each
//! behaviour in a schema of its own, dropped when it ends.

// The crate's test helpers: this target uses the server's URL, its schemas and connecting.
#[allow(dead_code)]
mod support;

use std::time::Duration;

/// The shared test server, in a schema of the fixture's own, reserving by `reserve_path`.
///
/// A schema of its own, because the behaviours running at once would otherwise purge each
/// other's records (a purge is schema-wide): a reopened record is gone at once, and its key,
/// reserved again, starts its fence at 1, which a behaviour waiting for the fence to grow takes
/// for a fence that failed to.
async fn fixture(
    reserve_path: idemgate_postgres::ReservePath,
) -> idemgate_conformance::Fixture<idemgate_postgres::PgStore> {
    let schema = support::fresh_schema(&format!(
        "idemgate_conformance_v{}",
        idemgate_postgres::SCHEMA_VERSION
    ));
    let options = idemgate_postgres::PgOptions {
        schema: schema.clone(),
        reserve_path,
        ..support::options()
    };
    let store = support::connect_with(&support::url(), options).await;
    idemgate_conformance::Fixture::real(store).then_drop(move || drop_on_own_thread(schema))
}

/// Drops `schema` (`support::drop_schema`) on a thread and runtime of its own: the fixture may
/// be dropped inside its test's runtime, which cannot be blocked on.
fn drop_on_own_thread(schema: String) {
    let dropped = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        // Bounded: a server that stops answering leaves the schema behind rather than hanging
        // the test.
        // (The timeout's timer needs the runtime: made inside `block_on`.)
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), support::drop_schema(&schema)).await
        })
    })
    .join();
    // Not a failure of the behaviour: the schema is left behind, and says so (a failed drop has
    // printed its panic).
    match dropped {
        Ok(Ok(())) => {}
        Ok(Err(_)) => eprintln!("dropping the test schema took over 30 s"),
        Err(_) => eprintln!("dropping the test schema failed"),
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
