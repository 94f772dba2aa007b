//! One NCCL communicator handle and its life: creation (non-blocking, NCCL's precondition for
//! a safe abort), waiting for calls that returned `ncclInProgress`, the asynchronous error,
//! the communicators made from it (split, shrink, grow), abort and orderly destruction.
//!
//! The handle sits behind a mutex: every call on it holds the lock for the duration of the
//! (non-blocking, hence short) NCCL call, and [`Comm::abort`] takes the handle out under the
//! same lock, so no call can use a communicator that another thread has just aborted and
//! freed. After an abort every call fails with [`Error::Aborted`].

use std::ffi::c_int;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::lost::LostGrace;
use crate::error::{Error, Result};
use crate::sync::relock;
use crate::xccl::library::types::{NcclConfig, NcclUniqueId};
use crate::xccl::library::{Library, NcclComm, NcclResult, Progress};

/// `NCCL_SPLIT_NOCOLOR` (nccl.h.in since 2.18.1): the color of a rank that takes no part in
/// a split and gets no communicator.
pub(crate) const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// `NCCL_SHRINK_DEFAULT` (nccl.h.in since 2.27.3): shrink a healthy parent, whose
/// operations are left to finish.
const NCCL_SHRINK_DEFAULT: c_int = 0x00;

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
    lib: Arc<Library>,
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
        lib: &Arc<Library>,
        n: usize,
        id: &NcclUniqueId,
        rank: usize,
        guard: &Guard<'_>,
    ) -> Result<Comm> {
        let nranks = ranks_for_nccl(n)?;
        let me = rank_for_nccl(rank)?;
        let mut raw: NcclComm = std::ptr::null_mut();
        let mut config = NcclConfig::with_blocking(false);
        // SAFETY: ncclCommInitRankConfig writes the new handle through `raw`, reads the id by
        // value and the config through a valid pointer to a `ncclConfig_v21400` (see
        // `NcclConfig`); the calling thread's current device is the one the engine chose.
        let result = unsafe { (lib.table.comm_init_rank_config)(&mut raw, nranks, *id, me, &mut config) };
        let comm = Comm::empty(lib);
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

    /// A communicator without a handle yet.
    fn empty(lib: &Arc<Library>) -> Comm {
        Comm { lib: Arc::clone(lib), raw: Mutex::new(None), aborted: Mutex::new(None) }
    }

    /// Checks that NCCL sees the communicator as oxccl made it (`size` ranks, this one
    /// `rank`, on `device`): a mismatch would mean every later call goes wrong.
    ///
    /// # Errors
    /// [`Error::Internal`] for a mismatch; the queries' errors.
    pub(crate) fn verify(&self, size: usize, rank: usize, device: u32) -> Result<()> {
        let (lib, t) = (&self.lib, &self.lib.table);
        let ask = |name: &str, f: crate::xccl::library::table::CommIntFn| -> Result<i64> {
            let mut v: c_int = -1;
            // SAFETY: a live communicator (lock held by `with`); writes one int.
            let (r, raw) = self.with(|c| (unsafe { f(c, &mut v) }, c))?;
            lib.check(name, r, raw)?;
            Ok(i64::from(v))
        };
        let seen = (ask("ncclCommCount", t.comm_count)?, ask("ncclCommUserRank", t.comm_user_rank)?);
        let dev = ask("ncclCommCuDevice", t.comm_cu_device)?;
        if seen != (size as i64, rank as i64) || dev != i64::from(device) {
            return Err(Error::Internal(format!(
                "NCCL made rank {} of {} on device {dev}, but oxccl asked for rank {rank} of {size} on device {device}",
                seen.1, seen.0
            )));
        }
        Ok(())
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

    /// Polls the asynchronous error until a call that returned `ncclInProgress` has finished,
    /// checking `guard`'s watch on every poll (a lost peer after a grace).
    ///
    /// # Errors
    /// The call's error; `guard`'s errors.
    pub(crate) fn wait_ready(&self, call: &str, guard: &Guard<'_>) -> Result<()> {
        let started = Instant::now();
        let mut pause = Duration::from_micros(1);
        let mut lost = LostGrace::default();
        loop {
            let (status, raw) = self.status()?;
            match status {
                NcclResult::SUCCESS => return Ok(()),
                NcclResult::IN_PROGRESS => {}
                bad => return Err(self.lib.error(call, bad, raw)),
            }
            // A peer that finished the call and closed its communicator is not a failure
            // yet: the next status may well be success (see `lost.rs`).
            let now = Instant::now();
            lost.check(now, (guard.watch)())?;
            if now >= guard.deadline {
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
    /// # Errors
    /// The library lacks `ncclCommSplit` (an internal error: callers check first); those of
    /// [`child`](Self::child).
    pub(crate) fn split(&self, color: c_int, key: c_int, guard: &Guard<'_>) -> Result<Option<Comm>> {
        let split = self
            .lib
            .table
            .comm_split
            .ok_or_else(|| Error::Internal("ncclCommSplit is missing from the loaded library".into()))?;
        let mut config = NcclConfig::with_blocking(false);
        self.child("ncclCommSplit", guard, |c, slot| {
            // SAFETY: `c` is live (`child` calls this under the lock); ncclCommSplit writes the
            // new handle through `slot`, which `child` keeps valid until NCCL's job is over,
            // and reads a valid `ncclConfig_v21400` during the call.
            unsafe { split(c, color, key, slot, &mut config) }
        })
    }

    /// Shrinks the communicator (`ncclCommShrink` with `NCCL_SHRINK_DEFAULT`,
    /// non-blocking): every rank not in `exclude` (old ranks; the excluded ones do not call
    /// this) gets the new communicator, in which the kept ranks keep their order. Returns
    /// once the shrink is done on this communicator's side, as [`split`](Self::split).
    ///
    /// # Errors
    /// The library lacks `ncclCommShrink` (an internal error: callers check first); an empty
    /// list (NCCL refuses it); those of [`child`](Self::child); no communicator for a kept
    /// rank (an internal error).
    pub(crate) fn shrink(&self, exclude: &[c_int], guard: &Guard<'_>) -> Result<Comm> {
        let shrink = self
            .lib
            .table
            .comm_shrink
            .ok_or_else(|| Error::Internal("ncclCommShrink is missing from the loaded library".into()))?;
        if exclude.is_empty() {
            return Err(Error::Internal("ncclCommShrink needs at least one rank to exclude".into()));
        }
        let count = c_int::try_from(exclude.len()).map_err(|_| Error::invalid("too many ranks to exclude for NCCL"))?;
        // NCCL sorts the list in place: it gets a copy of its own.
        let mut list = exclude.to_vec();
        let mut config = NcclConfig::with_blocking(false);
        let child = self.child("ncclCommShrink", guard, |c, slot| {
            // SAFETY: `c` is live (`child` calls this under the lock); `list` holds `count`
            // ints NCCL may reorder (it copies them for its job); the new handle is written
            // through `slot`, which `child` keeps valid until NCCL's job is over; the config is
            // a valid `ncclConfig_v21400` read during the call.
            unsafe { shrink(c, list.as_mut_ptr(), count, slot, &mut config, NCCL_SHRINK_DEFAULT) }
        })?;
        child.ok_or_else(|| Error::Internal("ncclCommShrink made no communicator for a rank it keeps".into()))
    }

    /// A communicator made from this one by `start` (`ncclCommSplit` or `ncclCommShrink`,
    /// non-blocking), which is given the live handle (under the lock) and the slot for the
    /// new one.
    ///
    /// On a non-blocking parent NCCL (2.18 on) returns with the new handle still null (and
    /// with `ncclSuccess`, not `ncclInProgress`, in 2.28), and its background job writes the
    /// handle later. So the handle's slot is heap memory that outlives the call, read only
    /// once the parent's asynchronous error is `ncclSuccess`; when the call fails or its
    /// wait ends early, the parent is aborted first (NCCL's abort joins the job, so nothing
    /// writes the slot afterwards), and a handle the job wrote before that is aborted too.
    ///
    /// # Errors
    /// NCCL's error; the wait's errors. Each is a failure of this communicator, which is
    /// aborted.
    fn child(
        &self,
        call: &str,
        guard: &Guard<'_>,
        start: impl FnOnce(NcclComm, *mut NcclComm) -> NcclResult,
    ) -> Result<Option<Comm>> {
        let slot: *mut NcclComm = Box::into_raw(Box::new(std::ptr::null_mut()));
        let result = self.with(|c| start(c, slot));
        // The child is collective over the parent: its progress shows on the parent. NCCL
        // (2.28 at least) returns ncclSuccess from a non-blocking split whose job still runs
        // (its group's ncclInProgress is dropped), so the parent is polled whatever the call
        // returned: only its settled state says the handle has been written.
        let settled = result.and_then(|r| self.settle(call, r, guard)).and_then(|()| self.wait_ready(call, guard));
        if let Err(e) = &settled {
            // Joins NCCL's job: after this nothing writes the slot.
            self.abort(&format!("{call} on the NCCL communicator failed: {e}"));
        }
        // SAFETY: from `Box::into_raw` above, freed once here; NCCL no longer writes it (the
        // parent settled, or was aborted just above).
        let new = *unsafe { Box::from_raw(slot) };
        let child = Comm::empty(&self.lib);
        if !new.is_null() {
            *relock(&child.raw) = Some(Handle(new));
        }
        settled?;
        Ok((!new.is_null()).then_some(child))
    }

    /// `ncclCommGetUniqueId`: the id of this communicator's next grow, made by the one rank
    /// of it that passes the id to [`grow_member`](Self::grow_member) (the root).
    ///
    /// # Errors
    /// The library lacks `ncclCommGetUniqueId` (an internal error: callers check first);
    /// NCCL's error.
    pub(crate) fn grow_id(&self) -> Result<NcclUniqueId> {
        let get = self
            .lib
            .table
            .comm_get_unique_id
            .ok_or_else(|| Error::Internal("ncclCommGetUniqueId is missing from the loaded library".into()))?;
        let mut id = NcclUniqueId::zeroed();
        // SAFETY: `c` is live (lock held); ncclCommGetUniqueId writes one id through a valid
        // pointer.
        let (r, raw) = self.with(|c| (unsafe { get(c, &mut id) }, c))?;
        self.lib.check("ncclCommGetUniqueId", r, raw)?;
        Ok(id)
    }

    /// This rank's communicator of `total` ranks grown from this one (`ncclCommGrow`,
    /// non-blocking): it keeps its rank; the root passes the id of [`grow_id`](Self::grow_id),
    /// the others `None`. Waits until the new communicator is ready, within `guard`.
    ///
    /// # Errors
    /// The library lacks `ncclCommGrow` (an internal error: callers check first); those of
    /// [`grown`](Self::grown). This communicator is left as it is.
    pub(crate) fn grow_member(&self, total: usize, id: Option<&NcclUniqueId>, guard: &Guard<'_>) -> Result<Comm> {
        let grow = grow_fn(&self.lib)?;
        let n = ranks_for_nccl(total)?;
        let id: *const NcclUniqueId = id.map_or(std::ptr::null(), std::ptr::from_ref);
        Comm::grown(&self.lib, guard, |slot, config| {
            self.with(|c| {
                // SAFETY: `c` is live (lock held); `id` is null or the caller's id, read during
                // the call; the new handle is written through `slot`, which `grown` keeps
                // valid until NCCL's job is over; `config` is a valid `ncclConfig_v21400`.
                unsafe { grow(c, n, id, -1, slot, config) }
            })
        })
    }

    /// A newcomer's communicator: rank `rank` of `total`, grown from a communicator it is no
    /// member of, met through the root's id (`ncclCommGrow` with no parent, non-blocking).
    /// The device is the one current on the calling thread. Waits until it is ready, within
    /// `guard`.
    ///
    /// # Errors
    /// The library lacks `ncclCommGrow` (an internal error: callers check first); those of
    /// [`grown`](Self::grown).
    pub(crate) fn grow_new(
        lib: &Arc<Library>,
        total: usize,
        id: &NcclUniqueId,
        rank: usize,
        guard: &Guard<'_>,
    ) -> Result<Comm> {
        let grow = grow_fn(lib)?;
        let n = ranks_for_nccl(total)?;
        let me = rank_for_nccl(rank)?;
        Comm::grown(lib, guard, |slot, config| {
            // SAFETY: a null parent is a newcomer's call; `id` is valid for the call; the new
            // handle is written through `slot`, which `grown` keeps valid until NCCL's job is
            // over; `config` is a valid `ncclConfig_v21400`.
            Ok(unsafe { grow(std::ptr::null_mut(), n, id, me, slot, config) })
        })
    }

    /// The communicator `start` makes with `ncclCommGrow`, given the slot for the new handle
    /// and a non-blocking config; waits until it is ready.
    ///
    /// NCCL writes the new handle before returning (its state `ncclInProgress`), and its
    /// init job writes it again as it ends, before the new communicator's asynchronous
    /// error leaves `ncclInProgress`. So the slot is heap memory, read at once (atomically:
    /// the job may be writing the same value) and freed only after the new communicator
    /// settled, or after it was aborted (which joins the job).
    ///
    /// # Errors
    /// NCCL's error; the wait's errors (the new communicator is aborted).
    fn grown(
        lib: &Arc<Library>,
        guard: &Guard<'_>,
        start: impl FnOnce(*mut NcclComm, *mut NcclConfig) -> Result<NcclResult>,
    ) -> Result<Comm> {
        const CALL: &str = "ncclCommGrow";
        let slot: *mut NcclComm = Box::into_raw(Box::new(std::ptr::null_mut()));
        let mut config = NcclConfig::with_blocking(false);
        let result = start(slot, &mut config);
        // SAFETY: `slot` is a live, aligned `*mut` from `Box::into_raw`; NCCL's job writes it
        // with an atomic store, so reading it through an atomic is race-free.
        let raw = unsafe { AtomicPtr::from_ptr(slot) }.load(Ordering::Acquire);
        let comm = Comm::empty(lib);
        let ready = if raw.is_null() {
            match result.and_then(|r| lib.check(CALL, r, raw)) {
                Ok(()) => Err(Error::Backend {
                    code: i64::from(NcclResult::INTERNAL_ERROR.0),
                    message: format!("{CALL} returned no communicator"),
                }),
                Err(e) => Err(e),
            }
        } else {
            *relock(&comm.raw) = Some(Handle(raw));
            // The job runs whatever the call answered (2.29 answers ncclSuccess): only the new
            // communicator's settled state says it is over.
            result
                .and_then(|r| lib.check_progress(CALL, r, raw))
                .and_then(|_| comm.wait_ready(CALL, guard))
                .inspect_err(|e| comm.abort(&format!("growing the NCCL communicator failed: {e}")))
        };
        // SAFETY: from `Box::into_raw` above, freed once here; nothing writes it any more:
        // NCCL made no communicator (no job), or the new one settled or was aborted above.
        drop(unsafe { Box::from_raw(slot) });
        ready.map(|()| comm)
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

/// The library's `ncclCommGrow`.
///
/// # Errors
/// [`Error::Internal`] when it lacks it (callers check first).
fn grow_fn(lib: &Library) -> Result<crate::xccl::library::table::CommGrowFn> {
    lib.table.comm_grow.ok_or_else(|| Error::Internal("ncclCommGrow is missing from the loaded library".into()))
}

/// `n` as NCCL's rank count.
///
/// # Errors
/// [`Error::InvalidArgument`] past `c_int::MAX`.
fn ranks_for_nccl(n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| Error::invalid(format!("NCCL takes at most {} ranks", c_int::MAX)))
}

/// Rank `r` as NCCL's `int`.
pub(crate) fn rank_for_nccl(r: usize) -> Result<c_int> {
    c_int::try_from(r).map_err(|_| Error::invalid("rank out of NCCL's range"))
}
