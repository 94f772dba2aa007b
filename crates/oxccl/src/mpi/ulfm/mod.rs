//! Recovery (revoke, agree, shrink) on the `mpi` backend through MPI's own form of it, ULFM
//! (User Level Failure Mitigation: `MPIX_Comm_revoke`, `MPIX_Comm_agree`,
//! `MPIX_Comm_shrink`, `MPIX_Comm_failure_ack`, `MPIX_Comm_failure_get_acked`), where the
//! MPI that runs has it: Open MPI 5 built with ULFM (its default), launched with
//! `mpiexec --with-ft ulfm` so that a dead rank does not end the job. Its functions are found
//! at run time (`symbols.rs`): oxccl builds and links against an MPI without them (Debian's
//! Open MPI 4.1), where these calls answer [`Error::BackendUnavailable`] naming what is
//! missing. MPICH's `ch4` device exports them but aborts in them: refused too (`classes.rs`).
//!
//! * `revoke(reason)` (`ops.rs`): the rank tells its peers on the side channel (a `REVOKE`
//!   notice carrying its rank and reason, `side.rs`), poisons its own communicator with
//!   [`Error::Revoked`] naming itself, then calls `MPIX_Comm_revoke`. A peer whose notice
//!   arrives first reports the revoking rank and its reason. Otherwise it learns of the revoke
//!   from MPI: a call failing with `MPIX_ERR_REVOKED`, which [`classify`] turns into
//!   [`Error::Revoked`]. ULFM does not say who revoked, so that error names *this* rank and
//!   says in its reason that it was revoked through MPI by a rank MPI does not name.
//! * Errors ([`classify`] in `errors.rs`, used wherever the engine turns an MPI return code
//!   into an error): the class (`MPI_Error_class`) is looked up in the MPI family's table
//!   (`classes.rs`: Open MPI 5's 75/76/77, MPICH's 101/102/103). `MPIX_ERR_PROC_FAILED` and
//!   `MPIX_ERR_PROC_FAILED_PENDING` become [`Error::PeerLost`] naming the lowest failed rank
//!   (`MPIX_Comm_failure_ack`, `MPIX_Comm_failure_get_acked`, `MPI_Group_translate_ranks`
//!   into the communicator's ranks; every failed rank is listed in the detail);
//!   `MPIX_ERR_REVOKED` becomes [`Error::Revoked`]. Every other code stays
//!   [`Error::Backend`] with MPI's error string. Every communicator has `MPI_ERRORS_RETURN`
//!   (the world's duplicate, split and shrunk ones alike), so MPI returns these codes instead
//!   of ending the process.
//! * `agree(flag)`: `decide.rs` (the argument why every survivor gets the same flag and the
//!   same failed set, from rounds of 32-bit `MPIX_Comm_agree`s), over `MPIX_Comm_iagree`
//!   polled against the call's deadline where the MPI has it (Open MPI 5), else the blocking
//!   `MPIX_Comm_agree` (no deadline). `joiners` is 0: this backend has no store to join
//!   through. An agreement that timed out still runs inside MPI: the communicator cannot agree
//!   again (later `agree`/`shrink` calls say so).
//! * `shrink(exclude)`: the list is checked as on the cpu backend (same errors), then the
//!   survivors agree that they passed the same list (a digest, with the call's deadline: a
//!   live rank that never calls `shrink` ends it with a timeout), then `MPIX_Comm_shrink`
//!   (blocking; ULFM gives every survivor the same members, in the old rank order), then
//!   `MPI_Comm_split` leaves out the listed ranks, which get `None`.
//! * `grow`: ULFM has none (`MPI_Comm_spawn` starts new processes, it does not admit ones
//!   that joined through a store): [`Error::BackendUnavailable`], pointing at the cpu backend.

mod classes;
mod decide;
mod errors;
mod ops;
mod symbols;

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

pub(crate) use errors::classify;
pub(crate) use ops::{agree, revoke, shrink};

use crate::error::Error;

/// A communicator's recovery state.
#[derive(Default)]
pub(crate) struct Recovery {
    /// Agreements started on the communicator (an agreement's number in a timeout).
    agreements: AtomicU64,
    /// Set when an agreement timed out: its request still runs inside MPI, so the ranks'
    /// agreements are out of step for good.
    broken: Mutex<Option<String>>,
}

/// The error of `call` (`revoke`, `agree`, `shrink`, `grow`) when the MPI that runs cannot do
/// it: `why` is the reason ([`symbols::ulfm`]'s).
pub(crate) fn unavailable(call: &str, why: &str) -> Error {
    Error::BackendUnavailable {
        backend: "mpi".into(),
        why: format!("{call} needs ULFM, and {why}; run recovery on the cpu backend (OXCCL_BACKEND=cpu)"),
    }
}

/// `grow`'s error: ULFM has no grow.
pub(crate) fn no_grow() -> Error {
    Error::BackendUnavailable {
        backend: "mpi".into(),
        why: "grow is not available on the mpi backend: ULFM has no way to admit newcomers (MPI_Comm_spawn starts \
              new processes itself, it is not a join through a rendezvous store); shrink works here, and a job that \
              must grow back runs on the cpu backend (OXCCL_BACKEND=cpu, under `oxccl run`)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_errors_say_what_is_missing_and_what_to_do() {
        let e = unavailable("shrink", "Open MPI v4.1.4 does not export MPIX_Comm_revoke").to_string();
        assert!(e.contains("shrink needs ULFM") && e.contains("MPIX_Comm_revoke"), "{e}");
        assert!(e.contains("Open MPI v4.1.4") && e.contains("OXCCL_BACKEND=cpu"), "{e}");
        let e = no_grow().to_string();
        assert!(e.contains("ULFM has no way to admit newcomers") && e.contains("MPI_Comm_spawn"), "{e}");
        assert!(e.contains("OXCCL_BACKEND=cpu") && e.contains("backend `mpi`"), "{e}");
    }

    #[test]
    fn without_ulfm_the_reason_names_the_missing_functions() {
        // Debian's Open MPI 4.1 (what this test runs against in CI) exports none of them.
        let missing = symbols::missing();
        match symbols::ulfm() {
            Ok(_) => assert!(missing.is_empty()),
            Err(why) => {
                for m in &missing {
                    assert!(why.contains(m), "{why}");
                }
                assert!(!why.is_empty());
            }
        }
    }
}
