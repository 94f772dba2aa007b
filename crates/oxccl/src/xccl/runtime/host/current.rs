//! The per-thread current device, as the vendor runtimes keep it: each thread has its own,
//! device 0 until set.

use std::cell::RefCell;
use std::collections::HashMap;

use super::codes::{fail, DEINITIALIZED};
use crate::error::Result;

thread_local! {
    /// This thread's current device, per runtime (keyed by the runtime's number). Entries of
    /// dropped runtimes stay until the thread ends (a few bytes each), except the dropping
    /// thread's own, which the drop removes.
    static CURRENT: RefCell<HashMap<u64, u32>> = RefCell::new(HashMap::new());
}

/// Makes `device` current for `runtime` on the calling thread.
///
/// # Errors
/// The thread is being torn down (its thread-locals are gone).
pub(super) fn set(runtime: u64, device: u32) -> Result<()> {
    CURRENT
        .try_with(|map| {
            if let Ok(mut map) = map.try_borrow_mut() {
                map.insert(runtime, device);
            }
        })
        .map_err(|_| fail(DEINITIALIZED, "set_current", "the calling thread is exiting"))
}

/// The calling thread's current device for `runtime` (0 when never set).
pub(super) fn get(runtime: u64) -> u32 {
    CURRENT.try_with(|map| map.try_borrow().ok().and_then(|m| m.get(&runtime).copied())).ok().flatten().unwrap_or(0)
}

/// Forgets the calling thread's entry for `runtime` (it is being dropped).
pub(super) fn forget(runtime: u64) {
    let _ = CURRENT.try_with(|map| {
        if let Ok(mut map) = map.try_borrow_mut() {
            map.remove(&runtime);
        }
    });
}
