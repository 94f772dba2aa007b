//! Large moves by single-copy reads: broadcast, all_gather and all_to_all where every rank
//! may read the others' memory ([`single_copy`]). Each rank publishes the address of its
//! source with its arrival; after every rank arrived, each reads what it needs straight
//! from the peers' buffers into its output (one copy per byte, by the kernel, where the
//! slots take two), then publishes `done`. A rank whose buffer others read returns only
//! when they all are done with it.
//!
//! Cost: two synchronizations and `n − 1` reads (`process_vm_readv`: a system call and the
//! peer's pages pinned, about 1–2 µs, then memory speed) per rank; the slots' chunked
//! copies stay cheaper below [`SINGLE_COPY_FROM`] per read.

use std::sync::atomic::Ordering;

use super::{Phase, ShmCollectives, PEER_BUF};
use crate::backend::{RawBuf, RawBufMut};
use crate::cpu::algorithms::Ctx;
use crate::cpu::transport::shm::{copy, single_copy};
use crate::error::{Error, Result};

/// The smallest read, in bytes, that goes through single copy.
const SINGLE_COPY_FROM: usize = 8 << 10;

impl ShmCollectives {
    /// Whether a move that reads `per_peer` bytes from each peer reads them directly.
    pub(super) fn reads_directly(&self, per_peer: usize) -> bool {
        self.single_copy && per_peer >= SINGLE_COPY_FROM
    }

    /// Publishes `src` as this rank's source for `step` and arrives.
    fn publish(&self, ctx: &Ctx, src: *const u8) -> u64 {
        let (step, b) = self.begin(ctx);
        // Read by the peers after they see our arrival (release in `post`).
        self.peer_word(self.me, PEER_BUF + 8 * b).store(src as u64, Ordering::Relaxed);
        self.post(Phase::Arrive, step);
        step
    }

    /// Reads `len` bytes at offset `at` of `rank`'s source of `step` into `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes that nobody else accesses meanwhile.
    unsafe fn read_from(&self, rank: usize, step: u64, at: usize, dst: *mut u8, len: usize) -> Result<()> {
        let src = self.peer_word(rank, PEER_BUF + 8 * (step % 2) as usize).load(Ordering::Relaxed);
        let pid = self.peer_pid(rank);
        // SAFETY: forwarded from this function's contract.
        unsafe { single_copy::read(pid, src + at as u64, dst, len) }
            .map_err(|e| Error::io(format!("reading rank {rank}'s buffer (process {pid}) by cross-memory attach"), &e))
    }

    /// broadcast from `root` by single-copy reads of the root's buffer.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract.
    pub(super) unsafe fn broadcast_single_copy(
        &self,
        ctx: &Ctx,
        input: Option<RawBuf>,
        output: RawBufMut,
        root: usize,
    ) -> Result<()> {
        let bytes = output.bytes();
        let src = input.map_or(output.ptr as *const u8, |i| i.ptr);
        let step = self.publish(ctx, src);
        if self.me == root && !std::ptr::eq(src, output.ptr) {
            // SAFETY: distinct buffers of `bytes` (contract).
            unsafe { copy::copy_out(src, output.ptr, bytes, copy::streams(bytes, false)) };
        }
        self.wait_all(ctx, Phase::Arrive, step)?;
        if self.me != root {
            // SAFETY: `output` is valid for `bytes` and only this rank writes it (contract).
            unsafe { self.read_from(root, step, 0, output.ptr, bytes)? };
        }
        self.post(Phase::Done, step);
        if self.me == root {
            // Our buffer is read until every rank is done.
            self.wait_all(ctx, Phase::Done, step)?;
        }
        Ok(())
    }

    /// all_gather by single-copy reads: rank p's `input` becomes block p of every output.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract.
    pub(super) unsafe fn all_gather_single_copy(&self, ctx: &Ctx, input: RawBuf, output: RawBufMut) -> Result<()> {
        let (n, me, bytes) = (self.n, self.me, input.bytes());
        let step = self.publish(ctx, input.ptr);
        // In place, our input is block `me` of the output already.
        if !std::ptr::eq(input.ptr, output.ptr.wrapping_add(me * bytes)) {
            // SAFETY: out of place, `input` and `output` do not overlap (two borrows); the
            // output holds n blocks of `bytes` (contract).
            unsafe { copy::copy_out(input.ptr, output.ptr.add(me * bytes), bytes, copy::streams(bytes, false)) };
        }
        self.wait_all(ctx, Phase::Arrive, step)?;
        // Starting at the next rank spreads the readers over the sources.
        for p in (1..n).map(|k| (me + k) % n) {
            // SAFETY: block p of `output` is valid (contract) and only this rank writes it;
            // in place, peers read only our block `me`.
            unsafe { self.read_from(p, step, 0, output.ptr.add(p * bytes), bytes)? };
        }
        self.post(Phase::Done, step);
        self.wait_all(ctx, Phase::Done, step)
    }

    /// all_to_all out of place by single-copy reads: block q of rank p's `input` becomes
    /// block p of rank q's `output`.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract, and must not be the same.
    pub(super) unsafe fn all_to_all_single_copy(&self, ctx: &Ctx, input: RawBuf, output: RawBufMut) -> Result<()> {
        let (n, me) = (self.n, self.me);
        let block = output.bytes() / n;
        let step = self.publish(ctx, input.ptr);
        // SAFETY: distinct buffers of n blocks (contract).
        unsafe { copy::copy_out(input.ptr.add(me * block), output.ptr.add(me * block), block, false) };
        self.wait_all(ctx, Phase::Arrive, step)?;
        for p in (1..n).map(|k| (me + k) % n) {
            // SAFETY: block p of `output` is valid (contract) and only this rank writes it.
            unsafe { self.read_from(p, step, me * block, output.ptr.add(p * block), block)? };
        }
        self.post(Phase::Done, step);
        self.wait_all(ctx, Phase::Done, step)
    }
}
