//! Collectives that run directly in shared memory, for communicators whose ranks are all on
//! one host: the fast path of the `cpu` backend (algorithm `shared_memory`).
//!
//! Each communicator maps its own segment with, per rank, a control line (`arrive` and
//! `done` step counters, the fingerprint of the operation in progress), two data slots and
//! two result areas. A collective moves through the slots in chunks; each chunk is one
//! *step*, on slot and result area `step % 2`:
//!
//! 1. every rank copies its chunk into its slot and publishes `arrive = step`;
//! 2. once every rank has arrived, small operations are reduced by every rank from all slots
//!    (one synchronization, lowest latency); larger ones are split in n sub-blocks per chunk:
//!    rank r reduces sub-block r (its own part straight from its input, the others' from
//!    their slots) into its result area and publishes `done = step`, and every rank then
//!    copies every reduced sub-block out (bandwidth: each byte is reduced once).
//!
//! All-reduce is pipelined: a rank copies chunk s+1 in and publishes its arrival before it
//! waits for chunk s to be reduced everywhere and copies it out, so a rank that is briefly
//! late (descheduled, say) delays the others less. Every region is double-buffered by step
//! parity, and a region of step s is rewritten at step s+2 only after its owner has seen
//! every rank publish a step that follows their last read of it: no further synchronization
//! is needed. Sources are always combined in rank order, so every
//! rank gets bitwise-identical results. Waits spin, then sleep on a futex; while waiting a
//! rank checks the deadline, aborts, failure notices and lost peers (through the transport)
//! and compares the fingerprints its peers published, so a mismatch is an error, not a hang.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{barrier, block_bytes, broadcast, Ctx};
use crate::backend::reduce::reduce_sources;
use crate::backend::Op;
use crate::cpu::transport::frame::{decode_fp, FP_LEN};
use crate::cpu::transport::shm::copy;
use crate::cpu::transport::shm::futex;
use crate::cpu::transport::shm::segment::{unique_name, Segment};
use crate::cpu::transport::shm::wait::WaitPolicy;
use crate::cpu::transport::{Channel, Stage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::reduce_op::ReduceOp;

const MAGIC: u64 = u64::from_le_bytes(*b"OXSHMCL1");
/// Chunks up to this size are reduced by every rank (one synchronization per chunk).
const DIRECT: usize = 16 * 1024;
const LINE: usize = 128;
/// Per rank: two slots and two result areas (double buffering by step parity).
const REGIONS: usize = 4;
/// The first result area (`RESULT + parity`).
const RESULT: usize = 2;
/// How often a waiting rank looks at the transport for failures and mismatches.
const CHECK_EVERY: Duration = Duration::from_millis(5);

/// The shared-memory collectives of one communicator.
pub struct ShmCollectives {
    seg: Segment,
    n: usize,
    me: usize,
    slot: usize,
    data: usize,
    /// How waits poll and sleep.
    wait: WaitPolicy,
    /// Steps taken so far (the same on every rank).
    step: AtomicU64,
}

/// A fingerprint as the three words of a control line (the wire encoding of `frame`).
fn pack(fp: &Fingerprint) -> [u64; 3] {
    let b = fp.to_bytes();
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[8 * i..8 * i + 8]);
        u64::from_le_bytes(w)
    };
    [word(0), word(1), word(2)]
}

fn unpack(w: [u64; 3]) -> Option<Fingerprint> {
    let mut b = [0u8; FP_LEN];
    for (i, x) in w.iter().enumerate() {
        b[8 * i..8 * i + 8].copy_from_slice(&x.to_le_bytes());
    }
    decode_fp(&b).ok()
}

/// Which step counter a wait looks at.
#[derive(Clone, Copy)]
enum Phase {
    Arrive = 0,
    Done = 1,
}

