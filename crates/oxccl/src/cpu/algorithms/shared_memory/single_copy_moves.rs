//! Large moves by single-copy reads: broadcast, all_gather, all_to_all and scatter where
//! every rank may read the others' memory ([`single_copy`]). Each rank publishes the
//! address of its source with its arrival; after every rank arrived, each reads what it
//! needs straight from the peers' buffers into its output (one copy per byte, by the
//! kernel, where the slots take two), then publishes `done`. A rank whose buffer others
//! read returns only when they all are done with it.
//!
//! Cost: two synchronizations and `n − 1` reads (`process_vm_readv`: a system call and the
//! peer's pages pinned, then memory speed) per rank; the slots' chunked copies stay cheaper
//! below [`SINGLE_COPY_FROM`] per read, and below more where several ranks read the same
//! source at once ([`reads_directly`]: a broadcast reads directly only between two ranks).
//!
//! A broadcast's root has nothing to read: in place, from [`ROOT_SHARE_FROM`] up, it writes
//! the last `1/n` of the buffer into every peer (`process_vm_writev`) while they read the
//! rest, so the root's core copies too. Every rank then copies `(n − 1)/n` of the buffer,
//! which halves a 2-rank broadcast's time. Writing into a peer is safe only while the peer
//! cannot return: the root writes into a peer only once it said its buffer is ready (after
//! it passed the arrivals, where it could still fail and leave), and a ready peer returns
//! only after the root's `done`, however long that takes (but not if the root fails or the
//! operation is aborted), then fails if the root reports that its writes failed.
//!
//! Measurements: docs/performance.md.

use std::sync::atomic::Ordering;

use super::{futex, Phase, ShmCollectives, PEER_BUF, PEER_READY, PEER_SPLIT, PEER_STATUS, WRITE_FAILED};
use crate::backend::{RawBuf, RawBufMut};
use crate::cpu::algorithms::Ctx;
use crate::cpu::transport::shm::{copy, single_copy};
use crate::error::{Error, Result};

/// The smallest read, in bytes, that goes through single copy.
const SINGLE_COPY_FROM: usize = 8 << 10;

/// The smallest block, in bytes, that a scatter's peers read from the root directly (see
/// [`reads_directly`]).
const SCATTER_FROM: usize = 64 << 10;

/// The smallest part of a broadcast, in bytes, that its root writes into every peer itself
/// (below, the peers read everything: the root's part would not pay for the peers' wait
/// for its `done`).
const ROOT_SHARE_FROM: usize = 64 << 10;

/// Where a broadcast of `bytes` to `n` ranks splits: the peers read `..head`, the root
/// writes `head..` into each of them. Its part is `1/n` of the buffer, in whole pages.
fn broadcast_head(bytes: usize, n: usize) -> usize {
    let share = bytes / n.max(1) / 4096 * 4096;
    if share >= ROOT_SHARE_FROM {
        bytes - share
    } else {
        bytes
    }
}

/// The moves that may read the peers' buffers directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Move {
    Broadcast,
    AllGather,
    AllToAll,
    Scatter,
}

/// Whether `mv` among `n` ranks, each reading `per_peer` bytes from every peer it reads,
/// reads them by single copy (where the host allows it) rather than through the slots.
/// The kernel's reads of the same pages by several processes at once slow each other down
/// (each pins the pages it reads), so the threshold depends on how many ranks read each
/// source (measured on a 16-core machine: docs/performance.md):
/// - all_to_all, where each rank reads its own part of every source: from
///   [`SINGLE_COPY_FROM`] per peer.
/// - all_gather, where the `n − 1` peers read every block: from `n − 1` times that.
/// - scatter, where the `n − 1` peers each read their own block of the root's input: from
///   [`SCATTER_FROM`] per block, and from 5 ranks up only where the root's input reaches
///   1 MiB. Many readers of small blocks queue behind each other, probably on the root's
///   page-table locks, which the kernel takes for every page it pins (one lock per 2 MiB
///   of the root's address space). Where they pay, the root's core no longer copies every
///   block into its slot while the peers wait.
/// - broadcast, where every peer reads the root's buffer: between two ranks only (there
///   the root also writes a part, see the module documentation). From 3 ranks up the slots
///   were as fast or faster at every size from 8 KiB to 8 MiB.
pub(super) fn reads_directly(mv: Move, n: usize, per_peer: usize) -> bool {
    match mv {
        Move::AllToAll => per_peer >= SINGLE_COPY_FROM,
        Move::Scatter => per_peer >= SCATTER_FROM && (n <= 4 || n * per_peer >= 1 << 20),
        Move::AllGather => per_peer >= SINGLE_COPY_FROM * n.saturating_sub(1).max(1),
        Move::Broadcast => n == 2 && per_peer >= SINGLE_COPY_FROM,
    }
}

