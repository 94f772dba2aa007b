//! One NCCL communicator handle and its life: creation (non-blocking, NCCL's precondition for
//! a safe abort), waiting for calls that returned `ncclInProgress`, the asynchronous error,
//! split, abort and orderly destruction.
//!
//! The handle sits behind a mutex: every call on it holds the lock for the duration of the
//! (non-blocking, hence short) NCCL call, and [`Comm::abort`] takes the handle out under the
//! same lock, so no call can use a communicator that another thread has just aborted and
//! freed. After an abort every call fails with [`Error::Aborted`].

use std::ffi::c_int;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::sync::relock;
use crate::xccl::library::types::{NcclConfig, NcclUniqueId};
use crate::xccl::library::{Library, NcclComm, NcclResult, Progress};

/// `NCCL_SPLIT_NOCOLOR` (nccl.h.in since 2.18.1): the color of a rank that takes no part in
/// a split and gets no communicator.
pub(crate) const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// What bounds a wait on the communicator: a deadline, a watch checked while waiting (a peer
/// known to be gone, an abort from another thread), and the error to report past the
/// deadline (the engine's names the operation and its sequence number).
pub(crate) struct Guard<'a> {
    /// When to give up.
    pub(crate) deadline: Instant,
    /// Checked on every poll; its error ends the wait.
    pub(crate) watch: &'a dyn Fn() -> Result<()>,
    /// The error past the deadline, given how long the wait took.
    pub(crate) late: &'a dyn Fn(Duration) -> Error,
}

/// A raw handle that may move between threads: NCCL communicators may be used from any
/// thread as long as calls on one communicator are not concurrent, which the mutex in
/// [`Comm`] ensures.
struct Handle(NcclComm);

// SAFETY: see the type's documentation: NCCL allows a communicator to be used from any
// thread; `Comm` serializes every call on it with its mutex.
unsafe impl Send for Handle {}

/// An NCCL communicator, created non-blocking.
pub(crate) struct Comm {
    lib: std::sync::Arc<Library>,
    raw: Mutex<Option<Handle>>,
    /// Why the communicator was aborted, once it was.
    aborted: Mutex<Option<String>>,
}

impl Comm {
    /// Creates rank `rank` of the `n`-rank communicator `id` (non-blocking), and waits until
    /// NCCL has finished setting it up, within `guard`.
    ///
    /// The device the communicator uses is the one current on the calling thread.
    ///
    /// # Errors
    /// NCCL's error ([`Error::Backend`]); `guard`'s errors (the half-made communicator is
    /// aborted).
    pub(crate) fn init(
        lib: &std::sync::Arc<Library>,
        n: usize,
        id: &NcclUniqueId,
        rank: usize,
        guard: &Guard<'_>,
    ) -> Result<Comm> {
        let nranks =
            c_int::try_from(n).map_err(|_| Error::invalid(format!("NCCL takes at most {} ranks", c_int::MAX)))?;
        let me = c_int::try_from(rank).map_err(|_| Error::invalid("rank out of NCCL's range"))?;
        let mut raw: NcclComm = std::ptr::null_mut();
        let mut config = NcclConfig::with_blocking(false);
        // SAFETY: ncclCommInitRankConfig writes the new handle through `raw`, reads the id by
        // value and the config through a valid pointer to a `ncclConfig_v21400` (see
        // `NcclConfig`); the calling thread's current device is the one the engine chose.
        let result = unsafe { (lib.table.comm_init_rank_config)(&mut raw, nranks, *id, me, &mut config) };
        let comm = Comm { lib: std::sync::Arc::clone(lib), raw: Mutex::new(None), aborted: Mutex::new(None) };
        if raw.is_null() {
            // Nothing to clean up: NCCL made no communicator.
            lib.check("ncclCommInitRankConfig", result, raw)?;
            return Err(Error::Backend {
                code: i64::from(result.0),
                message: "ncclCommInitRankConfig returned no communicator".into(),
            });
        }
        *relock(&comm.raw) = Some(Handle(raw));
        let progress = lib.check_progress("ncclCommInitRankConfig", result, raw);
        let ready = progress.and_then(|p| match p {
            Progress::Done => Ok(()),
            Progress::InProgress => comm.wait_ready("ncclCommInitRankConfig", guard),
        });
        if let Err(e) = ready {
            comm.abort(&format!("creating the NCCL communicator failed: {e}"));
            return Err(e);
        }
        Ok(comm)
    }

