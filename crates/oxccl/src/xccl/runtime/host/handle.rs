//! Stream and event handles: numbers posing as pointers.
//!
//! Every stream and event of every [`HostRuntime`](super::HostRuntime) in the process gets
//! the next number of one process-wide counter, and its handle is a pointer whose address is
//! that number and which has no provenance: it is never dereferenced, only looked up in its
//! runtime's table of live objects. Numbers are never reused, so a destroyed handle, a
//! handle of another runtime, an event passed as a stream (or the reverse) and a made-up
//! value all miss the table and are reported as invalid handles.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::codes::{fail, OUT_OF_MEMORY};
use crate::error::Result;

/// The next handle number; 0 is never handed out (a null stream is the default stream).
static NEXT: AtomicUsize = AtomicUsize::new(1);

/// A fresh handle number, never handed out before in this process.
///
/// # Errors
/// The numbers are exhausted (`usize::MAX` handles made; not reachable on 64-bit targets).
pub(super) fn next(call: &str) -> Result<usize> {
    NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1))
        .map_err(|_| fail(OUT_OF_MEMORY, call, "no handle numbers left"))
}

/// The handle pointer for number `id`.
pub(super) fn to_raw(id: usize) -> *mut c_void {
    std::ptr::without_provenance_mut(id)
}

/// The number a handle pointer stands for.
pub(super) fn from_raw(raw: *mut c_void) -> usize {
    raw.addr()
}
