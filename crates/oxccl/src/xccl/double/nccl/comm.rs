//! Communicators of the double: init by unique id, the registry of live handles, the state
//! a communicator's background work leaves (a child's late handle, see `child.rs`; a grown
//! communicator's, see `grow.rs`), abort, async errors, and fault injection.

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use super::counts::counted;
use super::gathering::{Child, Gathering, Member, Net, Poll};
use super::ids::{is_grow_id, is_our_id};
use super::status::{fail, guard, set_last_error};
use crate::error::Error;
use crate::sync::relock;
use crate::xccl::library::types::{
    NcclComm, NcclCommOpaque, NcclConfig, NcclResult, NcclUniqueId, NCCL_CONFIG_MAGIC, NCCL_CONFIG_UNDEF_INT,
};
use crate::xccl::runtime::host::codes::LAUNCH_FAILED;
use crate::xccl::runtime::host::{enqueue_anywhere, Closure, CurrentDevice};
use crate::xccl::runtime::RawStream;

/// How long a blocking init, split, shrink or grow waits for the other ranks before giving
/// up (so a test never hangs for ever).
const BLOCKING_LIMIT: Duration = Duration::from_secs(60);

/// A stall of a communicator's next operation (from [`hang_next`]).
#[derive(Debug, Default)]
pub(super) struct Hang {
    /// Set when the guard lets go.
    open: AtomicBool,
}

impl Hang {
    /// Blocks until released or the communicator is aborted.
    ///
    /// # Errors
    /// The abort reason.
    pub(super) fn wait(&self, net: &Net) -> Result<(), String> {
        net.world.hold(&self.open)
    }
}

/// Keeps a communicator's hung operation hanging; dropping it (or an abort) lets it go.
#[derive(Debug)]
#[must_use = "dropping the guard releases the hang at once"]
pub(crate) struct HangGuard {
    /// The hang.
    hang: Arc<Hang>,
    /// Whom to wake.
    net: Arc<Net>,
}

impl HangGuard {
    /// Lets the operation go on (the same as dropping the guard).
    pub(crate) fn release(self) {}
}

impl Drop for HangGuard {
    fn drop(&mut self) {
        self.hang.open.store(true, Ordering::SeqCst);
        self.net.world.wake();
    }
}

/// What an `ncclComm_t` of the double stands for.
#[derive(Debug)]
pub(super) struct Shared {
    /// Where its ranks meet.
    gathering: Arc<Gathering>,
    /// Its slot there (the rank at init; the parent's rank for a split; the new rank for a
    /// shrink or grow).
    slot: usize,
    /// The device current on the creating thread.
    pub(super) device: u32,
    /// Whether calls block (`config->blocking`).
    pub(super) blocking: bool,
    /// What changes.
    st: Mutex<CommState>,
}

/// The changing part of a communicator.
#[derive(Debug, Default)]
struct CommState {
    /// Its place, once its gathering completed.
    member: Option<Member>,
    /// The sticky error of a failed operation.
    error: Option<NcclResult>,
    /// The index of the next collective.
    next_coll: u64,
    /// The index of the next split, shrink and grow of this communicator.
    next_child: HashMap<Child, u64>,
    /// A hang for the next operation.
    hang: Option<Arc<Hang>>,
    /// Live registration handles.
    registered: HashSet<usize>,
    /// The algorithms (collective names, point-to-point per peer) used so far.
    warmed: HashSet<String>,
    /// Work held while a call that returned `ncclInProgress` is "connecting".
    busy: Option<Busy>,
    /// A non-blocking split or shrink whose new handle is not written yet.
    pending_child: Option<PendingChild>,
    /// A grown communicator's `(newcomm, handle)`: as NCCL's grow job does at its end, the
    /// handle is written into the caller's `ncclComm_t*` again when the grow completes.
    late_write: Option<(usize, usize)>,
}

/// How many polls of `ncclCommGetAsyncError` a first use of an algorithm stays in progress.
const CONNECT_POLLS: u32 = 2;

/// Work of a first use of an algorithm, held back as NCCL 2.22+ does while it connects in
/// the background: queued on its streams when the connection is "made" (a later poll).
struct Busy {
    /// Polls left before the work is queued.
    polls: u32,
    /// The work, with its streams, in call order.
    held: Vec<(RawStream, Closure)>,
}

