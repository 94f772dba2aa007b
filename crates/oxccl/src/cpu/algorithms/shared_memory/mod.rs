//! Collectives that run directly in shared memory, for communicators whose ranks are all on
//! one host: the fast path of the `cpu` backend (algorithm `shared_memory`).
//!
//! Each communicator maps its own segment with, per rank, a control block, two data slots
//! and two result areas. The control block holds two *boxes*, one cache line each, one per
//! step parity: the rank's latest `arrive` step of that parity, the fingerprint of its
//! operation, and up to 32 bytes of inline payload (as Open MPI's fastboxes: a tiny
//! all_reduce costs each peer one line fetch, not one for the arrival and one for the data),
//! and a line with its `done` step counter. A collective moves through the slots in chunks;
//! each chunk is one *step*, on slot and result area `step % 2`:
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
//! rank gets bitwise-identical results. Waits spin, poll yielding the CPU, then sleep on a
//! futex ([`WaitPolicy`]); while waiting a rank checks the deadline, aborts, failure notices
//! and lost peers (through the transport) and compares the fingerprints its peers
//! published, so a mismatch is an error, not a hang.
//!
//! The segment also keeps a tally of the frames each rank sent each other rank in the
//! communicator's point-to-point collectives: with every arrival a rank publishes how many
//! it has sent each rank so far (double-buffered by step parity, like the fingerprints, so
//! the sends of its next operation do not show), and each rank counts the frames it took.
//! In a correct program every frame of an operation is taken in that operation, so at
//! every arrival the counts agree;
//! a frame left unread (a broadcast whose ranks named different roots: the one that
//! thought itself the root receives nothing) is a mismatch found at the next step, not a
//! frame that would sit unread under the shared-memory calls that follow.
//!
//! - this file: the segment, the control lines, the step protocol ([`ShmCollectives::in_steps`]);
//! - `all_reduce.rs`: the one-step and the pipelined all_reduce;
//! - `moves.rs`: broadcast, all_gather, all_to_all, gather, scatter;
//! - `single_copy_moves.rs`: the large broadcast, all_gather, all_to_all and scatter by
//!   single-copy reads of the peers' buffers;
//! - `reductions.rs`: reduce, reduce_scatter;
//! - `blocks.rs`: reduce_scatter and all_gather in place over uneven blocks, the phases
//!   inside each host of the hierarchical all_reduce;
//! - `tests.rs`: every operation against a sequential reference.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{barrier, broadcast, Ctx, FrameTally};
use crate::backend::peer_waits::PeerWaits;
use crate::cpu::transport::shm::futex;
use crate::cpu::transport::shm::segment::{unique_name, Segment};
use crate::cpu::transport::shm::single_copy;
use crate::cpu::transport::shm::wait::WaitPolicy;
use crate::cpu::transport::{Channel, Stage, TransportError};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;

mod all_reduce;
mod blocks;
mod moves;
mod reductions;
mod run;
mod single_copy_moves;

pub(crate) use single_copy_moves::scatter_reads_directly;

const MAGIC: u64 = u64::from_le_bytes(*b"OXSHMCL1");
const LINE: usize = 128;
/// Where the control blocks start (after the header line and the doorbell's line).
const CONTROL: usize = 2 * LINE;
/// Bytes of a rank's control block: two boxes of one cache line (one per step parity), each
/// at the start of its own 128-byte pair of lines (an adjacent-line prefetch fetches a
/// line's pair: the box of the other parity would be taken from the peer that is about to
/// write it), the `done` line beside the first box and a spare line beside the second.
const BLOCK: usize = 4 * 64;
/// Distance between a rank's two boxes.
const BOX_STRIDE: usize = 128;
/// Bytes of a box: the arrival, the fingerprint (three words), the inline area.
const BOX: usize = 64;
/// Offset of the inline area in a box.
const BOX_INLINE: usize = 32;
/// Offset of the `done` counter in a control block.
const DONE_AT: usize = BOX;
/// Per rank: two slots and two result areas (double buffering by step parity).
const REGIONS: usize = 4;
/// Bytes of a rank's inline area per parity (all_reduce of this much or less skips the slots).
const INLINE: usize = BOX - BOX_INLINE;
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
    /// Frames of point-to-point collectives sent to each rank (see the module doc).
    sent: Vec<AtomicU64>,
    /// Frames of point-to-point collectives taken from each rank.
    taken: Vec<AtomicU64>,
    /// The first rank a wait found missing at its last check (`usize::MAX`: none), for the
    /// flight recorder's dump of a hang.
    waiting: std::sync::atomic::AtomicUsize,
    /// Offset of the peers' area: a line per rank (see `PEER_*`).
    peers_at: usize,
    /// Whether large moves read straight from the peers' buffers.
    single_copy: bool,
}

