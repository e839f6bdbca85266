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
/// and as the decimal byte list that `Debug` prints for a `Vec<u8>`.
pub fn forms(secret: &str) -> Vec<String> {
    let bytes = secret.as_bytes();
    let debug = format!("{bytes:?}");
    vec![
        secret.to_owned(),
        hex(bytes),
        hex(bytes).to_uppercase(),
        debug[1..debug.len() - 1].to_owned(),
    ]
}

/// Whether `dump` holds `secret` in any of its [`forms`].
pub fn reveals(dump: &[u8], secret: &str) -> bool {
    forms(secret)
        .iter()
        .any(|form| dump.windows(form.len()).any(|w| w == form.as_bytes()))
}