impl std::fmt::Debug for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Busy").field("polls", &self.polls).field("held", &self.held.len()).finish()
    }
}

/// A non-blocking `ncclCommSplit` or `ncclCommShrink` in progress: as NCCL does, the new
/// handle is written into the caller's slot only when the child's background job finishes
/// (the parent's async error turns from `ncclInProgress` to `ncclSuccess`); until then the
/// slot holds null.
#[derive(Debug)]
pub(super) struct PendingChild {
    /// The call, for messages.
    pub(super) call: &'static str,
    /// The caller's `ncclComm_t*`.
    pub(super) slot: usize,
    /// The new communicator (null for `NCCL_SPLIT_NOCOLOR`).
    pub(super) handle: usize,
    /// The ranks of the child meeting.
    pub(super) gathering: Arc<Gathering>,
    /// This rank's slot there.
    pub(super) rank: usize,
}

impl Shared {
    /// A communicator of `gathering`'s slot `slot`, on `device`.
    pub(super) fn new(gathering: Arc<Gathering>, slot: usize, device: u32, blocking: bool) -> Shared {
        Shared { gathering, slot, device, blocking, st: Mutex::new(CommState::default()) }
    }

    /// Takes the index of this rank's next child of `kind`.
    pub(super) fn next_child(&self, kind: Child) -> u64 {
        let mut st = relock(&self.st);
        let next = st.next_child.entry(kind).or_insert(0);
        *next += 1;
        *next - 1
    }

    /// The index this rank's next child of `kind` will take (not taken).
    pub(super) fn peek_child(&self, kind: Child) -> u64 {
        relock(&self.st).next_child.get(&kind).copied().unwrap_or(0)
    }

    /// Records a non-blocking child in progress (see [`PendingChild`]).
    pub(super) fn set_pending(&self, p: PendingChild) {
        relock(&self.st).pending_child = Some(p);
    }

    /// Writes `handle` into the caller's `newcomm` again once the grow completes (see
    /// `late_write`).
    pub(super) fn write_when_ready(&self, newcomm: usize, handle: usize) {
        relock(&self.st).late_write = Some((newcomm, handle));
    }

    /// Its place in the communicator.
    ///
    /// # Errors
    /// `ncclInProgress` while the other ranks have not all arrived; `ncclRemoteError` when
    /// one aborted first.
    pub(super) fn member(&self) -> Result<Member, NcclResult> {
        let mut st = relock(&self.st);
        if let Some(m) = &st.member {
            return Ok(m.clone());
        }
        match self.gathering.poll(self.slot) {
            Poll::Ready(Some(m)) => {
                st.member = Some(m.clone());
                if let Some((newcomm, handle)) = st.late_write.take() {
                    // SAFETY: ncclCommGrow's caller keeps `newcomm` valid and writable until
                    // the new communicator's async error is no longer ncclInProgress, which
                    // is what completion makes it: NCCL's grow job writes it last, as here.
                    unsafe {
                        std::ptr::with_exposed_provenance_mut::<NcclComm>(newcomm)
                            .write(std::ptr::with_exposed_provenance_mut(handle))
                    };
                }
                Ok(m)
            }
            Poll::Ready(None) => Err(fail(NcclResult::INTERNAL_ERROR, "the double made a communicator for no color")),
            Poll::Pending => Err(fail(
                NcclResult::IN_PROGRESS,
                "the communicator is still initializing (other ranks have not joined)",
            )),
            Poll::Aborted(why) => Err(fail(NcclResult::REMOTE_ERROR, format!("initialization was aborted: {why}"))),
        }
    }

    /// Waits (up to [`BLOCKING_LIMIT`]) for the other ranks, for a blocking init, split,
    /// shrink or grow.
    pub(super) fn wait_ready(&self, call: &str) -> NcclResult {
        match self.gathering.wait(self.slot, BLOCKING_LIMIT) {
            Poll::Ready(_) => match self.member() {
                Ok(_) => NcclResult::SUCCESS,
                Err(code) => code,
            },
            Poll::Pending => fail(
                NcclResult::SYSTEM_ERROR,
                format!("{call}: the other ranks did not join within {BLOCKING_LIMIT:?} (the double's safety limit)"),
            ),
            Poll::Aborted(why) => fail(NcclResult::REMOTE_ERROR, format!("{call}: aborted: {why}")),
        }
    }

