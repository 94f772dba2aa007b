//! Growing a communicator (NCCL 2.29.2+): `ncclCommGetUniqueId` on one existing rank (the
//! root) makes the id of the communicator's next grow; `ncclCommGrow` on every existing rank
//! (which keeps its rank) and on each new rank (with the id and the rank it was given) meets
//! in one gathering. The new handle is written at once and again when the grow completes
//! (NCCL's job writes it last); its progress shows on the new communicator.
//!
//! What NCCL passes over its bootstrap (the id to the parent's ranks 0 and N-1, the others
//! through the parent) is modelled by the parent's shared state: an existing rank finds its
//! grow by its index in its own call order, a new rank by the id. The checks are NCCL's
//! (`ncclCommGrow` in `src/init.cc`), each an `ncclInvalidArgument` with a last error saying
//! which; and, stricter, a new rank must take a rank the communicator did not have.

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use super::comm::{blocking_of, lookup, new_handle, ready_parent, Shared};
use super::counts::counted;
use super::gathering::{Child, Net};
use super::ids::{fresh_id, is_grow_id};
use super::status::{fail, guard};
use crate::sync::relock;
use crate::xccl::library::types::{NcclComm, NcclConfig, NcclResult, NcclUniqueId};
use crate::xccl::runtime::host::CurrentDevice;

/// What a grow id stands for: the communicator to grow, which of its grows, and its size.
#[derive(Debug)]
struct Ticket {
    /// The communicator's shared state.
    net: Weak<Net>,
    /// The grow's index in its ranks' call order.
    index: u64,
    /// The communicator's size (NCCL's grow handle carries it too).
    nranks: usize,
}

/// The grow ids of the process: those not used yet, and those used.
#[derive(Debug, Default)]
struct Ids {
    /// Made by `ncclCommGetUniqueId`, not used by a complete grow yet.
    open: HashMap<[u8; 128], Ticket>,
    /// Used by a complete grow (an id serves one).
    used: HashSet<[u8; 128]>,
}

/// Every grow id (one lock: grows are rare, and an id's checks and its use are then one step).
static IDS: LazyLock<Mutex<Ids>> = LazyLock::new(|| Mutex::new(Ids::default()));

impl Ids {
    /// The open id of `net`'s grow number `index`, if there is one.
    fn of(&self, net: &Arc<Net>, index: u64) -> Option<[u8; 128]> {
        self.open.iter().find(|(_, t)| t.index == index && Weak::ptr_eq(&t.net, &Arc::downgrade(net))).map(|(k, _)| *k)
    }

    /// Whether `net` has an open id.
    fn any_open(&self, net: &Arc<Net>) -> bool {
        self.open.values().any(|t| Weak::ptr_eq(&t.net, &Arc::downgrade(net)))
    }

    /// Marks the id of `net`'s grow number `index` used (its grow is complete).
    fn consume(&mut self, net: &Arc<Net>, index: u64) {
        if let Some(key) = self.of(net, index) {
            self.open.remove(&key);
            self.used.insert(key);
        }
    }
}

/// `ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId)`: the id of
/// `comm`'s next grow, on one of its ranks. One at a time: a second one before the first was
/// used by a complete grow is `ncclInvalidUsage`.
///
/// # Safety
/// `unique_id` is null or writable.
pub(super) unsafe extern "C" fn nccl_comm_get_unique_id(comm: NcclComm, unique_id: *mut NcclUniqueId) -> NcclResult {
    const CALL: &str = "ncclCommGetUniqueId";
    counted(|c| c.get_unique_id += 1);
    guard(CALL, || {
        let (shared, member) = match ready_parent(comm, CALL) {
            Ok(p) => p,
            Err(code) => return code,
        };
        if unique_id.is_null() {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: uniqueId is null"));
        }
        let mut ids = relock(&IDS);
        ids.open.retain(|_, t| t.net.strong_count() > 0);
        if ids.any_open(&member.net) {
            return fail(
                NcclResult::INVALID_USAGE,
                format!("{CALL}: the id made earlier for this communicator was not used by a grow yet (one at a time)"),
            );
        }
        let id = fresh_id(true);
        let index = shared.peek_child(Child::Grow);
        ids.open.insert(id.internal, Ticket { net: Arc::downgrade(&member.net), index, nranks: member.nranks });
        // SAFETY: non-null and writable (our caller's contract).
        unsafe { unique_id.write(id) };
        NcclResult::SUCCESS
    })
}

