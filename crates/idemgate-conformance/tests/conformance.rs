//! The memory store passes the conformance suite.

idemgate_conformance::store_conformance!(async {
    idemgate_conformance::Fixture::manual(idemgate_core::MemoryStore::with_clock)
});
