//! The backend layer: one object-safe, type-erased trait that every backend implements.
//!
//! The typed front door ([`Communicator`](crate::Communicator)) checks every argument,
//! turns typed slices into [`RawBuf`]/[`RawBufMut`] and submits an [`Op`]. A backend only
//! sees raw pointers, element counts and dtypes, so the same trait serves host memory
//! (`local`, `cpu`, `mpi`) and device memory (`nccl`, `rccl`).
//!
//! What every engine shares lives here too, so that a third engine does not copy it a third
//! time: the reduction kernels ([`reduce`]), the completion slot ([`completion`]), the
//! poisoned state ([`poison`]), the per-call options and algorithm resolution
//! ([`options`]), and the [`factory`] trait by which `init` finds the backends.

pub mod buffer;
pub mod completion;
pub(crate) mod exclude;
pub mod factory;
pub mod op;
pub mod options;
pub mod peer_waits;
pub mod poison;
pub mod reduce;
pub mod staging;

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op_kind::OpKind;

pub use op::{BufferSlot, Op, P2p, RawBuf, RawBufMut};
pub use options::{CallOptions, Stream, StreamOrder};

/// What a completed operation reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completion {
    /// Element counts received, one per receive ([`P2p::Recv`], [`P2p::RecvAny`]) of a
    /// batch, in order.
    pub received: Vec<usize>,
    /// The rank each receive took its message from, in the same order (where a backend
    /// does not report them, empty; every backend that runs [`P2p::RecvAny`] does).
    pub sources: Vec<usize>,
}

/// A submitted operation that may still be running.
pub trait Pending: Send + Sync {
    /// Waits up to `timeout` (forever with `None`; the operation's own deadline still applies)
    /// and returns its result, or `None` if it is still running.
    fn wait(&self, timeout: Option<Duration>) -> Option<Result<Completion>>;
    /// Whether the operation has finished (successfully or not).
    fn is_completed(&self) -> bool;
}

/// How a caller will wait for a submitted operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The caller waits at once: a backend may run the operation on the calling thread.
    Blocking,
    /// The caller goes on: the operation runs in the background.
    Async,
}

/// What the survivors of a communicator agreed ([`Backend::agree`]): the same on every one
/// of them, even when ranks die during the call (ULFM's `MPIX_Comm_agree`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreement {
    /// The bitwise AND of the flags of every rank not in `failed`.
    pub flag: u64,
    /// The ranks found dead, in order.
    pub failed: Vec<usize>,
    /// How many newcomers wait at the rendezvous store to join (rank 0 asked the store
    /// during the call; 0 when it could not, or died first): the members then call
    /// [`Communicator::grow`](crate::Communicator::grow) with it.
    pub joiners: usize,
}

/// A message waiting to be received, as reported by [`Backend::probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageInfo {
    /// The sender.
    pub source: usize,
    /// The tag.
    pub tag: u32,
    /// Element type of the message.
    pub dtype: DType,
    /// Number of elements.
    pub count: usize,
}

