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

use super::profile::{LinkCost, Profile};
use crate::algorithm::Algorithm;
use crate::fingerprint::OpKind;

/// The shared-memory collectives reduce messages up to this size in one step.
const NATIVE_DIRECT: f64 = 16.0 * 1024.0;

fn lg_ceil(n: usize) -> f64 {
    (usize::BITS - n.saturating_sub(1).leading_zeros()) as f64
}

/// Predicted seconds for `algo` running `op` on `bytes` (see the module documentation) over
/// `n` ranks whose messages cost `link`; `slot` is the chunk size of the shared-memory
/// collectives. `None` when the algorithm does not run the operation.
pub fn predict(
    op: OpKind,
    algo: Algorithm,
    n: usize,
    bytes: usize,
    link: &LinkCost,
    prof: &Profile,
    slot: usize,
) -> Option<f64> {
    if n <= 1 {
        return Some(0.0);
    }
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
    let s = prof.native_step;
    let chunks = |per_step: f64| (m / per_step.max(64.0)).ceil().max(1.0);
    let slot = slot.max(4096) as f64;
    use Algorithm as A;
    use OpKind as O;
    let t = match (op, algo) {
        (O::AllReduce, A::Ring) => 2.0 * (nf - 1.0) * a + 2.0 * (nf - 1.0) / nf * m * b + (nf - 1.0) / nf * m * g,
        (O::AllReduce, A::RecursiveDoubling) => (l + 2.0 * e) * (a + m * b) + (l + e) * m * g,
        (O::AllReduce, A::Rabenseifner) => {
            (2.0 * l + 2.0 * e) * a + 2.0 * (pf - 1.0) / pf * m * b + (pf - 1.0) / pf * m * g + e * m * (2.0 * b + g)
        }
        (O::AllReduce, A::BinomialTree) => 2.0 * lgn * (a + m * b) + lgn * m * g,
        (O::AllReduce, A::SharedMemory) if m <= NATIVE_DIRECT.min(slot) => s + m * k + (nf - 1.0) * m * g,
        (O::AllReduce, A::SharedMemory) => 2.0 * chunks(slot) * s + 2.0 * m * k + (nf - 1.0) / nf * m * g,
        (O::AllGather, A::Ring) => (nf - 1.0) * (a + m * b),
        (O::AllGather, A::Bruck) => lgn * a + (nf - 1.0) * m * b + nf * m * k,
        (O::AllGather, A::SharedMemory) => chunks(slot) * s + (1.0 + nf) * m * k,
        (O::ReduceScatter, A::Ring) => (nf - 1.0) * a + (nf - 1.0) / nf * m * (b + g),
        (O::ReduceScatter, A::RecursiveHalving) => (l + 2.0 * e) * a + (pf - 1.0) / pf * m * (b + g) + e * m * (b + g),
        (O::ReduceScatter, A::SharedMemory) => chunks(slot) * s + m * k + (nf - 1.0) / nf * m * g,
        (O::Broadcast, A::BinomialTree) => lgn * (a + m * b),
        (O::Broadcast, A::SharedMemory) => chunks(slot) * s + 2.0 * m * k,
        (O::Reduce, A::BinomialTree) => lgn * (a + m * b + m * g),
        (O::Reduce, A::SharedMemory) => chunks(slot) * s + m * k + (nf - 1.0) * m * g,
        (O::AllToAll | O::AllToAllV, A::Pairwise) => (nf - 1.0) * a + (nf - 1.0) / nf * m * b,
        (O::AllToAll, A::SharedMemory) => chunks(slot) * s + 2.0 * (nf - 1.0) / nf * m * k,
        (O::Gather, A::Linear) => (nf - 1.0) * (a + m * b),
        (O::Scatter, A::Linear) => (nf - 1.0) * (a + m * b),
        (O::Gather | O::Scatter, A::SharedMemory) => chunks(slot) * s + nf * m * k,
        (O::AllGatherV, A::Ring) => (nf - 1.0) * a + (nf - 1.0) / nf * m * b,
        (O::Barrier, A::Dissemination) => lgn * a,
        (O::Barrier, A::SharedMemory) => s,
        _ => return None,
    };
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(alpha_us: f64, gbps: f64) -> LinkCost {
        LinkCost { alpha: alpha_us * 1e-6, bandwidth: gbps * 1e9 }
    }

    #[test]
    fn costs_follow_the_textbook_shapes() {
        let prof = Profile::default();
        let l = link(10.0, 1.0);
        let t = |op, a, n, m| predict(op, a, n, m, &l, &prof, 1 << 20).unwrap();
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
        assert_eq!(predict(OpKind::Broadcast, Algorithm::Ring, 4, 8, &l, &prof, 1 << 20), None);
        assert_eq!(predict(OpKind::AllReduce, Algorithm::Ring, 1, 1 << 20, &l, &prof, 1 << 20), Some(0.0));
        assert_eq!(lg_ceil(1), 0.0);
        assert_eq!(lg_ceil(5), 3.0);
        assert_eq!(lg_ceil(8), 3.0);
    }
}
