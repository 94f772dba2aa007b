//! Streams: a queue of jobs and the worker thread that runs them strictly in order.
//!
//! A job that fails breaks its stream, as a sticky error does in CUDA: the worker records
//! the error (saying which job failed), skips every later job (failing the event records
//! among them with the same error, so their waiters learn of it), and every later call on
//! the stream returns it.
//!
//! A stream ends in one of two ways. [`Stream::close`] (`stream_destroy`) lets the queued
//! jobs run and then ends the worker. [`Stream::stop`] (the runtime dropping) ends it after
//! the job in progress; the jobs still queued are dropped without being run.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use super::codes::{fail, split, DEINITIALIZED, INVALID_HANDLE, LAUNCH_FAILED, OPERATING_SYSTEM};
use super::event::Point;
use super::memory::{Memory, Transfer};
use super::stall::Gate;
use super::wake::{Waited, Wake};
use crate::error::{Error, Result};
use crate::sync::relock;

/// A closure queued on a stream (what the NCCL double runs its collectives as).
pub(crate) type Closure = Box<dyn FnOnce() -> Result<()> + Send>;

/// What a job does.
pub(super) enum Work {
    /// A copy, checked against the registry once more when it runs.
    Copy(Transfer, Arc<Memory>),
    /// An event record: fires the point.
    Fire(Arc<Point>),
    /// A wait on an event's record: later jobs wait until the point fires; a point that
    /// failed breaks this stream too.
    Wait(Arc<Point>),
    /// A stall: blocks until the gate opens.
    Stall(Arc<Gate>),
    /// A closure.
    Run(Closure),
}

impl Work {
    /// One line for messages.
    fn describe(&self) -> String {
        match self {
            Work::Copy(t, _) => t.describe(),
            Work::Fire(_) => "event record".to_string(),
            Work::Wait(_) => "wait on an event".to_string(),
            Work::Stall(_) => "stall".to_string(),
            Work::Run(_) => "closure".to_string(),
        }
    }

    /// Runs the job on the worker.
    ///
    /// # Errors
    /// The job's own error: a copy whose memory went away, an awaited event whose stream
    /// failed, the runtime dropping during a wait, a closure's error.
    fn run(self, wake: &Wake) -> Result<()> {
        match self {
            Work::Copy(t, memory) => memory.run(&t),
            Work::Fire(point) => {
                point.fire(wake);
                Ok(())
            }
            Work::Wait(point) => match wake.wait_for(None, || point.outcome()) {
                Waited::Ready(Ok(())) => Ok(()),
                Waited::Ready(Err(e)) => {
                    let (code, message) = split(e, LAUNCH_FAILED);
                    Err(Error::Backend { code, message: format!("the awaited event's stream failed: {message}") })
                }
                Waited::Stopping | Waited::TimedOut => {
                    Err(fail(DEINITIALIZED, "stream_wait_event", "the runtime was dropped during the wait"))
                }
            },
            Work::Stall(gate) => {
                // A stall ends when released or when the runtime drops; either way it is done.
                let _ = wake.wait_for(None, || gate.is_open().then_some(()));
                Ok(())
            }
            Work::Run(f) => f(),
        }
    }

    /// Passes over the job on a broken stream: an event record among the skipped jobs fails
    /// with the stream's error; anything else is dropped unrun.
    fn skip(self, error: &Error, wake: &Wake) {
        if let Work::Fire(point) = self {
            point.fail(error.clone(), wake);
        }
    }
}

/// The queue and the stream's state.
#[derive(Default)]
struct Queue {
    /// Jobs not yet started, with their numbers (1, 2, ... in queueing order).
    jobs: VecDeque<(u64, Work)>,
    /// How many jobs were ever queued.
    queued: u64,
    /// How many of them have been run or skipped.
    done: u64,
    /// The sticky error, once a job failed.
    broken: Option<Error>,
    /// Destroyed: run what is queued, then end.
    closing: bool,
    /// The runtime is dropping: end after the job in progress.
    stopping: bool,
}

/// A stream of the double.
pub(super) struct Stream {
    /// Its handle number (0 for the default stream).
    pub(super) id: usize,
    /// Its device; `None` for the legacy default stream, which serves the calling thread's
    /// current device.
    pub(super) device: Option<u32>,
    /// The queue.
    queue: Mutex<Queue>,
    /// Signals the worker (new job, close, stop) and the synchronizers (a job done).
    cv: Condvar,
    /// The runtime's hub, for the waits jobs do.
    wake: Arc<Wake>,
}