/// Whether a scatter among `n` ranks with blocks of `block` bytes has its peers read their
/// blocks from the root directly where the communicator has single copy (the selector
/// prices it so).
pub(crate) fn scatter_reads_directly(n: usize, block: usize) -> bool {
    reads_directly(Move::Scatter, n, block)
}

impl ShmCollectives {
    /// Whether `mv`, reading `per_peer` bytes from each peer, reads them directly (see
    /// [`reads_directly`]).
    pub(super) fn reads_directly(&self, mv: Move, per_peer: usize) -> bool {
        self.single_copy && reads_directly(mv, self.n, per_peer)
    }

    /// Publishes `src` as this rank's source for `step` and arrives.
    fn publish(&self, ctx: &Ctx, src: *const u8) -> u64 {
        self.publish_split(ctx, src, 0)
    }

    /// [`ShmCollectives::publish`] with a broadcast's split (the root's word, see
    /// [`broadcast_head`]).
    fn publish_split(&self, ctx: &Ctx, src: *const u8, split: u64) -> u64 {
        let (step, b) = self.begin(ctx);
        // Read by the peers after they see our arrival (release in `post`).
        self.peer_word(self.me, PEER_BUF + 8 * b).store(src as u64, Ordering::Relaxed);
        self.peer_word(self.me, PEER_SPLIT + 8 * b).store(split, Ordering::Relaxed);
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

    /// Writes `len` bytes from `src` into `rank`'s published buffer of `step`, at offset `at`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes, and nobody may access that part of the
    /// peer's buffer meanwhile.
    unsafe fn write_to(&self, rank: usize, step: u64, at: usize, src: *const u8, len: usize) -> Result<()> {
        let dst = self.peer_word(rank, PEER_BUF + 8 * (step % 2) as usize).load(Ordering::Relaxed);
        let pid = self.peer_pid(rank);
        // SAFETY: forwarded from this function's contract.
        unsafe { single_copy::write(pid, dst + at as u64, src, len) }.map_err(|e| {
            Error::io(format!("writing into rank {rank}'s buffer (process {pid}) by cross-memory attach"), &e)
        })
    }

    /// broadcast from `root` by single-copy reads of the root's buffer, and for large
    /// buffers by the root's writes of their last part (see the module documentation).
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
        // The root splits where it has nothing to copy itself (its input is its output):
        // out of place, copying its own output is already its part.
        let head = if self.me == root && std::ptr::eq(src, output.ptr) { broadcast_head(bytes, self.n) } else { bytes };
        let step = self.publish_split(ctx, src, head as u64);
        if self.me == root && !std::ptr::eq(src, output.ptr) {
            // SAFETY: distinct buffers of `bytes` (contract).
            unsafe { copy::copy_out(src, output.ptr, bytes, copy::streams(bytes, false)) };
        }
        self.wait_all(ctx, Phase::Arrive, step)?;
        // The root's split, the same on every rank (published with its arrival).
        let b = (step % 2) as usize;
        let head = (self.peer_word(root, PEER_SPLIT + 8 * b).load(Ordering::Relaxed) as usize).min(bytes);
        if self.me == root {
            // The peers to write into: every one, where the root takes a part.
            let peers = if head < bytes { 1..self.n } else { 0..0 };
            let wrote = peers.map(|k| (root + k) % self.n).try_for_each(|p| {
                let ready = || self.peer_word(p, PEER_READY + 8 * b).load(Ordering::Acquire) == step;
                self.wait_for(ctx, p, true, ready)?;
                // SAFETY: `src` is valid for `bytes` (contract); peer p said its buffer is
                // ready, and then neither reads nor writes past `head` nor returns until
                // our `done` (below).
                unsafe { self.write_to(p, step, head, src.add(head), bytes - head) }
            });
            let status = if wrote.is_ok() { step } else { step | WRITE_FAILED };
            // Read by the peers after our `done` (release in `post`).
            self.peer_word(root, PEER_STATUS + 8 * b).store(status, Ordering::Relaxed);
            self.post(Phase::Done, step);
            // Our buffer is read until every rank is done.
            let read = self.wait_all(ctx, Phase::Done, step);
            return wrote.and(read);
        }
        if head < bytes {
            // From here on we stay until the root is done with our buffer.
            self.peer_word(self.me, PEER_READY + 8 * b).store(step, Ordering::Release);
            futex::ring(self.doorbell(), self.sleepers());
        }
        // SAFETY: `output` is valid for `bytes` and only this rank writes its first `head`
        // (contract); the root writes the rest, if any.
        let read = unsafe { self.read_from(root, step, 0, output.ptr, head) };
        self.post(Phase::Done, step);
        if head < bytes {
            // No deadline: leaving while the root writes would let its bytes land in memory
            // our caller has reused. It ends if the root fails or the operation is aborted.
            let done = || self.counter(root, Phase::Done, step).load(Ordering::Acquire) >= step;
            self.wait_for(ctx, root, false, done)?;
            if self.peer_word(root, PEER_STATUS + 8 * b).load(Ordering::Relaxed) != step {
                read?;
                return Err(Error::Io {
                    context: format!(
                        "rank {root} writing its part of a broadcast of {bytes} bytes into this rank's buffer by \
                         cross-memory attach"
                    ),
                    kind: std::io::ErrorKind::Other,
                    message: "it failed there, and its own error says why; this rank's buffer is incomplete".into(),
                });
            }
        }
        read
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

    /// scatter from `root` by single-copy reads: each peer reads block p of the root's
    /// `input` into its `output`, in parallel, where the slots have the root copy every
    /// block in first. Only the root's buffer is read, so only the root waits for the
    /// others' `done`.
    ///
    /// # Safety
    /// The buffers must satisfy `Backend::submit`'s contract.
    pub(super) unsafe fn scatter_single_copy(
        &self,
        ctx: &Ctx,
        input: Option<RawBuf>,
        output: RawBufMut,
        root: usize,
    ) -> Result<()> {
        let (me, bytes) = (self.me, output.bytes());
        let src = input.filter(|_| me == root);
        let step = self.publish(ctx, src.map_or(std::ptr::null(), |s| s.ptr));
        if let Some(src) = src {
            // SAFETY: the root's input holds n blocks of `bytes` and is distinct from its
            // output (two borrows, contract).
            unsafe { copy::copy_out(src.ptr.add(me * bytes), output.ptr, bytes, copy::streams(bytes, false)) };
        }
        self.wait_all(ctx, Phase::Arrive, step)?;
        if me == root {
            self.post(Phase::Done, step);
            // Our input is read until every rank is done.
            return self.wait_all(ctx, Phase::Done, step);
        }
        // SAFETY: `output` is valid for `bytes` and only this rank writes it (contract); the
        // root published its input, n blocks of `bytes`, and keeps it until our `done`.
        let read = unsafe { self.read_from(root, step, me * bytes, output.ptr, bytes) };
        self.post(Phase::Done, step);
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_more_ranks_read_a_source_the_larger_a_direct_read_must_be() {
        use Move::*;
        // all_to_all: every rank reads its own part of each source.
        assert!(!reads_directly(AllToAll, 16, SINGLE_COPY_FROM - 1));
        assert!(reads_directly(AllToAll, 16, SINGLE_COPY_FROM));
        // scatter: every peer reads its own block of the root's input, from 5 ranks up
        // only where that input is 1 MiB or more.
        assert!(!reads_directly(Scatter, 3, SCATTER_FROM - 1));
        assert!(reads_directly(Scatter, 3, SCATTER_FROM));
        assert!(reads_directly(Scatter, 4, SCATTER_FROM));
        assert!(!reads_directly(Scatter, 8, SCATTER_FROM));
        assert!(reads_directly(Scatter, 8, 128 << 10));
        assert!(reads_directly(Scatter, 16, SCATTER_FROM));
        assert!(!reads_directly(Scatter, 32, SCATTER_FROM - 1));
        // all_gather: n − 1 readers of every block.
        assert!(reads_directly(AllGather, 2, SINGLE_COPY_FROM));
        assert!(!reads_directly(AllGather, 4, SINGLE_COPY_FROM));
        assert!(!reads_directly(AllGather, 16, 15 * SINGLE_COPY_FROM - 1));
        assert!(reads_directly(AllGather, 16, 15 * SINGLE_COPY_FROM));
        assert!(!reads_directly(AllGather, 1, SINGLE_COPY_FROM - 1));
        // broadcast: two ranks only, whatever the size.
        assert!(reads_directly(Broadcast, 2, SINGLE_COPY_FROM));
        assert!(!reads_directly(Broadcast, 2, SINGLE_COPY_FROM - 1));
        assert!(!reads_directly(Broadcast, 3, 1 << 30));
        assert!(!reads_directly(Broadcast, 16, 1 << 24));
    }

    #[test]
    fn a_broadcasts_root_takes_a_page_aligned_nth_from_its_threshold() {
        // 2 ranks, 1 MiB: the root writes the second half.
        assert_eq!(broadcast_head(1 << 20, 2), 1 << 19);
        // 3 ranks: a third, rounded down to pages; the peers read the rest.
        let bytes = 3 * (100 << 10) + 5;
        assert_eq!(broadcast_head(bytes, 3), bytes - (100 << 10));
        // Below 64 KiB per rank (and one rank) the peers read everything.
        assert_eq!(broadcast_head(128 << 10, 2), 64 << 10);
        assert_eq!(broadcast_head((128 << 10) - 1, 2), (128 << 10) - 1);
        assert_eq!(broadcast_head(1 << 20, 17), 1 << 20);
    }
}
