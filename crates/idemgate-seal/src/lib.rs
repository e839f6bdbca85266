#![doc = include_str!("../README.md")]

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
