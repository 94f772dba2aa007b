//! Completion of GPU operations: an event recorded after the operation's calls, polled with
//! the communicator's asynchronous error, the host side's view of the peers and the
//! operation's deadline, so that a wait ends with the result or a clear error, never a hang.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Inner;
use crate::backend::{Completion, Pending};
use crate::error::{Error, Result};
use crate::fingerprint::OpKind;
use crate::sync::relock;
use crate::xccl::runtime::RawEvent;

/// How often a waiting thread asks NCCL for its asynchronous error and the host side for
/// lost peers (event queries are made on every turn).
const WATCH_EVERY: Duration = Duration::from_millis(1);
/// Turns of spinning before a waiting thread starts to sleep between polls.
const SPINS: u32 = 4096;
/// The longest sleep between polls.
const MAX_PAUSE: Duration = Duration::from_micros(200);
/// How long a wait goes on after the host side reported a peer gone, before failing with
/// it. A peer that finished this operation and then closed its communicator looks gone
/// while this rank's stream may still be finishing the same (complete) operation; a peer
/// that really died leaves the operation unable to finish, and after the grace the wait
/// fails, well within the 10 s a survivor has to notice.
const LOST_GRACE: Duration = Duration::from_secs(2);

/// An event of the engine's pool, given back when the last operation using it is done.
pub(crate) struct PooledEvent {
    pub(super) inner: Arc<Inner>,
    pub(super) event: RawEvent,
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        self.inner.give_back_event(self.event);
    }
}

/// Device memory an operation needs until it completes (a copy of an in-place input, a
/// landing place for a message too long for its buffer, a sent message), handed back to the
/// engine's cache after it (see `pool.rs`).
pub(crate) struct DeviceTemp {
    pub(super) inner: Arc<Inner>,
    pub(super) ptr: u64,
    /// Its block's size class.
    pub(super) class: usize,
}

impl Drop for DeviceTemp {
    fn drop(&mut self) {
        // Temporaries are dropped only after their operation's event fired or the
        // communicator was aborted and its stream drained (see `Inner::fail`), or by the
        // retiring list once their group's event fired.
        self.inner.give_back_block(self.ptr, self.class);
    }
}

/// A copy from a pinned block into the caller's host range, once the stream wrote the block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostCopy {
    pub(super) dst: *mut u8,
    pub(super) src: *const u8,
    pub(super) bytes: usize,
}

// SAFETY: as for `Staged` below: the caller's range is valid until completion, and the
// pinned block is kept with the operation.
unsafe impl Send for HostCopy {}
// SAFETY: as above; the copy is made once, by whoever completes the operation.
unsafe impl Sync for HostCopy {}

impl HostCopy {
    /// Makes the copies (after the operation's event fired).
    ///
    /// # Safety
    /// The stream has written the pinned blocks, and the caller's ranges are valid.
    pub(crate) unsafe fn run(copies: &[HostCopy]) {
        for c in copies.iter().filter(|c| c.bytes > 0) {
            // SAFETY: this function's contract; a pinned block and a caller's range are
            // distinct allocations.
            unsafe { std::ptr::copy_nonoverlapping(c.src, c.dst, c.bytes) };
        }
    }
}

/// Pinned host memory an operation needs until it completes (from the engine's cache).
pub(crate) struct PinnedTemp {
    pub(super) inner: Arc<Inner>,
    pub(super) ptr: *mut u8,
    pub(super) class: usize,
}

// SAFETY: pinned host memory is plain memory any thread may use; the block is the
// operation's alone until it is handed back.
unsafe impl Send for PinnedTemp {}
// SAFETY: as above.
unsafe impl Sync for PinnedTemp {}

impl Drop for PinnedTemp {
    fn drop(&mut self) {
        self.inner.give_back_pinned(self.ptr, self.class);
    }
}

/// What issuing an operation produced.
pub(crate) struct Issued {
    /// Fires when the operation's calls have run.
    pub(crate) event: Arc<PooledEvent>,
    /// Element counts received, one per receive of a batch.
    pub(crate) received: Vec<usize>,
    /// Kept until completion (dropping them frees the memory).
    #[allow(dead_code)] // held, never read
    pub(crate) temps: Vec<DeviceTemp>,
    /// An error to report once the calls have run (a message longer than its buffer: it
    /// was received elsewhere so that the sender's calls still match).
    pub(crate) error: Option<Error>,
    /// Staged outputs to copy from pinned memory into the caller's host ranges once the
    /// calls have run (made by the first wait that sees the event fire).
    pub(crate) back: Mutex<Vec<HostCopy>>,
    /// The pinned blocks those copies read (kept until then).
    #[allow(dead_code)] // held, never read
    pub(crate) pinned: Vec<PinnedTemp>,
}

