//! The kinds of operation ([`OpKind`]), as fingerprints, errors, profiles and algorithm
//! choices name them.

use std::fmt;

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
    /// fault-tolerant agreement among the survivors (`agree`, and `shrink` built on it)
    Agree = 15,
}

impl OpKind {
    /// Every op kind, in tag order.
    pub const ALL: [OpKind; 16] = [
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
        OpKind::Agree,
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
            OpKind::Agree => "agree",
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
