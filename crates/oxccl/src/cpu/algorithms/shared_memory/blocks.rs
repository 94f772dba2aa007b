//! reduce_scatter and all_gather in place over blocks of any lengths, in shared memory: the
//! two phases inside each host of the hierarchical all_reduce, run by the collectives of a
//! host's ranks ([`ShmCollectives`] set up over them alone). The blocks are the ones the
//! hierarchical algorithm cuts (near-equal, one element apart), so they are the same on a
//! host whose phases run over the shared-memory transport instead.
//!
//! Each step moves chunk `at..at + c` of every block (a block shorter than that moves
//! what it has left, possibly nothing):
//! - **reduce_scatter**: every rank copies its chunk of every block into its slot (chunk q
//!   at `q·c`), every rank arrives, and rank r combines chunk r of every slot, in rank
//!   order, into block r of its buffer. n copies in and n reads per rank and result byte;
//!   its own chunk goes through its slot too, since the result overwrites it.
//! - **all_gather**: every rank copies its chunk of its own block into its slot, every rank
//!   arrives, and each copies every other rank's chunk out into that rank's block.

use std::ops::Range;

use super::ShmCollectives;
use crate::backend::reduce::reduce_sources;
use crate::cpu::algorithms::{Ctx, HostPhases};
use crate::cpu::transport::shm::copy;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::reduce_op::ReduceOp;

/// The part of `block` in the step's chunk `at..at + c` (relative to the block's start).
fn clip(block: &Range<usize>, at: usize, c: usize) -> usize {
    block.len().saturating_sub(at).min(c)
}

/// The longest block (the steps run until it is done), after checking that the `n`
/// blocks lie in `len` bytes.
fn longest(blocks: &[Range<usize>], n: usize, len: usize) -> Result<usize> {
    if blocks.len() != n || blocks.iter().any(|b| b.start > b.end || b.end > len) {
        return Err(Error::Internal(format!("{} blocks {blocks:?} for {n} ranks in {len} bytes", blocks.len())));
    }
    Ok(blocks.iter().map(|b| b.len()).max().unwrap_or(0))
}

impl HostPhases for ShmCollectives {
    /// Combines block r of every rank's contribution into block r of rank r's `buf`
    /// (`blocks[i]`: block i's bytes, the same on every rank; elements of `dtype`, combined
    /// with `op` in rank order). A rank's contribution is its `input` when given (as long
    /// as `buf`: out of place, nothing is copied into `buf` first), else its `buf`. The
    /// other blocks of `buf` are left as they were.
    ///
    /// # Errors
    /// [`Error::Internal`] when the blocks do not fit `buf`, `input` is not as long, or the
    /// blocks are not one per rank; mismatch, timeout, abort and lost-peer errors.
    fn reduce_scatter_blocks(
        &self,
        ctx: &Ctx,
        input: Option<&[u8]>,
        buf: &mut [u8],
        blocks: &[Range<usize>],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let (n, me) = (self.n, self.me);
        let per_block = longest(blocks, n, buf.len())?;
        if input.is_some_and(|i| i.len() != buf.len()) {
            return Err(Error::Internal(format!(
                "an input of {:?} bytes for {} bytes",
                input.map(<[u8]>::len),
                buf.len()
            )));
        }
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(n);
        let base = buf.as_mut_ptr();
        let from: *const u8 = input.map_or(base.cast_const(), <[u8]>::as_ptr);
        self.in_steps(
            ctx,
            per_block,
            n,
            |at, c, b| {
                for (q, block) in blocks.iter().enumerate() {
                    let len = clip(block, at, c);
                    // SAFETY: `block.start + at + len` is inside `buf`, and `input` is as
                    // long (both checked above; `len` clipped to the block); our slot holds
                    // n chunks of `c` and is ours until we arrive. Both are borrowed for
                    // the whole call.
                    unsafe { copy::copy_cached(from.add(block.start + at), self.slot_ptr(me, b).add(q * c), len) };
                }
            },
            |at, c, b| {
                let mine = &blocks[me];
                let len = clip(mine, at, c);
                srcs.clear();
                // SAFETY: every rank published chunk `me` of its slot with its arrival and
                // refills it only after our next arrival; each holds `len` bytes of block
                // `me` (the blocks are the same on every rank). None overlaps `buf`.
                srcs.extend(
                    (0..n).map(|p| unsafe {
                        std::slice::from_raw_parts(self.slot_ptr(p, b).add(me * c) as *const u8, len)
                    }),
                );
                // SAFETY: inside `buf` (as in the fill), and no source aliases it (above);
                // no other reference into `buf` is alive while this one is.
                let dst = unsafe { std::slice::from_raw_parts_mut(base.add(mine.start + at), len) };
                reduce_sources(dtype, op, &srcs, dst)
            },
        )
    }

    /// Copies block r of rank r's `buf` into block r of every rank's `buf` (`blocks`: as
    /// in [`HostPhases::reduce_scatter_blocks`]).
    ///
    /// # Errors
    /// As [`HostPhases::reduce_scatter_blocks`].
    fn all_gather_blocks(&self, ctx: &Ctx, buf: &mut [u8], blocks: &[Range<usize>]) -> Result<()> {
        let (n, me) = (self.n, self.me);
        let per_block = longest(blocks, n, buf.len())?;
        let streaming = buf.len() >= copy::STREAM_FROM;
        let base = buf.as_mut_ptr();
        self.in_steps(
            ctx,
            per_block,
            1,
            |at, c, b| {
                let mine = &blocks[me];
                // SAFETY: inside `buf` (checked by `longest`, clipped to the block); our
                // slot holds `c` bytes and is ours until we arrive.
                unsafe { copy::copy_cached(base.add(mine.start + at), self.slot_ptr(me, b), clip(mine, at, c)) };
            },
            |at, c, b| {
                for (p, block) in blocks.iter().enumerate().filter(|&(p, _)| p != me) {
                    // SAFETY: rank p published its chunk of block p with its arrival and
                    // refills its slot only after our next arrival; the destination is
                    // inside `buf` and is no slot.
                    unsafe {
                        copy::copy_out(self.slot_ptr(p, b), base.add(block.start + at), clip(block, at, c), streaming)
                    };
                }
                Ok(())
            },
        )
    }
}
