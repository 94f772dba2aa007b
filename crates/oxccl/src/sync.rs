//! Locking shared by the crate's modules.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning. Every critical section in this crate is a few field
/// updates that cannot be left half done, so the data behind a poisoned lock (a thread
/// panicked while holding it) is still consistent.
pub(crate) fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
