//! The runtime's one wake-up hub: every blocking wait of the double (a stream waiting on an
//! event, a stall, [`event_wait`](super::HostRuntime::event_wait)) sleeps on its condition
//! variable, and every change that could end such a wait (an event firing or failing, a
//! stall released, the runtime dropping) notifies it. One hub rather than one condition
//! variable per object is what lets the drop wake every blocked job at once; the price, every
//! sleeper re-checking on every change, is nothing for a test double.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Instant;

use crate::sync::relock;

/// How a [`Wake::wait_for`] ended.
#[derive(Debug)]
pub(super) enum Waited<T> {
    /// The condition held, with what it returned.
    Ready(T),
    /// The runtime is dropping.
    Stopping,
    /// The deadline passed.
    TimedOut,
}

/// The hub.
#[derive(Debug, Default)]
pub(super) struct Wake {
    /// Held while checking a condition and while notifying, so no notification is lost.
    lock: Mutex<()>,
    /// Where sleepers sleep.
    cv: Condvar,
    /// Set once, when the runtime drops.
    stopping: AtomicBool,
}

impl Wake {
    /// Wakes every sleeper to re-check its condition. Call after the change is visible
    /// (stored, its own lock released).
    pub(super) fn notify(&self) {
        let _held = relock(&self.lock);
        self.cv.notify_all();
    }

    /// Marks the runtime as dropping and wakes every sleeper.
    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.notify();
    }

    /// Whether the runtime is dropping.
    pub(super) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Sleeps until `ready` returns something, the runtime drops, or `deadline` (when there
    /// is one) passes. `ready` is called with the hub's lock held: it may take the lock of
    /// the object it looks at, never the hub's.
    pub(super) fn wait_for<T>(&self, deadline: Option<Instant>, mut ready: impl FnMut() -> Option<T>) -> Waited<T> {
        let mut held = relock(&self.lock);
        loop {
            if let Some(v) = ready() {
                return Waited::Ready(v);
            }
            if self.stopping() {
                return Waited::Stopping;
            }
            held = match deadline {
                None => self.cv.wait(held).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Waited::TimedOut;
                    }
                    match self.cv.wait_timeout(held, deadline - now) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    }
                }
            };
        }
    }
}