    /// `ncclCommGetAsyncError`'s answer. Polling is what moves the double's background
    /// work on: a held first use is queued after [`CONNECT_POLLS`] polls, and a finished
    /// split or shrink writes its handle.
    pub(super) fn async_error(&self) -> NcclResult {
        if let Some(e) = relock(&self.st).error {
            return e;
        }
        if let Some(code) = self.poll_busy() {
            return code;
        }
        if let Some(code) = self.poll_child() {
            return code;
        }
        match self.gathering.poll(self.slot) {
            Poll::Pending => NcclResult::IN_PROGRESS,
            Poll::Aborted(_) => NcclResult::REMOTE_ERROR,
            Poll::Ready(_) => match self.member() {
                Ok(m) => m.net.abort_code(m.rank).unwrap_or(NcclResult::SUCCESS),
                Err(code) => code,
            },
        }
    }

    /// Moves a held first use on; `Some(ncclInProgress)` while it is still held.
    fn poll_busy(&self) -> Option<NcclResult> {
        let mut st = relock(&self.st);
        let busy = st.busy.as_mut()?;
        busy.polls = busy.polls.saturating_sub(1);
        if busy.polls > 0 {
            return Some(NcclResult::IN_PROGRESS);
        }
        let held = st.busy.take().map(|b| b.held).unwrap_or_default();
        drop(st);
        for (stream, job) in held {
            if let Err(e) = enqueue_anywhere(stream, job) {
                relock(&self.st).error.get_or_insert(NcclResult::UNHANDLED_CUDA_ERROR);
                set_last_error(&format!("the stream refused held work: {e}"));
                return Some(NcclResult::UNHANDLED_CUDA_ERROR);
            }
        }
        None
    }

    /// Writes a finished child's handle; `Some(code)` while it runs or when it failed.
    fn poll_child(&self) -> Option<NcclResult> {
        let mut st = relock(&self.st);
        let pending = st.pending_child.as_ref()?;
        match pending.gathering.poll(pending.rank) {
            Poll::Pending => Some(NcclResult::IN_PROGRESS),
            Poll::Aborted(why) => {
                let p = st.pending_child.take();
                drop(st);
                let call = p.as_ref().map_or("ncclCommSplit", |p| p.call);
                if let Some(p) = p {
                    drop_pending_child(p);
                }
                Some(fail(NcclResult::REMOTE_ERROR, format!("{call}: aborted: {why}")))
            }
            Poll::Ready(_) => {
                let p = st.pending_child.take()?;
                // SAFETY: the caller of the non-blocking ncclCommSplit or ncclCommShrink keeps
                // its slot valid until the parent's async error is no longer ncclInProgress
                // (NCCL's contract: the handle is written by the child's background job).
                unsafe {
                    std::ptr::with_exposed_provenance_mut::<NcclComm>(p.slot)
                        .write(std::ptr::with_exposed_provenance_mut(p.handle))
                };
                None
            }
        }
    }

    /// Whether the communicator is busy with a call that returned `ncclInProgress`.
    pub(super) fn busy(&self) -> bool {
        let st = relock(&self.st);
        st.busy.is_some() || st.pending_child.is_some()
    }

    /// Whether any of `keys` is used for the first time on this non-blocking communicator
    /// (NCCL 2.22+ then connects in the background and the call returns `ncclInProgress`);
    /// marks them used.
    pub(super) fn cold(&self, keys: &[String]) -> bool {
        if self.blocking {
            return false;
        }
        let mut st = relock(&self.st);
        let mut cold = false;
        for k in keys {
            cold |= st.warmed.insert(k.clone());
        }
        cold
    }

    /// Holds `jobs` until the communicator has been polled [`CONNECT_POLLS`] times.
    pub(super) fn hold(&self, jobs: Vec<(RawStream, Closure)>) {
        let mut st = relock(&self.st);
        let busy = st.busy.get_or_insert_with(|| Busy { polls: CONNECT_POLLS, held: Vec::new() });
        busy.held.extend(jobs);
    }

