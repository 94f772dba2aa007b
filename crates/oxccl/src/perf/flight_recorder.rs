//! The flight recorder: the last operations of one communicator, kept in a ring, with
//! their state and times, dumped ([`FlightRecorder::dump_to`]) when something goes wrong.
//!
//! Recording takes no lock: an operation's begin claims the next sequence number (one atomic
//! add) and writes its slot of the ring under a sequence lock; its end stores one time. A
//! snapshot copies the slots and keeps the ones it read whole. Nothing is formatted or
//! allocated until a dump is written; errors, rare, go into a small locked list.
//!
//! States are derived at the snapshot, as the operations of a communicator run in order:
//! an operation that has not ended is `Started` when the one before it has ended (or is not
//! in the ring), `Queued` otherwise, and it started when it was submitted or when the one
//! before it ended, whichever came later.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::clock::{self, Tick};

use super::dump::{self, Dump, OpRecord, OpState};
use crate::backend::Op;
use crate::error::Result;
use crate::fingerprint::Fingerprint;

/// Communicators made by this process so far: each recorder's `comm` number.
static COMMUNICATORS: AtomicU64 = AtomicU64::new(0);

/// Errors kept for a snapshot (a broken communicator fails every later call; the oldest go).
const ERRORS_KEPT: usize = 64;

/// `ended` of an operation that has not ended.
const NOT_ENDED: u64 = u64::MAX;

/// Now, in microseconds since the Unix epoch.
pub(crate) fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// One slot of the ring: the operation of sequence number `seq`, where `version` is
/// `2 seq + 1` while its begin writes it and `2 seq + 2` once written (0: never used).
#[derive(Default)]
struct RingEntry {
    version: AtomicU64,
    fp: [AtomicU64; 3],
    bytes: AtomicU64,
    enqueued: AtomicU64,
    /// When it ended ([`NOT_ENDED`] until then).
    ended: AtomicU64,
}

/// One operation as a snapshot read it.
struct Read {
    fp: Fingerprint,
    bytes: u64,
    enqueued: Tick,
    ended: Option<Tick>,
}

impl RingEntry {
    /// The operation in this slot, if the slot was read whole (not rewritten meanwhile).
    fn read(&self) -> Option<Read> {
        let v = self.version.load(Ordering::Acquire);
        if v == 0 || v % 2 == 1 {
            return None;
        }
        let words = self.fp.each_ref().map(|w| w.load(Ordering::Relaxed));
        let (bytes, enqueued) = (self.bytes.load(Ordering::Relaxed), self.enqueued.load(Ordering::Relaxed));
        let ended = self.ended.load(Ordering::Relaxed);
        // Pairs with the writer's release fence: a rewrite that began before our loads
        // above shows in the version.
        fence(Ordering::Acquire);
        if self.version.load(Ordering::Relaxed) != v {
            return None;
        }
        let fp = Fingerprint::from_words(words).ok()?;
        Some(Read { fp, bytes, enqueued, ended: (ended != NOT_ENDED).then_some(ended) })
    }
}

/// What is recorded rarely, under a lock.
#[derive(Debug, Default)]
struct Rare {
    /// The last failures: (sequence number, error, the peer waited on).
    errors: VecDeque<(u64, String, Option<usize>)>,
    /// The peer the oldest unfinished operation waits for, by its sequence number.
    waiting: Option<(u64, usize)>,
    /// Whether a failure has been dumped already (later failures of a broken
    /// communicator do not dump again; `SIGUSR1` always does).
    dumped_failure: bool,
}

/// Asks the backend which peer it is blocked on now.
type WaitingProbe = Box<dyn Fn() -> Option<usize> + Send + Sync>;

/// The last operations of one communicator on this rank.
pub struct FlightRecorder {
    capacity: usize,
    rank: usize,
    world_size: usize,
    comm: u64,
    backend: &'static str,
    job: Option<String>,
    created: Tick,
    created_unix_us: u64,
    /// The next operation's sequence number.
    next: AtomicU64,
    /// Operation `seq` lives in slot `seq & mask`: a power of two at least `capacity` (no
    /// division on the path of every call).
    slots: Box<[RingEntry]>,
    mask: u64,
    rare: Mutex<Rare>,
    probe: std::sync::OnceLock<WaitingProbe>,
}

