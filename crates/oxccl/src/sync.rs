//! Locking, and what a caught panic says, shared by the crate's modules.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning. Every critical section in this crate is a few field
/// updates that cannot be left half done, so the data behind a poisoned lock (a thread
/// panicked while holding it) is still consistent.
pub(crate) fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A caught panic's message, when it has one.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}
