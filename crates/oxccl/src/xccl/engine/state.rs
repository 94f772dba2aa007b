//! What the engine is made of ([`Parts`]) and shares with its operations: [`Engine`], its
//! state ([`Inner`]), and what an operation holds of it until it completes (events,
//! temporaries, its issue, its place in the queue). Behaviour lives in the other files.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::comm::Comm;
use super::pool::Pool;
use crate::algorithm::AlgorithmOverrides;
use crate::backend::poison::Poison;
use crate::backend::{Backend, Op, P2p, StreamOrder};
use crate::config::HostBuffers;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sync::relock;
use crate::xccl::host_side::HostSide;
use crate::xccl::library::Library;
use crate::xccl::runtime::{DeviceRuntime, RawEvent, RawStream};

/// What a GPU communicator is made of.
pub(crate) struct Parts {
    /// `nccl` or `rccl`.
    pub(crate) name: &'static str,
    /// The loaded NCCL or RCCL.
    pub(crate) lib: Arc<Library>,
    /// The device runtime.
    pub(crate) rt: Arc<dyn DeviceRuntime>,
    /// The device ordinal this rank uses.
    pub(crate) device: u32,
    /// A host communicator over the same ranks.
    pub(crate) host: Arc<dyn Backend>,
    /// Whether collectives are fingerprint-checked.
    pub(crate) check: bool,
    /// What happens to host buffers.
    pub(crate) host_buffers: HostBuffers,
    /// The default deadline.
    pub(crate) timeout: Duration,
    /// Configured algorithm overrides: NCCL picks its own algorithms (`NCCL_ALGO`), so a
    /// forced one is only checked to apply and carried in the fingerprint, as on `mpi`.
    pub(crate) algorithms: AlgorithmOverrides,
}

/// One rank of a GPU communicator (see the module documentation).
pub(crate) struct Engine {
    pub(super) inner: Arc<Inner>,
}

/// What the engine and its pending operations share.
pub(crate) struct Inner {
    pub(super) name: &'static str,
    pub(super) lib: Arc<Library>,
    pub(super) rt: Arc<dyn DeviceRuntime>,
    pub(super) device: u32,
    pub(super) kind: Device,
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) timeout: Duration,
    pub(super) algorithms: AlgorithmOverrides,
    pub(super) host: HostSide,
    pub(super) host_buffers: HostBuffers,
    pub(super) comm: Comm,
    /// The engine's own stream.
    pub(super) stream: RawStream,
    /// Where buffered sends are copied: never behind a group waiting for its peers.
    pub(super) copy_stream: RawStream,
    /// Four bytes of device memory for the barrier.
    pub(super) scratch: u64,
    /// Recorded on a caller's stream for the engine's stream to wait on (under `order`).
    pub(super) order_event: RawEvent,
    /// Completion events for reuse.
    pub(super) events: Mutex<Vec<RawEvent>>,
    /// Device temporaries for reuse (`pool.rs`).
    pub(super) pool: Mutex<Pool>,
    /// Pinned host blocks for reuse (staging, `stage.rs`).
    pub(super) pinned_pool: Mutex<Pool>,
    /// Issues nobody waits for (a buffered send's group), kept until their event fires.
    pub(super) retiring: Mutex<Vec<Arc<Issued>>>,
    /// Whether the progress thread runs (`progress.rs`).
    pub(super) progress: Mutex<bool>,
    /// Enqueue order: every NCCL call is made under this lock.
    pub(super) order: Mutex<Order>,
    pub(super) poison: Mutex<Poison>,
}

/// Counters, the point-to-point queue and the stash of early messages.
pub(crate) struct Order {
    /// Collectives issued (their fingerprints' sequence numbers).
    pub(super) collectives: u64,
    /// Point-to-point batches submitted.
    pub(super) p2p: u64,
    /// Batches not yet issued.
    pub(super) queue: Vec<Queued>,
    /// Messages received ahead of their receive, per peer.
    pub(super) stash: Stash,
    /// When this rank's thread last called into the communicator (`progress.rs`).
    pub(super) touched: Instant,
}

