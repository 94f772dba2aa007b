//! The [`Pending`] of the `mpi` backend: an operation's completion slot, advanced by
//! polling the communicator (`MPI_Test` on its requests, the side channel, the deadline)
//! from `wait` and `is_completed`. No thread per operation: whoever waits drives progress.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::engine::{Cell, Shared};
use crate::backend::{Completion, Pending};
use crate::error::Result;

/// Spins briefly, then yields (ranks often share cores), then naps.
pub(crate) struct Backoff {
    polls: u32,
    since: Instant,
}

impl Backoff {
    /// A backoff that starts spinning.
    pub(crate) fn new() -> Backoff {
        Backoff { polls: 0, since: Instant::now() }
    }

    /// Waits a little, longer as the wait goes on.
    pub(crate) fn snooze(&mut self) {
        self.polls = self.polls.saturating_add(1);
        if self.polls < 64 || !self.polls.is_multiple_of(16) {
            // MPI's non-blocking collectives progress only inside MPI calls (MPI_Test):
            // poll often while the operation is young.
            std::hint::spin_loop();
        } else if self.since.elapsed() < Duration::from_millis(50) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// Polls `shared` until `cell` completes or `timeout` (None: until the operation's own
/// deadline, which the poll enforces) passes.
pub(crate) fn wait_cell(shared: &Shared, cell: &Cell, timeout: Option<Duration>) -> Option<Result<Completion>> {
    let until = timeout.map(|t| Instant::now() + t);
    let mut b = Backoff::new();
    loop {
        if let Some(r) = cell.result() {
            return Some(r);
        }
        shared.poll();
        if let Some(r) = cell.result() {
            return Some(r);
        }
        if until.is_some_and(|u| Instant::now() >= u) {
            return None;
        }
        b.snooze();
    }
}

/// A submitted operation of the `mpi` backend.
pub(crate) struct MpiPending {
    pub(crate) shared: Arc<Shared>,
    pub(crate) cell: Arc<Cell>,
}

impl Pending for MpiPending {
    fn wait(&self, timeout: Option<Duration>) -> Option<Result<Completion>> {
        wait_cell(&self.shared, &self.cell, timeout)
    }

    fn is_completed(&self) -> bool {
        if self.cell.result().is_some() {
            return true;
        }
        self.shared.poll();
        self.cell.result().is_some()
    }
}