    /// Runs `f` with the handle, under the lock.
    ///
    /// # Errors
    /// [`Error::Aborted`] when the communicator was aborted or destroyed.
    pub(crate) fn with<R>(&self, f: impl FnOnce(NcclComm) -> R) -> Result<R> {
        let guard = relock(&self.raw);
        match guard.as_ref() {
            Some(h) => Ok(f(h.0)),
            None => Err(self.gone()),
        }
    }

    /// The error for a call on a communicator that is no more.
    fn gone(&self) -> Error {
        let reason = relock(&self.aborted).clone().unwrap_or_else(|| "the NCCL communicator was destroyed".into());
        Error::Aborted { reason }
    }

    /// Checks the result of a call made through [`with`](Self::with) on a non-blocking
    /// communicator; waits (as [`wait_ready`](Self::wait_ready)) when it is in progress.
    ///
    /// # Errors
    /// NCCL's error; those of `wait_ready`.
    pub(crate) fn settle(&self, call: &str, result: NcclResult, guard: &Guard<'_>) -> Result<()> {
        let raw = self.with(|c| c)?;
        match self.lib.check_progress(call, result, raw)? {
            Progress::Done => Ok(()),
            Progress::InProgress => self.wait_ready(call, guard),
        }
    }

    /// The communicator's asynchronous error: `Ok(None)` when healthy (or still busy with a
    /// non-blocking call), `Ok(Some(error))` after a failure NCCL detected (a remote error,
    /// a network failure, an internal error).
    ///
    /// # Errors
    /// [`Error::Aborted`] when the communicator is no more; the query's own failure.
    pub(crate) fn async_error(&self) -> Result<Option<Error>> {
        let (status, raw) = self.status()?;
        Ok(match status {
            NcclResult::SUCCESS | NcclResult::IN_PROGRESS => None,
            bad => Some(self.lib.error("the NCCL communicator", bad, raw)),
        })
    }

    /// `ncclCommGetAsyncError`: the communicator's state, and its handle (for messages).
    ///
    /// # Errors
    /// [`Error::Aborted`] when the communicator is no more; the query's own failure.
    fn status(&self) -> Result<(NcclResult, NcclComm)> {
        let (status, result, raw) = self.with(|c| {
            let mut status = NcclResult::SUCCESS;
            // SAFETY: `c` is a live communicator (we hold the lock that abort takes), and
            // ncclCommGetAsyncError writes one result through a valid pointer.
            let result = unsafe { (self.lib.table.comm_get_async_error)(c, &mut status) };
            (status, result, c)
        })?;
        self.lib.check("ncclCommGetAsyncError", result, raw)?;
        Ok((status, raw))
    }

