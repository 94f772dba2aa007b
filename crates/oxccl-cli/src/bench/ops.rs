//! The benchmarked operations: their names, how a size maps to buffers (as nccl-tests
//! defines it), their bus-bandwidth factors, and one function per operation that runs it once.

use std::fmt;

use oxccl::{BufferMut, Communicator, OpKind, ReduceOp, Result};

use super::elem::BenchElem;

/// An operation `oxccl bench` can measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BenchOp {
    /// `all_reduce`: every rank gets the reduction of every rank's buffer.
    AllReduce,
    /// `all_gather`: every rank gets every rank's block.
    AllGather,
    /// `reduce_scatter`: rank i gets block i of the reduction.
    ReduceScatter,
    /// `broadcast`: every rank gets the root's buffer.
    Broadcast,
    /// `reduce`: the root gets the reduction.
    Reduce,
    /// `all_to_all`: block j of rank i goes to block i of rank j.
    AllToAll,
    /// `gather`: the root gets every rank's block.
    Gather,
    /// `scatter`: rank i gets block i of the root's buffer.
    Scatter,
    /// `send_recv`: a ring exchange, every rank sends to rank+1 and receives from rank−1 in one batch.
    SendRecv,
    /// `barrier`: no data; one row.
    Barrier,
}

impl BenchOp {
    /// Every operation, in the order `oxccl bench all` runs them.
    pub const ALL: [BenchOp; 10] = [
        BenchOp::AllReduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::Broadcast,
        BenchOp::Reduce,
        BenchOp::AllToAll,
        BenchOp::Gather,
        BenchOp::Scatter,
        BenchOp::SendRecv,
        BenchOp::Barrier,
    ];

    /// The name used on the command line, in tables and in JSON.
    pub const fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::AllToAll => "all_to_all",
            BenchOp::Gather => "gather",
            BenchOp::Scatter => "scatter",
            BenchOp::SendRecv => "send_recv",
            BenchOp::Barrier => "barrier",
        }
    }

    /// Parses one operation name (`all_reduce`, also `allreduce` and `all-reduce`) or `all`.
    ///
    /// # Errors
    /// A message listing the accepted names.
    pub fn parse_list(s: &str) -> std::result::Result<Vec<BenchOp>, String> {
        let norm: String = s.trim().to_ascii_lowercase().chars().filter(|c| *c != '_' && *c != '-').collect();
        if norm == "all" {
            return Ok(BenchOp::ALL.to_vec());
        }
        let alias = match norm.as_str() {
            "sendrecv" | "p2p" => Some(BenchOp::SendRecv),
            "alltoall" | "a2a" => Some(BenchOp::AllToAll),
            _ => None,
        };
        alias
            .or_else(|| BenchOp::ALL.into_iter().find(|op| op.name().replace('_', "") == norm))
            .map(|op| vec![op])
            .ok_or_else(|| {
                let names: Vec<_> = BenchOp::ALL.iter().map(|o| o.name()).collect();
                format!("unknown operation `{s}`; expected `all` or one of {}", names.join(", "))
            })
    }

    /// Whether the operation combines values with a reduce op.
    pub const fn is_reduction(self) -> bool {
        matches!(self, BenchOp::AllReduce | BenchOp::ReduceScatter | BenchOp::Reduce)
    }

    /// Whether the operation has a root rank.
    pub const fn is_rooted(self) -> bool {
        matches!(self, BenchOp::Broadcast | BenchOp::Reduce | BenchOp::Gather | BenchOp::Scatter)
    }

    /// Whether the operation has an in-place form that is measured too.
    pub const fn has_in_place(self) -> bool {
        matches!(
            self,
            BenchOp::AllReduce
                | BenchOp::AllGather
                | BenchOp::ReduceScatter
                | BenchOp::Broadcast
                | BenchOp::Reduce
                | BenchOp::AllToAll
        )
    }

    /// Whether the operation's total count must be a multiple of the number of ranks
    /// (one equal block per rank).
    pub const fn is_blocked(self) -> bool {
        matches!(
            self,
            BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::AllToAll | BenchOp::Gather | BenchOp::Scatter
        )
    }

    /// Bus bandwidth over algorithm bandwidth for `n` ranks (see DESIGN.md, "How we measure"):
    /// all_reduce 2(n−1)/n; all_gather, reduce_scatter, all_to_all (n−1)/n; the others 1.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::AllToAll => (n - 1.0) / n,
            _ => 1.0,
        }
    }

    /// The total element count measured for a size of `bytes` (as nccl-tests defines it: the
    /// larger of a rank's send and receive buffers, e.g. all_gather's output): `bytes / elem`,
    /// rounded down to a multiple of `n` where each rank owns one block. Barrier: 0.
    pub fn count_for(self, bytes: usize, elem: usize, n: usize) -> usize {
        let c = bytes / elem.max(1);
        match self {
            BenchOp::Barrier => 0,
            op if op.is_blocked() => c - c % n.max(1),
            _ => c,
        }
    }

    /// The library's operation kind (None for the send/recv exchange, which is not a
    /// collective).
    pub const fn kind(self) -> Option<OpKind> {
        Some(match self {
            BenchOp::AllReduce => OpKind::AllReduce,
            BenchOp::AllGather => OpKind::AllGather,
            BenchOp::ReduceScatter => OpKind::ReduceScatter,
            BenchOp::Broadcast => OpKind::Broadcast,
            BenchOp::Reduce => OpKind::Reduce,
            BenchOp::AllToAll => OpKind::AllToAll,
            BenchOp::Gather => OpKind::Gather,
            BenchOp::Scatter => OpKind::Scatter,
            BenchOp::Barrier => OpKind::Barrier,
            BenchOp::SendRecv => return None,
        })
    }

    /// The bytes the library's algorithm choice looks at for `count` elements of `elem`
    /// bytes ([`Communicator::algorithm_for`]): the output of all_reduce, broadcast and
    /// scatter, the input of the others.
    pub fn message_bytes(self, count: usize, elem: usize, n: usize) -> usize {
        let (input, output) = self.buffer_lens(count, n, Place::OutOfPlace);
        elem * match self {
            BenchOp::AllReduce | BenchOp::Broadcast | BenchOp::Scatter => output,
            _ => input,
        }
    }

    /// The lengths of this rank's (input, output) buffers for `count` elements; in place, the
    /// output is the one buffer and has the length of the larger side.
    pub fn buffer_lens(self, count: usize, n: usize, place: Place) -> (usize, usize) {
        let block = count / n.max(1);
        if place == Place::InPlace {
            return (count, count);
        }
        match self {
            BenchOp::AllGather | BenchOp::Gather => (block, count),
            BenchOp::ReduceScatter | BenchOp::Scatter => (count, block),
            BenchOp::Barrier => (0, 0),
            _ => (count, count),
        }
    }
}

