//! The graveyard of the `mpi` backend: dropped communicators whose MPI communicator cannot
//! be freed yet.
//!
//! Dropping a communicator (`Drop for Shared` in `engine.rs`) abandons its queued
//! operations, sends `LEFT` to every peer (see `side.rs`), receives what has arrived, and
//! hands the MPI communicator here ([`bury`]) with what still refers to it: the peers whose
//! `LEFT` has not arrived yet, the sends in flight (their [`Outbox`]), and the requests of
//! abandoned operations with their temporaries.
//!
//! `MPI_Comm_free` waits until every peer has said it left too, so that a late side message
//! from a peer can never land in a new communicator that reuses the context id. [`drain_grave`] runs on every
//! progress of any communicator of the process (and after each burial): for each dropped
//! communicator it receives and discards whatever arrives, notes each peer's `LEFT`, and
//! tests the outbox; once every peer has left and every send has completed, and no
//! abandoned operation holds requests on it, the communicator is freed. It takes the
//! graveyard's lock with `try_lock`, so a progress never waits for another thread's drain.
//! Communicators with abandoned requests are never freed here (MPI may still complete those
//! requests); at finalisation [`bury_all`] frees only those whose peers have all left, as
//! here, and leaks the others (see its doc: freeing a communicator with unreceived messages
//! hangs Open MPI 5's finalisation in ULFM mode).
//!
//! A revoked communicator (ULFM) is never freed, not even at finalisation: Open MPI 5 frees
//! it, but the peers' `MPI_Finalize` then hangs in its barrier when a collective was still in
//! flight on it (seen with a revoke during a 64 MiB all_reduce; a plain C program that frees
//! the revoked communicator hangs the same way). Its handle is leaked instead.
//!
//! Every function here makes MPI calls: the caller holds the runtime's lock when MPI is not
//! thread-multiple.

use std::sync::Mutex;

use mpi::ffi;

use super::comm::Comm;
use super::side::{self, Outbox};
use super::state::Abandoned;
use crate::sync::relock;

/// A dropped communicator waiting for its peers' `LEFT` before `MPI_Comm_free`.
struct Dead {
    comm: Comm,
    waiting: Vec<bool>,
    outbox: Outbox,
    abandoned: Vec<Abandoned>,
    /// Revoked (ULFM): never freed.
    revoked: bool,
}

static GRAVE: Mutex<Vec<Dead>> = Mutex::new(Vec::new());

/// Hands a dropped communicator to the graveyard: `waiting[p]` says whether peer `p`'s
/// `LEFT` is still to come; `outbox` and `abandoned` are what MPI may still use; a `revoked`
/// one is never freed.
pub(super) fn bury(comm: Comm, waiting: Vec<bool>, outbox: Outbox, abandoned: Vec<Abandoned>, revoked: bool) {
    relock(&GRAVE).push(Dead { comm, waiting, outbox, abandoned, revoked });
}

/// Receives what arrives on dropped communicators and frees those whose peers all left.
/// The caller holds the runtime's lock when MPI is not thread-multiple.
pub(super) fn drain_grave() {
    let Ok(mut g) = GRAVE.try_lock() else { return };
    g.retain_mut(|d| !settle(d));
}

/// Receives what arrived on `d`, and frees it once every peer has left, every send has
/// completed and no abandoned request holds it (never when revoked): whether it was freed.
fn settle(d: &mut Dead) -> bool {
    if d.waiting.iter().any(|&w| w) {
        while let Ok(Some((src, m))) = side::recv_raw(d.comm) {
            if side::is_left(&m) {
                if let Some(w) = usize::try_from(src).ok().and_then(|s| d.waiting.get_mut(s)) {
                    *w = false;
                }
            }
        }
    }
    d.outbox.flush();
    let done = !d.waiting.iter().any(|&w| w) && d.outbox.is_empty();
    if done && d.abandoned.is_empty() && !d.revoked {
        // SAFETY: every peer has left and nothing of ours is pending on the communicator.
        unsafe { ffi::MPI_Comm_free(&mut d.comm.0) };
        return true;
    }
    false
}

/// At finalisation: frees the dropped communicators that [`drain_grave`] would free now, and
/// leaks the others' handles (MPI_Finalize reclaims them), with their abandoned requests,
/// temporaries and unfinished sends' buffers, since MPI may still refer to them. Freeing a
/// communicator on which peers' messages may still arrive unreceived makes Open MPI 5's
/// `MPI_Finalize` hang in its barrier under `mpiexec --with-ft ulfm` (seen with a plain C
/// program too); leaving it unfreed does not.
pub(super) fn bury_all() {
    let mut g = relock(&GRAVE);
    for mut d in g.drain(..) {
        settle(&mut d);
        std::mem::forget(std::mem::take(&mut d.abandoned));
        std::mem::forget(std::mem::take(&mut d.outbox));
    }
}
