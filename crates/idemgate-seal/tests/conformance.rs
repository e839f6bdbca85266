//! The memory store, sealed, passes the conformance suite: sealing changes how records are kept,
//! never what the store answers.

use idemgate_core::MemoryStore;
use idemgate_seal::{testing, Sealed};

async fn fixture() -> idemgate_conformance::Fixture<Sealed<MemoryStore>> {
    idemgate_conformance::Fixture::manual(MemoryStore::with_clock)
        .map(testing::sealed)
        .listing_keys_as(testing::stored_name)
}

idemgate_conformance::store_conformance!(fixture());

idemgate_conformance::store_model_test!(fixture(), cases = 256);