/// A batch waiting to be issued.
pub(crate) struct Queued {
    /// The sends and receives.
    pub(crate) ops: Vec<P2p>,
    /// Where its issue lands.
    pub(crate) ticket: Arc<Ticket>,
    /// Its deadline (for the envelopes it waits for).
    pub(crate) deadline: Instant,
    /// How it is ordered with the caller's stream.
    pub(crate) order: Option<StreamOrder>,
    /// Its host buffers' device copies (`OXCCL_GPU_HOST_BUFFERS=stage`).
    pub(crate) staged: Option<Staged>,
    /// Its number among this rank's batches.
    pub(crate) seq: u64,
    /// Copies of its sends' payloads, when it is a buffered send (kept until its group ran).
    pub(crate) keep: Vec<DeviceTemp>,
    /// A buffered send: its submitter's work already completed, and its sends read only
    /// `keep`, so the group need not follow the caller's stream.
    pub(crate) buffered: bool,
    /// A buffered send's copies: the group waits for this event.
    pub(crate) ready: Option<Arc<PooledEvent>>,
}

/// A message received ahead of the receive that wants it. Its device memory is a raw
/// address (not a [`DeviceTemp`], which would keep the engine alive from inside itself):
/// the consuming receive turns it into one; the engine frees what is left when dropped.
pub(crate) struct Stashed {
    pub(super) tag: u32,
    pub(super) dtype: DType,
    pub(super) count: usize,
    /// Device memory holding the message (a block of the engine's cache).
    pub(crate) ptr: u64,
    /// Its block's size class.
    pub(super) class: usize,
}

/// The stash: early messages per peer, oldest first.
pub(crate) type Stash = Vec<VecDeque<Stashed>>;

/// An event of the engine's pool, given back when the last operation using it is done.
pub(crate) struct PooledEvent {
    pub(super) inner: Arc<Inner>,
    pub(super) event: RawEvent,
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        self.inner.give_back_event(self.event);
    }
}

/// Device memory an operation needs until it completes (a copy of an in-place input, a
/// landing place for a message too long for its buffer, a sent message), handed back to the
/// engine's cache after it (see `pool.rs`).
pub(crate) struct DeviceTemp {
    pub(super) inner: Arc<Inner>,
    pub(super) ptr: u64,
    /// Its block's size class.
    pub(super) class: usize,
}

impl Drop for DeviceTemp {
    fn drop(&mut self) {
        // Temporaries are dropped only after their operation's event fired or the
        // communicator was aborted and its stream drained (see `Inner::fail`), or by the
        // retiring list once their group's event fired.
        self.inner.give_back_block(self.ptr, self.class);
    }
}

/// A copy from a pinned block into the caller's host range, once the stream wrote the block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostCopy {
    pub(super) dst: *mut u8,
    pub(super) src: *const u8,
    pub(super) bytes: usize,
}

// SAFETY: as for `Staged` below: the caller's range is valid until completion, and the
// pinned block is kept with the operation.
unsafe impl Send for HostCopy {}
// SAFETY: as above; the copy is made once, by whoever completes the operation.
unsafe impl Sync for HostCopy {}

impl HostCopy {
    /// Makes the copies (after the operation's event fired).
    ///
    /// # Safety
    /// The stream has written the pinned blocks, and the caller's ranges are valid.
    pub(crate) unsafe fn run(copies: &[HostCopy]) {
        for c in copies.iter().filter(|c| c.bytes > 0) {
            // SAFETY: this function's contract; a pinned block and a caller's range are
            // distinct allocations.
            unsafe { std::ptr::copy_nonoverlapping(c.src, c.dst, c.bytes) };
        }
    }
}

