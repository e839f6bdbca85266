//! The addon's functions on keys, fingerprints and verdicts, for the package and its tests.

use idemgate::{IdempotencyKey, Verdict};
use napi::{Error, Result};
use napi_derive::napi;

/// A stable key for one step of one run: `IdempotencyKey::derive(run_id, step)`, the same as the
/// Python package's `derive_key`.
#[napi]
pub fn derive_key(run_id: String, step: String) -> String {
    IdempotencyKey::derive(&run_id, &step).as_str().to_owned()
}

/// A fresh random key: `IdempotencyKey::mint()`.
#[napi]
pub fn mint_key() -> String {
    IdempotencyKey::mint().as_str().to_owned()
}

/// A caller's key as the engine takes it (`IdempotencyKey::explicit`); throws with the reason.
#[napi]
pub fn check_key(key: String) -> Result<String> {
    IdempotencyKey::explicit(&key)
        .map(|k| k.as_str().to_owned())
        .map_err(|e| Error::from_reason(e.to_string()))
}

/// The fingerprint (hex SHA-256 of the canonical JSON) of a call's arguments given as JSON text.
#[napi]
pub fn fingerprint(args_json: String) -> Result<String> {
    idemgate::Fingerprint::of_json_text(args_json.as_bytes())
        .map(|f| f.to_hex())
        .map_err(|e| Error::from_reason(e.to_string()))
}

/// Every verdict label an answer may carry, with whether it is an error: what the package's
/// table of error classes is checked against.
#[napi]
pub fn verdict_labels() -> Vec<Vec<String>> {
    Verdict::ALL
        .into_iter()
        .map(|v| vec![v.label().to_owned(), v.is_error().to_string()])
        .collect()
}
