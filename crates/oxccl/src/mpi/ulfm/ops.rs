//! The MPI side of recovery: `revoke`, `agree` and `shrink` on one communicator (see the
//! module's doc in `mod.rs` for what each does, and `decide.rs` for the agreement).

use std::collections::BTreeSet;
use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mpi::ffi;

use super::classes::UlfmClass;
use super::decide::{self, Agreer};
use super::errors::{class_of, classify, failed_ranks};
use super::symbols::{self, Ulfm};
use super::unavailable;
use crate::backend::{Agreement, CallOptions};
use crate::error::{Error, Result};
use crate::fingerprint::OpKind;
use crate::mpi::backoff::Backoff;
use crate::mpi::check::check;
use crate::mpi::comm::Comm;
use crate::mpi::state::Shared;
use crate::sync::relock;

/// The loaded MPI's ULFM for `call`, or the error that says why there is none.
fn ulfm(call: &str) -> Result<&'static Ulfm> {
    symbols::ulfm().map_err(|why| unavailable(call, why))
}

/// `MPI_REQUEST_NULL`.
fn null_req() -> ffi::MPI_Request {
    // SAFETY: reading the rsmpi shim's constant.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// oxccl's error for MPI's failed return code `rc` of `what` on `s` ([`classify`]'d).
fn error_of(s: &Shared, rc: c_int, what: &str) -> Error {
    match check(rc, what) {
        Err(e) => classify(s, e),
        Ok(()) => Error::Internal(format!("{what} failed with MPI_SUCCESS")),
    }
}

/// The error of a call on a communicator whose agreements are out of step.
fn check_broken(s: &Shared) -> Result<()> {
    match relock(&s.recovery.broken).as_ref() {
        None => Ok(()),
        Some(why) => Err(Error::Aborted {
            reason: format!(
                "this communicator cannot agree or shrink any more: {why}, and still runs inside MPI, so the ranks' \
                 agreements are out of step; create a new communicator"
            ),
        }),
    }
}

/// See [`Backend::revoke`](crate::backend::Backend::revoke): tells the peers, poisons this
/// rank's communicator with [`Error::Revoked`], then `MPIX_Comm_revoke`.
///
/// # Errors
/// [`Error::BackendUnavailable`] without a usable ULFM; MPI's error of the revoke.
pub(crate) fn revoke(s: &Shared, reason: &str) -> Result<()> {
    let u = ulfm("revoke")?;
    s.revoke_here(reason);
    let _g = s.rt.lock();
    // SAFETY: `s.comm` is a valid communicator of this process; revoking is allowed from any
    // thread and on a communicator that is already revoked.
    let rc = unsafe { (u.revoke)(s.comm.0) };
    match class_of(i64::from(rc)).and_then(|c| u.classes.of(c)) {
        _ if rc == 0 => Ok(()),
        Some(UlfmClass::Revoked) => Ok(()),
        _ => check(rc, "MPIX_Comm_revoke"),
    }
}

/// One rank's ULFM primitives on one communicator, for `decide`.
struct MpiAgreer<'a> {
    u: &'a Ulfm,
    s: &'a Shared,
    deadline: Instant,
    started: Instant,
    number: u64,
}

impl MpiAgreer<'_> {
    /// The error of an agreement still running at the deadline; the communicator cannot agree
    /// again (its request cannot be taken back).
    fn timed_out(&self) -> Error {
        let e = Error::Timeout { op: OpKind::Agree, seq: self.number, peer: None, waited: self.started.elapsed() };
        relock(&self.s.recovery.broken).get_or_insert_with(|| format!("agreement #{} timed out", self.number));
        e
    }

    /// The outcome of one agreement call's return code: the agreed word, also when MPI reports
    /// a process failure with it (ULFM still sets the flag: the failure is caught by
    /// `decide`'s stable bit). The caller holds the runtime's lock when MPI is not
    /// thread-multiple.
    fn outcome(&self, rc: c_int, flag: c_int, what: &str) -> Result<u32> {
        if rc == 0 {
            return Ok(flag as u32);
        }
        match class_of(i64::from(rc)).and_then(|c| self.u.classes.of(c)) {
            Some(UlfmClass::ProcFailed) => Ok(flag as u32),
            _ => Err(error_of(self.s, rc, what)),
        }
    }
}

