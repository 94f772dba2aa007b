//! The flight recorder: the last operations of one communicator, kept in a ring, with
//! their state and times, dumped ([`FlightRecorder::dump_to`]) when something goes wrong.
//!
//! Recording costs one uncontended lock and a clock read when an operation begins and when
//! it ends; nothing is formatted or allocated until a dump is written.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::clock::{self, Tick};

use super::dump::{self, Dump, OpRecord, OpState};
use crate::backend::Op;
use crate::error::Result;
use crate::fingerprint::Fingerprint;

/// Communicators made by this process so far: each recorder's `comm` number.
static COMMUNICATORS: AtomicU64 = AtomicU64::new(0);

/// Now, in microseconds since the Unix epoch.
pub(crate) fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// One recorded operation (typed; formatted only when dumped).
#[derive(Debug, Clone)]
struct Entry {
    fp: Fingerprint,
    bytes: u64,
    state: OpState,
    enqueued: Tick,
    started: Option<Tick>,
    ended: Option<Tick>,
    waiting_on: Option<usize>,
    error: Option<String>,
}

#[derive(Debug)]
struct Ring {
    entries: VecDeque<Entry>,
    /// The next operation's sequence number.
    next: u64,
    /// Entries dropped to keep the ring at its capacity.
    dropped: u64,
    /// Operations begun and not yet ended (they run in order: the oldest is the one
    /// running, the others are queued behind it).
    unfinished: usize,
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
    ring: Mutex<Ring>,
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
            job: crate::bootstrap::env::job_id(|k| std::env::var(k).ok()),
            created: clock::now(),
            created_unix_us: unix,
            ring: Mutex::new(Ring {
                entries: VecDeque::with_capacity(capacity.min(1 << 16)),
                next: 0,
                dropped: 0,
                unfinished: 0,
                dumped_failure: false,
            }),
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

    /// Records the start of `op` (submitted now) and returns its sequence number. It is
    /// `Queued` while an earlier operation of the communicator has not finished. A recorder
    /// of capacity 0 records nothing (and costs nothing).
    pub fn begin(&self, op: &Op) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        let now = clock::now();
        let mut ring = crate::sync::relock(&self.ring);
        let seq = ring.next;
        ring.next += 1;
        let (state, started) =
            if ring.unfinished > 0 { (OpState::Queued, None) } else { (OpState::Started, Some(now)) };
        ring.unfinished += 1;
        if ring.entries.len() == self.capacity {
            ring.entries.pop_front();
            ring.dropped += 1;
        }
        ring.entries.push_back(Entry {
            fp: op.fingerprint(seq, crate::algorithm::Algorithm::Auto),
            bytes: op.message_bytes() as u64,
            state,
            enqueued: now,
            started,
            ended: None,
            waiting_on: None,
            error: None,
        });
        seq
    }

    /// Records the end of operation `seq`: completed, or failed with `error` (and the rank
    /// it waited on, where known). The next queued operation starts now.
    pub fn end(&self, seq: u64, error: Option<(&crate::error::Error, Option<usize>)>) {
        if self.capacity == 0 {
            return;
        }
        let now = clock::now();
        let mut ring = crate::sync::relock(&self.ring);
        let Some(first) = ring.entries.front().map(|e| e.fp.seq) else { return };
        let Some(i) = seq.checked_sub(first).map(|i| i as usize) else { return };
        let Some(e) = ring.entries.get_mut(i) else { return };
        if e.ended.is_some() {
            return;
        }
        e.ended = Some(now);
        e.started.get_or_insert(now);
        match error {
            None => e.state = OpState::Completed,
            Some((err, peer)) => {
                e.state = OpState::Failed;
                e.error = Some(err.to_string());
                e.waiting_on = peer;
            }
        }
        ring.unfinished = ring.unfinished.saturating_sub(1);
        if let Some(next) = ring.entries.get_mut(i + 1).filter(|e| e.state == OpState::Queued) {
            next.state = OpState::Started;
            next.started = Some(now);
        }
    }

    /// Notes that the oldest unfinished operation waits for `peer` (a hang's dump names it).
    pub fn waiting_on(&self, peer: usize) {
        let mut ring = crate::sync::relock(&self.ring);
        if let Some(e) = ring.entries.iter_mut().find(|e| e.state == OpState::Started) {
            e.waiting_on = Some(peer);
        }
    }

    /// Claims the right to dump a failure: true the first time only.
    pub(crate) fn first_failure(&self) -> bool {
        let mut ring = crate::sync::relock(&self.ring);
        !std::mem::replace(&mut ring.dumped_failure, true)
    }

    /// What the recorder holds now, as a [`Dump`] written for `reason`.
    pub fn snapshot(&self, reason: &str) -> Dump {
        // Asked before the ring is locked: the backend may take its own locks.
        let blocked_on = self.probe.get().and_then(|p| p());
        let ring = crate::sync::relock(&self.ring);
        let running = ring.entries.iter().position(|e| e.state == OpState::Started);
        let scale = clock::Scale::now();
        let created = scale.us(self.created);
        let us = |t: Tick| (scale.us(t) - created).max(0.0);
        let ops = ring
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| OpRecord {
                seq: e.fp.seq,
                op: e.fp.op.to_string(),
                dtype: e.fp.dtype.to_string(),
                count: e.fp.count,
                bytes: e.bytes,
                root: e.fp.root,
                reduce: e.fp.reduce.map(|r| r.to_string()),
                state: e.state,
                enqueued_us: us(e.enqueued),
                started_us: e.started.map(us),
                ended_us: e.ended.map(us),
                waiting_on: e.waiting_on.or(if Some(i) == running { blocked_on } else { None }),
                error: e.error.clone(),
            })
            .collect();
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
            dropped: ring.dropped,
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
}
