//! The conformance suite on buffers staged through host memory: every buffer staged
//! (`staged`), and device buffers of the host double (`device_placed`). One binary of their
//! own: they read the process-wide pinned pool's counters, which no other test may move
//! meanwhile, and take [`serial`] for it.

use std::sync::{Mutex, MutexGuard};

mod device_placed;
mod staged;

/// Serialises the tests (the pinned pool's counters are process-wide).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