impl Issued {
    /// An issue with no receives, staged copies or error.
    pub(crate) fn plain(event: Arc<PooledEvent>, temps: Vec<DeviceTemp>) -> Issued {
        Issued { event, received: Vec::new(), temps, error: None, back: Mutex::new(Vec::new()), pinned: Vec::new() }
    }
}

/// Where an operation's issue lands: at once for collectives, when the queue is flushed for
/// point-to-point batches.
#[derive(Default)]
pub(crate) struct Ticket {
    issued: Mutex<Option<Result<Arc<Issued>>>>,
}

impl Ticket {
    /// A ticket already issued.
    pub(crate) fn issued(r: Result<Issued>) -> Arc<Ticket> {
        Arc::new(Ticket { issued: Mutex::new(Some(r.map(Arc::new))) })
    }

    /// Records the issue (the first one stays).
    pub(crate) fn set(&self, r: Result<Issued>) {
        relock(&self.issued).get_or_insert(r.map(Arc::new));
    }

    /// The issue, when it happened.
    pub(crate) fn get(&self) -> Option<Result<Arc<Issued>>> {
        relock(&self.issued).clone()
    }
}

/// A submitted GPU operation (see the module documentation).
pub(crate) struct GpuPending {
    pub(super) inner: Arc<Inner>,
    pub(super) ticket: Arc<Ticket>,
    pub(super) kind: OpKind,
    pub(super) seq: u64,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    pub(super) done: Mutex<Option<Result<Completion>>>,
}

impl GpuPending {
    /// Keeps the first result.
    fn finish(&self, r: Result<Completion>) -> Result<Completion> {
        relock(&self.done).get_or_insert(r).clone()
    }

    /// The operation's issue, flushing the engine's queue when it is still waiting there.
    fn issued(&self) -> Result<Arc<Issued>> {
        if let Some(r) = self.ticket.get() {
            return r;
        }
        self.inner.flush_queue()?;
        self.ticket.get().unwrap_or_else(|| Err(Error::Internal("a queued operation was not issued".into())))
    }

    /// The completion once the event fired (the staged outputs copied back first).
    fn completed(issued: &Issued) -> Result<Completion> {
        let back = std::mem::take(&mut *relock(&issued.back));
        // SAFETY: the event fired, so the stream wrote the pinned blocks (kept in `issued`);
        // the caller's ranges are valid until completion (the submit contract).
        unsafe { HostCopy::run(&back) };
        match &issued.error {
            Some(e) => Err(e.clone()),
            None => Ok(Completion { received: issued.received.clone(), sources: Vec::new() }),
        }
    }
}

impl Pending for GpuPending {
    fn wait(&self, timeout: Option<Duration>) -> Option<Result<Completion>> {
        if let Some(r) = relock(&self.done).clone() {
            return Some(r);
        }
        let until = timeout.map(|t| Instant::now() + t);
        let issued = match self.issued() {
            Ok(i) => i,
            Err(e) => return Some(self.finish(Err(e))),
        };
        let mut turns = 0u32;
        let mut pause = Duration::from_micros(5);
        let mut watched = Instant::now();
        let mut lost: Option<(Instant, Error)> = None;
        loop {
            match self.inner.rt.event_query(issued.event.event) {
                Ok(true) => {
                    // A receive that did not fit poisons the communicator, as on the host
                    // backends.
                    let r = Self::completed(&issued).map_err(|e| match e {
                        e @ Error::Mismatch { .. } => self.inner.fail(e),
                        e => e,
                    });
                    return Some(self.finish(r));
                }
                Ok(false) => {}
                Err(e) => return Some(self.finish(Err(self.inner.fail(e)))),
            }
            if let Err(e) = self.inner.poisoned() {
                return Some(self.finish(Err(e)));
            }
            let now = Instant::now();
            if now.duration_since(watched) >= WATCH_EVERY {
                watched = now;
                match self.inner.watch() {
                    Ok(()) => {}
                    Err(e @ Error::PeerLost { .. }) => {
                        let (since, _) = lost.get_or_insert((now, e));
                        if now.duration_since(*since) >= LOST_GRACE {
                            let e = lost.take().map_or_else(|| Error::Internal("lost peer vanished".into()), |l| l.1);
                            return Some(self.finish(Err(self.inner.fail(e))));
                        }
                    }
                    Err(e) => return Some(self.finish(Err(self.inner.fail(e)))),
                }
            }
            if now >= self.deadline {
                let e = Error::Timeout { op: self.kind, seq: self.seq, peer: None, waited: self.started.elapsed() };
                return Some(self.finish(Err(self.inner.fail(e))));
            }
            if until.is_some_and(|u| now >= u) {
                return None;
            }
            turns = turns.saturating_add(1);
            if turns < SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }

    fn is_completed(&self) -> bool {
        if relock(&self.done).is_some() {
            return true;
        }
        // A batch still in the engine's queue has not started; asking must not flush it
        // (flushing may wait for a peer's envelope).
        self.ticket.get().is_some() && self.wait(Some(Duration::ZERO)).is_some()
    }
}