impl fmt::Display for BenchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Out-of-place (separate input and output buffers) or in-place (one buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Separate input and output.
    OutOfPlace,
    /// One buffer is both.
    InPlace,
}

/// One rank's buffers. In place only `output` is used (it starts with the input).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Buffers<T> {
    /// The input (out of place).
    pub input: Vec<T>,
    /// The output, or the one buffer in place.
    pub output: Vec<T>,
}

/// The arguments every operation function takes besides the buffers.
#[derive(Debug, Clone, Copy)]
pub struct OpArgs {
    /// Out of place or in place.
    pub place: Place,
    /// The reduce op of reductions.
    pub redop: ReduceOp,
    /// The root of rooted operations.
    pub root: usize,
}

/// Runs `op` once on `comm` with buffers from [`prepare`](super::check::prepare).
///
/// # Errors
/// The operation's error.
pub fn run<T: BenchElem>(comm: &Communicator, op: BenchOp, b: &mut Buffers<T>, a: &OpArgs) -> Result<()> {
    run_on(comm, op, &b.input, &mut b.output, a)
}

/// Runs `op` once on `comm` with any buffers (host slices, or device buffers for the GPU
/// backends) laid out as [`prepare`](super::check::prepare) lays them out.
///
/// # Errors
/// The operation's error.
pub fn run_on<V: BufferMut + ?Sized>(
    comm: &Communicator,
    op: BenchOp,
    input: &V,
    output: &mut V,
    a: &OpArgs,
) -> Result<()> {
    let root = comm.rank() == a.root;
    match (op, a.place) {
        (BenchOp::AllReduce, Place::OutOfPlace) => comm.all_reduce_into(input, output, a.redop),
        (BenchOp::AllReduce, Place::InPlace) => comm.all_reduce(output, a.redop),
        (BenchOp::AllGather, Place::OutOfPlace) => comm.all_gather(input, output),
        // This rank's block of the one buffer is its input.
        (BenchOp::AllGather, Place::InPlace) => comm.all_gather_in_place(output),
        (BenchOp::ReduceScatter, Place::OutOfPlace) => comm.reduce_scatter(input, output, a.redop),
        // The result is this rank's block.
        (BenchOp::ReduceScatter, Place::InPlace) => comm.reduce_scatter_in_place(output, a.redop),
        (BenchOp::Broadcast, Place::OutOfPlace) => comm.broadcast_into(root.then_some(input), output, a.root),
        (BenchOp::Broadcast, Place::InPlace) => comm.broadcast(output, a.root),
        (BenchOp::Reduce, Place::OutOfPlace) => comm.reduce_into(input, root.then_some(output), a.redop, a.root),
        (BenchOp::Reduce, Place::InPlace) => comm.reduce(output, a.redop, a.root),
        (BenchOp::AllToAll, Place::OutOfPlace) => comm.all_to_all(input, output),
        (BenchOp::AllToAll, Place::InPlace) => comm.all_to_all_in_place(output),
        // Out of place only.
        (BenchOp::Gather, _) => comm.gather(input, root.then_some(output), a.root),
        (BenchOp::Scatter, _) => comm.scatter(root.then_some(input), output, a.root),
        (BenchOp::SendRecv, _) => {
            // The ring exchange: one batch that sends the input to rank+1 and receives from
            // rank−1.
            let (rank, n) = (comm.rank(), comm.world_size());
            let mut batch = comm.batch();
            batch.send(input, (rank + 1) % n, 0)?;
            batch.recv(output, (rank + n - 1) % n, 0)?;
            comm.run_batch(batch).map(drop)
        }
        (BenchOp::Barrier, _) => comm.barrier(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::check::{self, prepare};

    #[test]
    fn names_parse_back() {
        for op in BenchOp::ALL {
            assert_eq!(BenchOp::parse_list(op.name()), Ok(vec![op]));
        }
        assert_eq!(BenchOp::parse_list("AllReduce"), Ok(vec![BenchOp::AllReduce]));
        assert_eq!(BenchOp::parse_list("all-gather"), Ok(vec![BenchOp::AllGather]));
        assert_eq!(BenchOp::parse_list("sendrecv"), Ok(vec![BenchOp::SendRecv]));
        assert_eq!(BenchOp::parse_list("all").map(|v| v.len()), Ok(10));
        let e = BenchOp::parse_list("allreduse").unwrap_err();
        assert!(e.contains("all_reduce") && e.contains("all"), "{e}");
    }

    #[test]
    fn bus_factors_follow_the_design() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(BenchOp::AllReduce.bus_factor(4), 1.5));
        assert!(close(BenchOp::AllReduce.bus_factor(1), 0.0));
        assert!(close(BenchOp::AllGather.bus_factor(4), 0.75));
        assert!(close(BenchOp::ReduceScatter.bus_factor(8), 0.875));
        assert!(close(BenchOp::AllToAll.bus_factor(2), 0.5));
        for op in [BenchOp::Broadcast, BenchOp::Reduce, BenchOp::Gather, BenchOp::Scatter, BenchOp::SendRecv] {
            assert!(close(op.bus_factor(4), 1.0), "{op}");
        }
    }

    #[test]
    fn counts_follow_nccl_tests() {
        assert_eq!(BenchOp::AllReduce.count_for(8, 4, 3), 2);
        assert_eq!(BenchOp::AllReduce.count_for(10, 4, 3), 2);
        assert_eq!(BenchOp::AllGather.count_for(64, 4, 3), 15);
        assert_eq!(BenchOp::AllGather.count_for(8, 4, 3), 0);
        assert_eq!(BenchOp::Scatter.count_for(4096, 2, 4), 2048);
        assert_eq!(BenchOp::Barrier.count_for(4096, 4, 4), 0);
        assert_eq!(BenchOp::AllGather.buffer_lens(12, 3, Place::OutOfPlace), (4, 12));
        assert_eq!(BenchOp::ReduceScatter.buffer_lens(12, 3, Place::OutOfPlace), (12, 4));
        assert_eq!(BenchOp::ReduceScatter.buffer_lens(12, 3, Place::InPlace), (12, 12));
    }

    #[test]
    fn every_op_checks_clean_on_a_local_world() {
        let n = 3;
        let comms = oxccl::Config::new().backend("local").init_world(n).unwrap();
        std::thread::scope(|s| {
            for comm in &comms {
                s.spawn(move || {
                    for op in BenchOp::ALL {
                        for place in [Place::OutOfPlace, Place::InPlace] {
                            if place == Place::InPlace && !op.has_in_place() {
                                continue;
                            }
                            for redop in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Avg] {
                                let a = OpArgs { place, redop, root: 2 };
                                let count = op.count_for(96, 4, n);
                                let mut b = prepare::<f32>(comm, op, count, &a);
                                run(comm, op, &mut b, &a).unwrap();
                                let ctx = check::CheckCtx { op, redop, root: 2, rank: comm.rank(), n, count };
                                assert_eq!(check::count_wrong(&ctx, &b, place), 0, "{op} {place:?} {redop}");
                            }
                        }
                    }
                });
            }
        });
    }
}
