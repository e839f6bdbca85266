//! What sealing protects, how keys rotate, and how a bad keyring is refused.

use std::time::Duration;

use idemgate_core::{
    Call, Claim, Decision, Effect, Engine, Fingerprint, IdempotencyKey, Key, ListFilter,
    MemoryStore, Outcome, RecordState, Reopened, Reservation, Store, StoreError, TenantId,
    ToolName,
};
use idemgate_seal::{
    from_vars, is_stored_name, testing, Keyring, NameSecret, SealError, Sealed, KEYS_FILE_VAR,
    KEYS_VAR, SECRET_FILE_VAR, SECRET_VAR,
};

const SECRET_KEY: &str = "order-7f3a-confidential-key";
const SECRET_RESULT: &str = "wire transfer 4410-secret-result";
const TTL: Duration = Duration::from_secs(3600);
const LEASE: Duration = Duration::from_secs(600);

fn key(k: &str) -> Key {
    Key::new(
        TenantId::new("acme").unwrap(),
        ToolName::new("payments/transfer").unwrap(),
        IdempotencyKey::new(k).unwrap(),
    )
}

/// Reserves `key` on `store` and completes it with `body`.
async fn write<S: Store>(store: &S, key: &Key, body: &str) {
    let r = Reservation::new(key.clone(), Fingerprint::of_bytes(b"args"), LEASE);
    let Claim::Acquired(lease) = store.reserve(&r).await.unwrap() else {
        panic!("expected to acquire {key}");
    };
    store
        .complete(key, lease, &Outcome::success(body.as_bytes()), TTL)
        .await
        .unwrap();
}

/// The body of the completed record `key` holds.
async fn body<S: Store>(store: &S, key: &Key) -> Result<Vec<u8>, StoreError> {
    match store.get(key).await?.expect("a record").state {
        RecordState::Completed { outcome, .. } => Ok(outcome.body),
        other => panic!("expected a completed record, found {other:?}"),
    }
}

#[tokio::test]
async fn a_dump_of_the_memory_store_shows_neither_the_result_nor_the_key() {
    // The memory store's dump is its `Debug` form: every record, with its name and outcome.
    let plain = MemoryStore::new();
    testing::write_secret_record(&plain, "acme").await;
    let sealed = testing::sealed(MemoryStore::new());
    testing::write_secret_record(&sealed, "acme").await;
    testing::assert_dump_hides_secrets(
        format!("{plain:?}").as_bytes(),
        format!("{:?}", sealed.inner()).as_bytes(),
    );
}

#[tokio::test]
async fn the_engine_replays_a_sealed_outcome_in_clear() {
    let engine = Engine::new(Sealed::new(MemoryStore::new(), testing::seal(&["k1"])));
    let call = Call::new(
        TenantId::new("acme").unwrap(),
        ToolName::new("send").unwrap(),
    )
    .key(IdempotencyKey::explicit(SECRET_KEY).unwrap())
    .args(&serde_json::json!({"to": 42}));
    let first = engine
        .call(call.clone(), || async {
            Effect::Success(SECRET_RESULT.into())
        })
        .await
        .unwrap();
    assert!(matches!(first.decision, Decision::Executed { .. }));
    let again = engine
        .call(call, || async { unreachable!("never runs twice") })
        .await
        .unwrap();
    assert!(matches!(again.decision, Decision::Replayed { .. }));
    assert_eq!(again.outcome().unwrap().body, SECRET_RESULT.as_bytes());
}

#[tokio::test]
async fn after_rotation_old_records_replay_and_new_ones_are_sealed_under_the_new_key() {
    let store = MemoryStore::new();
    let before = Sealed::new(store.clone(), testing::seal(&["k1"]));
    write(&before, &key("old"), "sealed under k1").await;

    // k2 is current now; k1 still opens.
    let rotated = Sealed::new(store.clone(), testing::seal(&["k2", "k1"]));
    assert_eq!(
        body(&rotated, &key("old")).await.unwrap(),
        b"sealed under k1"
    );
    write(&rotated, &key("new"), "sealed under k2").await;
    let seal = rotated.seal();
    let key_id_of = |raw: Vec<u8>| {
        let len = usize::from(raw[idemgate_seal::SEALED_MAGIC.len()]);
        let at = idemgate_seal::SEALED_MAGIC.len() + 1;
        String::from_utf8(raw[at..at + len].to_vec()).unwrap()
    };
    assert_eq!(
        key_id_of(body(&store, &seal.stored_name(&key("new"))).await.unwrap()),
        "k2"
    );
    assert_eq!(
        key_id_of(body(&store, &seal.stored_name(&key("old"))).await.unwrap()),
        "k1"
    );

    // A keyring without k1 says which key the old record needs, and still reads the new one.
    let without_k1 = Sealed::new(store, testing::seal(&["k2"]));
    let e = body(&without_k1, &key("old")).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt(m) if m.contains("\"k1\"") && m.contains("acme/payments/transfer/old")),
        "{e}"
    );
    assert_eq!(
        body(&without_k1, &key("new")).await.unwrap(),
        b"sealed under k2"
    );
}

