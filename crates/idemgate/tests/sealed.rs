//! A store opened sealed answers as the store under it (the conformance suite through
//! `AnyStore`'s sealed variant), and keeps its records sealed.

use idemgate::{AnyStore, IdempotencyKey, Key, MemoryStore, SealedStore, TenantId, ToolName};
use idemgate_conformance::Fixture;
use idemgate_seal::testing;

async fn fixture() -> Fixture<AnyStore> {
    Fixture::manual(|clock| AnyStore::Memory(MemoryStore::with_clock(clock)))
        .map(|store| AnyStore::Sealed(SealedStore::new(store, testing::seal(&["k1"]))))
        .listing_keys_as(testing::stored_name)
}

idemgate_conformance::store_conformance!(fixture());

#[tokio::test]
async fn a_store_opened_with_a_seal_seals_and_one_without_does_not() {
    let plain = AnyStore::connect_sealed("memory:", None).await.unwrap();
    let seal = testing::seal(&["k1"]);
    let sealed = AnyStore::connect_sealed("memory:", Some(seal.clone()))
        .await
        .unwrap();
    assert!(plain.seal().is_none());
    assert!(matches!(sealed.unsealed(), AnyStore::Memory(_)));
    assert!(!sealed.is_durable());
    testing::write_secret_record(&plain, "acme").await;
    testing::write_secret_record(&sealed, "acme").await;
    testing::assert_dump_hides_secrets(
        format!("{plain:?}").as_bytes(),
        format!("{:?}", sealed.unsealed()).as_bytes(),
    );
    let key = Key::new(
        TenantId::new("acme").unwrap(),
        ToolName::new("payments/transfer").unwrap(),
        IdempotencyKey::new(testing::SECRET_KEY).unwrap(),
    );
    assert_eq!(sealed.stored_name(&key), seal.stored_name(&key));
    assert_eq!(plain.stored_name(&key), key);
}
