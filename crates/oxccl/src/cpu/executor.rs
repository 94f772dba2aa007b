//! A communicator's executor: one operation at a time, in the order they were issued. A
//! blocking call runs on its caller's thread once every earlier operation has finished; an
//! asynchronous one is queued for the communicator's worker thread.
//!
//! The common case, a blocking call with nothing running or queued, takes one atomic
//! compare-and-swap to start and one to finish (a lock and an unlock of a mutex on each
//! side cost four; measurements: docs/performance.md). The state word holds whether an
//! operation runs ([`BUSY`]), whether jobs are queued ([`QUEUED`]) and whether threads wait
//! ([`WAITERS`]); the last two change only under the queue's lock, so a call that finds
//! either set takes the lock, and a finishing call that finds either set wakes the waiting
//! threads under it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;

use crate::sync::relock;

/// An operation runs.
const BUSY: u32 = 1;
/// Jobs wait in the queue.
const QUEUED: u32 = 2;
/// Blocking calls wait for the executor (in [`Executor::run_inline`]).
const WAITERS: u32 = 4;

/// The executor of one communicator, whose queued jobs are `J`.
pub(super) struct Executor<J> {
    state: AtomicU32,
    queue: Mutex<Queue<J>>,
    cv: Condvar,
}

struct Queue<J> {
    jobs: VecDeque<J>,
    /// Blocking calls waiting on the condition variable (the [`WAITERS`] bit is set while
    /// any is).
    waiting: usize,
    shutdown: bool,
    worker: Option<JoinHandle<()>>,
}

/// A blocking call's turn on the executor: ends it when dropped, after `on_panic` when
/// dropped by a panic's unwinding.
struct Turn<'a, J, P: FnMut()> {
    exec: &'a Executor<J>,
    on_panic: P,
}

impl<J, P: FnMut()> Drop for Turn<'_, J, P> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            (self.on_panic)();
        }
        self.exec.release();
    }
}

impl<J> Executor<J> {
    pub(super) fn new() -> Executor<J> {
        Executor {
            state: AtomicU32::new(0),
            queue: Mutex::new(Queue { jobs: VecDeque::new(), waiting: 0, shutdown: false, worker: None }),
            cv: Condvar::new(),
        }
    }

    /// Runs `f` on this thread once every earlier operation (running or queued) has finished.
    /// The turn ends when `f` returns or unwinds.
    pub(super) fn run_inline<R>(&self, f: impl FnOnce() -> R) -> R {
        self.run_inline_or(f, || {})
    }

    /// [`Executor::run_inline`], calling `on_panic` before the turn ends when `f` unwinds.
    pub(super) fn run_inline_or<R>(&self, f: impl FnOnce() -> R, on_panic: impl FnMut()) -> R {
        if self.state.compare_exchange(0, BUSY, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.acquire_slow();
        }
        // Ended by a guard rather than after a `let r = f()`: `f`'s result goes straight to
        // the caller (an operation's result is some 80 bytes, and the copy out of a local,
        // read back right after `f` wrote it, stalled on store forwarding).
        let _turn = Turn { exec: self, on_panic };
        f()
    }

    /// Ends the running operation of a blocking call.
    fn release(&self) {
        if self.state.compare_exchange(BUSY, 0, Ordering::Release, Ordering::Relaxed).is_err() {
            self.release_slow();
        }
    }

