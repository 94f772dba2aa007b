//! Which operations the shared-memory collectives run, and how each is dispatched to its
//! moves: through the slots, or by single copy from the peers' buffers.

use super::single_copy_moves::Move;
use super::{Phase, ShmCollectives};
use crate::backend::Op;
use crate::cpu::algorithms::Ctx;
use crate::cpu::transport::shm::copy;
use crate::error::{Error, Result};
use crate::op_kind::OpKind;

/// Chunks up to this size are reduced by every rank (one synchronization per chunk).
const DIRECT: usize = 16 * 1024;

impl ShmCollectives {
    /// Whether `op` runs here: every collective but the `_v` forms, on communicators whose
    /// slots hold at least 64 bytes per rank (the block operations split a slot in n).
    pub fn supports(&self, op: &Op) -> bool {
        self.supports_kind(op.kind())
    }

    /// [`ShmCollectives::supports`] by the operation's kind.
    pub fn supports_kind(&self, op: OpKind) -> bool {
        let blocks_fit = self.slot / self.n >= 64;
        match op {
            OpKind::AllReduce | OpKind::Broadcast | OpKind::Barrier | OpKind::AllGather => true,
            OpKind::Reduce | OpKind::Gather => true,
            OpKind::ReduceScatter | OpKind::AllToAll | OpKind::Scatter => blocks_fit,
            _ => false,
        }
    }

    /// Runs `op` (see [`ShmCollectives::supports`]).
    ///
    /// # Safety
    /// The buffers in `op` must satisfy `Backend::submit`'s contract.
    ///
    /// # Errors
    /// Mismatch, timeout, abort and lost-peer errors.
    pub unsafe fn run(&self, ctx: &Ctx, op: &Op) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            match op {
                Op::AllReduce { input, output, op } => {
                    let (es, total) = (output.dtype.size(), output.count);
                    if total * es <= DIRECT.min(self.slot) {
                        self.all_reduce_direct(ctx, input.ptr, output.ptr, total, output.dtype, *op)
                    } else {
                        let streaming = copy::streams(output.bytes(), std::ptr::eq(input.ptr, output.ptr));
                        self.all_reduce_pipelined(ctx, input.ptr, output.ptr, total, output.dtype, *op, streaming)
                    }
                }
                Op::Barrier => {
                    let (step, _) = self.begin(ctx);
                    self.post(Phase::Arrive, step);
                    self.wait_all(ctx, Phase::Arrive, step)
                }
                Op::Broadcast { input, output, root } if self.reads_directly(Move::Broadcast, output.bytes()) => {
                    self.broadcast_single_copy(ctx, *input, *output, *root)
                }
                Op::Broadcast { input, output, root } => self.broadcast(ctx, *input, *output, *root),
                Op::AllGather { input, output } if self.reads_directly(Move::AllGather, input.bytes()) => {
                    self.all_gather_single_copy(ctx, *input, *output)
                }
                Op::AllGather { input, output } => self.all_gather(ctx, *input, *output),
                Op::AllToAll { input, output }
                    if self.reads_directly(Move::AllToAll, output.bytes() / self.n)
                        && !std::ptr::eq(input.ptr, output.ptr) =>
                {
                    self.all_to_all_single_copy(ctx, *input, *output)
                }
                Op::AllToAll { input, output } => self.all_to_all(ctx, *input, *output),
                Op::Gather { input, output, root } => self.gather(ctx, *input, *output, *root),
                Op::Scatter { input, output, root } if self.reads_directly(Move::Scatter, output.bytes()) => {
                    self.scatter_single_copy(ctx, *input, *output, *root)
                }
                Op::Scatter { input, output, root } => self.scatter(ctx, *input, *output, *root),
                Op::Reduce { input, output, op, root } => self.reduce(ctx, *input, *output, *op, *root),
                Op::ReduceScatter { input, output, op } => self.reduce_scatter(ctx, *input, *output, *op),
                Op::AllGatherV { .. } | Op::AllToAllV { .. } | Op::Batch(_) => {
                    Err(Error::invalid("operation has no shared-memory implementation"))
                }
            }
        }
    }
}
