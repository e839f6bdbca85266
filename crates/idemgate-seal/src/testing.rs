//! Seals and checks for tests (of this crate and of the stores): fixed, public keys, never for a
//! deployment.

use base64::Engine as _;
use idemgate_core::key::hex;

use crate::seal::{Keyring, NameSecret, Seal};

/// The base64 of a fixed test key for `id` (its 32 bytes are public: tests only).
pub fn key_b64(id: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("idemgate test key {id}").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// A keyring of the test keys of `ids`, the first current: `ID:BASE64` entries, one a line.
pub fn keyring_text(ids: &[&str]) -> String {
    ids.iter()
        .map(|id| format!("{id}:{}\n", key_b64(id)))
        .collect()
}

/// A fixed test secret for naming records, in base64.
pub fn secret_b64() -> String {
    key_b64("the naming secret")
}

/// A seal of the test keys of `ids` (the first current) and the test secret.
///
/// # Panics
/// When `ids` is empty or names an invalid id.
pub fn seal(ids: &[&str]) -> Seal {
    Seal::new(
        Keyring::parse(&keyring_text(ids)).expect("a test keyring"),
        NameSecret::parse(&secret_b64()).expect("a test secret"),
    )
}

/// The forms in which a store may hold `secret`: as it is, in hex (PostgreSQL prints `bytea` so),
/// and as the decimal byte lists that `Debug` and JSON make of a `Vec<u8>`.
pub fn forms(secret: &str) -> Vec<String> {
    let bytes = secret.as_bytes();
    let debug = format!("{bytes:?}");
    vec![
        secret.to_owned(),
        hex(bytes),
        hex(bytes).to_uppercase(),
        debug[1..debug.len() - 1].to_owned(),
        debug[1..debug.len() - 1].replace(' ', ""),
    ]
}

/// Whether `dump` holds `secret` in any of its [`forms`].
pub fn reveals(dump: &[u8], secret: &str) -> bool {
    forms(secret)
        .iter()
        .any(|form| dump.windows(form.len()).any(|w| w == form.as_bytes()))
}

/// `store`, sealed by the test keyring `k1` ([`seal`]).
pub fn sealed<S>(store: S) -> crate::Sealed<S> {
    crate::Sealed::new(store, seal(&["k1"]))
}

/// How [`sealed`] stores name the record of `key`.
pub fn stored_name(key: &idemgate_core::Key) -> idemgate_core::Key {
    seal(&["k1"]).stored_name(key)
}

/// The key a dump test writes: no store may hold it in clear once sealed.
pub const SECRET_KEY: &str = "order-7f3a-confidential-key";
/// The result a dump test writes.
pub const SECRET_RESULT: &str = "wire transfer 4410-secret-result";

/// Reserves [`SECRET_KEY`] under `tenant` on `store` and completes it with [`SECRET_RESULT`],
/// then reads it back (through the seal, when `store` is sealed): the record the dump tests look
/// for.
///
/// # Panics
/// When the store does not take or give back the record.
pub async fn write_secret_record<S: idemgate_core::Store>(store: &S, tenant: &str) {
    use idemgate_core::{Claim, Fingerprint, IdempotencyKey, Key, Outcome, RecordState};
    use idemgate_core::{Reservation, TenantId, ToolName};
    let key = Key::new(
        TenantId::new(tenant).expect("a tenant id"),
        ToolName::new("payments/transfer").expect("a tool name"),
        IdempotencyKey::new(SECRET_KEY).expect("a key"),
    );
    let hour = std::time::Duration::from_secs(3600);
    let r = Reservation::new(key.clone(), Fingerprint::of_bytes(b"args"), hour);
    let Claim::Acquired(lease) = store.reserve(&r).await.expect("reserve") else {
        panic!("expected to acquire {key}");
    };
    store
        .complete(&key, lease, &Outcome::success(SECRET_RESULT), hour)
        .await
        .expect("complete");
    let rec = store.get(&key).await.expect("get").expect("the record");
    assert!(
        matches!(&rec.state, RecordState::Completed { outcome, .. } if outcome.body == SECRET_RESULT.as_bytes()),
        "{rec:?}"
    );
}

/// Checks that the dump of a store written in clear shows [`SECRET_KEY`] and [`SECRET_RESULT`]
/// (so the search can find them) and the dump of one written sealed shows neither.
///
/// # Panics
/// When either dump says otherwise.
pub fn assert_dump_hides_secrets(plain: &[u8], sealed: &[u8]) {
    for secret in [SECRET_KEY, SECRET_RESULT] {
        assert!(
            reveals(plain, secret),
            "the dump of the store written in clear should show {secret:?}: the search is broken"
        );
        assert!(
            !reveals(sealed, secret),
            "the dump of the sealed store shows {secret:?}: {}",
            String::from_utf8_lossy(sealed)
        );
    }
}
