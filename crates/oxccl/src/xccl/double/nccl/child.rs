//! Communicators made from a parent's ranks: `ncclCommSplit` (by color and key) and
//! `ncclCommShrink` (the parent without the excluded ranks, which do not call it, the others
//! renumbered in order). Both are NCCL's child init: the parent must be ready, and on a
//! non-blocking parent the call returns `ncclSuccess` with the new handle still null, which
//! the child's background job writes later; its progress shows on the parent's async error
//! (see `PendingChild` in `comm.rs`).

use std::ffi::c_int;
use std::sync::Arc;

use super::comm::{blocking_of, lookup, new_handle, ready_parent, PendingChild, Shared};
use super::counts::counted;
use super::gathering::{Child, Gathering, NCCL_SPLIT_NOCOLOR};
use super::status::{fail, guard};
use crate::xccl::library::types::{NcclComm, NcclConfig, NcclResult};

/// `NCCL_SHRINK_ABORT` (nccl.h.in since 2.27.3): end the parent's operations first.
pub(crate) const NCCL_SHRINK_ABORT: c_int = 0x01;

/// `ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
/// ncclConfig_t* config)`: every rank of `comm` calls it; the ranks of one color form a new
/// communicator, ordered by (key, rank); [`NCCL_SPLIT_NOCOLOR`] gets null. A null config
/// inherits the parent's blocking mode.
///
/// # Safety
/// `newcomm` is null or writable; `config` is null or an `ncclConfig_t`.
pub(super) unsafe extern "C" fn nccl_comm_split(
    comm: NcclComm,
    color: c_int,
    key: c_int,
    newcomm: *mut NcclComm,
    config: *mut NcclConfig,
) -> NcclResult {
    const CALL: &str = "ncclCommSplit";
    counted(|c| c.split += 1);
    guard(CALL, || {
        if newcomm.is_null() {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: newcomm is null"));
        }
        if color < NCCL_SPLIT_NOCOLOR {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: color {color} is negative"));
        }
        let (parent, member) = match ready_parent(comm, CALL) {
            Ok(p) => p,
            Err(code) => return code,
        };
        // SAFETY: `config` is null or a config (our caller's contract).
        let blocking = match unsafe { blocking_of(config, CALL, parent.blocking) } {
            Ok(b) => b,
            Err(code) => return code,
        };
        let index = parent.next_child(Child::Split);
        let who = format!("{CALL}: rank {}", member.rank);
        let gathering =
            match member.net.meet((Child::Split, index), member.nranks, &[], (member.rank, color, key), &who) {
                Ok((g, _)) => g,
                Err(code) => return code,
            };
        let made = color != NCCL_SPLIT_NOCOLOR;
        // SAFETY: `newcomm` is non-null and writable (our caller's contract).
        unsafe { hand_out(&parent, (gathering, member.rank), made, blocking, newcomm, CALL) }
    })
}

