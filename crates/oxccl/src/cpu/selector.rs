//! The default algorithm choice of the CPU backends, by operation, message size and world
//! size. Latency-bound messages take log(n)-round algorithms; bandwidth-bound ones take the
//! ring. Forced choices (per call or `OXCCL_ALGO`) win. A measured α-β cost model replaces
//! these thresholds when the shared-memory and TCP transports arrive.

use crate::algorithm::Algorithm;
use crate::fingerprint::OpKind;

/// Messages up to this many bytes are latency-bound: recursive doubling / Bruck.
pub const SMALL: usize = 16 * 1024;
/// Messages up to this many bytes use Rabenseifner / recursive halving; larger ones the ring.
pub const MEDIUM: usize = 512 * 1024;

/// The algorithm that runs `op` on `bytes` (the per-rank buffer) over `n` ranks.
/// `forced` wins when it is not `Auto` (it has been checked to apply to `op`).
pub fn choose(op: OpKind, bytes: usize, n: usize, forced: Algorithm) -> Algorithm {
    if forced != Algorithm::Auto {
        return forced;
    }
    match op {
        OpKind::AllReduce if bytes <= SMALL || n <= 2 && bytes <= MEDIUM => Algorithm::RecursiveDoubling,
        OpKind::AllReduce if bytes <= MEDIUM => Algorithm::Rabenseifner,
        OpKind::AllReduce => Algorithm::Ring,
        OpKind::AllGather if bytes.saturating_mul(n) <= MEDIUM => Algorithm::Bruck,
        OpKind::AllGather => Algorithm::Ring,
        OpKind::ReduceScatter if bytes <= MEDIUM => Algorithm::RecursiveHalving,
        OpKind::ReduceScatter => Algorithm::Ring,
        other => Algorithm::for_op(other)[0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_to_their_op() {
        for op in OpKind::ALL {
            for bytes in [0, 8, SMALL, SMALL + 1, MEDIUM, MEDIUM + 1, 1 << 26] {
                for n in 1..=9 {
                    let a = choose(op, bytes, n, Algorithm::Auto);
                    assert!(Algorithm::for_op(op).contains(&a), "{op} {bytes} {n} -> {a}");
                }
            }
        }
        assert_eq!(choose(OpKind::AllReduce, 1 << 26, 4, Algorithm::BinomialTree), Algorithm::BinomialTree);
    }
}