impl Stream {
    /// A stream and its running worker.
    ///
    /// # Errors
    /// The operating system refused the thread.
    pub(super) fn spawn(
        id: usize,
        device: Option<u32>,
        wake: Arc<Wake>,
        call: &str,
    ) -> Result<(Arc<Stream>, JoinHandle<()>)> {
        let stream = Arc::new(Stream { id, device, queue: Mutex::new(Queue::default()), cv: Condvar::new(), wake });
        let worker = Arc::clone(&stream);
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-host-stream-{id:#x}"))
            .spawn(move || worker.work())
            .map_err(|e| fail(OPERATING_SYSTEM, call, format!("cannot start the stream's worker thread: {e}")))?;
        Ok((stream, thread))
    }

    /// The stream's name in messages.
    pub(super) fn name(&self) -> String {
        match self.device {
            Some(d) => format!("stream {:#x} (device {d})", self.id),
            None => "the default stream".to_string(),
        }
    }

    /// Waits on the condition variable, ignoring poisoning.
    fn sleep<'a>(&self, q: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        self.cv.wait(q).unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `work`.
    ///
    /// # Errors
    /// The stream's sticky error when it is broken (the job is dropped); an invalid handle
    /// once it is destroyed.
    pub(super) fn push(&self, work: Work, call: &str) -> Result<()> {
        let mut q = relock(&self.queue);
        if let Some(e) = &q.broken {
            return Err(e.clone());
        }
        if q.closing || q.stopping {
            return Err(fail(INVALID_HANDLE, call, format!("{} was destroyed", self.name())));
        }
        q.queued += 1;
        let seq = q.queued;
        q.jobs.push_back((seq, work));
        self.cv.notify_all();
        Ok(())
    }

    /// The sticky error, if the stream is broken.
    ///
    /// # Errors
    /// That error.
    pub(super) fn health(&self) -> Result<()> {
        relock(&self.queue).broken.clone().map_or(Ok(()), Err)
    }

    /// Blocks until every job queued before the call has run (or been skipped).
    ///
    /// # Errors
    /// The sticky error, if the stream is broken.
    pub(super) fn synchronize(&self) -> Result<()> {
        let mut q = relock(&self.queue);
        let target = q.queued;
        while q.done < target && !q.stopping {
            q = self.sleep(q);
        }
        q.broken.clone().map_or(Ok(()), Err)
    }

    /// Destroys the stream: the queued jobs still run, then the worker ends.
    pub(super) fn close(&self) {
        relock(&self.queue).closing = true;
        self.cv.notify_all();
    }

    /// Stops the worker after the job in progress (the runtime is dropping); the jobs still
    /// queued are dropped unrun. Blocking waits inside jobs are woken by the hub, not here.
    pub(super) fn stop(&self) {
        relock(&self.queue).stopping = true;
        self.cv.notify_all();
    }

    /// The worker's loop.
    fn work(self: Arc<Self>) {
        loop {
            let (seq, work, broken) = {
                let mut q = relock(&self.queue);
                loop {
                    if q.stopping {
                        let unrun = std::mem::take(&mut q.jobs);
                        drop(q);
                        // Dropped outside the lock: a closure's captures may do anything.
                        drop(unrun);
                        return;
                    }
                    if let Some((seq, work)) = q.jobs.pop_front() {
                        break (seq, work, q.broken.clone());
                    }
                    if q.closing {
                        return;
                    }
                    q = self.sleep(q);
                }
            };
            let failed = match broken {
                Some(e) => {
                    work.skip(&e, &self.wake);
                    None
                }
                None => {
                    let what = work.describe();
                    let outcome = catch_unwind(AssertUnwindSafe(|| work.run(&self.wake))).unwrap_or_else(|panic| {
                        Err(Error::Internal(format!("the job panicked: {}", crate::sync::panic_message(&*panic))))
                    });
                    outcome.err().map(|e| {
                        let (code, detail) = split(e, LAUNCH_FAILED);
                        Error::Backend {
                            code,
                            message: format!("host runtime: {} job #{seq} ({what}) failed: {detail}", self.name()),
                        }
                    })
                }
            };
            let mut q = relock(&self.queue);
            q.done += 1;
            if let Some(e) = failed {
                q.broken.get_or_insert(e);
            }
            self.cv.notify_all();
        }
    }
}