/// Words of a rank's line in the peers' area: its process id, the address of its probe
/// word, whether it may read every peer (1) or not (2), the buffer a single-copy step of
/// parity b reads from (`PEER_BUF + 8 b`), and for a single-copy broadcast of parity b:
/// where it splits (`PEER_SPLIT + 8 b`, the root's), that a peer's buffer is ready for the
/// root's writes (`PEER_READY + 8 b`, the step), and whether the root's writes succeeded
/// (`PEER_STATUS + 8 b`, the root's: the step, or the step with [`WRITE_FAILED`]).
const PEER_PID: usize = 0;
const PEER_PROBE: usize = 8;
const PEER_OK: usize = 16;
const PEER_BUF: usize = 24;
const PEER_SPLIT: usize = 40;
const PEER_READY: usize = 56;
const PEER_STATUS: usize = 72;

/// Marks a root's `PEER_STATUS` word when a write into a peer failed.
const WRITE_FAILED: u64 = 1 << 63;

/// The word rank `rank` of process `pid` publishes for its peers' probe (see `establish`).
fn probe_value(pid: u64, rank: usize) -> u64 {
    MAGIC ^ (pid << 16) ^ rank as u64
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
    /// it returns that error and every other rank returns `Ok(None)`. With `single_copy`, the
    /// ranks then find out whether each may read the others' memory (see
    /// [`single_copy`](crate::cpu::transport::shm::single_copy)); large moves read straight
    /// from the peers' buffers where all of them may.
    ///
    /// # Errors
    /// Segment errors (a /dev/shm that is too small says so) and communication errors.
    pub fn establish(
        ctx: &Ctx,
        slot_bytes: usize,
        wait: WaitPolicy,
        single_copy: bool,
    ) -> Result<Option<ShmCollectives>> {
        let n = ctx.size();
        let me = ctx.rank();
        let slot = slot_bytes.max(4096).div_ceil(4096) * 4096;
        let peers_at = (CONTROL + BLOCK * n + 2 * 8 * n * n).div_ceil(LINE) * LINE;
        let data = (peers_at + LINE * n).div_ceil(4096) * 4096;
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
        // An empty name tells the others that creation failed. Where the name cannot reach
        // them (a peer is gone), the segment goes: nobody else will map it.
        if let Err(e) = broadcast::binomial_tree::run(ctx, &mut name, 0) {
            if let Some(Ok(seg)) = &created {
                seg.unlink();
            }
            return Err(e);
        }
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
        // The control area (arrivals, inline payloads, fingerprints, the tally) is used by
        // every operation, however small: map it now rather than in the first calls.
        seg.prefault(data);
        if me == 0 {
            // SAFETY: the header words are inside the fresh mapping, not yet shared.
            unsafe {
                let h = seg.ptr() as *const AtomicU64;
                (*h).store(MAGIC, Ordering::Release);
            }
        }
        // What the peers read (and write back unchanged) to learn whether they may read and
        // write this process: a word that lives until every rank has looked (the step
        // below). Atomic: others' writes land in it while we hold it.
        let pid = std::process::id();
        let probe_word = AtomicU64::new(probe_value(u64::from(pid), me));
        let mine = |at: usize| {
            // SAFETY: our line of the peers' area lies inside the control area.
            unsafe { &*(seg.ptr().add(peers_at + LINE * me + at) as *const AtomicU64) }
        };
        mine(PEER_PID).store(u64::from(pid), Ordering::Relaxed);
        mine(PEER_PROBE).store(probe_word.as_ptr() as u64, Ordering::Relaxed);
        let r = barrier::dissemination::run(ctx);
        if me == 0 {
            seg.unlink();
        }
        r?;
        let counts = || (0..n).map(|_| AtomicU64::new(0)).collect();
        let mut coll = ShmCollectives {
            seg,
            n,
            me,
            slot,
            data,
            wait,
            step: AtomicU64::new(0),
            sent: counts(),
            taken: counts(),
            waiting: std::sync::atomic::AtomicUsize::new(usize::MAX),
            peers_at,
            single_copy: false,
        };
        if n > 1 {
            // Every rank says whether it may read and write every other one; all must. (A step every
            // rank takes, whatever it was asked, so that their steps stay in line.)
            let ok = single_copy
                && (0..n).filter(|&p| p != me).all(|p| {
                    let expect = probe_value(u64::from(coll.peer_pid(p)), p);
                    single_copy::probe(coll.peer_pid(p), coll.peer_word(p, PEER_PROBE).load(Ordering::Relaxed), expect)
                });
            let (step, _) = coll.begin(ctx);
            coll.peer_word(me, PEER_OK).store(if ok { 1 } else { 2 }, Ordering::Relaxed);
            coll.post(Phase::Arrive, step);
            coll.wait_all(ctx, Phase::Arrive, step)?;
            coll.single_copy = (0..n).all(|p| coll.peer_word(p, PEER_OK).load(Ordering::Relaxed) == 1);
        }
        // Keeps the word alive until here (every rank probed before it arrived).
        std::hint::black_box(&probe_word);
        Ok(Some(coll))
    }

    /// Word `at` of `rank`'s line in the peers' area (pid, probe address, verdict, and the
    /// buffer each step of a single-copy move publishes).
    fn peer_word(&self, rank: usize, at: usize) -> &AtomicU64 {
        self.u64_at(self.peers_at + LINE * rank + at)
    }

    fn peer_pid(&self, rank: usize) -> u32 {
        self.peer_word(rank, PEER_PID).load(Ordering::Relaxed) as u32
    }

    /// How many frames of point-to-point collectives rank `from` had sent rank `to` when it
    /// arrived at its latest step of parity `b`.
    fn published_sent(&self, b: usize, from: usize, to: usize) -> &AtomicU64 {
        self.u64_at(CONTROL + BLOCK * self.n + 8 * ((b * self.n + from) * self.n + to))
    }

    /// After every rank arrived: a frame some rank sent this one in an earlier operation
    /// that this rank never took is a mismatch (the two ran different operations). The
    /// frame itself names the peer's operation; it was written before the peer arrived, so
    /// it is delivered soon if it is not here yet.
    fn check_untaken(&self, ctx: &Ctx, b: usize) -> Result<()> {
        for p in (0..self.n).filter(|&p| p != self.me) {
            let sent = self.published_sent(b, p, self.me).load(Ordering::Relaxed);
            if sent <= self.taken[p].load(Ordering::Relaxed) {
                continue;
            }
            let t = ctx.ranks[p];
            loop {
                match ctx.transport.probe(t, ctx.comm_id, Channel::Collective, None) {
                    Ok(Some(got)) => {
                        return Err(Error::Mismatch { peer: p, ours: ctx.fp, theirs: got.header.fingerprint })
                    }
                    Ok(None) if Instant::now() < ctx.clock.deadline() => std::thread::yield_now(),
                    Ok(None) => {
                        return Err(Error::Aborted {
                            reason: format!(
                                "rank {p} sent this rank a message in an earlier collective that this rank \
                                 never took (the two called different collectives), and it never arrived"
                            ),
                        })
                    }
                    Err(e) => return Err(ctx.map_err(e)),
                }
            }
        }
        Ok(())
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

    /// The counter `rank` publishes `step` of `phase` in: the arrival in the box of the
    /// step's parity (it holds the latest step of that parity the rank arrived at, so a
    /// rank that arrived at step s, or later, shows a value >= s in box s % 2), `done` in
    /// its own line.
    fn counter(&self, rank: usize, phase: Phase, step: u64) -> &AtomicU64 {
        match phase {
            Phase::Arrive => self.u64_at(self.box_at(rank, (step % 2) as usize)),
            Phase::Done => self.u64_at(CONTROL + BLOCK * rank + DONE_AT),
        }
    }

    /// Offset of `rank`'s box for steps of parity `b`.
    fn box_at(&self, rank: usize, b: usize) -> usize {
        CONTROL + BLOCK * rank + BOX_STRIDE * b
    }

    /// The fingerprint `rank` published for steps of parity `b`, in the box of its arrival.
    /// Double-buffered like the slots: a rank cannot reach step s+2 (and overwrite) before
    /// every rank is past step s.
    fn fp_words(&self, rank: usize, b: usize) -> [&AtomicU64; 3] {
        let base = self.box_at(rank, b) + 8;
        [self.u64_at(base), self.u64_at(base + 8), self.u64_at(base + 16)]
    }

    /// The inline area of `rank` for steps of parity `b`: [`INLINE`] bytes in the box its
    /// arrival is published in, so the peers' one fetch of that line brings a tiny payload
    /// with the arrival. Double-buffered like the slots.
    fn inline_ptr(&self, rank: usize, b: usize) -> *mut u8 {
        // SAFETY: the box lies inside `rank`'s control block, inside the control area.
        unsafe { self.seg.ptr().add(self.box_at(rank, b) + BOX_INLINE) }
    }

    /// Region `b` of `rank` (slot 0, slot 1, or result area [`RESULT`] + 0 or 1), as raw memory.
    fn slot_ptr(&self, rank: usize, b: usize) -> *mut u8 {
        // SAFETY: the region lies inside the mapping (size computed in `establish`).
        unsafe { self.seg.ptr().add(self.data + (REGIONS * rank + b) * self.slot) }
    }

    /// The rank a wait of this rank has been missing for at least one check, if a wait is
    /// under way.
    pub(crate) fn waiting_on(&self) -> Option<usize> {
        Some(self.waiting.load(Ordering::Relaxed)).filter(|&p| p != usize::MAX)
    }

    /// Publishes this rank's progress and wakes sleepers.
    fn post(&self, phase: Phase, step: u64) {
        self.counter(self.me, phase, step).store(step, Ordering::Release);
        futex::ring(self.doorbell(), self.sleepers());
    }

    /// Waits until every rank has reached `step` in `phase`, checking fingerprints,
    /// failures and the deadline.
    fn wait_all(&self, ctx: &Ctx, phase: Phase, step: u64) -> Result<()> {
        let arrived = |p: usize| self.counter(p, phase, step).load(Ordering::Acquire) >= step;
        let ours = ctx.fp.to_words();
        // Ranks are looked at in order from the first one missing (arrivals are monotonic, so
        // a rank passed stays arrived). With the profiler on, a wait that does not end at once
        // is charged to the last rank the scan stopped at: the last to arrive, to within one
        // look (every rank before it arrived earlier, every rank after it was there when it
        // came).
        let mut next = 0;
        let mut blocker = usize::MAX;
        let mut since = None;
        let profiled = ctx.waits.is_some();
        let r = futex::wait_until(
            self.doorbell(),
            self.sleepers(),
            &self.wait,
            || {
                while next < self.n {
                    if !arrived(next) {
                        blocker = next;
                        if profiled && since.is_none() {
                            since = Some(PeerWaits::start());
                        }
                        return false;
                    }
                    next += 1;
                }
                true
            },
            CHECK_EVERY,
            || {
                for p in (0..self.n).filter(|&p| p != self.me) {
                    if arrived(p) {
                        continue;
                    }
                    self.waiting.store(p, Ordering::Relaxed);
                    let t = ctx.ranks[p];
                    match ctx.transport.probe(t, ctx.comm_id, Channel::Collective, Some(Stage::of_seq(ctx.fp.seq))) {
                        Err(e) => return Err(ctx.map_err(e)),
                        Ok(Some(got)) if got.header.fingerprint != ctx.fp => {
                            return Err(Error::Mismatch { peer: p, ours: ctx.fp, theirs: got.header.fingerprint })
                        }
                        Ok(_) => {}
                    }
                    if Instant::now() >= ctx.clock.deadline() {
                        return Err(ctx.map_err(TransportError::Timeout { peer: t }));
                    }
                }
                Ok(())
            },
        );
        if self.waiting.load(Ordering::Relaxed) != usize::MAX {
            self.waiting.store(usize::MAX, Ordering::Relaxed);
        }
        r?;
        if let (Some(w), Some(t0)) = (ctx.waits, since) {
            w.add_since(blocker, t0);
        }
        if matches!(phase, Phase::Arrive) {
            for p in 0..self.n {
                let w = self.fp_words(p, (step % 2) as usize).map(|a| a.load(Ordering::Relaxed));
                if w != ours {
                    let theirs = Fingerprint::from_words(w).unwrap_or(ctx.fp);
                    return Err(Error::Mismatch { peer: p, ours: ctx.fp, theirs });
                }
            }
            self.check_untaken(ctx, (step % 2) as usize)?;
        }
        Ok(())
    }

    /// Waits until `done` holds, where `rank` is the one to make it so: its failures end the
    /// wait, and with `deadline` the operation's deadline does.
    fn wait_for(&self, ctx: &Ctx, rank: usize, deadline: bool, done: impl FnMut() -> bool) -> Result<()> {
        futex::wait_until(self.doorbell(), self.sleepers(), &self.wait, done, CHECK_EVERY, || {
            let t = ctx.ranks[rank];
            if let Err(e) = ctx.transport.probe(t, ctx.comm_id, Channel::Collective, Some(Stage::of_seq(ctx.fp.seq))) {
                return Err(ctx.map_err(e));
            }
            if deadline && Instant::now() >= ctx.clock.deadline() {
                return Err(ctx.map_err(TransportError::Timeout { peer: t }));
            }
            Ok(())
        })
    }

    /// Starts a step: records our fingerprint, returns the step number and slot index.
    fn begin(&self, ctx: &Ctx) -> (u64, usize) {
        let step = self.step.fetch_add(1, Ordering::Relaxed) + 1;
        let b = (step % 2) as usize;
        for (a, v) in self.fp_words(self.me, b).iter().zip(ctx.fp.to_words()) {
            a.store(v, Ordering::Relaxed);
        }
        // Published with the arrival (release), read by the others after they see it. Only
        // a changed count is stored: the counts of all ranks share cache lines, and storing
        // an unchanged one would take the line from the peers on every step (loading our
        // own, unchanged, hits the cache).
        for (q, s) in self.sent.iter().enumerate() {
            let (now, published) = (s.load(Ordering::Relaxed), self.published_sent(b, self.me, q));
            if published.load(Ordering::Relaxed) != now {
                published.store(now, Ordering::Relaxed);
            }
        }
        (step, b)
    }

    /// The step loop of the operations that move blocks through the slots: `per_block`
    /// bytes per block, in chunks of at most `1/blocks` of a slot (a multiple of 64 bytes,
    /// so of every element size). In each step `fill(at, c, b)` writes this rank's part
    /// into its slot `b` (block i of the step at `i * c`), every rank arrives and waits for
    /// the others, then `drain(at, c, b)` reads what this rank needs from the slots of
    /// parity `b`. At least one step runs, so an empty operation still synchronizes and
    /// checks fingerprints.
    ///
    /// Nothing but the arrivals is needed between steps: a rank arrives at step s + 1 only
    /// after its `drain` of step s, and a slot of step s is refilled at step s + 2, after
    /// its owner waited for every rank's arrival at s + 1.
    fn in_steps(
        &self,
        ctx: &Ctx,
        per_block: usize,
        blocks: usize,
        mut fill: impl FnMut(usize, usize, usize),
        mut drain: impl FnMut(usize, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let chunk = (self.slot / blocks.max(1) / 64 * 64).max(64);
        let mut at = 0;
        loop {
            let c = chunk.min(per_block - at);
            let (step, b) = self.begin(ctx);
            fill(at, c, b);
            self.post(Phase::Arrive, step);
            self.wait_all(ctx, Phase::Arrive, step)?;
            drain(at, c, b)?;
            at += c;
            if at >= per_block {
                return Ok(());
            }
        }
    }
}

impl FrameTally for ShmCollectives {
    /// Counts a frame this rank sent `to` in a point-to-point collective.
    fn count_sent(&self, to: usize) {
        if let Some(s) = self.sent.get(to) {
            s.store(s.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }

    /// Counts a frame this rank took from `from` in a point-to-point collective.
    fn count_taken(&self, from: usize) {
        if let Some(t) = self.taken.get(from) {
            t.store(t.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