/// A communication backend: one rank's membership in one communicator.
///
/// Operations on one backend object execute in submission order (like a CUDA stream), and
/// every rank must submit the same collectives in the same order.
pub trait Backend: Send + Sync + 'static {
    /// The backend's name (`local`, `cpu`, `nccl`, `rccl`, `mpi`).
    fn name(&self) -> &'static str;
    /// This rank, in 0..world_size.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world_size(&self) -> usize;
    /// The default deadline of this communicator's waits.
    fn timeout(&self) -> Duration;

    /// The device this rank's collectives run on: `Cpu` for the host backends, the GPU for
    /// `nccl`/`rccl` (where device buffers must live).
    fn device(&self) -> Device {
        Device::Cpu
    }

    /// Checks that this backend can reach memory on `device` (the front door calls it for
    /// every buffer before an operation is started). The default accepts host memory only.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] saying which memory the backend takes.
    fn check_device(&self, device: Device) -> Result<()> {
        match device {
            Device::Cpu => Ok(()),
            other => Err(Error::invalid(format!(
                "the {} backend takes host memory only, and this buffer is on {other}; \
                 use a GPU backend (OXCCL_BACKEND=nccl or rccl) for device buffers, or copy to the host",
                self.name()
            ))),
        }
    }

    /// Starts `op`.
    ///
    /// # Safety
    /// Every buffer in `op` must point to `count` valid, properly aligned elements of its
    /// dtype, stay valid until the returned [`Pending`] reports completion, and must not be
    /// read (outputs) or written (inputs and outputs) by anyone else until then.
    ///
    /// # Errors
    /// [`Error::Aborted`] when the communicator is poisoned; errors of
    /// the operation itself arrive through the [`Pending`].
    unsafe fn submit(&self, op: Op, mode: Mode, opts: &CallOptions) -> Result<Arc<dyn Pending>>;

    /// The algorithm this backend would run for an operation of kind `op` on `bytes` (the
    /// operation's [`Op::message_bytes`]) with `opts`; `None` when the backend does not
    /// choose among algorithms of its own (`mpi`, `nccl`, `rccl` decide inside their
    /// libraries).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `opts` force an algorithm that cannot run `op`.
    fn algorithm_for(&self, _op: OpKind, _bytes: usize, _opts: &CallOptions) -> Result<Option<Algorithm>> {
        Ok(None)
    }

    /// Runs `op` to completion before returning (the blocking calls). The default submits
    /// it in [`Mode::Blocking`] and waits; a backend that runs blocking operations on the
    /// caller's thread overrides it to skip the completion slot (no allocation on the
    /// latency path).
    ///
    /// # Safety
    /// As [`Backend::submit`], until this call returns.
    ///
    /// # Errors
    /// [`Error::Aborted`] when the communicator is poisoned; the operation's own errors.
    unsafe fn run_blocking(&self, op: &Op, opts: &CallOptions) -> Result<Completion> {
        // SAFETY: forwarded from this function's contract; `wait(None)` returns only once
        // the operation has completed.
        let pending = unsafe { self.submit(op.clone(), Mode::Blocking, opts)? };
        pending.wait(None).unwrap_or_else(|| Err(Error::Internal("a blocking operation returned unfinished".into())))
    }

    /// Reports the first message from `peer` with `tag` not yet received, without receiving it.
    ///
    /// # Errors
    /// [`Error::Aborted`] on a poisoned communicator,
    /// [`Error::PeerLost`] when `peer` is gone and nothing is queued.
    fn probe(&self, peer: usize, tag: u32) -> Result<Option<MessageInfo>>;

    /// Collective over all ranks: ranks with the same `Some(color)` form a new communicator,
    /// ordered by `(key, rank)`; `None` takes no part and gets `None`.
    ///
    /// # Errors
    /// Communication errors of the exchange.
    fn split(&self, color: Option<u32>, key: i64, opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>>;

    /// The rank (in this communicator) that an operation of this rank is blocked receiving
    /// from now, where the backend knows it (the flight recorder's dump of a hang names it).
    fn waiting_on(&self) -> Option<usize> {
        None
    }

    /// The backend's account of the time this rank waits for each peer, where it keeps one
    /// (off until [`peer_waits::PeerWaits::enable`]; the profiler turns it on).
    fn peer_waits(&self) -> Option<Arc<peer_waits::PeerWaits>> {
        None
    }

    /// Aborts the communicator: every wait on it, on any thread, returns
    /// [`Error::Aborted`], and peers are told so they fail fast too.
    fn abort(&self, reason: &str);

    /// Revokes the communicator, from any thread: every pending and later call on it, on
    /// every live rank, fails with [`Error::Revoked`]; unlike an aborted one it can still
    /// agree and shrink. The default: the backend cannot.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] where the backend cannot.
    fn revoke(&self, _reason: &str) -> Result<()> {
        Err(Error::BackendUnavailable {
            backend: self.name().to_string(),
            why: "this backend cannot revoke a communicator; use abort, or the cpu or local backend".into(),
        })
    }

    /// Fault-tolerant agreement among the live ranks (every live rank calls it, in the same
    /// order as its other agreements and shrinks): the AND of their flags and the ranks found
    /// dead, identical on every survivor even when ranks die during the call. It works on a
    /// communicator that failed. The default: the backend has none.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] where the backend cannot; a timeout.
    fn agree(&self, _flag: u64, _opts: &CallOptions) -> Result<Agreement> {
        Err(Error::BackendUnavailable {
            backend: self.name().to_string(),
            why: "this backend has no fault-tolerant agreement (agree, shrink); use the cpu or local backend".into(),
        })
    }

    /// A communicator of the survivors, without the ranks agreed dead and without `exclude`
    /// (every live rank calls it with the same list), in the old rank order; `None` for the
    /// ranks in `exclude`. It works on a communicator that failed. The default: the backend
    /// has none.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] where the backend cannot; [`Error::InvalidArgument`]
    /// for a bad list or lists that differ between ranks; a timeout.
    fn shrink(&self, _exclude: &[usize], _opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        Err(Error::BackendUnavailable {
            backend: self.name().to_string(),
            why: "this backend cannot shrink a communicator; use the cpu or local backend".into(),
        })
    }

    /// A communicator of the members (every live member calls it, with the same `joiners`)
    /// and `joiners` newcomers that joined through the rendezvous store, the members first in
    /// their order. The default: the backend cannot grow.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] by default.
    fn grow(&self, _joiners: usize, _opts: &CallOptions) -> Result<Arc<dyn Backend>> {
        Err(Error::BackendUnavailable {
            backend: self.name().to_string(),
            why: "this backend cannot grow a communicator; use the cpu backend".into(),
        })
    }
}
