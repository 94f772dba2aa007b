//! How a waiter polls MPI ([`Backoff`]): spins briefly, then yields, then naps. Used by every
//! wait of the engine and by ULFM's agreements.

use std::time::{Duration, Instant};

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
