#![doc = include_str!("../README.md")]

mod any;
pub mod defaults;
pub mod journal;

pub use any::{redact_url, AnyStore, SealedStore, SCHEMES};
pub use defaults::store_and_journal;
pub use idemgate_core::*;
pub use journal::FileJournal;

#[cfg(feature = "postgres")]
pub use idemgate_postgres as postgres;
#[cfg(feature = "redis")]
pub use idemgate_redis as redis;
#[cfg(feature = "sqlite")]
pub use idemgate_sqlite as sqlite;
