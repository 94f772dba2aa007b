//! The argument checks of the front door, in one room: every operation is built here from
//! raw buffers after its lengths, roots, peers and forced algorithm are checked, shared by
//! the blocking and the async forms. Nothing reaches a backend unchecked, so every backend
//! refuses bad input with the same [`Error::InvalidArgument`] and stays usable.

use super::Communicator;
use crate::algorithm::not_applicable;
use crate::backend::{Backend, Op, RawBuf, RawBufMut};
use crate::error::{Error, Result};
use crate::op_kind::OpKind;
use crate::reduce_op::ReduceOp;

pub(super) fn check_len(what: &str, name: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::invalid(format!("{what}: `{name}` has {got} elements, expected {want}")))
    }
}

impl Communicator {
    pub(super) fn check_rank(&self, what: &str, name: &str, r: usize) -> Result<()> {
        if r < self.world_size() {
            Ok(())
        } else {
            Err(Error::invalid(format!("{what}: {name} {r} is out of range for a world of {}", self.world_size())))
        }
    }

    pub(super) fn check_opts(&self, kind: OpKind) -> Result<()> {
        if self.opts.algorithm.applies_to(kind) {
            Ok(())
        } else {
            Err(not_applicable(kind, self.opts.algorithm))
        }
    }

    /// Every buffer of `op` must be on one device, and one the backend can reach.
    pub(super) fn check_devices(&self, op: &Op) -> Result<()> {
        // No allocation: this runs on every call's latency path.
        let mut first = None;
        let mut other = None;
        op.for_each_buffer(|b| match first {
            None => first = Some(b.device),
            Some(f) if b.device != f && other.is_none() => other = Some(b.device),
            Some(_) => {}
        });
        let Some(first) = first else { return Ok(()) };
        if other.is_none() && first == crate::device::Device::Cpu && self.takes_host {
            return Ok(());
        }
        if let Some(other) = other {
            return Err(Error::invalid(format!(
                "{}: the buffers are on different devices ({first} and {other}); every buffer of one call must be on the same device",
                op.kind()
            )));
        }
        self.backend.check_device(first).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::invalid(format!("{}: {m}", op.kind())),
            e => e,
        })
    }

    pub(super) fn block_count(&self, what: &str, total: usize) -> Result<usize> {
        let n = self.world_size();
        if !total.is_multiple_of(n) {
            return Err(Error::invalid(format!(
                "{what}: {total} elements do not divide into {n} equal blocks (one per rank)"
            )));
        }
        Ok(total / n)
    }

    pub(super) fn op_all_reduce(&self, input: RawBuf, output: RawBufMut, op: ReduceOp) -> Result<Op> {
        check_len("all_reduce", "output", output.count, input.count)?;
        Ok(Op::AllReduce { input, output, op })
    }

    pub(super) fn op_reduce(&self, input: RawBuf, output: Option<RawBufMut>, op: ReduceOp, root: usize) -> Result<Op> {
        self.check_rank("reduce", "root", root)?;
        let output = if self.rank() == root {
            let o = output.ok_or_else(|| Error::invalid("reduce: the root must pass an output buffer"))?;
            check_len("reduce", "output", o.count, input.count)?;
            Some(o)
        } else {
            None
        };
        Ok(Op::Reduce { input, output, op, root })
    }

    pub(super) fn op_broadcast(&self, input: Option<RawBuf>, output: RawBufMut, root: usize) -> Result<Op> {
        self.check_rank("broadcast", "root", root)?;
        let input = if self.rank() == root {
            let i = input.ok_or_else(|| Error::invalid("broadcast: the root must pass an input buffer"))?;
            check_len("broadcast", "input", i.count, output.count)?;
            Some(i)
        } else {
            None
        };
        Ok(Op::Broadcast { input, output, root })
    }

    pub(super) fn op_all_gather(&self, input: RawBuf, output: RawBufMut) -> Result<Op> {
        check_len("all_gather", "output", output.count, input.count.saturating_mul(self.world_size()))?;
        Ok(Op::AllGather { input, output })
    }

    /// In-place all_gather: this rank's input is its block of `buf`.
    pub(super) fn op_all_gather_in_place(&self, buf: RawBufMut) -> Result<Op> {
        let c = self.block_count("all_gather_in_place", buf.count)?;
        let input =
            RawBuf { ptr: buf.ptr.wrapping_add(self.rank() * c * buf.dtype.size()), count: c, ..buf.as_const() };
        self.op_all_gather(input, buf)
    }

    /// In-place reduce_scatter: the output is this rank's block of `buf`.
    pub(super) fn op_reduce_scatter_in_place(&self, buf: RawBufMut, op: ReduceOp) -> Result<Op> {
        let c = self.block_count("reduce_scatter_in_place", buf.count)?;
        let output = RawBufMut { ptr: buf.ptr.wrapping_add(self.rank() * c * buf.dtype.size()), count: c, ..buf };
        self.op_reduce_scatter(buf.as_const(), output, op)
    }

    pub(super) fn op_reduce_scatter(&self, input: RawBuf, output: RawBufMut, op: ReduceOp) -> Result<Op> {
        check_len("reduce_scatter", "input", input.count, output.count.saturating_mul(self.world_size()))?;
        Ok(Op::ReduceScatter { input, output, op })
    }

    pub(super) fn op_all_to_all(&self, input: RawBuf, output: RawBufMut) -> Result<Op> {
        check_len("all_to_all", "output", output.count, input.count)?;
        self.block_count("all_to_all", input.count)?;
        Ok(Op::AllToAll { input, output })
    }

    pub(super) fn op_all_gather_v(&self, input: RawBuf, output: RawBufMut, counts: &[usize]) -> Result<Op> {
        check_len("all_gather_v", "counts", counts.len(), self.world_size())?;
        check_len("all_gather_v", "input", input.count, counts[self.rank()])?;
        let total = counts.iter().try_fold(0usize, |a, &c| a.checked_add(c));
        let total = total.ok_or_else(|| Error::invalid("all_gather_v: the counts overflow"))?;
        check_len("all_gather_v", "output", output.count, total)?;
        Ok(Op::AllGatherV { input, output, counts: counts.to_vec() })
    }

    pub(super) fn op_all_to_all_v(&self, input: RawBuf, sc: &[usize], output: RawBufMut, rc: &[usize]) -> Result<Op> {
        let n = self.world_size();
        check_len("all_to_all_v", "send_counts", sc.len(), n)?;
        check_len("all_to_all_v", "recv_counts", rc.len(), n)?;
        let sum = |v: &[usize]| v.iter().try_fold(0usize, |a, &c| a.checked_add(c));
        let (s, r) = match (sum(sc), sum(rc)) {
            (Some(s), Some(r)) => (s, r),
            _ => return Err(Error::invalid("all_to_all_v: the counts overflow")),
        };
        check_len("all_to_all_v", "input (sum of send_counts)", input.count, s)?;
        check_len("all_to_all_v", "output (sum of recv_counts)", output.count, r)?;
        let me = self.rank();
        if sc[me] != rc[me] {
            return Err(Error::invalid(format!(
                "all_to_all_v: this rank sends {} elements to itself but expects {}",
                sc[me], rc[me]
            )));
        }
        Ok(Op::AllToAllV { input, send_counts: sc.to_vec(), output, recv_counts: rc.to_vec() })
    }

    pub(super) fn op_gather(&self, input: RawBuf, output: Option<RawBufMut>, root: usize) -> Result<Op> {
        self.check_rank("gather", "root", root)?;
        let output = if self.rank() == root {
            let o = output.ok_or_else(|| Error::invalid("gather: the root must pass an output buffer"))?;
            check_len("gather", "output", o.count, input.count.saturating_mul(self.world_size()))?;
            Some(o)
        } else {
            None
        };
        Ok(Op::Gather { input, output, root })
    }

    pub(super) fn op_scatter(&self, input: Option<RawBuf>, output: RawBufMut, root: usize) -> Result<Op> {
        self.check_rank("scatter", "root", root)?;
        let input = if self.rank() == root {
            let i = input.ok_or_else(|| Error::invalid("scatter: the root must pass an input buffer"))?;
            check_len("scatter", "input", i.count, output.count.saturating_mul(self.world_size()))?;
            Some(i)
        } else {
            None
        };
        Ok(Op::Scatter { input, output, root })
    }

    pub(super) fn p2p_peer(&self, what: &str, peer: usize) -> Result<()> {
        self.check_rank(what, "peer", peer)
    }
}
