//! Striping a frame across a peer's connections (`OXCCL_SOCKETS_PER_PEER`, like NCCL's
//! `NCCL_NSOCKS_PERTHREAD`): for links that one TCP stream cannot fill, a large payload is
//! cut into near-equal stripes in order, stripe 0 going behind the header on the first
//! connection (lane 0) and stripe j alone on lane j.
//!
//! Every frame's header travels on lane 0, and the other lanes carry nothing but stripes:
//! so the frames' order is lane 0's, and whoever decodes a header reads its stripes next
//! from every lane (a sender holds lane 0's writer while it writes any lane, so the stripes
//! on each lane come in the order of their headers). Whether a payload is striped follows
//! from its length and the number of lanes, which both ends know (the handshake checks they
//! agree): nothing on the wire says it.
//!
//! [`Stripes`] is how far each stripe of one payload has gone, on the sending side
//! (`writer`) and on the receiving side (`incoming`), so both can stop when a socket is
//! full or empty and resume later.

use std::ops::Range;

use super::options::MAX_LANES;

/// The smallest payload striped (smaller ones gain nothing from more streams).
pub(super) const STRIPE_FROM: usize = 128 * 1024;

/// Most a payload buffer is given before its bytes arrive.
pub(super) const PREALLOC: usize = 64 << 20;

/// How many lanes a payload of `len` bytes travels on, of `lanes`: all of them from
/// [`STRIPE_FROM`] bytes to [`PREALLOC`] (a receiver must hold a striped payload whole
/// before its bytes arrive), else lane 0 alone.
pub(super) fn lanes_for(len: usize, lanes: usize) -> usize {
    if lanes > 1 && (STRIPE_FROM..=PREALLOC).contains(&len) {
        lanes.min(MAX_LANES)
    } else {
        1
    }
}

/// How far each stripe of one payload has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stripes {
    len: usize,
    n: usize,
    /// Bytes of each stripe moved so far.
    done: [usize; MAX_LANES],
}

impl Stripes {
    /// A payload of `len` bytes on `n` lanes (1 to [`MAX_LANES`]), nothing moved yet.
    pub(super) fn new(len: usize, n: usize) -> Stripes {
        Stripes { len, n: n.clamp(1, MAX_LANES), done: [0; MAX_LANES] }
    }

    /// A payload of `len` bytes on the lanes [`lanes_for`] gives it among `lanes`.
    pub(super) fn of(len: usize, lanes: usize) -> Stripes {
        Stripes::new(len, lanes_for(len, lanes))
    }

    /// How many lanes the payload travels on.
    pub(super) fn lanes(&self) -> usize {
        self.n
    }

    /// Stripe `j`'s bytes in the payload.
    pub(super) fn range(&self, j: usize) -> Range<usize> {
        let (base, extra) = (self.len / self.n, self.len % self.n);
        let start = j * base + j.min(extra);
        start..start + base + usize::from(j < extra)
    }

    /// Bytes of stripe `j` moved so far.
    pub(super) fn done(&self, j: usize) -> usize {
        self.done[j]
    }

    /// Records that stripe `j` has moved `at` bytes in all.
    pub(super) fn set_done(&mut self, j: usize, at: usize) {
        self.done[j] = at;
    }

    /// Whether stripe `j` still has bytes to move.
    pub(super) fn pending(&self, j: usize) -> bool {
        j < self.n && self.done[j] < self.range(j).len()
    }

    /// Whether every stripe has moved.
    pub(super) fn complete(&self) -> bool {
        (0..self.n).all(|j| !self.pending(j))
    }

    /// Copies the bytes moved so far of every stripe of `from` (the payload's buffer) to
    /// the same places in `to` (as long).
    pub(super) fn copy_moved(&self, from: &[u8], to: &mut [std::mem::MaybeUninit<u8>]) {
        for j in 0..self.n {
            let r = self.range(j);
            let moved = r.start..r.start + self.done[j];
            for (d, s) in to[moved.clone()].iter_mut().zip(&from[moved]) {
                d.write(*s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_cover_the_payload_in_order() {
        for (len, lanes) in [(STRIPE_FROM, 3), (STRIPE_FROM + 5, 4), (1 << 20, 8), (1 << 20, 2)] {
            let s = Stripes::of(len, lanes);
            assert_eq!(s.lanes(), lanes);
            let mut at = 0;
            for j in 0..lanes {
                let r = s.range(j);
                assert_eq!(r.start, at);
                assert!(r.len() >= len / lanes && r.len() <= len / lanes + 1);
                at = r.end;
            }
            assert_eq!(at, len);
        }
        // Small payloads, payloads beyond what a receiver may hold ahead, and one lane: lane 0.
        for (len, lanes) in [(STRIPE_FROM - 1, 4), (PREALLOC + 1, 4), (1 << 20, 1), (0, 4)] {
            assert_eq!(Stripes::of(len, lanes).lanes(), 1, "{len} {lanes}");
            assert_eq!(Stripes::of(len, lanes).range(0), 0..len);
        }
    }

    #[test]
    fn progress_is_kept_per_stripe() {
        let mut s = Stripes::of(STRIPE_FROM + 1, 2);
        assert!(s.pending(0) && s.pending(1) && !s.pending(2) && !s.complete());
        s.set_done(1, s.range(1).len());
        assert!(s.pending(0) && !s.pending(1));
        s.set_done(0, s.range(0).len());
        assert!(s.complete());
        // An empty payload is complete from the start.
        assert!(Stripes::of(0, 4).complete());
    }
}