/// Pinned host memory an operation needs until it completes (from the engine's cache).
pub(crate) struct PinnedTemp {
    pub(super) inner: Arc<Inner>,
    pub(super) ptr: *mut u8,
    pub(super) class: usize,
}

// SAFETY: pinned host memory is plain memory any thread may use; the block is the
// operation's alone until it is handed back.
unsafe impl Send for PinnedTemp {}
// SAFETY: as above.
unsafe impl Sync for PinnedTemp {}

impl Drop for PinnedTemp {
    fn drop(&mut self) {
        self.inner.give_back_pinned(self.ptr, self.class);
    }
}

/// What issuing an operation produced.
pub(crate) struct Issued {
    /// Fires when the operation's calls have run.
    pub(crate) event: Arc<PooledEvent>,
    /// Element counts received, one per receive of a batch.
    pub(crate) received: Vec<usize>,
    /// Kept until completion (dropping them frees the memory).
    #[allow(dead_code)] // held, never read
    pub(crate) temps: Vec<DeviceTemp>,
    /// An error to report once the calls have run (a message longer than its buffer: it
    /// was received elsewhere so that the sender's calls still match).
    pub(crate) error: Option<Error>,
    /// Staged outputs to copy from pinned memory into the caller's host ranges once the
    /// calls have run (made by the first wait that sees the event fire).
    pub(crate) back: Mutex<Vec<HostCopy>>,
    /// The pinned blocks those copies read (kept until then).
    #[allow(dead_code)] // held, never read
    pub(crate) pinned: Vec<PinnedTemp>,
}

impl Issued {
    /// An issue with no receives, staged copies or error.
    pub(crate) fn plain(event: Arc<PooledEvent>, temps: Vec<DeviceTemp>) -> Issued {
        Issued { event, received: Vec::new(), temps, error: None, back: Mutex::new(Vec::new()), pinned: Vec::new() }
    }
}

/// Where an operation's issue lands: at once for collectives, when the queue is flushed for
/// point-to-point batches.
#[derive(Default)]
pub(crate) struct Ticket {
    issued: Mutex<Option<Result<Arc<Issued>>>>,
}

impl Ticket {
    /// A ticket already issued.
    pub(crate) fn issued(r: Result<Issued>) -> Arc<Ticket> {
        Arc::new(Ticket { issued: Mutex::new(Some(r.map(Arc::new))) })
    }

    /// Records the issue (the first one stays).
    pub(crate) fn set(&self, r: Result<Issued>) {
        relock(&self.issued).get_or_insert(r.map(Arc::new));
    }

    /// The issue, when it happened.
    pub(crate) fn get(&self) -> Option<Result<Arc<Issued>>> {
        relock(&self.issued).clone()
    }
}

/// One copy between a host range, its pinned mirror and its device image.
#[derive(Debug, Clone, Copy)]
pub(super) struct Copy {
    pub(super) host: *mut u8,
    pub(super) pinned: *mut u8,
    pub(super) device: u64,
    pub(super) bytes: usize,
}

/// An operation moved onto device temporaries.
pub(crate) struct Staged {
    /// The operation on device memory.
    pub(crate) op: Op,
    /// The temporaries (kept until completion).
    pub(crate) temps: Vec<DeviceTemp>,
    /// Their pinned mirrors (kept until the copies back are made).
    pub(crate) pinned: Vec<PinnedTemp>,
    /// Whole temporaries to fill from the host first.
    pub(super) ins: Vec<Copy>,
    /// Output ranges to copy back (collectives).
    pub(super) outs: Vec<Copy>,
    /// Per receive of a batch, where its message is copied back (its count known later).
    pub(super) recvs: Vec<Copy>,
}

// SAFETY: the host pointers describe the caller's buffers, which the submit contract keeps
// valid and untouched until completion; moving their description between threads is what
// that contract allows (as for `RawBuf`).
unsafe impl Send for Staged {}