/// `ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int
/// rank, ncclComm_t* newcomm, ncclConfig_t* config)`: `nRanks` is the new total. Existing
/// ranks pass their communicator and rank -1 (the root its id, the others null or the same
/// id), new ranks a null communicator, the id and their rank. A null config: the parent's
/// blocking mode for existing ranks, blocking for new ones.
///
/// # Safety
/// `unique_id` is null or readable; `newcomm` is null or writable (and, for a non-blocking
/// grow, stays so until the new communicator's async error is no longer `ncclInProgress`);
/// `config` is null or an `ncclConfig_t`.
pub(super) unsafe extern "C" fn nccl_comm_grow(
    comm: NcclComm,
    nranks: c_int,
    unique_id: *const NcclUniqueId,
    rank: c_int,
    newcomm: *mut NcclComm,
    config: *mut NcclConfig,
) -> NcclResult {
    const CALL: &str = "ncclCommGrow";
    counted(|c| c.grow += 1);
    guard(CALL, || {
        if newcomm.is_null() {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: newcomm is null"));
        }
        let Some(n) = usize::try_from(nranks).ok().filter(|&n| n > 0) else {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: total ranks must be positive, got {nranks}"));
        };
        // SAFETY: non-null and writable (our caller's contract); NCCL clears it first too.
        unsafe { newcomm.write(std::ptr::null_mut()) };
        // SAFETY: null or readable (our caller's contract).
        let id = (!unique_id.is_null()).then(|| unsafe { unique_id.read() });
        let mut ids = relock(&IDS);
        let place = if comm.is_null() { newcomer(&ids, n, id, rank) } else { existing(&ids, comm, n, id, rank) };
        let Place { net, index, slot, device, blocking } = match place {
            Ok(p) => p,
            Err(code) => return code,
        };
        // SAFETY: `config` is null or a config (our caller's contract).
        let blocking = match unsafe { blocking_of(config, CALL, blocking) } {
            Ok(b) => b,
            Err(code) => return code,
        };
        let Ok(key) = c_int::try_from(slot) else {
            return fail(NcclResult::INTERNAL_ERROR, format!("{CALL}: rank {slot} does not fit an int"));
        };
        let who = format!("{CALL}: rank {slot} of the grown communicator");
        let (gathering, complete) = match net.meet((Child::Grow, index), n, &[], (slot, 0, key), &who) {
            Ok(g) => g,
            Err(code) => return code,
        };
        if complete {
            ids.consume(&net, index);
        }
        drop(ids);
        let shared = Shared::new(gathering, slot, device, blocking);
        let handle = new_handle(shared);
        // SAFETY: non-null and writable (our caller's contract).
        unsafe { newcomm.write(handle) };
        let Ok(shared) = lookup(handle, CALL) else {
            return fail(NcclResult::INTERNAL_ERROR, format!("{CALL}: the new handle vanished"));
        };
        if blocking {
            return shared.wait_ready(CALL);
        }
        shared.write_when_ready(newcomm.expose_provenance(), handle.expose_provenance());
        // As NCCL: the job runs in the background, the call answers ncclSuccess.
        NcclResult::SUCCESS
    })
}

/// Where a rank of a grow meets the others.
struct Place {
    /// The shared state of the communicator grown.
    net: Arc<Net>,
    /// Which of its grows.
    index: u64,
    /// The rank in the grown communicator.
    slot: usize,
    /// The device of the new communicator.
    device: u32,
    /// The blocking mode a null config means.
    blocking: bool,
}

/// An existing rank's place: its communicator, checked ready, and its own rank.
///
/// # Errors
/// `ncclInvalidArgument` for a total not above the size, a rank other than -1, an id that is
/// not this grow's; those of [`ready_parent`].
fn existing(ids: &Ids, comm: NcclComm, n: usize, id: Option<NcclUniqueId>, rank: c_int) -> Result<Place, NcclResult> {
    const CALL: &str = "ncclCommGrow";
    let (parent, member) = ready_parent(comm, CALL)?;
    if n <= member.nranks {
        return Err(fail(
            NcclResult::INVALID_ARGUMENT,
            format!("{CALL}: total ranks {n} is not more than the communicator's {}", member.nranks),
        ));
    }
    if rank != -1 {
        return Err(fail(
            NcclResult::INVALID_ARGUMENT,
            format!("{CALL}: existing ranks must pass rank -1, got {rank}"),
        ));
    }
    let index = parent.next_child(Child::Grow);
    if let Some(id) = id {
        if ids.of(&member.net, index) != Some(id.internal) {
            return Err(fail(
                NcclResult::INVALID_ARGUMENT,
                format!(
                    "{CALL}: the unique id is not the one ncclCommGetUniqueId made for this grow of the communicator"
                ),
            ));
        }
    }
    Ok(Place { net: member.net, index, slot: member.rank, device: parent.device, blocking: parent.blocking })
}

/// A new rank's place: the communicator its id names, at the rank it was given.
///
/// # Errors
/// `ncclInvalidArgument` for a negative rank, a null id, a rank not below the total, an id
/// used already, an id that is not a grow's, a communicator gone, a rank the communicator
/// had.
fn newcomer(ids: &Ids, n: usize, id: Option<NcclUniqueId>, rank: c_int) -> Result<Place, NcclResult> {
    const CALL: &str = "ncclCommGrow";
    let bad = |why: String| fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: {why}"));
    let Ok(slot) = usize::try_from(rank) else {
        return Err(bad(format!("new ranks must pass a rank >= 0, got {rank}")));
    };
    let Some(id) = id else { return Err(bad("new ranks must pass a unique id, not null".into())) };
    if slot >= n {
        return Err(bad(format!("new rank {rank} is not below the total ranks {n}")));
    }
    if ids.used.contains(&id.internal) {
        return Err(bad("this unique id was used by a grow already: an id serves one grow".into()));
    }
    let Some(ticket) = ids.open.get(&id.internal).filter(|_| is_grow_id(&id)) else {
        return Err(bad("not an id of ncclCommGetUniqueId (ncclGetUniqueId's ids are for ncclCommInitRank*)".into()));
    };
    let Some(net) = ticket.net.upgrade() else {
        return Err(bad("the communicator the id was made on is gone".into()));
    };
    if n <= ticket.nranks {
        return Err(bad(format!("total ranks {n} is not more than the communicator's {}", ticket.nranks)));
    }
    if slot < ticket.nranks {
        return Err(bad(format!(
            "rank {rank} is an existing rank's: the communicator has {} ranks, new ones take {}..{n}",
            ticket.nranks, ticket.nranks
        )));
    }
    let device = CurrentDevice::get().map_or(0, |d| d.device());
    Ok(Place { net, index: ticket.index, slot, device, blocking: true })
}
