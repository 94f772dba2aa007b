//! Collective fingerprints: what each message says it belongs to, so that ranks running
//! different collectives find out (with [`Error::Mismatch`](crate::Error::Mismatch)) instead
//! of hanging or exchanging garbage.

use std::fmt;

use crate::algorithm::Algorithm;
use crate::dtype::DType;
use crate::reduce_op::ReduceOp;

/// The kind of operation, as recorded in fingerprints, errors and profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpKind {
    /// all_reduce
    AllReduce = 0,
    /// reduce to a root
    Reduce = 1,
    /// broadcast from a root
    Broadcast = 2,
    /// all_gather
    AllGather = 3,
    /// all_gather with per-rank counts
    AllGatherV = 4,
    /// reduce_scatter
    ReduceScatter = 5,
    /// all_to_all
    AllToAll = 6,
    /// all_to_all with per-pair counts
    AllToAllV = 7,
    /// gather to a root
    Gather = 8,
    /// scatter from a root
    Scatter = 9,
    /// barrier
    Barrier = 10,
    /// point-to-point send
    Send = 11,
    /// point-to-point receive
    Recv = 12,
    /// a batch of point-to-point sends and receives
    Batch = 13,
    /// communicator split (an all_gather of colors and keys)
    Split = 14,
}

impl OpKind {
    /// Every op kind, in tag order.
    pub const ALL: [OpKind; 15] = [
        OpKind::AllReduce,
        OpKind::Reduce,
        OpKind::Broadcast,
        OpKind::AllGather,
        OpKind::AllGatherV,
        OpKind::ReduceScatter,
        OpKind::AllToAll,
        OpKind::AllToAllV,
        OpKind::Gather,
        OpKind::Scatter,
        OpKind::Barrier,
        OpKind::Send,
        OpKind::Recv,
        OpKind::Batch,
        OpKind::Split,
    ];

    /// The snake_case name (`all_reduce`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::Reduce => "reduce",
            OpKind::Broadcast => "broadcast",
            OpKind::AllGather => "all_gather",
            OpKind::AllGatherV => "all_gather_v",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllToAll => "all_to_all",
            OpKind::AllToAllV => "all_to_all_v",
            OpKind::Gather => "gather",
            OpKind::Scatter => "scatter",
            OpKind::Barrier => "barrier",
            OpKind::Send => "send",
            OpKind::Recv => "recv",
            OpKind::Batch => "batch",
            OpKind::Split => "split",
        }
    }

    /// The op kind with wire tag `tag`, if any.
    pub fn from_tag(tag: u8) -> Option<OpKind> {
        OpKind::ALL.get(tag as usize).copied()
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a collective is: every rank must agree on all of it.
///
/// For the uneven variants (`all_gather_v`, `all_to_all_v`) `count` is what this rank
/// expects from the peer in question, so a peer that sends a different amount is caught too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// Position of the collective on its communicator (0, 1, 2, ...).
    pub seq: u64,
    /// Which collective.
    pub op: OpKind,
    /// Element type.
    pub dtype: DType,
    /// Element count (per rank, as the operation defines it).
    pub count: u64,
    /// The root rank, for rooted collectives.
    pub root: Option<u32>,
    /// The reduce op, for reductions.
    pub reduce: Option<ReduceOp>,
    /// The algorithm that runs it (ranks that chose differently cannot interoperate).
    pub algorithm: Algorithm,
}

impl Fingerprint {
    /// The fingerprint of a split (`Communicator::split`, `new_group`) as collective `seq`:
    /// every rank exchanges its (color, key) pair, two `i64` values.
    pub fn of_split(seq: u64, algorithm: Algorithm) -> Fingerprint {
        Fingerprint { seq, op: OpKind::Split, dtype: DType::I64, count: 2, root: None, reduce: None, algorithm }
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}({} x {}", self.op, self.seq, self.dtype, self.count)?;
        if let Some(r) = self.reduce {
            write!(f, ", {r}")?;
        }
        if let Some(root) = self.root {
            write!(f, ", root {root}")?;
        }
        write!(f, ", {})", self.algorithm)
    }
}
