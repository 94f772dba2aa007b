//! The α-β-γ cost of each algorithm (Hockney's model, as Thakur, Rabenseifner and Gropp
//! use it for MPI's collectives): a message of `m` bytes over a link costs `α + m β`
//! (`β` = 1 / bandwidth); combining `m` bytes costs `m γ`; a local copy `m κ`. `n` ranks,
//! `p` the largest power of two `≤ n`, `L = log2 p`, `e = 1` when `n` is not a power of
//! two (the fold of the halving/doubling algorithms costs two more rounds), `⌈lg n⌉` the
//! rounds of a binomial tree. `m` is [`Op::message_bytes`](crate::backend::Op::message_bytes):
//! the per-rank buffer of all_reduce, reduce, broadcast; the input block of all_gather and
//! gather; the whole input of reduce_scatter and all_to_all; the output of scatter.
//!
//! | operation | algorithm | cost |
//! |---|---|---|
//! | all_reduce | ring | `2(n−1)α + 2(n−1)/n·mβ + (n−1)/n·mγ` |
//! | | recursive_doubling | `(L + 2e)(α + mβ) + (L + e)·mγ` |
//! | | rabenseifner | `(2L + 2e)α + 2(p−1)/p·mβ + (p−1)/p·mγ + e·m(2β + γ)` |
//! | | binomial_tree | `2⌈lg n⌉(α + mβ) + ⌈lg n⌉·mγ` |
//! | all_gather (block b) | ring | `(n−1)(α + bβ)` |
//! | | bruck | `⌈lg n⌉α + (n−1)bβ + n·bκ` (the final rotation) |
//! | reduce_scatter (input m) | ring | `(n−1)α + (n−1)/n·m(β + γ)` |
//! | | recursive_halving | `(L + 2e)α + (p−1)/p·m(β + γ) + e·m(β + γ)` |
//! | broadcast | binomial_tree | `⌈lg n⌉(α + mβ)` |
//! | reduce | binomial_tree | `⌈lg n⌉(α + mβ + mγ)` |
//! | all_to_all (input m) | pairwise | `(n−1)α + (n−1)/n·mβ` |
//! | gather, scatter | linear | `(n−1)α + (n−1)/n·mβ` at the root |
//! | barrier | dissemination | `⌈lg n⌉α` |
//!
//! The shared-memory family pays a step `σ` per chunk (every rank publishes and waits for
//! the others) and local copies instead of messages: all_reduce up to 16 KiB `σ + mκ +
//! (n−1)mγ`, above `2kσ + 2mκ + (n−1)/n·mγ·n/2` with `k` chunks; the block movers `kσ` plus
//! one copy in and one out of the bytes each rank handles.
//!
//! Two refinements price what the rounds above leave out (`o`: a link's CPU time per
//! message when messages stream one way; `c`: the crowd, the host's ranks over its CPUs):
//! - **Work.** A point-to-point algorithm costs at least the messages each rank handles
//!   times `o`, times `c` when the ranks outnumber the CPUs (they take turns).
//! - **One-way operations.** Broadcast, reduce, gather and scatter over point-to-point
//!   never wait for a reply, so back-to-back calls overlap: they cost the busiest rank's
//!   messages (`⌈lg n⌉` for a tree's root, `n−1` for linear) times `o + 2mκ` (copied into
//!   the link and out; `o + mβ` above a chunk, which streams), or the work bound, not
//!   rounds of `α`.
//! - **Crowded rendezvous.** A shared-memory step waits for every rank: when `c > 1` the
//!   ranks must also be switched in and out on every CPU, `σ + 2c·s` per step (`s`: the
//!   profile's switch cost; 3, 4 and 8 ranks on 2 cores measured 2.3, 3.6 and 8.3 µs per
//!   step, with `s` = 0.78 µs). This makes the tree and linear algorithms win the small
//!   rooted operations on such hosts, as measured (a rank that names another root is
//!   still caught: the shared-memory collectives keep a tally of point-to-point frames, see
//!   `algorithms/shared_memory`).

use super::profile::{LinkCost, Profile};
use crate::algorithm::Algorithm;
use crate::fingerprint::OpKind;

/// The shared-memory collectives reduce messages up to this size in one step.
const NATIVE_DIRECT: f64 = 16.0 * 1024.0;

