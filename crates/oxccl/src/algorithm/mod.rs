//! Algorithm names and how users force them (per call, or with `OXCCL_ALGO`).

use std::fmt;

use crate::op_kind::OpKind;

mod overrides;

pub(crate) use overrides::not_applicable;
pub use overrides::AlgorithmOverrides;

/// A collective algorithm. Which ones apply depends on the operation
/// (see [`Algorithm::applies_to`]); [`Algorithm::Auto`] lets oxccl choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Algorithm {
    /// Let the selector choose by message size and world size.
    #[default]
    Auto = 0,
    /// Ring: bandwidth-optimal for large messages (all_reduce, all_gather, reduce_scatter).
    Ring = 1,
    /// Recursive doubling: log(n) rounds exchanging whole buffers (all_reduce).
    RecursiveDoubling = 2,
    /// Rabenseifner: recursive-halving reduce-scatter then recursive-doubling all-gather.
    Rabenseifner = 3,
    /// Binomial tree (broadcast, reduce; all_reduce as reduce then broadcast).
    BinomialTree = 4,
    /// Bruck's all-gather: log(n) rounds for any world size.
    Bruck = 5,
    /// Recursive halving reduce-scatter.
    RecursiveHalving = 6,
    /// Pairwise exchange (all_to_all).
    Pairwise = 7,
    /// Dissemination (barrier).
    Dissemination = 8,
    /// Direct exchange with the root (gather, scatter) or between the pair (send/recv).
    Linear = 9,
    /// Directly in shared memory (all_reduce, broadcast, all_gather, barrier), on `cpu`
    /// communicators whose ranks are all on one host; chosen automatically there.
    SharedMemory = 10,
    /// Shared memory inside each host, TCP between hosts on a fraction of the data
    /// (all_reduce: reduce-scatter in the host, all-reduce across, all-gather in the host),
    /// on `cpu` communicators spanning hosts with the same number of ranks, at least 2, on
    /// each; chosen automatically there where the cost model prefers it.
    Hierarchical = 11,
}

impl Algorithm {
    /// Every algorithm, in tag order.
    pub const ALL: [Algorithm; 12] = [
        Algorithm::Auto,
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::Rabenseifner,
        Algorithm::BinomialTree,
        Algorithm::Bruck,
        Algorithm::RecursiveHalving,
        Algorithm::Pairwise,
        Algorithm::Dissemination,
        Algorithm::Linear,
        Algorithm::SharedMemory,
        Algorithm::Hierarchical,
    ];

    /// The snake_case name used by `OXCCL_ALGO` (`ring`, `recursive_doubling`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Auto => "auto",
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::Rabenseifner => "rabenseifner",
            Algorithm::BinomialTree => "binomial_tree",
            Algorithm::Bruck => "bruck",
            Algorithm::RecursiveHalving => "recursive_halving",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Dissemination => "dissemination",
            Algorithm::Linear => "linear",
            Algorithm::SharedMemory => "shared_memory",
            Algorithm::Hierarchical => "hierarchical",
        }
    }

    /// The algorithm with wire tag `tag`, if any.
    pub fn from_tag(tag: u8) -> Option<Algorithm> {
        Algorithm::ALL.get(tag as usize).copied()
    }

    /// The portable algorithms the CPU backends implement for `op` over any transport
    /// (never includes `Auto`, nor [`Algorithm::SharedMemory`], which needs a single host, nor
    /// [`Algorithm::Hierarchical`], which needs several hosts with several ranks on each).
    pub fn for_op(op: OpKind) -> &'static [Algorithm] {
        use Algorithm::*;
        match op {
            OpKind::AllReduce => &[Ring, RecursiveDoubling, Rabenseifner, BinomialTree],
            OpKind::AllGather => &[Ring, Bruck],
            OpKind::AllGatherV => &[Ring],
            OpKind::ReduceScatter => &[Ring, RecursiveHalving],
            OpKind::Broadcast | OpKind::Reduce => &[BinomialTree],
            OpKind::AllToAll | OpKind::AllToAllV => &[Pairwise],
            OpKind::Gather | OpKind::Scatter => &[Linear],
            OpKind::Barrier => &[Dissemination],
            OpKind::Send | OpKind::Recv | OpKind::Batch => &[Linear],
            OpKind::Split => &[Ring],
            OpKind::Agree => &[Linear],
        }
    }

    /// Whether this algorithm can run `op` (`Auto` applies to everything).
    pub fn applies_to(self, op: OpKind) -> bool {
        match self {
            Algorithm::Auto => true,
            Algorithm::SharedMemory => {
                matches!(
                    op,
                    OpKind::AllReduce
                        | OpKind::Broadcast
                        | OpKind::AllGather
                        | OpKind::Barrier
                        | OpKind::Reduce
                        | OpKind::ReduceScatter
                        | OpKind::AllToAll
                        | OpKind::Gather
                        | OpKind::Scatter
                )
            }
            Algorithm::Hierarchical => op == OpKind::AllReduce,
            a => Algorithm::for_op(op).contains(&a),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_global_and_per_op() {
        let o = AlgorithmOverrides::parse("ring").unwrap();
        assert_eq!(o.for_op(OpKind::AllReduce), Algorithm::Ring);
        assert_eq!(o.for_op(OpKind::Broadcast), Algorithm::Auto, "ring does not apply to broadcast");

        let o = AlgorithmOverrides::parse("all_reduce:rabenseifner, all-gather:bruck,tree").unwrap();
        assert_eq!(o.for_op(OpKind::AllReduce), Algorithm::Rabenseifner);
        assert_eq!(o.for_op(OpKind::AllGather), Algorithm::Bruck);
        assert_eq!(o.for_op(OpKind::Reduce), Algorithm::BinomialTree);
        assert_eq!(o.for_op(OpKind::ReduceScatter), Algorithm::Auto);
    }

    #[test]
    fn parse_errors_name_the_problem() {
        let e = AlgorithmOverrides::parse("all_reduce:bruck").unwrap_err().to_string();
        assert!(e.contains("bruck") && e.contains("all_reduce"), "{e}");
        let e = AlgorithmOverrides::parse("warp_drive").unwrap_err().to_string();
        assert!(e.contains("warp_drive"), "{e}");
        let e = AlgorithmOverrides::parse("allreduce2:ring").unwrap_err().to_string();
        assert!(e.contains("allreduce2"), "{e}");
    }
}