    /// Drops what a failed or aborted communicator still holds: held work, a child's
    /// unwritten handle (its communicator is aborted and freed, as NCCL's abort joins the
    /// child's job), a grow's last write (an abort ends the grow job: nothing writes after).
    fn drop_background(&self) {
        let (busy, child) = {
            let mut st = relock(&self.st);
            st.late_write = None;
            (st.busy.take(), st.pending_child.take())
        };
        drop(busy);
        if let Some(p) = child {
            drop_pending_child(p);
        }
    }

    /// The sticky error, if an operation failed (checked before queueing more).
    pub(super) fn sticky(&self) -> Option<NcclResult> {
        relock(&self.st).error
    }

    /// The index of the next collective.
    pub(super) fn next_coll(&self) -> u64 {
        let mut st = relock(&self.st);
        st.next_coll += 1;
        st.next_coll - 1
    }

    /// The hang set for the next operation, taken.
    pub(super) fn take_hang(&self) -> Option<Arc<Hang>> {
        relock(&self.st).hang.take()
    }

    /// Records that an operation failed with `code` (`why` becomes the last error) and
    /// returns the error that breaks its stream.
    pub(super) fn failed(&self, code: NcclResult, why: &str) -> Error {
        relock(&self.st).error.get_or_insert(code);
        set_last_error(why);
        Error::Backend { code: LAUNCH_FAILED, message: format!("NCCL double: {code}: {why}") }
    }

    /// Adds a registration handle.
    pub(super) fn register(&self, handle: usize) {
        relock(&self.st).registered.insert(handle);
    }

    /// Removes a registration handle; whether it was there.
    pub(super) fn deregister(&self, handle: usize) -> bool {
        relock(&self.st).registered.remove(&handle)
    }
}

/// What an `ncclComm_t` of the double points to: a heap object whose address is the handle
/// (its content is never read; the registry maps the address to the communicator).
struct Handle {
    /// Makes the allocation non-empty, so every live handle has its own address.
    _byte: u64,
}

/// The live communicators, by handle address.
static COMMS: LazyLock<Mutex<HashMap<usize, Arc<Shared>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// A new handle for `shared`.
pub(super) fn new_handle(shared: Shared) -> NcclComm {
    let ptr = Box::into_raw(Box::new(Handle { _byte: 0 }));
    relock(&COMMS).insert(ptr.addr(), Arc::new(shared));
    ptr.cast::<NcclCommOpaque>()
}

/// The communicator `comm` stands for.
///
/// # Errors
/// `ncclInvalidArgument` for null, destroyed or made-up handles.
pub(super) fn lookup(comm: NcclComm, call: &str) -> Result<Arc<Shared>, NcclResult> {
    if comm.is_null() {
        return Err(fail(NcclResult::INVALID_ARGUMENT, format!("{call}: comm is null")));
    }
    relock(&COMMS).get(&comm.addr()).cloned().ok_or_else(|| {
        fail(
            NcclResult::INVALID_ARGUMENT,
            format!("{call}: {:#x} is not a live communicator of the double", comm.addr()),
        )
    })
}

/// `comm`, checked as NCCL's `ncclCommEnsureReady` checks the parent of a split, shrink or
/// grow (and the communicator of `ncclCommGetUniqueId`): live, initialized, not failed or
/// aborted, and not busy with a call that has not settled; and this rank's place in it.
///
/// # Errors
/// As [`lookup`]; the sticky error or the abort's code; `ncclInvalidArgument` for a
/// communicator still initializing or busy (NCCL: "Attempt to use communicator before the
/// previous operation returned ncclSuccess").
pub(super) fn ready_parent(comm: NcclComm, call: &str) -> Result<(Arc<Shared>, Member), NcclResult> {
    let parent = lookup(comm, call)?;
    if let Some(e) = parent.sticky() {
        return Err(fail(e, format!("{call}: the communicator has failed ({e})")));
    }
    let not_ready = || {
        fail(
            NcclResult::INVALID_ARGUMENT,
            format!(
                "{call}: the communicator is busy with a call that has not returned ncclSuccess yet; poll \
                 ncclCommGetAsyncError until it does first"
            ),
        )
    };
    let member = parent.member().map_err(|code| if code == NcclResult::IN_PROGRESS { not_ready() } else { code })?;
    if let Some(code) = member.net.abort_code(member.rank) {
        return Err(fail(code, format!("{call}: the communicator was aborted")));
    }
    if parent.busy() {
        return Err(not_ready());
    }
    Ok((parent, member))
}