#[tokio::test]
async fn an_outcome_copied_to_another_record_does_not_open() {
    let store = MemoryStore::new();
    let sealed = Sealed::new(store.clone(), testing::seal(&["k1"]));
    let seal = sealed.seal().clone();
    write(&sealed, &key("a"), "a's result").await;
    let copied = body(&store, &seal.stored_name(&key("a"))).await.unwrap();
    // Someone with write access to the store puts a's sealed outcome into b's record.
    let b = seal.stored_name(&key("b"));
    write(&store, &b, "placeholder").await;
    let r = Reservation::new(b.clone(), Fingerprint::of_bytes(b"args"), LEASE);
    let Claim::Existing(rec) = store.reserve(&r).await.unwrap() else {
        panic!("b exists");
    };
    assert!(matches!(
        store.reopen(&b, rec.fence).await.unwrap(),
        Reopened::Expired
    ));
    let Claim::Acquired(lease) = store.reserve(&r).await.unwrap() else {
        panic!("b was reopened");
    };
    store
        .complete(&b, lease, &Outcome::success(copied), TTL)
        .await
        .unwrap();
    let e = body(&sealed, &key("b")).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt(m) if m.contains("does not open")),
        "{e}"
    );
    assert_eq!(body(&sealed, &key("a")).await.unwrap(), b"a's result");
}

#[tokio::test]
async fn an_outcome_stored_in_clear_is_reported_corrupt_not_replayed() {
    let store = MemoryStore::new();
    let sealed = Sealed::new(store.clone(), testing::seal(&["k1"]));
    write(&store, &sealed.seal().stored_name(&key("a")), "in clear").await;
    let e = body(&sealed, &key("a")).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt(m) if m.contains("not sealed")),
        "{e}"
    );
}

#[tokio::test]
async fn listings_show_stored_names_that_find_the_record_again() {
    let sealed = Sealed::new(MemoryStore::new(), testing::seal(&["k1"]));
    write(&sealed, &key(SECRET_KEY), SECRET_RESULT).await;
    let fallback = Key::fallback(
        TenantId::new("acme").unwrap(),
        ToolName::new("payments/transfer").unwrap(),
        &Fingerprint::of_bytes(b"args"),
    );
    write(&sealed, &fallback, "by the window").await;
    let listed = sealed.list(&ListFilter::default()).await.unwrap();
    assert_eq!(listed.len(), 2);
    for rec in &listed {
        assert!(is_stored_name(&rec.key.key), "{}", rec.key);
        assert!(!rec.key.key.as_str().contains(SECRET_KEY));
        // The listed name finds the record, as the operator's key does.
        assert_eq!(
            sealed.get(&rec.key).await.unwrap().unwrap().fence,
            rec.fence
        );
    }
    let rules: Vec<_> = listed
        .iter()
        .map(|r| idemgate_core::KeyRule::of(&r.key.key))
        .collect();
    assert!(
        rules.contains(&idemgate_core::KeyRule::Fallback),
        "{rules:?}"
    );
    assert!(
        rules.contains(&idemgate_core::KeyRule::Explicit),
        "{rules:?}"
    );
    let by_key = sealed.get(&key(SECRET_KEY)).await.unwrap().unwrap();
    assert_eq!(by_key.key, key(SECRET_KEY), "found by its key, named by it");
    assert!(listed
        .iter()
        .any(|r| r.key == sealed.seal().stored_name(&key(SECRET_KEY))));
    // Another tenant's record of the same key has another stored name.
    let other = Key::new(
        TenantId::new("other").unwrap(),
        key(SECRET_KEY).tool,
        key(SECRET_KEY).key,
    );
    assert_ne!(
        sealed.seal().stored_name(&other).key,
        sealed.seal().stored_name(&key(SECRET_KEY)).key
    );
}

