//! Fault injection: a stream job that blocks until the test lets it go, so an operation can
//! "hang on the GPU" for as long as a test needs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::wake::Wake;

/// The gate a stall job waits behind.
#[derive(Debug, Default)]
pub(super) struct Gate {
    /// Set once the guard is released or dropped.
    open: AtomicBool,
}

impl Gate {
    /// Whether the stall is over.
    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }
}

/// Keeps a stream stalled (from [`HostRuntime::stall`](super::HostRuntime::stall)): the
/// stall job on the stream blocks until this guard is released or dropped, or until the
/// runtime drops.
#[derive(Debug)]
#[must_use = "dropping the guard releases the stall at once"]
pub(crate) struct StallGuard {
    /// The gate the stall job waits behind.
    gate: Arc<Gate>,
    /// The runtime's hub, to wake the stall job.
    wake: Arc<Wake>,
}

impl StallGuard {
    /// A guard for `gate`.
    pub(super) fn new(gate: Arc<Gate>, wake: Arc<Wake>) -> StallGuard {
        StallGuard { gate, wake }
    }

    /// Lets the stalled stream go on (the same as dropping the guard).
    pub(crate) fn release(self) {}
}

impl Drop for StallGuard {
    fn drop(&mut self) {
        self.gate.open.store(true, Ordering::SeqCst);
        self.wake.notify();
    }
}
