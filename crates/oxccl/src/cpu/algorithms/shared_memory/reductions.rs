//! reduce and reduce_scatter in shared memory. Each step, every rank copies the chunks
//! others will combine into its slot, every rank arrives, and the rank that owns a result
//! combines its chunk from every slot, in rank order ([`ShmCollectives::in_steps`]).
//!
//! - **reduce**: every rank but the root copies its chunk in; the root combines n chunks
//!   into its output (n reads and one write per result byte, all at the root).
//! - **reduce_scatter**: rank p copies its chunk of every other rank's block in; rank r
//!   combines block r from every slot into its output. Each result byte is combined once,
//!   by its owner: n − 1 copies in and n reads per rank and result byte, one
//!   synchronization per chunk.
//!
//! Half types accumulate in f32 and round once; `Avg` divides the combined sum by n
//! (both inside [`reduce_sources`]).

use super::ShmCollectives;
use crate::backend::reduce::reduce_sources;
use crate::backend::{RawBuf, RawBufMut};
use crate::cpu::algorithms::Ctx;
use crate::cpu::transport::shm::copy;
use crate::error::Result;
use crate::reduce_op::ReduceOp;

impl ShmCollectives {
    /// reduce to `root`. In place at the root (`output` is `input`), the root's own chunk is
    /// read from its slot, so the output it writes never aliases a source.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract.
    pub(super) unsafe fn reduce(
        &self,
        ctx: &Ctx,
        input: RawBuf,
        output: Option<RawBufMut>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let (n, me) = (self.n, self.me);
        let out = output.filter(|_| me == root);
        let in_place = out.is_some_and(|o| std::ptr::eq(o.ptr, input.ptr));
        let dtype = input.dtype;
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(n);
        self.in_steps(
            ctx,
            input.bytes(),
            1,
            |at, c, b| {
                if me != root || in_place {
                    // SAFETY: `input` is valid for its bytes (contract); our slot is ours
                    // until we arrive.
                    unsafe { copy::copy_cached(input.ptr.add(at), self.slot_ptr(me, b), c) };
                }
            },
            |at, c, b| {
                let Some(out) = out else { return Ok(()) };
                srcs.clear();
                // SAFETY: every other rank published its slot with its arrival and refills
                // it only after our next arrival; our own chunk comes from our slot in
                // place, else from `input`, which then does not overlap `out` (contract).
                srcs.extend((0..n).map(|p| unsafe {
                    let from = if p == me && !in_place { input.ptr.add(at) } else { self.slot_ptr(p, b) as *const u8 };
                    std::slice::from_raw_parts(from, c)
                }));
                // SAFETY: `out` is valid for the input's bytes (contract) and not aliased by
                // any source (above).
                let dst = unsafe { std::slice::from_raw_parts_mut(out.ptr.add(at), c) };
                reduce_sources(dtype, op, &srcs, dst)
            },
        )
    }

    /// reduce_scatter: block r of the combination of every rank's `input` (n blocks)
    /// becomes rank r's `output`. In place (`output` is block r of `input`), our own chunk
    /// is read from our slot; the input's other blocks are left as they were.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract.
    pub(super) unsafe fn reduce_scatter(
        &self,
        ctx: &Ctx,
        input: RawBuf,
        output: RawBufMut,
        op: ReduceOp,
    ) -> Result<()> {
        let (n, me) = (self.n, self.me);
        let block = output.bytes();
        let in_place = std::ptr::eq(output.ptr, input.ptr.wrapping_add(me * block));
        let dtype = output.dtype;
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(n);
        self.in_steps(
            ctx,
            block,
            n,
            |at, c, b| {
                for q in (0..n).filter(|&q| q != me || in_place) {
                    // SAFETY: `input` holds n blocks (contract); our slot holds n chunks of
                    // `c` and is ours until we arrive.
                    unsafe { copy::copy_cached(input.ptr.add(q * block + at), self.slot_ptr(me, b).add(q * c), c) };
                }
            },
            |at, c, b| {
                srcs.clear();
                // SAFETY: every rank published chunk `me` of its slot with its arrival and
                // refills it only after our next arrival; our own chunk comes from our slot
                // in place, else from block `me` of `input`, which then does not overlap
                // `output` (contract).
                srcs.extend((0..n).map(|p| unsafe {
                    let from = if p == me && !in_place {
                        input.ptr.add(me * block + at)
                    } else {
                        self.slot_ptr(p, b).add(me * c) as *const u8
                    };
                    std::slice::from_raw_parts(from, c)
                }));
                // SAFETY: `output` is valid for `block` bytes (contract), aliased by no source.
                let dst = unsafe { std::slice::from_raw_parts_mut(output.ptr.add(at), c) };
                reduce_sources(dtype, op, &srcs, dst)
            },
        )
    }
}
