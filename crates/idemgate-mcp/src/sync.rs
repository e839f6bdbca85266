//! The one way the crate takes a lock. A room of its own so that every other room can use it
//! without importing another room.

use std::sync::{Mutex, MutexGuard};

/// The guard of `m`, poisoned or not: every change under the crate's locks is one insert or
/// remove, or one assignment, so a lock whose holder panicked still guards consistent data.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