    /// Polls the asynchronous error until a call that returned `ncclInProgress` has finished.
    ///
    /// # Errors
    /// The call's error; `guard`'s errors.
    pub(crate) fn wait_ready(&self, call: &str, guard: &Guard<'_>) -> Result<()> {
        let started = Instant::now();
        let mut pause = Duration::from_micros(1);
        loop {
            let (status, raw) = self.status()?;
            match status {
                NcclResult::SUCCESS => return Ok(()),
                NcclResult::IN_PROGRESS => {}
                bad => return Err(self.lib.error(call, bad, raw)),
            }
            (guard.watch)()?;
            if Instant::now() >= guard.deadline {
                return Err((guard.late)(started.elapsed()));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }

    /// Splits the communicator (`ncclCommSplit`, non-blocking): ranks with the same `color`
    /// form a new communicator ordered by `key`; [`NCCL_SPLIT_NOCOLOR`] gets `None`. Returns
    /// once the split is done on this communicator's side; the new one may still be
    /// initializing (wait for it with [`Comm::wait_ready`]).
    ///
    /// On a non-blocking parent NCCL (2.18 on) returns with the new handle still null (and
    /// with `ncclSuccess`, not `ncclInProgress`, in 2.28), and its background job writes the
    /// handle later. So the handle's slot is
    /// heap memory that outlives the call, read only once the parent's asynchronous error is
    /// `ncclSuccess`; when the split fails or its wait ends early, the parent is aborted
    /// first (NCCL's abort joins the job, so nothing writes the slot afterwards), and a
    /// handle the job wrote before that is aborted too.
    ///
    /// # Errors
    /// The library lacks `ncclCommSplit` (an internal error: callers check first); NCCL's
    /// error; the wait's errors. Each is a failure of this communicator, which is aborted.
    pub(crate) fn split(&self, color: c_int, key: c_int, guard: &Guard<'_>) -> Result<Option<Comm>> {
        let split = self
            .lib
            .table
            .comm_split
            .ok_or_else(|| Error::Internal("ncclCommSplit is missing from the loaded library".into()))?;
        let slot: *mut NcclComm = Box::into_raw(Box::new(std::ptr::null_mut()));
        let mut config = NcclConfig::with_blocking(false);
        let result = self.with(|c| {
            // SAFETY: `c` is live (lock held); ncclCommSplit writes the new handle through
            // `slot` (now or from its background job: the slot lives until that is over, see
            // below) and reads a valid `ncclConfig_v21400`.
            unsafe { split(c, color, key, slot, &mut config) }
        });
        // The split is collective over the parent: its progress shows on the parent. NCCL
        // (2.28 at least) returns ncclSuccess from a non-blocking split whose job still runs
        // (its group's ncclInProgress is dropped), so the parent is polled whatever the call
        // returned: only its settled state says the handle has been written.
        let settled = result
            .and_then(|r| self.settle("ncclCommSplit", r, guard))
            .and_then(|()| self.wait_ready("ncclCommSplit", guard));
        if let Err(e) = &settled {
            // Joins NCCL's split job: after this nothing writes the slot.
            self.abort(&format!("splitting the NCCL communicator failed: {e}"));
        }
        // SAFETY: from `Box::into_raw` above, freed once here; NCCL no longer writes it (the
        // parent settled, or was aborted just above).
        let new = *unsafe { Box::from_raw(slot) };
        let child = Comm { lib: std::sync::Arc::clone(&self.lib), raw: Mutex::new(None), aborted: Mutex::new(None) };
        if !new.is_null() {
            *relock(&child.raw) = Some(Handle(new));
        }
        settled?;
        Ok((!new.is_null()).then_some(child))
    }

    /// Aborts the communicator (`ncclCommAbort`): NCCL stops its kernels and frees it. Later
    /// calls fail with [`Error::Aborted`] carrying `reason`. Idempotent.
    pub(crate) fn abort(&self, reason: &str) {
        let mut guard = relock(&self.raw);
        relock(&self.aborted).get_or_insert_with(|| reason.to_string());
        if let Some(h) = guard.take() {
            // SAFETY: `h` is a live communicator taken out under the lock, so no other call
            // uses it now or later; ncclCommAbort frees it.
            let _ = unsafe { (self.lib.table.comm_abort)(h.0) };
        }
    }

    /// Destroys the communicator in order (`ncclCommFinalize`, waiting for it until
    /// `deadline`, then `ncclCommDestroy`); aborts it instead when finalizing fails or takes
    /// too long. Does nothing after an abort.
    pub(crate) fn destroy(&self, deadline: Instant) {
        let finalized = self
            .with(|c| {
                // SAFETY: `c` is live (lock held).
                unsafe { (self.lib.table.comm_finalize)(c) }
            })
            .and_then(|r| {
                let late = |waited: Duration| Error::Aborted {
                    reason: format!("ncclCommFinalize did not finish within {waited:?}"),
                };
                self.settle("ncclCommFinalize", r, &Guard { deadline, watch: &|| Ok(()), late: &late })
            });
        if finalized.is_err() {
            self.abort("the communicator was dropped");
            return;
        }
        let mut guard = relock(&self.raw);
        relock(&self.aborted).get_or_insert_with(|| "the communicator was dropped".into());
        if let Some(h) = guard.take() {
            // SAFETY: taken out under the lock, finalized, used by nobody afterwards.
            let _ = unsafe { (self.lib.table.comm_destroy)(h.0) };
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.abort("the communicator was dropped");
    }
}
