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
//! requests): at finalisation [`bury_all`] frees every communicator left and leaks the
//! abandoned requests, their temporaries and the unfinished sends' buffers, since MPI may
//! still refer to them.
//!
//! Every function here makes MPI calls: the caller holds the runtime's lock when MPI is not
//! thread-multiple.

use std::sync::Mutex;

use mpi::ffi;

use super::engine::{Abandoned, Comm};
use super::side::{self, Outbox};
use crate::sync::relock;

/// A dropped communicator waiting for its peers' `LEFT` before `MPI_Comm_free`.
struct Dead {
    comm: Comm,
    waiting: Vec<bool>,
    outbox: Outbox,
    abandoned: Vec<Abandoned>,
}

static GRAVE: Mutex<Vec<Dead>> = Mutex::new(Vec::new());

/// Hands a dropped communicator to the graveyard: `waiting[p]` says whether peer `p`'s
/// `LEFT` is still to come; `outbox` and `abandoned` are what MPI may still use.
pub(super) fn bury(comm: Comm, waiting: Vec<bool>, outbox: Outbox, abandoned: Vec<Abandoned>) {
    relock(&GRAVE).push(Dead { comm, waiting, outbox, abandoned });
}

/// Receives what arrives on dropped communicators and frees those whose peers all left.
/// The caller holds the runtime's lock when MPI is not thread-multiple.
pub(super) fn drain_grave() {
    let Ok(mut g) = GRAVE.try_lock() else { return };
    g.retain_mut(|d| {
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
        if done && d.abandoned.is_empty() {
            // SAFETY: every peer has left and nothing of ours is pending on the communicator.
            unsafe { ffi::MPI_Comm_free(&mut d.comm.0) };
            return false;
        }
        true
    });
}

/// Frees every dropped communicator (at finalisation). Abandoned requests and their
/// temporaries are leaked: MPI may still refer to them.
pub(super) fn bury_all() {
    let mut g = relock(&GRAVE);
    for mut d in g.drain(..) {
        // SAFETY: finalisation: nothing of oxccl uses the communicator any more.
        unsafe { ffi::MPI_Comm_free(&mut d.comm.0) };
        std::mem::forget(std::mem::take(&mut d.abandoned));
        std::mem::forget(std::mem::take(&mut d.outbox));
    }
}
