//! The memory store passes the conformance suite.

idemgate_conformance::store_conformance!(async {
    idemgate_conformance::Fixture::manual(idemgate_core::MemoryStore::with_clock)
});

idemgate_conformance::store_model_test!(
    async { idemgate_conformance::Fixture::manual(idemgate_core::MemoryStore::with_clock) },
    cases = 512
);