    /// Waits, under the lock, until nothing runs and nothing is queued, then marks an
    /// operation running.
    fn acquire_slow(&self) {
        let mut q = relock(&self.queue);
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s & (BUSY | QUEUED) == 0 {
                // Only a fast start or finish changes the word outside the lock: retry if one did.
                if self.state.compare_exchange(s, s | BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return;
                }
                continue;
            }
            // Announce the wait with the word we decided on: if the operation finished in
            // between, this fails and we look again; once it succeeds, the finishing call
            // sees WAITERS and wakes us under the lock, which we hold until we wait.
            if self.state.compare_exchange(s, s | WAITERS, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue;
            }
            q.waiting += 1;
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
            q.waiting -= 1;
            // The last waiter to leave clears the bit (under the lock, as every change of it).
            if q.waiting == 0 {
                self.state.fetch_and(!WAITERS, Ordering::Relaxed);
            }
        }
    }

    /// Ends the running operation under the lock and wakes the waiting threads.
    fn release_slow(&self) {
        let _q = relock(&self.queue);
        self.state.fetch_and(!BUSY, Ordering::Release);
        self.cv.notify_all();
    }

    /// Queues `job` for the worker; `spawn` starts the worker when there is none yet.
    ///
    /// # Errors
    /// What `spawn` returns (the job is then not queued).
    pub(super) fn push<E>(&self, job: J, spawn: impl FnOnce() -> Result<JoinHandle<()>, E>) -> Result<(), E> {
        let mut q = relock(&self.queue);
        if q.worker.is_none() {
            q.worker = Some(spawn()?);
        }
        q.jobs.push_back(job);
        self.state.fetch_or(QUEUED, Ordering::Relaxed);
        drop(q);
        self.cv.notify_all();
        Ok(())
    }

    /// For the worker: the next queued job, once nothing else runs (it is then marked
    /// running; [`Executor::finish_job`] ends it). `None` once shut down with an empty queue.
    pub(super) fn next_job(&self) -> Option<J> {
        let mut q = relock(&self.queue);
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s & BUSY == 0 && !q.jobs.is_empty() {
                // QUEUED is set and BUSY clear, so no call starts or finishes without the lock,
                // which we hold: the word is still `s` (loaded with Acquire), ours to set.
                let job = q.jobs.pop_front();
                let queued = if q.jobs.is_empty() { 0 } else { QUEUED };
                self.state.store((s & !QUEUED) | queued | BUSY, Ordering::Relaxed);
                return job;
            }
            if q.jobs.is_empty() && q.shutdown {
                return None;
            }
            // Woken by the next push, or by the blocking call that runs, which finishes
            // under the lock because it sees QUEUED. (The worker is not among the WAITERS:
            // blocking calls would wake it for nothing while its queue is empty.)
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// For the worker: ends the job [`Executor::next_job`] returned and wakes the waiting
    /// threads.
    pub(super) fn finish_job(&self) {
        self.release_slow();
    }

    /// Tells the worker to stop once its queue is empty and returns it, to be joined.
    pub(super) fn shut_down(&self) -> Option<JoinHandle<()>> {
        let worker = {
            let mut q = relock(&self.queue);
            q.shutdown = true;
            q.worker.take()
        };
        self.cv.notify_all();
        worker
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Counts the operations running at once (noting, not panicking, when two do: a panic
    /// on the worker would leave the others waiting for its queue) and records their order.
    #[derive(Default)]
    struct Probe {
        running: AtomicUsize,
        overlaps: AtomicUsize,
        log: Mutex<Vec<(usize, usize)>>,
    }

    impl Probe {
        fn run(&self, thread: usize, i: usize) {
            if self.running.fetch_add(1, Ordering::SeqCst) != 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            relock(&self.log).push((thread, i));
            // Long enough for another thread to come in, if the executor let it.
            std::thread::yield_now();
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn worker(ex: &Arc<Executor<(usize, usize)>>, probe: &Arc<Probe>) -> std::io::Result<JoinHandle<()>> {
        let (ex, probe) = (Arc::clone(ex), Arc::clone(probe));
        std::thread::Builder::new().spawn(move || {
            while let Some((t, i)) = ex.next_job() {
                probe.run(t, i);
                ex.finish_job();
            }
        })
    }

    #[test]
    fn one_operation_at_a_time_and_each_threads_in_its_order() {
        // Threads mixing blocking calls and queued jobs: never two at once, every thread's
        // operations in the order it issued them, and a blocking call after queued jobs
        // waits for them.
        let ex: Arc<Executor<(usize, usize)>> = Arc::new(Executor::new());
        let probe = Arc::new(Probe::default());
        const THREADS: usize = 4;
        const OPS: usize = 3000;
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (ex, probe) = (Arc::clone(&ex), Arc::clone(&probe));
                s.spawn(move || {
                    for i in 0..OPS {
                        if (i + t) % 3 == 0 {
                            ex.push((t, i), || worker(&ex, &probe)).unwrap();
                        } else {
                            ex.run_inline(|| probe.run(t, i));
                        }
                    }
                });
            }
        });
        if let Some(w) = ex.shut_down() {
            w.join().unwrap();
        }
        assert_eq!(probe.overlaps.load(Ordering::SeqCst), 0, "operations ran at once");
        let log = relock(&probe.log);
        assert_eq!(log.len(), THREADS * OPS);
        for t in 0..THREADS {
            let mine: Vec<usize> = log.iter().filter(|e| e.0 == t).map(|e| e.1).collect();
            assert_eq!(mine, (0..OPS).collect::<Vec<_>>(), "thread {t} out of order");
        }
        assert_eq!(ex.state.load(Ordering::SeqCst), 0, "the executor did not come back to rest");
    }

    #[test]
    fn a_blocking_call_without_contention_leaves_the_lock_alone() {
        let ex: Executor<()> = Executor::new();
        let _held = relock(&ex.queue);
        // With the queue's lock held elsewhere, the fast path still runs and finishes.
        assert_eq!(ex.run_inline(|| 7), 7);
        assert_eq!(ex.state.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_blocking_call_that_panics_ends_its_turn() {
        // A panic inside an operation (a bug) reaches its caller; the communicator's next
        // call must still run, not wait forever for the turn of the one that unwound.
        let ex: Arc<Executor<()>> = Arc::new(Executor::new());
        let told = AtomicUsize::new(0);
        let on_panic = || {
            told.fetch_add(1, Ordering::SeqCst);
        };
        assert_eq!(ex.run_inline_or(|| 5, on_panic), 5);
        assert_eq!(told.load(Ordering::SeqCst), 0, "on_panic ran without a panic");
        let panicked =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ex.run_inline_or(|| panic!("bug"), on_panic)));
        assert!(panicked.is_err());
        assert_eq!(told.load(Ordering::SeqCst), 1, "on_panic did not run once");
        assert_eq!(ex.state.load(Ordering::SeqCst), 0, "the turn outlived the panic");
        let other = Arc::clone(&ex);
        assert_eq!(std::thread::spawn(move || other.run_inline(|| 3)).join().unwrap(), 3);
    }
}
