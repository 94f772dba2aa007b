//! Time a rank spends waiting for each peer, as a backend that knows it measures it (the
//! `cpu` backend: its receives, and its shared-memory collectives' waits for the last rank
//! to arrive), for the profiler (`OXCCL_PROFILE`) to attribute to operations.
//!
//! Off until the profiler turns it on: a backend looks at one relaxed flag per operation and
//! reads no clock while it is off.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Nanoseconds waited per peer of one communicator on this rank, accumulated.
#[derive(Debug)]
pub struct PeerWaits {
    on: AtomicBool,
    /// By communicator rank.
    ns: Box<[AtomicU64]>,
    /// The sum of `ns`, so a reader that finds it unchanged reads nothing else.
    total: AtomicU64,
}

impl PeerWaits {
    /// Accounts for a communicator of `n` ranks, off.
    pub fn new(n: usize) -> PeerWaits {
        PeerWaits {
            on: AtomicBool::new(false),
            ns: (0..n).map(|_| AtomicU64::new(0)).collect(),
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

    /// Adds `waited` to `peer` (a rank out of range is ignored).
    pub fn add(&self, peer: usize, waited: Duration) {
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        if let Some(a) = self.ns.get(peer) {
            a.fetch_add(ns, Ordering::Relaxed);
            self.total.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// Everything waited so far, all peers together, nanoseconds.
    pub fn total_ns(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Nanoseconds waited so far for each peer, by communicator rank.
    pub fn per_peer_ns(&self) -> Vec<u64> {
        self.ns.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    }

    /// The number of ranks accounted for.
    pub fn len(&self) -> usize {
        self.ns.len()
    }

    /// Whether the communicator has no ranks (never, for a real one).
    pub fn is_empty(&self) -> bool {
        self.ns.is_empty()
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
        w.add(1, Duration::from_micros(5));
        w.add(2, Duration::from_nanos(7));
        w.add(1, Duration::from_nanos(1));
        w.add(9, Duration::from_secs(1));
        assert_eq!(w.per_peer_ns(), [0, 5001, 7]);
        assert_eq!(w.total_ns(), 5008);
        assert_eq!(w.len(), 3);
    }
}
