//! The conformance suite on buffers staged through host memory: every buffer staged
//! (`staged`), and device buffers of the host double (`device_placed`). One binary of their
//! own: one test reads the process-wide pinned pool's counters, which no other test may move
//! meanwhile; it takes [`alone`], the others [`beside_others`].

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

mod device_placed;
mod staged;

static POOL: RwLock<()> = RwLock::new(());

/// For a test that uses the pinned pool: runs beside the others like it.
fn beside_others() -> RwLockReadGuard<'static, ()> {
    POOL.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// For the test that reads the pinned pool's counters: runs while no other test does.
fn alone() -> RwLockWriteGuard<'static, ()> {
    POOL.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}
