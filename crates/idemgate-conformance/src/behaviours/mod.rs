//! The behaviours every store passes, one `pub async fn` each, in files by what they exercise.
//! The crate root re-exports them all, since [`store_conformance!`](crate::store_conformance)
//! calls each by its name at the root (`$crate::$name`).

pub(crate) mod expiry;
pub(crate) mod history;
pub(crate) mod leases;
pub(crate) mod listing;
mod steps;