/// Removes `comm` from the registry and frees its handle.
///
/// # Errors
/// As [`lookup`].
pub(super) fn release(comm: NcclComm, call: &str) -> Result<Arc<Shared>, NcclResult> {
    let shared = lookup(comm, call)?;
    if relock(&COMMS).remove(&comm.addr()).is_none() {
        // Released by another thread in between.
        return Err(fail(NcclResult::INVALID_ARGUMENT, format!("{call}: the communicator was just destroyed")));
    }
    // SAFETY: the address was in the registry, so `comm` came from `Box::into_raw` in
    // `new_handle` and was not freed yet; removing it above makes this thread the only one
    // to free it.
    drop(unsafe { Box::from_raw(comm.cast::<Handle>()) });
    Ok(shared)
}

/// The gatherings of `ncclCommInitRankConfig` in progress, by unique id.
static INITS: LazyLock<Mutex<HashMap<[u8; 128], Arc<Gathering>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The ids whose communicators are complete (an id makes one communicator).
static USED_IDS: LazyLock<Mutex<HashSet<[u8; 128]>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// Reads `config->blocking` (null: blocking, NCCL's default).
///
/// # Safety
/// `config` is null or points to an [`NcclConfig`].
pub(super) unsafe fn blocking_of(config: *const NcclConfig, call: &str, default: bool) -> Result<bool, NcclResult> {
    if config.is_null() {
        return Ok(default);
    }
    // SAFETY: non-null, and an `NcclConfig` (our caller's contract).
    let c = unsafe { config.read() };
    if c.magic != NCCL_CONFIG_MAGIC {
        return Err(fail(NcclResult::INVALID_ARGUMENT, format!("{call}: config magic {:#x} is wrong", c.magic)));
    }
    match c.blocking {
        0 => Ok(false),
        1 => Ok(true),
        NCCL_CONFIG_UNDEF_INT => Ok(default),
        b => Err(fail(NcclResult::INVALID_ARGUMENT, format!("{call}: config blocking {b} is neither 0 nor 1"))),
    }
}

/// `ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
/// int rank, ncclConfig_t* config)`.
///
/// # Safety
/// `comm` is null or writable; `config` is null or an `ncclConfig_t`.
pub(super) unsafe extern "C" fn nccl_comm_init_rank_config(
    comm: *mut NcclComm,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
    config: *mut NcclConfig,
) -> NcclResult {
    const CALL: &str = "ncclCommInitRankConfig";
    counted(|c| c.init += 1);
    guard(CALL, || {
        if comm.is_null() {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: comm is null"));
        }
        // SAFETY: `config` is null or a config (our caller's contract).
        let blocking = match unsafe { blocking_of(config, CALL, true) } {
            Ok(b) => b,
            Err(code) => return code,
        };
        let (Ok(n), Ok(r)) = (usize::try_from(nranks), usize::try_from(rank)) else {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: nranks {nranks}, rank {rank}"));
        };
        if n < 1 || r >= n {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: rank {rank} of {nranks} ranks"));
        }
        if !is_our_id(&comm_id) {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: not a unique id of the double"));
        }
        if is_grow_id(&comm_id) {
            return fail(
                NcclResult::INVALID_ARGUMENT,
                format!("{CALL}: the unique id is ncclCommGetUniqueId's, which only ncclCommGrow takes"),
            );
        }
        let key = comm_id.internal;
        let gathering = {
            let mut inits = relock(&INITS);
            if relock(&USED_IDS).contains(&key) {
                return fail(
                    NcclResult::INVALID_USAGE,
                    format!("{CALL}: this unique id already made a complete communicator"),
                );
            }
            let g = Arc::clone(inits.entry(key).or_insert_with(|| Gathering::new(n)));
            if g.n != n {
                return fail(
                    NcclResult::INVALID_USAGE,
                    format!("{CALL}: rank {r} says {n} ranks, an earlier rank said {}", g.n),
                );
            }
            match g.arrive(r, 0, rank) {
                Ok(true) => {
                    inits.remove(&key);
                    relock(&USED_IDS).insert(key);
                }
                Ok(false) => {}
                Err(why) => return fail(NcclResult::INVALID_USAGE, format!("{CALL}: {why}")),
            }
            g
        };
        let device = CurrentDevice::get().map_or(0, |d| d.device());
        let handle = new_handle(Shared::new(gathering, r, device, blocking));
        // SAFETY: non-null and writable (our caller's contract).
        unsafe { comm.write(handle) };
        if !blocking {
            return NcclResult::IN_PROGRESS;
        }
        match lookup(handle, CALL) {
            Ok(s) => s.wait_ready(CALL),
            Err(code) => code,
        }
    })
}

