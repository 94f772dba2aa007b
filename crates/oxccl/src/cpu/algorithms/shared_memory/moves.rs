//! The operations that move data without combining it, in shared memory: broadcast,
//! all_gather, all_to_all, gather and scatter. Each step, the ranks that have something to
//! give copy it into their slot, every rank arrives, and each rank copies what it needs out
//! of the slots ([`ShmCollectives::in_steps`]): one copy in and one copy out per byte, and
//! one synchronization per chunk whatever the number of ranks.
//!
//! | operation | per step, into the slot | out of the slots |
//! |---|---|---|
//! | broadcast | the root: its chunk | everyone else: the root's slot |
//! | all_gather | everyone: its chunk | everyone: every slot |
//! | all_to_all | everyone: its chunk for every other rank | everyone: its chunk of every slot |
//! | gather | everyone but the root: its chunk | the root: every slot |
//! | scatter | the root: every other rank's chunk | everyone else: its chunk of the root's slot |

use super::ShmCollectives;
use crate::backend::{RawBuf, RawBufMut};
use crate::cpu::algorithms::Ctx;
use crate::cpu::transport::shm::copy;
use crate::error::Result;

impl ShmCollectives {
    /// broadcast from `root`; `input` is the root's source when it is not `output`.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract.
    pub(super) unsafe fn broadcast(
        &self,
        ctx: &Ctx,
        input: Option<RawBuf>,
        output: RawBufMut,
        root: usize,
    ) -> Result<()> {
        let bytes = output.bytes();
        let streaming = bytes >= copy::STREAM_FROM;
        let me = self.me;
        let src = input.map_or(output.ptr as *const u8, |i| i.ptr);
        let copies_out = me != root || input.is_some_and(|i| !std::ptr::eq(i.ptr, output.ptr));
        self.in_steps(
            ctx,
            bytes,
            1,
            |at, c, b| {
                if me == root {
                    // SAFETY: the root's source is valid for `bytes` (contract); our slot
                    // `b` holds at least `c` bytes and is ours until we arrive.
                    unsafe { copy::copy_cached(src.add(at), self.slot_ptr(me, b), c) };
                }
            },
            |at, c, b| {
                if copies_out {
                    // SAFETY: the root published its slot with its arrival (acquire in
                    // `wait_all`) and refills it only after our next arrival; `output` is
                    // valid for `bytes` (contract).
                    unsafe { copy::copy_out(self.slot_ptr(root, b), output.ptr.add(at), c, streaming) };
                }
                Ok(())
            },
        )
    }

    /// all_gather: rank p's `input` becomes block p of every rank's `output`.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract.
    pub(super) unsafe fn all_gather(&self, ctx: &Ctx, input: RawBuf, output: RawBufMut) -> Result<()> {
        let bytes = input.bytes();
        let streaming = output.bytes() >= copy::STREAM_FROM;
        let me = self.me;
        // In place, our input is block `me` of the output: it already holds our bytes.
        let in_place = std::ptr::eq(input.ptr, output.ptr.wrapping_add(me * bytes));
        // Out of place, our own block is one copy of `bytes` from a chunk just read: cached
        // stores unless the block itself is large (measurements: docs/performance.md).
        let own_streaming = bytes >= copy::STREAM_FROM;
        self.in_steps(
            ctx,
            bytes,
            1,
            |at, c, b| {
                // SAFETY: `input` is valid for `bytes` (contract); our slot is ours until we
                // arrive.
                unsafe { copy::copy_cached(input.ptr.add(at), self.slot_ptr(me, b), c) };
                if !in_place {
                    // Our own block, while the chunk just read is still in cache (and
                    // before we wait for the others). SAFETY: out of place `input` does not
                    // overlap `output` (two borrows); `output` holds n blocks of `bytes`
                    // and only this rank writes it (contract).
                    unsafe { copy::copy_out(input.ptr.add(at), output.ptr.add(me * bytes + at), c, own_streaming) };
                }
            },
            |at, c, b| {
                for p in (0..self.n).filter(|&p| p != me) {
                    // SAFETY: every rank published its slot with its arrival and refills it
                    // only after our next arrival; `output` holds n blocks of `bytes`
                    // (contract).
                    unsafe { copy::copy_out(self.slot_ptr(p, b), output.ptr.add(p * bytes + at), c, streaming) };
                }
                Ok(())
            },
        )
    }

