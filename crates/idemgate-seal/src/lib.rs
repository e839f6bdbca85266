//! Records protected at rest.
//!
//! A [`Sealed`] store keeps every idempotency key as an HMAC-SHA-256 under a per-deployment
//! secret ([`NameSecret`]) and every outcome's body sealed with AES-256-GCM under the current
//! key of a [`Keyring`] (a random nonce per outcome, the key's id beside it, bound to its record
//! and fence), so that a dump of the store shows neither the results nor the keys. Rotation: new
//! outcomes are sealed under the keyring's first key, and every key listed opens the outcomes
//! sealed under it. The environment configures it ([`from_env`]); `docs/OPERATIONS.md` says how
//! to run it.

mod config;
pub mod marker;
mod seal;
mod store;
#[doc(hidden)]
pub mod testing;

pub use config::{from_env, from_vars, KEYS_FILE_VAR, KEYS_VAR, SECRET_FILE_VAR, SECRET_VAR};
pub use seal::{
    is_stored_name, Keyring, NameSecret, Seal, SealError, KEY_LEN, MAX_KEY_ID_LEN, MIN_SECRET_LEN,
    SEALED_MAGIC, STORED_NAME_PREFIX,
};
pub use store::Sealed;
