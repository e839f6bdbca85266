//! The SQLite store passes the conformance suite, in clear and sealed, each behaviour on a fresh
//! file under Cargo's scratch directory for integration tests (kept, since the store outlives the
//! setup; `cargo clean` removes them).

/// A fresh store on a manual clock, in a directory of its own.
async fn fixture() -> idemgate_conformance::Fixture<idemgate_sqlite::SqliteStore> {
    let dir = tempfile::Builder::new()
        .prefix("idemgate-sqlite-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary directory")
        .keep();
    idemgate_conformance::Fixture::manual(|clock| {
        let opts = idemgate_sqlite::SqliteOptions {
            clock,
            ..Default::default()
        };
        idemgate_sqlite::SqliteStore::open(dir.join("idemgate.db"), opts).expect("open the store")
    })
}

idemgate_conformance::store_conformance!(fixture());

idemgate_conformance::store_model_test!(fixture(), cases = 256);

/// Sealed (keys stored as HMACs, outcomes encrypted), the store answers the same.
mod sealed {
    idemgate_conformance::store_conformance!(async {
        super::fixture()
            .await
            .map(idemgate_seal::testing::sealed)
            .listing_keys_as(idemgate_seal::testing::stored_name)
    });
}
