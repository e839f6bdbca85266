//! The mark a sealed store carries, so that it is never opened as if it were not sealed.
//!
//! Opened without its seal (the variables unset, or another naming secret), a sealed store finds
//! none of its records (they are named by HMACs of their keys), so every call would run its
//! action again. The first sealed open writes a marker record under a fixed name in the store
//! itself: a completed record whose outcome (in clear: it holds no secret) is a check value of the
//! naming secret, an HMAC of a constant. Every open reads it: an unsealed open of a marked store,
//! or a sealed open with another naming secret, is refused, naming what is missing.

use std::time::Duration;

use idemgate_core::{
    Claim, Fingerprint, IdempotencyKey, Keep, Key, Outcome, RecordState, Reservation, Store,
    StoreError, TenantId, ToolName,
};

use crate::config::{KEYS_FILE_VAR, KEYS_VAR, SECRET_FILE_VAR, SECRET_VAR};
use crate::seal::Seal;

/// The marker's record: tenant `idemgate`, tool `seal`, key `marker`.
pub fn marker_key() -> Key {
    Key::new(
        TenantId::new("idemgate").expect("a valid tenant id"),
        ToolName::new("seal").expect("a valid tool name"),
        IdempotencyKey::new("marker").expect("a valid key"),
    )
}

/// How long the marker lasts: as long as the store.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The marker's outcome for `seal`: the check value of its naming secret.
fn check_value(seal: &Seal) -> String {
    let digest = seal.digest(&[b"idemgate seal marker v1"]);
    format!(
        "{{\"sealed\":true,\"names\":\"{}\"}}",
        idemgate_core::key::hex(&digest[..16])
    )
}

/// Checks that `store` (the store under the seal, never a [`crate::Sealed`] one) is opened as it
/// was written: sealed by `seal` with the same naming secret, or never sealed. Writes the marker at
/// the first sealed open. A marker that cannot be written (a read-only store) is left for the
/// next open that can.
///
/// # Errors
/// [`StoreError::Misconfigured`] naming what is missing when the store is sealed and `seal` is
/// `None`, or was sealed with another naming secret; the store's error when the marker cannot be
/// read.
pub async fn check<S: Store>(store: &S, seal: Option<&Seal>) -> Result<(), StoreError> {
    let key = marker_key();
    let found = match store.get(&key).await? {
        Some(r) => match r.state {
            RecordState::Completed { outcome, .. } => Some(outcome.body),
            // A marker whose write was cut off: the store is sealed all the same.
            _ => Some(Vec::new()),
        },
        None => None,
    };
    match (found, seal) {
        (None, None) => Ok(()),
        (Some(_), None) => Err(StoreError::misconfigured(format!(
            "this store's records are sealed, and no seal is configured: set {KEYS_VAR} (or \
             {KEYS_FILE_VAR}) and {SECRET_VAR} (or {SECRET_FILE_VAR}) as when they were written. \
             Opened without them, none of its records would be found and every call would run \
             its action again"
        ))),
        (Some(body), Some(seal)) => {
            if body.is_empty() || body == check_value(seal).as_bytes() {
                Ok(())
            } else {
                Err(StoreError::misconfigured(format!(
                    "this store's records were sealed with another naming secret ({SECRET_VAR} \
                     or {SECRET_FILE_VAR}): with this one none of its records would be found and \
                     every call would run its action again; configure the secret they were \
                     written with"
                )))
            }
        }
        (None, Some(seal)) => {
            let _ = write(store, seal).await;
            Ok(())
        }
    }
}

async fn write<S: Store>(store: &S, seal: &Seal) -> Result<(), StoreError> {
    let key = marker_key();
    let r = Reservation::new(
        key.clone(),
        Fingerprint::of_bytes(b"idemgate seal marker"),
        Duration::from_secs(60),
    );
    match store.reserve(&r).await? {
        Claim::Acquired(lease) => {
            let marker = Outcome::success(check_value(seal).into_bytes());
            store
                .complete_at(&key, lease, &marker, Keep::replay(FOREVER), None)
                .await
                .map(drop)
        }
        // Another process wrote it first.
        Claim::Existing(_) => Ok(()),
    }
}