/// Frees the communicator of a split or shrink that will never be handed out (its parent
/// failed or was aborted first), ending its gathering.
fn drop_pending_child(p: PendingChild) {
    p.gathering.abort(&format!("the parent communicator was aborted during {}", p.call));
    if p.handle != 0 {
        let _ = release(std::ptr::with_exposed_provenance_mut(p.handle), p.call);
    }
}

/// Aborts what `shared` takes part in on behalf of its rank: its communicator, or its
/// gathering when still initializing.
fn abort_shared(shared: &Shared, why: &str) {
    match shared.member() {
        Ok(m) => m.net.abort(m.rank, why),
        Err(_) => shared.gathering.abort(why),
    }
}

/// `ncclResult_t ncclCommAbort(ncclComm_t comm)`: ends every wait of every rank of the
/// communicator (their queued and blocked work fails, their async error becomes
/// `ncclRemoteError`), then frees the communicator. Callable from any thread, while this
/// rank's stream is blocked inside an operation.
///
/// # Safety
/// None beyond NCCL's: `comm` is not used afterwards.
pub(super) unsafe extern "C" fn nccl_comm_abort(comm: NcclComm) -> NcclResult {
    const CALL: &str = "ncclCommAbort";
    guard(CALL, || {
        if comm.is_null() {
            // NCCL accepts a null communicator here.
            return NcclResult::SUCCESS;
        }
        match release(comm, CALL) {
            Ok(shared) => {
                shared.drop_background();
                abort_shared(&shared, &format!("rank {} aborted its communicator", shared.slot));
                NcclResult::SUCCESS
            }
            Err(code) => code,
        }
    })
}

/// `ncclResult_t ncclCommDestroy(ncclComm_t comm)`: frees the communicator (work already
/// queued still runs; it holds what it needs).
///
/// # Safety
/// None beyond NCCL's: `comm` is not used afterwards.
pub(super) unsafe extern "C" fn nccl_comm_destroy(comm: NcclComm) -> NcclResult {
    const CALL: &str = "ncclCommDestroy";
    guard(CALL, || {
        if comm.is_null() {
            return NcclResult::SUCCESS;
        }
        match release(comm, CALL) {
            Ok(shared) => {
                shared.drop_background();
                NcclResult::SUCCESS
            }
            Err(code) => code,
        }
    })
}

/// `ncclResult_t ncclCommFinalize(ncclComm_t comm)`: nothing to flush (queued work holds
/// what it needs); the sticky error, if any.
///
/// # Safety
/// None needed.
pub(super) unsafe extern "C" fn nccl_comm_finalize(comm: NcclComm) -> NcclResult {
    const CALL: &str = "ncclCommFinalize";
    guard(CALL, || match lookup(comm, CALL) {
        Ok(shared) => shared.sticky().unwrap_or(NcclResult::SUCCESS),
        Err(code) => code,
    })
}

std::thread_local! {
    /// Set by [`hold_polls`]: while it is false, this thread's `ncclCommGetAsyncError` calls
    /// answer `ncclInProgress` for communicators still initializing.
    static HELD: std::cell::RefCell<Option<Arc<AtomicBool>>> = const { std::cell::RefCell::new(None) };
}

/// Fault injection: until `release` is set, the calling thread sees every communicator whose
/// creation it polls as still initializing (a rank slow to notice its creation finished),
/// while the other ranks go on with it. Holds for the thread until [`hold_polls`] is called
/// again.
pub(crate) fn hold_polls(release: Arc<AtomicBool>) {
    HELD.with(|h| *h.borrow_mut() = Some(release));
}

/// Whether a hold of [`hold_polls`] makes this thread's poll of `shared` answer
/// `ncclInProgress`: the hold is not released, and this rank has not yet learned its place
/// in the communicator (a held poll does not look, so it stays unlearned until the release).
fn held(shared: &Shared) -> bool {
    HELD.with(|h| h.borrow().as_ref().is_some_and(|release| !release.load(Ordering::SeqCst)))
        && relock(&shared.st).member.is_none()
}