    /// all_to_all: block q of rank p's `input` becomes block p of rank q's `output`. In
    /// place (`input` is `output`), each step reads its chunk of every block before it
    /// writes the same chunk of every block, so no copy of the input is needed.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract.
    pub(super) unsafe fn all_to_all(&self, ctx: &Ctx, input: RawBuf, output: RawBufMut) -> Result<()> {
        let (n, me) = (self.n, self.me);
        let block = output.bytes() / n;
        let in_place = std::ptr::eq(input.ptr, output.ptr);
        // In place, each chunk lands on lines `fill` read just before (still cached).
        let streaming = copy::streams(output.bytes(), in_place);
        self.in_steps(
            ctx,
            block,
            n,
            |at, c, b| {
                for q in (0..n).filter(|&q| q != me) {
                    // SAFETY: `input` holds n blocks (contract); our slot holds n chunks of
                    // `c` (`in_steps` sizes them) and is ours until we arrive.
                    unsafe { copy::copy_cached(input.ptr.add(q * block + at), self.slot_ptr(me, b).add(q * c), c) };
                }
            },
            |at, c, b| {
                for p in 0..n {
                    let dst = output.ptr.wrapping_add(p * block + at);
                    if p != me {
                        // SAFETY: rank p published chunk `me` of its slot with its arrival;
                        // `output` holds n blocks (contract). In place, this chunk of block p
                        // was read into our slot by `fill` before.
                        unsafe { copy::copy_out(self.slot_ptr(p, b).add(me * c), dst, c, streaming) };
                    } else if !in_place {
                        // SAFETY: distinct buffers (not in place), both valid (contract).
                        unsafe { copy::copy_out(input.ptr.add(me * block + at), dst, c, streaming) };
                    }
                }
                Ok(())
            },
        )
    }

    /// gather to `root`: rank p's `input` becomes block p of the root's `output`.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract.
    pub(super) unsafe fn gather(&self, ctx: &Ctx, input: RawBuf, output: Option<RawBufMut>, root: usize) -> Result<()> {
        let (n, me) = (self.n, self.me);
        let bytes = input.bytes();
        let out = output.filter(|_| me == root);
        let streaming = out.is_some_and(|o| o.bytes() >= copy::STREAM_FROM);
        self.in_steps(
            ctx,
            bytes,
            1,
            |at, c, b| {
                if me != root {
                    // SAFETY: `input` is valid for `bytes`; our slot is ours until we arrive.
                    unsafe { copy::copy_cached(input.ptr.add(at), self.slot_ptr(me, b), c) };
                }
            },
            |at, c, b| {
                let Some(out) = out else { return Ok(()) };
                for p in 0..n {
                    let src = if p == me { input.ptr.wrapping_add(at) } else { self.slot_ptr(p, b) as *const u8 };
                    // SAFETY: rank p published its slot with its arrival; the root's own
                    // chunk comes from its input, a buffer distinct from `out` (the API
                    // takes them as two borrows); `out` holds n blocks (contract).
                    unsafe { copy::copy_out(src, out.ptr.add(p * bytes + at), c, streaming) };
                }
                Ok(())
            },
        )
    }

    /// scatter from `root`: block p of the root's `input` becomes rank p's `output`.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract.
    pub(super) unsafe fn scatter(
        &self,
        ctx: &Ctx,
        input: Option<RawBuf>,
        output: RawBufMut,
        root: usize,
    ) -> Result<()> {
        let (n, me) = (self.n, self.me);
        let bytes = output.bytes();
        let src = input.filter(|_| me == root);
        let streaming = bytes >= copy::STREAM_FROM;
        self.in_steps(
            ctx,
            bytes,
            n,
            |at, c, b| {
                let Some(src) = src else { return };
                for q in (0..n).filter(|&q| q != me) {
                    // SAFETY: the root's input holds n blocks (contract); its slot holds n
                    // chunks of `c` and is its own until it arrives.
                    unsafe { copy::copy_cached(src.ptr.add(q * bytes + at), self.slot_ptr(me, b).add(q * c), c) };
                }
            },
            |at, c, b| {
                let from = match src {
                    Some(src) => src.ptr.wrapping_add(me * bytes + at),
                    None => self.slot_ptr(root, b).wrapping_add(me * c) as *const u8,
                };
                // SAFETY: the root published its slot with its arrival; at the root, input
                // and output are distinct buffers (two borrows); `output` is valid for
                // `bytes` (contract).
                unsafe { copy::copy_out(from, output.ptr.add(at), c, streaming) };
                Ok(())
            },
        )
    }
}
