//! ULFM's error classes as oxccl's errors ([`classify`], see the module's doc in `mod.rs`),
//! and the failed ranks MPI reports ([`failed_ranks`]), which `agree` asks for too.

use std::ffi::c_int;

use mpi::ffi;

use super::classes::UlfmClass;
use super::symbols::{self, Ulfm};
use crate::error::{Error, Result};
use crate::mpi::check::check;
use crate::mpi::state::Shared;

/// Turns an [`Error::Backend`] whose MPI error class is one of ULFM's into oxccl's error (see
/// the module's doc); any other error comes back unchanged. The caller holds the runtime's
/// lock when MPI is not thread-multiple.
pub(crate) fn classify(s: &Shared, e: Error) -> Error {
    let Error::Backend { code, message } = &e else { return e };
    let Ok(u) = symbols::ulfm() else { return e };
    let Some(kind) = class_of(*code).and_then(|c| u.classes.of(c)) else { return e };
    match kind {
        UlfmClass::Revoked => Error::Revoked {
            rank: s.rank,
            reason: format!(
                "revoked through MPI ({message}); ULFM does not say which rank revoked it, so the rank named is this \
                 one"
            ),
        },
        UlfmClass::ProcFailed | UlfmClass::ProcFailedPending => match failed_ranks(u, s) {
            Ok(failed) if !failed.is_empty() => Error::PeerLost {
                rank: failed[0],
                detail: format!(
                    "MPI reports a process failure ({message}); ranks {failed:?} of this communicator failed; agree \
                     on it or shrink it to go on"
                ),
            },
            _ => e,
        },
    }
}

/// MPI's error class of `code`; `None` when MPI does not know the code.
pub(super) fn class_of(code: i64) -> Option<i32> {
    let code = c_int::try_from(code).ok()?;
    let mut class: c_int = 0;
    // SAFETY: MPI_Error_class reads an error code and writes one int; MPI is initialised
    // (the code came from an MPI call).
    let rc = unsafe { ffi::MPI_Error_class(code, &mut class) };
    (rc == 0).then_some(class)
}

/// The ranks of `s`'s communicator that MPI reports failed, acknowledged first
/// (`MPIX_Comm_failure_ack`, `MPIX_Comm_failure_get_acked`, translated into the
/// communicator's ranks), in order. The caller holds the runtime's lock when MPI is not
/// thread-multiple.
///
/// # Errors
/// MPI's errors.
pub(super) fn failed_ranks(u: &Ulfm, s: &Shared) -> Result<Vec<usize>> {
    let comm = s.comm.0;
    // SAFETY: `comm` is a valid communicator of this process.
    check(unsafe { (u.failure_ack)(comm) }, "MPIX_Comm_failure_ack")?;
    // SAFETY: a zeroed handle is overwritten by the call.
    let mut failed: ffi::MPI_Group = unsafe { std::mem::zeroed() };
    // SAFETY: as above; MPI creates the group, freed below.
    check(unsafe { (u.failure_get_acked)(comm, &mut failed) }, "MPIX_Comm_failure_get_acked")?;
    let out = translate(comm, &mut failed);
    // SAFETY: `failed` was created above and is freed once.
    unsafe { ffi::MPI_Group_free(&mut failed) };
    out
}

/// The ranks in `comm` of the members of `group` (a subgroup of `comm`'s), in order.
fn translate(comm: ffi::MPI_Comm, group: &mut ffi::MPI_Group) -> Result<Vec<usize>> {
    let mut k: c_int = 0;
    // SAFETY: `group` is a valid group.
    check(unsafe { ffi::MPI_Group_size(*group, &mut k) }, "MPI_Group_size")?;
    if k <= 0 {
        return Ok(Vec::new());
    }
    // SAFETY: a zeroed handle is overwritten by the call.
    let mut all: ffi::MPI_Group = unsafe { std::mem::zeroed() };
    // SAFETY: `comm` is a valid communicator; the group is freed below.
    check(unsafe { ffi::MPI_Comm_group(comm, &mut all) }, "MPI_Comm_group")?;
    let from: Vec<c_int> = (0..k).collect();
    let mut to: Vec<c_int> = vec![0; from.len()];
    // SAFETY: both arrays hold `k` ints; both groups are valid.
    let rc = unsafe { ffi::MPI_Group_translate_ranks(*group, k, from.as_ptr(), all, to.as_mut_ptr()) };
    // SAFETY: `all` was created above and is freed once.
    unsafe { ffi::MPI_Group_free(&mut all) };
    check(rc, "MPI_Group_translate_ranks")?;
    let mut ranks: Vec<usize> = to.into_iter().filter_map(|r| usize::try_from(r).ok()).collect();
    ranks.sort_unstable();
    Ok(ranks)
}