/// `ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)`:
/// `ncclInProgress` while initializing, the sticky error of a failed operation,
/// `ncclRemoteError` once another rank aborted, else `ncclSuccess`.
///
/// # Safety
/// `async_error` is null or writable.
pub(super) unsafe extern "C" fn nccl_comm_get_async_error(comm: NcclComm, async_error: *mut NcclResult) -> NcclResult {
    const CALL: &str = "ncclCommGetAsyncError";
    guard(CALL, || {
        if async_error.is_null() {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: asyncError is null"));
        }
        match lookup(comm, CALL) {
            Ok(shared) => {
                let status = if held(&shared) { NcclResult::IN_PROGRESS } else { shared.async_error() };
                // SAFETY: non-null and writable (our caller's contract).
                unsafe { async_error.write(status) };
                NcclResult::SUCCESS
            }
            Err(code) => code,
        }
    })
}

/// The body of the `ncclComm*(comm, int*)` queries.
///
/// # Safety
/// `out` is null or writable.
unsafe fn query(
    comm: NcclComm,
    out: *mut c_int,
    call: &str,
    what: fn(&Shared) -> Result<usize, NcclResult>,
) -> NcclResult {
    guard(call, || {
        if out.is_null() {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{call}: the output pointer is null"));
        }
        let value = match lookup(comm, call).and_then(|s| what(&s)) {
            Ok(v) => v,
            Err(code) => return code,
        };
        let Ok(value) = c_int::try_from(value) else {
            return fail(NcclResult::INTERNAL_ERROR, format!("{call}: {value} does not fit an int"));
        };
        // SAFETY: non-null and writable (our caller's contract).
        unsafe { out.write(value) };
        NcclResult::SUCCESS
    })
}

/// `ncclResult_t ncclCommCount(const ncclComm_t comm, int* count)`.
///
/// # Safety
/// `count` is null or writable.
pub(super) unsafe extern "C" fn nccl_comm_count(comm: NcclComm, count: *mut c_int) -> NcclResult {
    // SAFETY: passed on.
    unsafe { query(comm, count, "ncclCommCount", |s| s.member().map(|m| m.nranks)) }
}

/// `ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank)`.
///
/// # Safety
/// `rank` is null or writable.
pub(super) unsafe extern "C" fn nccl_comm_user_rank(comm: NcclComm, rank: *mut c_int) -> NcclResult {
    // SAFETY: passed on.
    unsafe { query(comm, rank, "ncclCommUserRank", |s| s.member().map(|m| m.rank)) }
}

/// `ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device)`: the device current
/// on the thread that created the communicator.
///
/// # Safety
/// `device` is null or writable.
pub(super) unsafe extern "C" fn nccl_comm_cu_device(comm: NcclComm, device: *mut c_int) -> NcclResult {
    // SAFETY: passed on.
    unsafe { query(comm, device, "ncclCommCuDevice", |s| Ok(s.device as usize)) }
}

/// Fault injection: makes `comm`'s next operation (collective, send or receive) hang on its
/// stream until the guard is dropped or the communicator is aborted. `None` for a handle
/// that is not a live, initialized communicator.
pub(crate) fn hang_next(comm: NcclComm) -> Option<HangGuard> {
    let shared = lookup(comm, "hang_next").ok()?;
    let member = shared.member().ok()?;
    let hang = Arc::new(Hang::default());
    relock(&shared.st).hang = Some(Arc::clone(&hang));
    Some(HangGuard { hang, net: member.net })
}

/// Fault injection: `comm`'s process dies. Its communicator is aborted as a dead peer's
/// would be (the others' work fails and their async error becomes `ncclRemoteError`); the
/// handle stays valid (a test destroys it). Whether `comm` was a live communicator.
pub(crate) fn kill(comm: NcclComm) -> bool {
    let Ok(shared) = lookup(comm, "kill") else { return false };
    shared.drop_background();
    abort_shared(&shared, &format!("rank {} died", shared.slot));
    relock(&shared.st).error.get_or_insert(NcclResult::SYSTEM_ERROR);
    true
}