impl ShmCollectives {
    /// Sets the collectives up, as a collective over `ctx`'s communicator (all ranks on this
    /// host): rank 0 creates the segment, broadcasts its name, everyone maps it, and after a
    /// barrier rank 0 removes the name from /dev/shm. When rank 0 cannot create the segment,
    /// it returns that error and every other rank returns `Ok(None)`.
    ///
    /// # Errors
    /// Segment errors (a /dev/shm that is too small says so) and communication errors.
    pub fn establish(ctx: &Ctx, slot_bytes: usize, wait: WaitPolicy) -> Result<Option<ShmCollectives>> {
        let n = ctx.size();
        let me = ctx.rank();
        let slot = slot_bytes.max(4096).div_ceil(4096) * 4096;
        let data = (LINE * (2 + n)).div_ceil(4096) * 4096;
        let size = data + REGIONS * n * slot;
        let mut name = [0u8; 96];
        let created = if me == 0 {
            let nm = unique_name("coll")?;
            // A failure names the slot size too: it is the setting that decides the size.
            let seg = Segment::create(&nm, size).map_err(|e| match e {
                Error::Io { context, kind, message } => Error::Io {
                    context: format!(
                        "{context} for the shared-memory collectives ({REGIONS} regions x {n} ranks x \
                         OXCCL_SHM_SLOT_BYTES={slot_bytes}; a smaller OXCCL_SHM_SLOT_BYTES needs less)"
                    ),
                    kind,
                    message,
                },
                e => e,
            });
            let len = nm.len().min(name.len());
            if seg.is_ok() {
                name[..len].copy_from_slice(&nm.as_bytes()[..len]);
            }
            Some(seg)
        } else {
            None
        };
        // An empty name tells the others that creation failed.
        broadcast::binomial_tree::run(ctx, &mut name, 0)?;
        let seg = match created {
            Some(seg) => seg?,
            None => {
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                if end == 0 {
                    return Ok(None);
                }
                let nm = std::str::from_utf8(&name[..end]).map_err(|_| Error::invalid("segment name is not UTF-8"))?;
                Segment::open(nm, size)?
            }
        };
        if me == 0 {
            // SAFETY: the header words are inside the fresh mapping, not yet shared.
            unsafe {
                let h = seg.ptr() as *const AtomicU64;
                (*h).store(MAGIC, Ordering::Release);
            }
        }
        let r = barrier::dissemination::run(ctx);
        if me == 0 {
            seg.unlink();
        }
        r?;
        Ok(Some(ShmCollectives { seg, n, me, slot, data, wait, step: AtomicU64::new(0) }))
    }

    fn u64_at(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is an 8-aligned offset inside the control area of the mapping.
        unsafe { &*(self.seg.ptr().add(at) as *const AtomicU64) }
    }

    fn u32_at(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is a 4-aligned offset inside the control area of the mapping.
        unsafe { &*(self.seg.ptr().add(at) as *const AtomicU32) }
    }

    fn doorbell(&self) -> &AtomicU32 {
        self.u32_at(LINE)
    }

    fn sleepers(&self) -> &AtomicU32 {
        self.u32_at(LINE + 4)
    }

    fn counter(&self, rank: usize, phase: Phase) -> &AtomicU64 {
        self.u64_at(LINE * (2 + rank) + 8 * phase as usize)
    }

    /// The fingerprint `rank` published for steps of parity `b`. Double-buffered like the
    /// slots: a rank cannot reach step s+2 (and overwrite) before every rank is past step s.
    fn fp_words(&self, rank: usize, b: usize) -> [&AtomicU64; 3] {
        let base = LINE * (2 + rank) + 16 + 24 * b;
        [self.u64_at(base), self.u64_at(base + 8), self.u64_at(base + 16)]
    }

    /// Region `b` of `rank` (slot 0, slot 1, or result area [`RESULT`] + 0 or 1), as raw memory.
    fn slot_ptr(&self, rank: usize, b: usize) -> *mut u8 {
        // SAFETY: the region lies inside the mapping (size computed in `establish`).
        unsafe { self.seg.ptr().add(self.data + (REGIONS * rank + b) * self.slot) }
    }

    /// Publishes this rank's progress and wakes sleepers.
    fn post(&self, phase: Phase, step: u64) {
        self.counter(self.me, phase).store(step, Ordering::Release);
        futex::ring(self.doorbell(), self.sleepers());
    }

