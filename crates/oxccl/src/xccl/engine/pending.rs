//! Completion of GPU operations: an event recorded after the operation's calls, polled with
//! the communicator's asynchronous error, the host side's view of the peers (with the grace
//! of `lost.rs`) and the operation's deadline, so that a wait ends with the result or a
//! clear error, never a hang.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::lost::LostGrace;
use super::state::{HostCopy, Inner, Issued, Ticket};
use crate::backend::{Completion, Pending};
use crate::error::{Error, Result};
use crate::fingerprint::OpKind;
use crate::sync::relock;

/// How often a waiting thread asks NCCL for its asynchronous error and the host side for
/// lost peers (event queries are made on every turn).
const WATCH_EVERY: Duration = Duration::from_millis(1);
/// How long a waiting thread polls without pause before it starts to sleep between polls:
/// about a small collective's time on a GPU. Bounded in time, not turns: a turn's cost
/// depends on the runtime, and a thread that spins for long takes a core from the ranks and
/// the progress threads beside it.
const SPIN_FOR: Duration = Duration::from_micros(50);
/// The longest sleep between polls.
const MAX_PAUSE: Duration = Duration::from_micros(200);
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
        let mut pause = Duration::from_micros(5);
        let mut watched = Instant::now();
        let spin_until = watched + SPIN_FOR;
        let mut lost = LostGrace::default();
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
                if let Err(e) = lost.check(now, self.inner.watch()) {
                    return Some(self.finish(Err(self.inner.fail(e))));
                }
            }
            if now >= self.deadline {
                let e = Error::Timeout { op: self.kind, seq: self.seq, peer: None, waited: self.started.elapsed() };
                return Some(self.finish(Err(self.inner.fail(e))));
            }
            if until.is_some_and(|u| now >= u) {
                return None;
            }
            if now < spin_until {
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