impl Agreer for MpiAgreer<'_> {
    fn and(&mut self, word: u32) -> Result<u32> {
        let comm = self.s.comm.0;
        let Some(iagree) = self.u.iagree else {
            let mut flag = word as c_int;
            let _g = self.s.rt.lock();
            // SAFETY: `comm` is valid; `flag` outlives the blocking call.
            let rc = unsafe { (self.u.agree)(comm, &mut flag) };
            return self.outcome(rc, flag, "MPIX_Comm_agree");
        };
        // The flag must stay where it is until the request completes, also past a timeout:
        // boxed, and leaked with the request if the deadline passes first.
        let flag = Box::into_raw(Box::new(word as c_int));
        let mut req = null_req();
        {
            let _g = self.s.rt.lock();
            // SAFETY: `comm` is valid; `flag` stays allocated until the request completes.
            let rc = unsafe { iagree(comm, flag, &mut req) };
            if rc != 0 {
                // SAFETY: the agreement did not start: nothing refers to `flag`.
                drop(unsafe { Box::from_raw(flag) });
                return Err(error_of(self.s, rc, "MPIX_Comm_iagree"));
            }
        }
        let mut backoff = Backoff::new();
        loop {
            {
                let _g = self.s.rt.lock();
                let mut done: c_int = 0;
                // SAFETY: MPI_Status is plain data that MPI fills in.
                let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
                // SAFETY: `req` is the active request of the agreement started above.
                let rc = unsafe { ffi::MPI_Test(&mut req, &mut done, &mut status) };
                if rc != 0 || done != 0 {
                    if done == 0 && req != null_req() {
                        // An error that left the request active: MPI may still write `flag`,
                        // which is leaked.
                        return Err(error_of(self.s, rc, "MPI_Test (MPIX_Comm_iagree)"));
                    }
                    // SAFETY: the request completed (or failed and was freed): MPI no longer
                    // writes `flag`.
                    let value = *unsafe { Box::from_raw(flag) };
                    return self.outcome(rc, value, "MPIX_Comm_iagree");
                }
            }
            if Instant::now() >= self.deadline {
                // `flag` is leaked on purpose: MPI may still write it.
                return Err(self.timed_out());
            }
            backoff.snooze();
        }
    }

    fn known_failed(&mut self) -> Result<BTreeSet<usize>> {
        let _g = self.s.rt.lock();
        Ok(failed_ranks(self.u, self.s)?.into_iter().collect())
    }
}

fn agreer<'a>(u: &'a Ulfm, s: &'a Shared, opts: &CallOptions) -> MpiAgreer<'a> {
    let started = Instant::now();
    let timeout: Duration = opts.timeout_or(s.cfg.timeout);
    let number = s.recovery.agreements.fetch_add(1, Ordering::Relaxed);
    MpiAgreer { u, s, deadline: started + timeout, started, number }
}

/// See [`Backend::agree`](crate::backend::Backend::agree).
///
/// # Errors
/// [`Error::BackendUnavailable`] without a usable ULFM; a timeout; [`Error::Aborted`] on a
/// communicator whose agreements are out of step, or when the others agreed this rank failed;
/// MPI's errors.
pub(crate) fn agree(s: &Shared, flag: u64, opts: &CallOptions) -> Result<Agreement> {
    let u = ulfm("agree")?;
    check_broken(s)?;
    let d = decide::agree(&mut agreer(u, s, opts), s.n, flag)?;
    if d.failed.contains(&s.rank) {
        return Err(Error::Aborted {
            reason: format!(
                "the other ranks agreed that this rank ({}) failed (MPI's failure detector suspected it); it cannot \
                 take part in this communicator any more",
                s.rank
            ),
        });
    }
    Ok(Agreement { flag: d.flag, failed: d.failed, joiners: 0 })
}

/// See [`Backend::shrink`](crate::backend::Backend::shrink): the new communicator (with
/// `MPI_ERRORS_RETURN`), `None` for the ranks in `exclude`.
///
/// # Errors
/// [`Error::InvalidArgument`] for a bad list (the cpu backend's checks) or lists that differ
/// between ranks (on every rank); as [`agree`]; MPI's errors of the shrink and split.
pub(crate) fn shrink(s: &Shared, exclude: &[usize], opts: &CallOptions) -> Result<Option<Comm>> {
    let u = ulfm("shrink")?;
    let excluded = crate::backend::exclude::check_exclude(exclude, s.n)?;
    check_broken(s)?;
    if !decide::same_everywhere(&mut agreer(u, s, opts), decide::list_digest(&excluded))? {
        return Err(Error::invalid(
            "shrink_excluding: the ranks passed different lists of ranks to exclude; every rank must pass the same",
        ));
    }
    let _g = s.rt.lock();
    // SAFETY: a zeroed handle is overwritten by MPIX_Comm_shrink.
    let mut shrunk: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
    // SAFETY: `s.comm` is valid; every survivor calls the shrink (they all passed the agreement).
    let rc = unsafe { (u.shrink)(s.comm.0, &mut shrunk) };
    if rc != 0 {
        return Err(error_of(s, rc, "MPIX_Comm_shrink"));
    }
    // SAFETY: `shrunk` was just created.
    check(unsafe { ffi::MPI_Comm_set_errhandler(shrunk, ffi::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler")?;
    if excluded.is_empty() {
        return Ok(Some(Comm(shrunk)));
    }
    let mut key: c_int = 0;
    // SAFETY: `shrunk` is valid.
    check(unsafe { ffi::MPI_Comm_rank(shrunk, &mut key) }, "MPI_Comm_rank")?;
    let color = if excluded.contains(&s.rank) {
        // SAFETY: reading the rsmpi shim's constant.
        unsafe { ffi::RSMPI_UNDEFINED }
    } else {
        0
    };
    // SAFETY: a zeroed handle is overwritten by MPI_Comm_split.
    let mut out: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
    // SAFETY: collective over `shrunk`, which every survivor has (keys keep the old order).
    let rc = unsafe { ffi::MPI_Comm_split(shrunk, color, key, &mut out) };
    // SAFETY: `shrunk` was created above; nothing else refers to it.
    unsafe { ffi::MPI_Comm_free(&mut shrunk) };
    check(rc, "MPI_Comm_split")?;
    if excluded.contains(&s.rank) {
        return Ok(None);
    }
    // SAFETY: `out` is the valid communicator of the kept ranks.
    check(unsafe { ffi::MPI_Comm_set_errhandler(out, ffi::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler")?;
    Ok(Some(Comm(out)))
}