impl std::fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("comm", &self.comm)
            .field("rank", &self.rank)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl FlightRecorder {
    /// A recorder keeping `capacity` operations of a communicator in which this process is
    /// `rank` of `world_size`, on `backend`.
    pub fn new(capacity: usize, rank: usize, world_size: usize, backend: &'static str) -> FlightRecorder {
        let unix = unix_us();
        FlightRecorder {
            capacity,
            rank,
            world_size,
            comm: COMMUNICATORS.fetch_add(1, Ordering::Relaxed),
            backend,
            job: crate::bootstrap::env::job_id_from_env(),
            created: clock::now(),
            created_unix_us: unix,
            next: AtomicU64::new(0),
            slots: (0..capacity.next_power_of_two()).map(|_| RingEntry::default()).collect(),
            mask: capacity.next_power_of_two() as u64 - 1,
            rare: Mutex::new(Rare::default()),
            probe: std::sync::OnceLock::new(),
        }
    }

    /// Sets how a snapshot learns which peer the running operation is blocked on (the
    /// backend's [`waiting_on`](crate::backend::Backend::waiting_on)); the first call wins.
    pub(crate) fn set_waiting_probe(&self, probe: WaitingProbe) {
        let _ = self.probe.set(probe);
    }

    /// This rank, in the communicator.
    pub fn snapshot_rank(&self) -> usize {
        self.rank
    }

    /// This communicator's number in the process (see [`Dump::comm`]).
    pub fn comm(&self) -> u64 {
        self.comm
    }

    /// Records the start of `op` (submitted now) and returns its sequence number. A
    /// recorder of capacity 0 records nothing (and costs nothing).
    pub fn begin(&self, op: &Op) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        let now = clock::now();
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = self.slot(seq);
        // A sequence lock: odd while written. The fence keeps the stores below from
        // becoming visible before the odd version (a reader then sees the version move).
        slot.version.store(2 * seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in slot.fp.iter().zip(op.fingerprint(seq, crate::algorithm::Algorithm::Auto).to_words()) {
            w.store(v, Ordering::Relaxed);
        }
        slot.bytes.store(op.message_bytes() as u64, Ordering::Relaxed);
        slot.enqueued.store(now, Ordering::Relaxed);
        slot.ended.store(NOT_ENDED, Ordering::Relaxed);
        slot.version.store(2 * seq + 2, Ordering::Release);
        seq
    }

    /// Records the end of operation `seq`: completed, or failed with `error` (and the rank
    /// it waited on, where known). An operation whose slot was taken by a later one (more
    /// operations in flight than the recorder holds) is not recorded.
    pub fn end(&self, seq: u64, error: Option<(&crate::error::Error, Option<usize>)>) {
        if self.capacity == 0 {
            return;
        }
        let now = clock::now();
        if let Some((err, peer)) = error {
            let mut rare = crate::sync::relock(&self.rare);
            if rare.errors.len() == ERRORS_KEPT {
                rare.errors.pop_front();
            }
            rare.errors.push_back((seq, err.to_string(), peer));
        }
        let slot = self.slot(seq);
        if slot.version.load(Ordering::Acquire) == 2 * seq + 2 {
            slot.ended.store(now, Ordering::Release);
        }
    }

    /// Notes that the oldest unfinished operation waits for `peer` (a hang's dump names it).
    pub fn waiting_on(&self, peer: usize) {
        let oldest =
            self.read_all(self.next.load(Ordering::Acquire)).into_iter().find(|r| r.ended.is_none()).map(|r| r.fp.seq);
        if let Some(seq) = oldest {
            crate::sync::relock(&self.rare).waiting = Some((seq, peer));
        }
    }

    fn slot(&self, seq: u64) -> &RingEntry {
        &self.slots[(seq & self.mask) as usize]
    }

    /// Claims the right to dump a failure: true the first time only, never for a recorder
    /// of capacity 0 (`OXCCL_FR_SIZE=0`: no dumps).
    pub(crate) fn first_failure(&self) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let mut rare = crate::sync::relock(&self.rare);
        !std::mem::replace(&mut rare.dumped_failure, true)
    }

    /// The operations in the ring when `next` had been claimed, oldest first (a slot being
    /// rewritten is left out).
    fn read_all(&self, next: u64) -> Vec<Read> {
        if self.capacity == 0 {
            return Vec::new();
        }
        let first = next.saturating_sub(self.capacity as u64);
        // Each slot once; a slot rewritten meanwhile holds a later operation, kept too.
        let mut reads: Vec<Read> = (first..next).filter_map(|seq| self.slot(seq).read()).collect();
        reads.sort_by_key(|r| r.fp.seq);
        reads
    }

    /// What the recorder holds now, as a [`Dump`] written for `reason`.
    pub fn snapshot(&self, reason: &str) -> Dump {
        // Asked before the ring is locked: the backend may take its own locks.
        let blocked_on = self.probe.get().and_then(|p| p());
        let next = self.next.load(Ordering::Acquire);
        let reads = self.read_all(next);
        let (errors, waiting) = {
            let rare = crate::sync::relock(&self.rare);
            (rare.errors.clone(), rare.waiting)
        };
        let dropped = next.saturating_sub(self.capacity as u64);
        let scale = clock::Scale::now();
        let created = scale.us(self.created);
        let us = |t: Tick| (scale.us(t) - created).max(0.0);
        let mut ops = Vec::with_capacity(reads.len());
        for (i, r) in reads.iter().enumerate() {
            let seq = r.fp.seq;
            let error = errors.iter().rev().find(|e| e.0 == seq);
            // The operation before it in order, when the ring still holds it.
            let before = i.checked_sub(1).map(|j| &reads[j]).filter(|p| p.fp.seq + 1 == seq);
            let state = match (r.ended, error, before) {
                (Some(_), Some(_), _) => OpState::Failed,
                (Some(_), None, _) => OpState::Completed,
                (None, _, Some(p)) if p.ended.is_none() => OpState::Queued,
                (None, _, _) => OpState::Started,
            };
            // It started when submitted, or when the one before it ended, if later.
            let started = (state != OpState::Queued).then(|| {
                let s = before.and_then(|p| p.ended).map_or(r.enqueued, |e| e.max(r.enqueued));
                s.min(r.ended.unwrap_or(u64::MAX))
            });
            let peer = error.and_then(|e| e.2).or(waiting.filter(|w| w.0 == seq).map(|w| w.1));
            ops.push(OpRecord {
                seq,
                op: r.fp.op.to_string(),
                dtype: r.fp.dtype.to_string(),
                count: r.fp.count,
                bytes: r.bytes,
                root: r.fp.root,
                reduce: r.fp.reduce.map(|x| x.to_string()),
                state,
                enqueued_us: us(r.enqueued),
                started_us: started.map(us),
                ended_us: r.ended.map(us),
                waiting_on: peer.or(if state == OpState::Started { blocked_on } else { None }),
                error: error.map(|e| e.1.clone()),
            });
        }
        Dump {
            version: dump::VERSION,
            job: self.job.clone(),
            rank: self.rank,
            world_size: self.world_size,
            comm: self.comm,
            backend: self.backend.to_string(),
            pid: std::process::id(),
            created_unix_us: self.created_unix_us,
            dumped_us: us(clock::now()),
            reason: reason.to_string(),
            dropped,
            ops,
        }
    }

    /// Writes [`FlightRecorder::snapshot`] into `dir` (see [`Dump::write`]); returns the path.
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) naming what could not be written.
    pub fn dump_to(&self, dir: &Path, reason: &str) -> Result<PathBuf> {
        self.snapshot(reason).write(dir)
    }

    /// Writes the recorder's dump and says where on stderr (the one place a failing job's
    /// user looks first).
    pub(crate) fn report(&self, dir: &Path, reason: &str) {
        match self.dump_to(dir, reason) {
            Ok(path) => tracing::warn!(
                "flight recorder of communicator {} (rank {}) written to {}; `oxccl trace analyze {}` explains the job's dumps",
                self.comm(),
                self.snapshot_rank(),
                path.display(),
                dir.display()
            ),
            Err(e) => tracing::error!("could not write the flight recorder's dump: {e}"),
        }
    }
}
