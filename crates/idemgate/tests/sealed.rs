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

/// A sealed store remembers that it is sealed: opened without its seal, or with another naming
/// secret, it is refused, naming what is missing (before, every sealed call ran again, since none
/// of its records could be found); opened as it was written, it works, and its listings are not
/// upset by the marker.
#[tokio::test]
async fn a_sealed_store_is_never_opened_as_if_it_were_not() {
    use idemgate::{ListFilter, Store as _};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let seal = testing::seal(&["k1"]);

    let sealed = AnyStore::connect_sealed(&url, Some(seal.clone()))
        .await
        .unwrap();
    testing::write_secret_record(&sealed, "acme").await;
    let listed = sealed.list(&ListFilter::default()).await.unwrap();
    assert_eq!(listed.len(), 1, "the marker is not listed: {listed:?}");
    drop(sealed);

    let e = AnyStore::connect_sealed(&url, None).await.unwrap_err();
    let said = e.to_string();
    assert!(
        matches!(e, idemgate::StoreError::Misconfigured(_))
            && said.contains("IDEMGATE_SEAL_KEYS")
            && said.contains("IDEMGATE_KEY_SECRET")
            && said.contains("run its action again"),
        "{said}"
    );

    let other_secret = idemgate_seal::Seal::new(
        idemgate_seal::Keyring::parse(&testing::keyring_text(&["k1"])).unwrap(),
        idemgate_seal::NameSecret::parse(&testing::key_b64("another naming secret")).unwrap(),
    );
    let e = AnyStore::connect_sealed(&url, Some(other_secret))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("another naming secret"), "{e}");

    // Rotated keys, the same naming secret: as written.
    let rotated = AnyStore::connect_sealed(&url, Some(testing::seal(&["k2", "k1"])))
        .await
        .unwrap();
    assert!(rotated.seal().is_some());

    // A store never sealed opens either way.
    let clear = format!("sqlite://{}", dir.path().join("clear.db").display());
    AnyStore::connect_sealed(&clear, None).await.unwrap();
    AnyStore::connect_sealed(&clear, None).await.unwrap();
}
