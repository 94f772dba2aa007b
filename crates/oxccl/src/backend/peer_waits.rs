//! Time a rank spends waiting for each peer, as a backend that knows it measures it (the
//! `cpu` backend: its receives, and its shared-memory collectives' waits for the last rank
//! to arrive), for the profiler (`OXCCL_PROFILE`) to attribute to operations.
//!
//! Off until the profiler turns it on: a backend looks at one relaxed flag per operation and
//! reads no clock while it is off. On, waits are timed in ticks of the crate's clock (the
//! time-stamp counter where the kernel trusts it: a few ns to read) and kept in ticks; the
//! reader scales them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::clock;

/// Time waited per peer of one communicator on this rank, accumulated, in clock ticks.
#[derive(Debug)]
pub struct PeerWaits {
    on: AtomicBool,
    /// By communicator rank.
    ticks: Box<[AtomicU64]>,
    /// The sum of `ticks`, so a reader that finds it unchanged reads nothing else.
    total: AtomicU64,
}

impl PeerWaits {
    /// Accounts for a communicator of `n` ranks, off.
    pub fn new(n: usize) -> PeerWaits {
        PeerWaits {
            on: AtomicBool::new(false),
            ticks: (0..n).map(|_| AtomicU64::new(0)).collect(),
            total: AtomicU64::new(0),
        }
    }

    /// Starts accounting (the profiler, at the communicator's creation).
    pub fn enable(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    /// Whether waits are being accounted.
    pub fn enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The start of a wait: now, in clock ticks.
    pub fn start() -> u64 {
        clock::now()
    }

    /// Charges the time since `since` (from [`PeerWaits::start`]) to `peer` (a rank out of
    /// range is ignored).
    pub fn add_since(&self, peer: usize, since: u64) {
        self.add_ticks(peer, clock::now().saturating_sub(since));
    }

    /// Charges `ticks` to `peer`.
    pub fn add_ticks(&self, peer: usize, ticks: u64) {
        if let Some(a) = self.ticks.get(peer) {
            a.fetch_add(ticks, Ordering::Relaxed);
            self.total.fetch_add(ticks, Ordering::Relaxed);
        }
    }

    /// Everything waited so far, all peers together, in ticks (a reader that finds it
    /// unchanged need read nothing else).
    pub fn total_ticks(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Ticks waited so far for each peer, by communicator rank.
    pub fn per_peer_ticks(&self) -> Vec<u64> {
        self.ticks.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    }

    /// Nanoseconds in `ticks` of this clock.
    pub fn ns(ticks: u64) -> f64 {
        clock::Scale::now_cached().ns(ticks)
    }

    /// The number of ranks accounted for.
    pub fn len(&self) -> usize {
        self.ticks.len()
    }

    /// Whether the communicator has no ranks (never, for a real one).
    pub fn is_empty(&self) -> bool {
        self.ticks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_add_up_per_peer_and_in_total() {
        let w = PeerWaits::new(3);
        assert!(!w.enabled());
        w.enable();
        assert!(w.enabled());
        w.add_ticks(1, 5000);
        w.add_ticks(2, 7);
        w.add_ticks(1, 1);
        w.add_ticks(9, 1_000_000);
        assert_eq!(w.per_peer_ticks(), [0, 5001, 7]);
        assert_eq!(w.total_ticks(), 5008);
        assert_eq!(w.len(), 3);
        let t0 = PeerWaits::start();
        std::thread::sleep(std::time::Duration::from_millis(20));
        w.add_since(0, t0);
        let ns = PeerWaits::ns(w.per_peer_ticks()[0]);
        assert!((19e6..1e9).contains(&ns), "a 20 ms sleep measured {ns} ns");
    }
}