/// `ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int
/// excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags)`: every
/// rank of `comm` not in the list calls it, with the same list; they form a new communicator
/// in their old order. As NCCL does, the list is sorted in place. The double is stricter than
/// NCCL about the list: ranks out of range and repeated ranks are refused (NCCL would count
/// the new size wrongly). `NCCL_SHRINK_ABORT` changes nothing here: a ready parent has
/// nothing in flight.
///
/// # Safety
/// `exclude` is null or points to `exclude_count` writable ints; `newcomm` is null or
/// writable; `config` is null or an `ncclConfig_t`.
pub(super) unsafe extern "C" fn nccl_comm_shrink(
    comm: NcclComm,
    exclude: *mut c_int,
    exclude_count: c_int,
    newcomm: *mut NcclComm,
    config: *mut NcclConfig,
    shrink_flags: c_int,
) -> NcclResult {
    const CALL: &str = "ncclCommShrink";
    counted(|c| c.shrink += 1);
    guard(CALL, || {
        if newcomm.is_null() {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: newcomm is null"));
        }
        if exclude.is_null() {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: excludeRanksList is null"));
        }
        let Some(k) = usize::try_from(exclude_count).ok().filter(|&k| k > 0) else {
            return fail(
                NcclResult::INVALID_ARGUMENT,
                format!("{CALL}: excludeRanksCount is {exclude_count}; it must be positive"),
            );
        };
        if shrink_flags & !NCCL_SHRINK_ABORT != 0 {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: unknown shrinkFlags {shrink_flags:#x}"));
        }
        let (parent, member) = match ready_parent(comm, CALL) {
            Ok(p) => p,
            Err(code) => return code,
        };
        // SAFETY: non-null, `exclude_count` ints, writable (our caller's contract); nothing
        // else uses them during the call.
        let list = unsafe { std::slice::from_raw_parts_mut(exclude, k) };
        list.sort_unstable();
        let n = member.nranks;
        if let Err(why) = check_exclusions(list, n, member.rank) {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: {why}"));
        }
        // SAFETY: `config` is null or a config (our caller's contract).
        let blocking = match unsafe { blocking_of(config, CALL, parent.blocking) } {
            Ok(b) => b,
            Err(code) => return code,
        };
        let index = parent.next_child(Child::Shrink);
        let below = list.iter().filter(|&&r| usize::try_from(r).is_ok_and(|r| r < member.rank)).count();
        let slot = member.rank - below;
        let Ok(key) = c_int::try_from(slot) else {
            return fail(NcclResult::INTERNAL_ERROR, format!("{CALL}: rank {slot} does not fit an int"));
        };
        let who = format!("{CALL}: rank {}", member.rank);
        let gathering = match member.net.meet((Child::Shrink, index), n - k, list, (slot, 0, key), &who) {
            Ok((g, _)) => g,
            Err(code) => return code,
        };
        // SAFETY: `newcomm` is non-null and writable (our caller's contract).
        unsafe { hand_out(&parent, (gathering, slot), true, blocking, newcomm, CALL) }
    })
}

/// Why the sorted exclusion list `list` of a communicator of `n` ranks cannot be used by rank
/// `me`, if it cannot.
fn check_exclusions(list: &[c_int], n: usize, me: usize) -> Result<(), String> {
    if let Some(r) = list.iter().find(|&&r| usize::try_from(r).map_or(true, |r| r >= n)) {
        return Err(format!("excluded rank {r} is out of range for {n} ranks"));
    }
    if let Some(w) = list.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("rank {} is excluded twice", w[0]));
    }
    if list.iter().any(|&r| usize::try_from(r).is_ok_and(|r| r == me)) {
        return Err(format!("rank {me} is in the exclusion list: excluded ranks must not call it"));
    }
    Ok(())
}

/// Hands this rank's child out: when `made`, a new communicator of `gathering`'s slot `slot`
/// (none for a split's `NCCL_SPLIT_NOCOLOR`). Non-blocking: null now, the handle when the
/// parent is polled after the child completed. Blocking: the handle once every rank has
/// arrived.
///
/// # Safety
/// `newcomm` is non-null and writable, until the parent settles when non-blocking.
unsafe fn hand_out(
    parent: &Shared,
    (gathering, slot): (Arc<Gathering>, usize),
    made: bool,
    blocking: bool,
    newcomm: *mut NcclComm,
    call: &'static str,
) -> NcclResult {
    let handle = made.then(|| new_handle(Shared::new(Arc::clone(&gathering), slot, parent.device, blocking)));
    if !blocking {
        // As NCCL since 2.18: null now, the handle once the child's job is done.
        // SAFETY: non-null and writable (our caller's contract).
        unsafe { newcomm.write(std::ptr::null_mut()) };
        parent.set_pending(PendingChild {
            call,
            slot: newcomm.expose_provenance(),
            handle: handle.map_or(0, |h| h.expose_provenance()),
            gathering,
            rank: slot,
        });
        // And, as NCCL 2.28 does, ncclSuccess: its child init drops the group's
        // ncclInProgress, so only the parent's async error says when the job is done.
        return NcclResult::SUCCESS;
    }
    let Some(handle) = handle else {
        // SAFETY: non-null and writable (our caller's contract).
        unsafe { newcomm.write(std::ptr::null_mut()) };
        return NcclResult::SUCCESS;
    };
    // SAFETY: non-null and writable (our caller's contract).
    unsafe { newcomm.write(handle) };
    match lookup(handle, call) {
        Ok(s) => s.wait_ready(call),
        Err(code) => code,
    }
}