fn vars(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

fn config_error(r: Result<Option<idemgate_seal::Seal>, SealError>) -> String {
    match r {
        Err(SealError::Config(m)) => m,
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[test]
fn without_configuration_nothing_is_sealed() {
    assert!(from_vars(vars(&[])).unwrap().is_none());
    assert!(from_vars(vars(&[(KEYS_VAR, String::new())]))
        .unwrap()
        .is_none());
}

#[test]
fn the_keyring_and_the_secret_come_from_variables_or_files() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let secret = dir.path().join("secret");
    std::fs::write(
        &keys,
        format!(
            "# current first\n{}\n",
            testing::keyring_text(&["k2", "k1"])
        ),
    )
    .unwrap();
    std::fs::write(&secret, testing::secret_b64() + "\n").unwrap();
    let from_files = from_vars(vars(&[
        (KEYS_FILE_VAR, keys.display().to_string()),
        (SECRET_FILE_VAR, secret.display().to_string()),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(from_files.keyring().ids(), vec!["k2", "k1"]);
    let inline = testing::keyring_text(&["k2", "k1"]).replace('\n', ",");
    let from_values = from_vars(vars(&[
        (KEYS_VAR, inline),
        (SECRET_VAR, testing::secret_b64()),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(from_values.keyring().current_id(), "k2");
    let shown = format!("{from_values:?}");
    assert!(shown.contains("k2"), "{shown}");
    for secret in [testing::key_b64("k2"), testing::secret_b64()] {
        assert!(
            !shown.contains(&secret),
            "Debug shows no key material: {shown}"
        );
    }
    // The same secret names records the same way wherever it was read from.
    assert_eq!(
        from_files.stored_name(&key("x")),
        from_values.stored_name(&key("x"))
    );
}

#[test]
fn a_bad_keyring_or_secret_is_refused_with_what_to_fix() {
    let good_keys = testing::keyring_text(&["k1"]);
    let secret = testing::secret_b64();
    let with = |keys: &str, secret: &str| {
        config_error(from_vars(vars(&[
            (KEYS_VAR, keys.to_owned()),
            (SECRET_VAR, secret.to_owned()),
        ])))
    };
    let short = "k1:".to_owned() + &base64_of(&[7u8; 16]);
    let m = with(&short, &secret);
    assert!(
        m.contains("\"k1\" is 16 bytes long") && m.contains("exactly 32"),
        "{m}"
    );
    assert!(
        !m.contains(&base64_of(&[7u8; 16])),
        "never the key itself: {m}"
    );
    let m = with("k1:not base64!", &secret);
    assert!(m.contains("\"k1\" is not valid base64"), "{m}");
    let m = with(&format!("{good_keys}{good_keys}"), &secret);
    assert!(m.contains("twice"), "{m}");
    let m = with(&base64_of(&[1u8; 32]), &secret);
    assert!(m.contains("entry 1 is not ID:BASE64KEY"), "{m}");
    let m = with(&format!("bad id:{}", base64_of(&[1u8; 32])), &secret);
    assert!(m.contains("key id \"bad id\""), "{m}");
    let m = with(" # nothing\n", &secret);
    assert!(m.contains("keyring is empty"), "{m}");
    let m = with(&good_keys, &base64_of(&[3u8; 16]));
    assert!(
        m.contains("16 bytes long") && m.contains("at least 32"),
        "{m}"
    );

    let m = config_error(from_vars(vars(&[(KEYS_VAR, good_keys.clone())])));
    assert!(m.contains("needs both"), "{m}");
    let m = config_error(from_vars(vars(&[(SECRET_VAR, secret.clone())])));
    assert!(m.contains("needs both"), "{m}");
    let m = config_error(from_vars(vars(&[
        (KEYS_VAR, good_keys),
        (KEYS_FILE_VAR, "/nonexistent".to_owned()),
        (SECRET_VAR, secret.clone()),
    ])));
    assert!(m.contains("set one"), "{m}");
    let m = config_error(from_vars(vars(&[
        (KEYS_FILE_VAR, "/nonexistent/idemgate-keys".to_owned()),
        (SECRET_VAR, secret),
    ])));
    assert!(
        m.contains("failed to read /nonexistent/idemgate-keys"),
        "{m}"
    );
    assert!(Keyring::parse("k1:").is_err());
    assert!(NameSecret::parse("").is_err());
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn a_history_reads_back_in_clear_and_is_stored_sealed() {
    use idemgate_core::{Happening, HistoryEntry, Timestamp};
    let store = MemoryStore::new();
    let sealed = Sealed::new(store.clone(), testing::seal(&["k1"]));
    let k = key(SECRET_KEY);
    write(&sealed, &k, SECRET_RESULT).await;
    let entry = HistoryEntry::new(
        Timestamp::from_millis(1_800_000_000_000),
        1,
        Happening::Reopened,
        Some("alice-secret-operator"),
        Some(SECRET_RESULT),
    );
    assert!(sealed.append_history(&k, &entry).await.unwrap());
    assert_eq!(sealed.history(&k).await.unwrap(), vec![entry]);
    let dump = format!("{store:?}");
    for secret in [SECRET_RESULT, "alice-secret-operator", SECRET_KEY] {
        assert!(!dump.contains(secret), "{secret} in the dump: {dump}");
    }
}