fn lg_ceil(n: usize) -> f64 {
    (usize::BITS - n.saturating_sub(1).leading_zeros()) as f64
}

/// What a price depends on besides the call: the links between the ranks, the machine,
/// the communicator's shared-memory chunk and how crowded its hosts are.
#[derive(Debug, Clone, Copy)]
pub struct Costs<'a> {
    /// The slowest link between two ranks of the communicator.
    pub link: &'a LinkCost,
    /// The machine's measured costs.
    pub profile: &'a Profile,
    /// The chunk size of the shared-memory collectives.
    pub slot: usize,
    /// Ranks per CPU on the most crowded host (above 1: oversubscribed).
    pub crowd: f64,
}

/// Predicted seconds for `algo` running `op` on `bytes` (see the module documentation) over
/// `n` ranks. `None` when the algorithm does not run the operation.
pub fn predict(op: OpKind, algo: Algorithm, n: usize, bytes: usize, costs: &Costs<'_>) -> Option<f64> {
    if n <= 1 {
        return Some(0.0);
    }
    let (link, prof) = (costs.link, costs.profile);
    let nf = n as f64;
    let m = bytes as f64;
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let pf = p as f64;
    let l = pf.log2();
    let e = if p == n { 0.0 } else { 1.0 };
    let lgn = lg_ceil(n);
    let (a, b) = (link.alpha, 1.0 / link.bandwidth);
    let g = 1.0 / prof.reduce;
    let k = 1.0 / prof.copy;
    let crowd = costs.crowd.max(1.0);
    let s = prof.native_step + if costs.crowd > 1.0 { 2.0 * costs.crowd * prof.switch } else { 0.0 };
    let chunks = |per_step: f64| (m / per_step.max(64.0)).ceil().max(1.0);
    let slot = costs.slot.max(4096) as f64;
    // The work bound: `total` messages over the job, each rank's share times `o`, taking
    // turns on crowded CPUs.
    let work = |total: f64| total / nf * link.overhead * crowd;
    // A one-way operation: the busiest rank handles `busiest` messages of `size` bytes
    // (`extra`: per-byte work besides the copies), `total` in all.
    // A message up to a chunk is copied into the link and out without waiting; a larger
    // one streams at the link's bandwidth.
    let one_way = |busiest: f64, total: f64, size: f64, extra: f64| {
        let per_byte = if size <= slot { 2.0 * k } else { b };
        let per = link.overhead + size * (per_byte + extra);
        (busiest * per).max(total / nf * per * crowd)
    };
    // Messages of the halving/doubling algorithms: `rounds` exchanges among p ranks, and
    // the fold of the n - p others (there and back).
    let halving = |rounds: f64| pf * rounds + 2.0 * (nf - pf);
    use Algorithm as A;
    use OpKind as O;
    let t = match (op, algo) {
        (O::AllReduce, A::Ring) => (2.0 * (nf - 1.0) * a + 2.0 * (nf - 1.0) / nf * m * b + (nf - 1.0) / nf * m * g)
            .max(work(2.0 * (nf - 1.0) * nf)),
        (O::AllReduce, A::RecursiveDoubling) => ((l + 2.0 * e) * (a + m * b) + (l + e) * m * g).max(work(halving(l))),
        (O::AllReduce, A::Rabenseifner) => {
            ((2.0 * l + 2.0 * e) * a + 2.0 * (pf - 1.0) / pf * m * b + (pf - 1.0) / pf * m * g + e * m * (2.0 * b + g))
                .max(work(halving(2.0 * l)))
        }
        (O::AllReduce, A::BinomialTree) => (2.0 * lgn * (a + m * b) + lgn * m * g).max(work(2.0 * (nf - 1.0))),
        (O::AllReduce, A::SharedMemory) if m <= NATIVE_DIRECT.min(slot) => s + m * k + (nf - 1.0) * m * g,
        (O::AllReduce, A::SharedMemory) => 2.0 * chunks(slot) * s + 2.0 * m * k + (nf - 1.0) / nf * m * g,
        (O::AllGather, A::Ring) => ((nf - 1.0) * (a + m * b)).max(work(nf * (nf - 1.0))),
        (O::AllGather, A::Bruck) => (lgn * a + (nf - 1.0) * m * b + nf * m * k).max(work(nf * lgn)),
        (O::AllGather, A::SharedMemory) => chunks(slot) * s + (1.0 + nf) * m * k,
        (O::ReduceScatter, A::Ring) => ((nf - 1.0) * a + (nf - 1.0) / nf * m * (b + g)).max(work(nf * (nf - 1.0))),
        (O::ReduceScatter, A::RecursiveHalving) => {
            ((l + 2.0 * e) * a + (pf - 1.0) / pf * m * (b + g) + e * m * (b + g)).max(work(halving(l)))
        }
        (O::ReduceScatter, A::SharedMemory) => chunks(slot) * s + m * k + (nf - 1.0) / nf * m * g,
        (O::Broadcast, A::BinomialTree) => one_way(lgn, nf - 1.0, m, 0.0),
        (O::Broadcast, A::SharedMemory) => chunks(slot) * s + 2.0 * m * k,
        (O::Reduce, A::BinomialTree) => one_way(lgn, nf - 1.0, m, g),
        // The root combines n chunks in one pass: reading n sources costs about n/2
        // two-source reductions.
        (O::Reduce, A::SharedMemory) => chunks(slot) * s + m * k + nf / 2.0 * m * g,
        (O::AllToAll | O::AllToAllV, A::Pairwise) => {
            ((nf - 1.0) * a + (nf - 1.0) / nf * m * b).max(work(nf * (nf - 1.0)))
        }
        (O::AllToAll, A::SharedMemory) => chunks(slot) * s + 2.0 * (nf - 1.0) / nf * m * k,
        (O::Gather, A::Linear) => one_way(nf - 1.0, nf - 1.0, m, 0.0),
        (O::Scatter, A::Linear) => one_way(nf - 1.0, nf - 1.0, m, 0.0),
        (O::Gather | O::Scatter, A::SharedMemory) => chunks(slot) * s + nf * m * k,
        (O::AllGatherV, A::Ring) => ((nf - 1.0) * a + (nf - 1.0) / nf * m * b).max(work(nf * (nf - 1.0))),
        (O::Barrier, A::Dissemination) => (lgn * a).max(work(nf * lgn)),
        (O::Barrier, A::SharedMemory) => s,
        _ => return None,
    };
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(alpha_us: f64, gbps: f64) -> LinkCost {
        LinkCost { alpha: alpha_us * 1e-6, bandwidth: gbps * 1e9, overhead: 0.5e-6 }
    }

    #[test]
    fn costs_follow_the_textbook_shapes() {
        let prof = Profile { tcp: link(10.0, 1.0), ..Profile::default() };
        let costs = Costs { link: &prof.tcp, profile: &prof, slot: 1 << 20, crowd: 1.0 };
        let t = |op, a, n, m| predict(op, a, n, m, &costs).unwrap();
        // Latency terms: rounds times alpha at zero bytes.
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        assert!(close(t(OpKind::AllReduce, Algorithm::Ring, 4, 0), 6.0 * 10e-6));
        assert!(close(t(OpKind::AllReduce, Algorithm::RecursiveDoubling, 4, 0), 2.0 * 10e-6));
        assert!(close(t(OpKind::AllReduce, Algorithm::RecursiveDoubling, 6, 0), 4.0 * 10e-6), "fold: +2 rounds");
        assert!(close(t(OpKind::AllReduce, Algorithm::Rabenseifner, 8, 0), 6.0 * 10e-6));
        assert!(close(t(OpKind::Barrier, Algorithm::Dissemination, 5, 0), 3.0 * 10e-6));
        // Bandwidth terms: the ring moves 2(n-1)/n of the buffer, recursive doubling lg(n) times it.
        let big = 1 << 26;
        assert!(
            t(OpKind::AllReduce, Algorithm::Ring, 8, big) < t(OpKind::AllReduce, Algorithm::RecursiveDoubling, 8, big)
        );
        assert!(t(OpKind::AllReduce, Algorithm::Ring, 8, 8) > t(OpKind::AllReduce, Algorithm::RecursiveDoubling, 8, 8));
        assert_eq!(predict(OpKind::Broadcast, Algorithm::Ring, 4, 8, &costs), None);
        assert_eq!(predict(OpKind::AllReduce, Algorithm::Ring, 1, 1 << 20, &costs), Some(0.0));
        assert_eq!(lg_ceil(1), 0.0);
        assert_eq!(lg_ceil(5), 3.0);
        assert_eq!(lg_ceil(8), 3.0);
    }
}