    /// Waits until every rank has reached `step` in `phase`, checking fingerprints,
    /// failures and the deadline.
    fn wait_all(&self, ctx: &Ctx, phase: Phase, step: u64) -> Result<()> {
        let arrived = |p: usize| self.counter(p, phase).load(Ordering::Acquire) >= step;
        let ours = pack(&ctx.fp);
        let r = futex::wait_until(
            self.doorbell(),
            self.sleepers(),
            &self.wait,
            || (0..self.n).all(arrived),
            CHECK_EVERY,
            || {
                for p in (0..self.n).filter(|&p| p != self.me) {
                    if arrived(p) {
                        continue;
                    }
                    let t = ctx.ranks[p];
                    match ctx.transport.probe(t, ctx.comm_id, Channel::Collective, Some(Stage::of_seq(ctx.fp.seq))) {
                        Err(e) => return Err(ctx.map_err(e)),
                        Ok(Some(got)) if got.header.fingerprint != ctx.fp => {
                            return Err(Error::Mismatch { peer: p, ours: ctx.fp, theirs: got.header.fingerprint })
                        }
                        Ok(_) => {}
                    }
                    if Instant::now() >= ctx.deadline {
                        return Err(Error::Timeout {
                            op: ctx.fp.op,
                            seq: ctx.fp.seq,
                            peer: Some(p),
                            waited: ctx.started.elapsed(),
                        });
                    }
                }
                Ok(())
            },
        );
        r?;
        if matches!(phase, Phase::Arrive) {
            for p in 0..self.n {
                let w = self.fp_words(p, (step % 2) as usize).map(|a| a.load(Ordering::Relaxed));
                if w != ours {
                    let theirs = unpack(w).unwrap_or(ctx.fp);
                    return Err(Error::Mismatch { peer: p, ours: ctx.fp, theirs });
                }
            }
        }
        Ok(())
    }

    /// Starts a step: records our fingerprint, returns the step number and slot index.
    fn begin(&self, ctx: &Ctx) -> (u64, usize) {
        let step = self.step.fetch_add(1, Ordering::Relaxed) + 1;
        for (a, v) in self.fp_words(self.me, (step % 2) as usize).iter().zip(pack(&ctx.fp)) {
            a.store(v, Ordering::Relaxed);
        }
        (step, (step % 2) as usize)
    }

