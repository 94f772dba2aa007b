//! all_reduce in shared memory: one step for small messages (every rank reduces every
//! slot), chunked and pipelined reduce-scatter-then-gather for large ones (see the
//! module documentation of [`super`]).

use super::{Phase, ShmCollectives, INLINE, RESULT};
use crate::backend::reduce::reduce_sources;
use crate::cpu::algorithms::{block_bytes, Ctx};
use crate::cpu::transport::shm::copy;
use crate::dtype::DType;
use crate::error::Result;
use crate::reduce_op::ReduceOp;

impl ShmCollectives {
    /// A small all_reduce in one step: every rank copies its input into its slot and reduces
    /// all slots itself (one synchronization).
    ///
    /// # Safety
    /// `input` and `output` (may be equal) must be valid for `count` elements of `dtype`,
    /// with `count * dtype.size() <= self.slot`.
    pub(super) unsafe fn all_reduce_direct(
        &self,
        ctx: &Ctx,
        input: *const u8,
        output: *mut u8,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let bytes = count * dtype.size();
        let (step, b) = self.begin(ctx);
        // Tiny payloads travel in the inline area beside the arrival, the others in the slot.
        let area = |p: usize| if bytes <= INLINE { self.inline_ptr(p, b) } else { self.slot_ptr(p, b) };
        // SAFETY: our area (inline: INLINE >= bytes; slot: `self.slot >= bytes`) is ours
        // until we post.
        unsafe { copy::copy_cached(input, area(self.me), bytes) };
        self.post(Phase::Arrive, step);
        self.wait_all(ctx, Phase::Arrive, step)?;
        // SAFETY: every rank posted `arrive = step` after filling its slot (release/acquire),
        // and nobody rewrites a slot of this step before every rank arrived at `step + 1`.
        let src = |p: usize| unsafe { std::slice::from_raw_parts(area(p) as *const u8, bytes) };
        // SAFETY: `output` is valid for `bytes` and not aliased by the slots.
        let out = unsafe { std::slice::from_raw_parts_mut(output, bytes) };
        // The sources on the stack for the usual world sizes: no allocation on this path.
        const ON_STACK: usize = 16;
        if self.n <= ON_STACK {
            let mut srcs: [&[u8]; ON_STACK] = [&[]; ON_STACK];
            for (p, s) in srcs.iter_mut().enumerate().take(self.n) {
                *s = src(p);
            }
            reduce_sources(dtype, op, &srcs[..self.n], out)
        } else {
            let srcs: Vec<&[u8]> = (0..self.n).map(src).collect();
            reduce_sources(dtype, op, &srcs, out)
        }
    }

    /// A large all_reduce, chunk by chunk, each chunk reduce-scattered (rank r reduces
    /// sub-block r) then gathered, with the copy-in of chunk s+1 overlapping the wait for
    /// chunk s (see the module's documentation). `streaming` writes the result with
    /// cache-bypassing stores.
    ///
    /// # Safety
    /// `input` and `output` (may be equal) must be valid for `total` elements of `dtype`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn all_reduce_pipelined(
        &self,
        ctx: &Ctx,
        input: *const u8,
        output: *mut u8,
        total: usize,
        dtype: DType,
        op: ReduceOp,
        streaming: bool,
    ) -> Result<()> {
        let es = dtype.size();
        let chunk = (self.slot / es).max(1);
        // The chunk reduced but not yet copied out: (step, first element, count).
        let mut pending: Option<(u64, usize, usize)> = None;
        // The reduction's sources, refilled for every chunk.
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(self.n);
        let mut at = 0;
        while at < total {
            let count = chunk.min(total - at);
            let bytes = count * es;
            let mine = block_bytes(count, self.n, self.me, es);
            let (step, b) = self.begin(ctx);
            // SAFETY: `input` is valid for `total` elements (contract); our slot `b` was last
            // read by the peers at step - 2, before they published `done = step - 2`, which
            // we waited for at step - 1. Our own sub-block is never read from the slot.
            unsafe {
                let (src, slot) = (input.add(at * es), self.slot_ptr(self.me, b));
                copy::copy_cached(src, slot, mine.start);
                copy::copy_cached(src.add(mine.end), slot.add(mine.end), bytes - mine.end);
            }
            self.post(Phase::Arrive, step);
            if let Some(prev) = pending.take() {
                // SAFETY: forwarded from this function's contract.
                unsafe { self.all_reduce_copy_out(ctx, prev, output, es, streaming)? };
            }
            self.wait_all(ctx, Phase::Arrive, step)?;
            // SAFETY: (the slices below) every rank published `arrive = step` after filling its
            // slot (release/acquire), and rewrites it only at step + 2, after we publish
            // `done = step`. `input` stays unwritten in this range until the copy-out of
            // this chunk (an in-place `output` is written only after the reduction).
            srcs.clear();
            // SAFETY: as argued above.
            srcs.extend((0..self.n).map(|p| unsafe {
                if p == self.me {
                    std::slice::from_raw_parts(input.add(at * es + mine.start), mine.len())
                } else {
                    std::slice::from_raw_parts(self.slot_ptr(p, b).add(mine.start), mine.len())
                }
            }));
            // SAFETY: result area `b` is written only by us; every rank copied step - 2's
            // results out of it before publishing `arrive = step`, which we waited for.
            let result = unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(self.me, RESULT + b), mine.len()) };
            reduce_sources(dtype, op, &srcs, result)?;
            self.post(Phase::Done, step);
            pending = Some((step, at, count));
            at += count;
        }
        match pending {
            // SAFETY: forwarded from this function's contract.
            Some(last) => unsafe { self.all_reduce_copy_out(ctx, last, output, es, streaming) },
            None => Ok(()),
        }
    }

    /// Waits until every rank has reduced its sub-block of the chunk `(step, at, count)` and
    /// copies the chunk's result out to `output`.
    ///
    /// # Safety
    /// `output` must be valid for `(at + count) * es` bytes.
    unsafe fn all_reduce_copy_out(
        &self,
        ctx: &Ctx,
        (step, at, count): (u64, usize, usize),
        output: *mut u8,
        es: usize,
        streaming: bool,
    ) -> Result<()> {
        self.wait_all(ctx, Phase::Done, step)?;
        let area = RESULT + (step % 2) as usize;
        for p in 0..self.n {
            let r = block_bytes(count, self.n, p, es);
            // SAFETY: rank p published its reduced sub-block with `done = step` and rewrites
            // it only after we publish `arrive = step + 2`; `output` is valid (contract).
            unsafe { copy::copy_out(self.slot_ptr(p, area), output.add(at * es + r.start), r.len(), streaming) };
        }
        Ok(())
    }
}