    /// Whether `op` runs here.
    pub fn supports(&self, op: &Op) -> bool {
        matches!(op, Op::AllReduce { .. } | Op::Broadcast { .. } | Op::Barrier | Op::AllGather { .. })
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
                    if self.n == 1 {
                        // The sum (or min, max, average...) of one source is the source.
                        if !std::ptr::eq(input.ptr, output.ptr) {
                            copy::copy_cached(input.ptr, output.ptr, total * es);
                        }
                        Ok(())
                    } else if total * es <= DIRECT.min(self.slot) {
                        self.all_reduce_direct(ctx, input.ptr, output.ptr, total, output.dtype, *op)
                    } else {
                        let streaming = output.bytes() >= copy::STREAM_FROM;
                        self.all_reduce_pipelined(ctx, input.ptr, output.ptr, total, output.dtype, *op, streaming)
                    }
                }
                Op::Barrier => {
                    let (step, _) = self.begin(ctx);
                    self.post(Phase::Arrive, step);
                    self.wait_all(ctx, Phase::Arrive, step)
                }
                Op::Broadcast { input, output, root } => {
                    let bytes = output.bytes();
                    let streaming = bytes >= copy::STREAM_FROM;
                    let mut at = 0;
                    loop {
                        let c = self.slot.min(bytes - at);
                        let (step, b) = self.begin(ctx);
                        if self.me == *root {
                            let src = input.map_or(output.ptr as *const u8, |i| i.ptr);
                            copy::copy_cached(src.add(at), self.slot_ptr(self.me, b), c);
                        }
                        self.post(Phase::Arrive, step);
                        self.wait_all(ctx, Phase::Arrive, step)?;
                        if self.me != *root || input.is_some_and(|i| !std::ptr::eq(i.ptr, output.ptr)) {
                            copy::copy_out(self.slot_ptr(*root, b), output.ptr.add(at), c, streaming);
                        }
                        at += c;
                        if at >= bytes {
                            break;
                        }
                    }
                    Ok(())
                }
                Op::AllGather { input, output } => {
                    let bytes = input.bytes();
                    let streaming = output.bytes() >= copy::STREAM_FROM;
                    let mut at = 0;
                    loop {
                        let c = self.slot.min(bytes - at);
                        let (step, b) = self.begin(ctx);
                        copy::copy_cached(input.ptr.add(at), self.slot_ptr(self.me, b), c);
                        self.post(Phase::Arrive, step);
                        self.wait_all(ctx, Phase::Arrive, step)?;
                        for p in 0..self.n {
                            copy::copy_out(self.slot_ptr(p, b), output.ptr.add(p * bytes + at), c, streaming);
                        }
                        at += c;
                        if at >= bytes {
                            break;
                        }
                    }
                    Ok(())
                }
                _ => Err(Error::invalid("operation has no shared-memory implementation")),
            }
        }
    }

    /// A small all_reduce in one step: every rank copies its input into its slot and reduces
    /// all slots itself (one synchronization).
    ///
    /// # Safety
    /// `input` and `output` (may be equal) must be valid for `count` elements of `dtype`,
    /// with `count * dtype.size() <= self.slot`.
    unsafe fn all_reduce_direct(
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
        // SAFETY: our slot has `self.slot >= bytes` bytes and is ours until we post.
        unsafe { copy::copy_cached(input, self.slot_ptr(self.me, b), bytes) };
        self.post(Phase::Arrive, step);
        self.wait_all(ctx, Phase::Arrive, step)?;
        // SAFETY: every rank posted `arrive = step` after filling its slot (release/acquire),
        // and nobody rewrites a slot of this step before every rank arrived at `step + 1`.
        let srcs: Vec<&[u8]> =
            (0..self.n).map(|p| unsafe { std::slice::from_raw_parts(self.slot_ptr(p, b), bytes) }).collect();
        // SAFETY: `output` is valid for `bytes` and not aliased by the slots.
        let out = unsafe { std::slice::from_raw_parts_mut(output, bytes) };
        reduce_sources(dtype, op, &srcs, out)
    }

    /// A large all_reduce, chunk by chunk, each chunk reduce-scattered (rank r reduces
    /// sub-block r) then gathered, with the copy-in of chunk s+1 overlapping the wait for
    /// chunk s (see the module's documentation). `streaming` writes the result with
    /// cache-bypassing stores.
    ///
    /// # Safety
    /// `input` and `output` (may be equal) must be valid for `total` elements of `dtype`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn all_reduce_pipelined(
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::cpu::transport::shm::links::tests::world_with;
    use crate::{bf16, Algorithm, Error, ReduceOp};

    const SLOT: usize = 16 * 1024;

    #[test]
    fn all_reduce_across_chunks_and_phases() {
        for n in [1, 2, 3, 4] {
            world_with(n, 1 << 16, Some(SLOT), |comm| {
                let r = comm.rank() as i64;
                // 0, direct (<= 16 KiB), and several chunks of the two-phase path.
                for count in [0usize, 1, 7, 2048, 2049, 10_000, 100_003] {
                    let mut x: Vec<i64> = (0..count as i64).map(|i| i * (r + 1) - r).collect();
                    comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                    let k = (n * (n + 1) / 2) as i64;
                    let sub = (n * (n - 1) / 2) as i64;
                    assert!(x.iter().enumerate().all(|(i, v)| *v == i as i64 * k - sub), "n={n} count={count}");
                    let input: Vec<f32> = (0..count).map(|i| ((i * 7 + comm.rank()) % 13) as f32).collect();
                    let mut out = vec![0f32; count];
                    comm.all_reduce_into(&input, &mut out, ReduceOp::Max).unwrap();
                    for (i, v) in out.iter().enumerate() {
                        let want = (0..n).map(|q| ((i * 7 + q) % 13) as f32).fold(f32::MIN, f32::max);
                        assert_eq!(*v, want);
                    }
                }
                // Half precision accumulates in f32 and rounds once; Avg divides before rounding.
                let mut h = vec![bf16::from_f32(1.0 + comm.rank() as f32); 5000];
                comm.all_reduce(&mut h, ReduceOp::Avg).unwrap();
                assert!(h.iter().all(|v| v.to_f32() == 1.0 + (n - 1) as f32 / 2.0));
            });
        }
    }

    #[test]
    fn large_operations_stream_their_results() {
        // Above `STREAM_FROM`, results are written with cache-bypassing stores.
        let count = crate::cpu::transport::shm::copy::STREAM_FROM / 4 + 1001;
        for n in [2, 3] {
            world_with(n, 1 << 16, Some(SLOT), |comm| {
                let r = comm.rank();
                let input: Vec<u32> = (0..count as u32).map(|i| i.wrapping_mul(2_654_435_761) ^ r as u32).collect();
                let want: Vec<u32> = (0..count as u32)
                    .map(|i| (0..n as u32).fold(0u32, |a, q| a.wrapping_add(i.wrapping_mul(2_654_435_761) ^ q)))
                    .collect();
                let mut out = vec![0u32; count];
                comm.all_reduce_into(&input, &mut out, ReduceOp::Sum).unwrap();
                assert!(out == want, "out of place, n={n}");
                let mut x = input.clone();
                comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                assert!(x == want, "in place, n={n}");
                let mut b = if r == 1 { input.clone() } else { vec![0; count] };
                comm.broadcast(&mut b, 1).unwrap();
                assert!(b.iter().enumerate().all(|(i, v)| *v == (i as u32).wrapping_mul(2_654_435_761) ^ 1));
                let mut g = vec![0u32; n * count];
                comm.all_gather(&input, &mut g).unwrap();
                for (q, c) in g.chunks(count).enumerate() {
                    assert!(c.iter().enumerate().all(|(i, v)| *v == (i as u32).wrapping_mul(2_654_435_761) ^ q as u32));
                }
            });
        }
    }

    #[test]
    fn results_are_bitwise_identical_on_every_rank() {
        world_with(3, 1 << 16, Some(SLOT), |comm| {
            let mut x: Vec<f32> = (0..50_000).map(|i| ((i * 31 + comm.rank() * 17) % 1000) as f32 / 7.0).collect();
            comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            let mut all = vec![0f32; 3 * x.len()];
            comm.with_algorithm(Algorithm::Ring).all_gather(&x, &mut all).unwrap();
            let (a, rest) = all.split_at(x.len());
            assert!(rest.chunks(x.len()).all(|c| c.iter().zip(a).all(|(p, q)| p.to_bits() == q.to_bits())));
        });
    }

    #[test]
    fn broadcast_all_gather_barrier_and_splits() {
        world_with(4, 1 << 16, Some(SLOT), |comm| {
            let r = comm.rank();
            for root in 0..4 {
                let mut b: Vec<i32> = (0..30_001).map(|i| (i * (r + 1)) as i32).collect();
                comm.broadcast(&mut b, root).unwrap();
                assert!(b.iter().enumerate().all(|(i, v)| *v == (i * (root + 1)) as i32));
            }
            let mut g = vec![0u32; 4 * 9000];
            comm.all_gather(&vec![r as u32; 9000], &mut g).unwrap();
            assert!(g.chunks(9000).enumerate().all(|(p, c)| c.iter().all(|v| *v == p as u32)));
            comm.barrier().unwrap();
            let sub = comm.split(Some((r % 2) as u32), r as i64).unwrap().unwrap();
            let mut s = [r as u8];
            sub.with_algorithm(Algorithm::SharedMemory).all_reduce(&mut s, ReduceOp::Sum).unwrap();
            assert_eq!(s[0] as usize, if r % 2 == 0 { 2 } else { 4 });
        });
    }

    #[test]
    fn mismatch_and_timeout_are_errors_not_hangs() {
        world_with(2, 1 << 16, Some(SLOT), |comm| {
            let mut x = [1.0f32; 4];
            let r = if comm.rank() == 0 { comm.all_reduce(&mut x, ReduceOp::Sum) } else { comm.broadcast(&mut x, 0) };
            assert!(matches!(r, Err(Error::Mismatch { .. })), "rank {}: {r:?}", comm.rank());
        });
        world_with(2, 1 << 16, Some(SLOT), |comm| {
            let c = comm.with_timeout(Duration::from_millis(150));
            if comm.rank() == 0 {
                let r = c.barrier();
                assert!(matches!(r, Err(Error::Timeout { peer: Some(1), .. })), "{r:?}");
            } else {
                std::thread::sleep(Duration::from_millis(400));
            }
        });
    }
}
