//! The backend layer: one object-safe, type-erased trait that every backend implements.
//!
//! The typed front door ([`Communicator`](crate::Communicator)) checks every argument,
//! turns typed slices into [`RawBuf`]/[`RawBufMut`] and submits an [`Op`]. A backend only
//! sees raw pointers, element counts and dtypes, so the same trait serves host memory
//! (`local`, `cpu`, `mpi`) and device memory (`nccl`, `rccl`).

pub mod cpu;
pub mod factory;
pub mod local;
pub mod mpi;

use std::sync::Arc;
use std::time::Duration;

use crate::config::CallOptions;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::fingerprint::OpKind;
use crate::reduce_op::ReduceOp;

/// A read-only buffer: `count` elements of `dtype` at `ptr` on `device`.
#[derive(Debug, Clone, Copy)]
pub struct RawBuf {
    /// First byte.
    pub ptr: *const u8,
    /// Number of elements.
    pub count: usize,
    /// Element type.
    pub dtype: DType,
    /// Where the memory lives.
    pub device: Device,
}

/// A writable buffer: `count` elements of `dtype` at `ptr` on `device`.
#[derive(Debug, Clone, Copy)]
pub struct RawBufMut {
    /// First byte.
    pub ptr: *mut u8,
    /// Number of elements.
    pub count: usize,
    /// Element type.
    pub dtype: DType,
    /// Where the memory lives.
    pub device: Device,
}

// SAFETY: a RawBuf is a description of memory that the submitter keeps valid (and does not
// mutate) until the operation completes, as `Backend::submit` requires; moving the
// description to the thread that executes the operation is what that contract allows.
unsafe impl Send for RawBuf {}
// SAFETY: as above; shared references to the description only read the pointer value.
unsafe impl Sync for RawBuf {}
// SAFETY: the submitter keeps the memory valid and untouched until completion, so the
// executing thread is its only user in that time.
unsafe impl Send for RawBufMut {}
// SAFETY: as above; shared references to the description only read the pointer value.
unsafe impl Sync for RawBufMut {}

impl RawBuf {
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }
}

impl RawBufMut {
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// The same memory, read-only.
    pub fn as_const(&self) -> RawBuf {
        RawBuf { ptr: self.ptr, count: self.count, dtype: self.dtype, device: self.device }
    }
}

/// One point-to-point operation inside a [`Op::Batch`].
#[derive(Debug, Clone, Copy)]
pub enum P2p {
    /// Send `buf` to `peer` with `tag`.
    Send {
        /// The data.
        buf: RawBuf,
        /// Destination rank.
        peer: usize,
        /// Message tag.
        tag: u32,
    },
    /// Receive a message from `peer` with `tag` into `buf` (it may be shorter than `buf`).
    Recv {
        /// Where the data goes.
        buf: RawBufMut,
        /// Source rank.
        peer: usize,
        /// Message tag.
        tag: u32,
    },
}

/// One operation, type-erased. Arguments have been checked by the front door: lengths are
/// consistent, roots and peers are in range, dtypes agree.
///
/// In-place forms follow NCCL: the input and output pointers coincide
/// (all_reduce, broadcast at the root, all_to_all), or the input is this rank's block of the
/// output (all_gather: `output + rank*count`), or the output is this rank's block of the input
/// (reduce_scatter: `input + rank*count`).
#[derive(Debug, Clone)]
pub enum Op {
    /// Every rank ends with the reduction of all inputs.
    AllReduce {
        /// This rank's contribution.
        input: RawBuf,
        /// The result (same count).
        output: RawBufMut,
        /// How values combine.
        op: ReduceOp,
    },
    /// The root ends with the reduction of all inputs; other ranks' buffers are unchanged.
    Reduce {
        /// This rank's contribution.
        input: RawBuf,
        /// The result, at the root only.
        output: Option<RawBufMut>,
        /// How values combine.
        op: ReduceOp,
        /// The rank that receives the result.
        root: usize,
    },
    /// Every rank ends with the root's data.
    Broadcast {
        /// The data, at the root only.
        input: Option<RawBuf>,
        /// Where it lands (the root's too).
        output: RawBufMut,
        /// The rank that sends.
        root: usize,
    },
    /// Every rank ends with all ranks' inputs, concatenated in rank order.
    AllGather {
        /// This rank's block (count c).
        input: RawBuf,
        /// All blocks (count n*c).
        output: RawBufMut,
    },
    /// all_gather with per-rank counts.
    AllGatherV {
        /// This rank's block (count `counts[rank]`).
        input: RawBuf,
        /// All blocks, concatenated (count = sum of counts).
        output: RawBufMut,
        /// Every rank's count.
        counts: Vec<usize>,
    },
    /// Rank i ends with block i of the reduction of all inputs.
    ReduceScatter {
        /// n blocks (count n*c).
        input: RawBuf,
        /// This rank's reduced block (count c).
        output: RawBufMut,
        /// How values combine.
        op: ReduceOp,
    },
    /// Block j of rank i's input becomes block i of rank j's output.
    AllToAll {
        /// n blocks.
        input: RawBuf,
        /// n blocks.
        output: RawBufMut,
    },
    /// all_to_all with per-pair counts (blocks concatenated in rank order).
    AllToAllV {
        /// The blocks to send, `send_counts[j]` elements for rank j.
        input: RawBuf,
        /// Element count sent to each rank.
        send_counts: Vec<usize>,
        /// The blocks received, `recv_counts[j]` elements from rank j.
        output: RawBufMut,
        /// Element count received from each rank.
        recv_counts: Vec<usize>,
    },
    /// The root ends with all inputs concatenated in rank order.
    Gather {
        /// This rank's block.
        input: RawBuf,
        /// n blocks, at the root only.
        output: Option<RawBufMut>,
        /// The receiving rank.
        root: usize,
    },
    /// Rank i ends with block i of the root's input.
    Scatter {
        /// n blocks, at the root only.
        input: Option<RawBuf>,
        /// This rank's block.
        output: RawBufMut,
        /// The sending rank.
        root: usize,
    },
    /// No rank leaves until every rank has entered.
    Barrier,
    /// Point-to-point sends and receives issued together; they cannot deadlock each other.
    Batch(Vec<P2p>),
}

impl Op {
    /// The kind of this operation.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::AllReduce { .. } => OpKind::AllReduce,
            Op::Reduce { .. } => OpKind::Reduce,
            Op::Broadcast { .. } => OpKind::Broadcast,
            Op::AllGather { .. } => OpKind::AllGather,
            Op::AllGatherV { .. } => OpKind::AllGatherV,
            Op::ReduceScatter { .. } => OpKind::ReduceScatter,
            Op::AllToAll { .. } => OpKind::AllToAll,
            Op::AllToAllV { .. } => OpKind::AllToAllV,
            Op::Gather { .. } => OpKind::Gather,
            Op::Scatter { .. } => OpKind::Scatter,
            Op::Barrier => OpKind::Barrier,
            Op::Batch(ops) => match ops.as_slice() {
                [P2p::Send { .. }] => OpKind::Send,
                [P2p::Recv { .. }] => OpKind::Recv,
                _ => OpKind::Batch,
            },
        }
    }
}

/// What a completed operation reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completion {
    /// Element counts received, one per [`P2p::Recv`] of a batch, in order.
    pub received: Vec<usize>,
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

    /// Starts `op`.
    ///
    /// # Safety
    /// Every buffer in `op` must point to `count` valid, properly aligned elements of its
    /// dtype, stay valid until the returned [`Pending`] reports completion, and must not be
    /// read (outputs) or written (inputs and outputs) by anyone else until then.
    ///
    /// # Errors
    /// [`Error::Aborted`](crate::Error::Aborted) when the communicator is poisoned; errors of
    /// the operation itself arrive through the [`Pending`].
    unsafe fn submit(&self, op: Op, mode: Mode, opts: &CallOptions) -> Result<Arc<dyn Pending>>;

    /// Reports the first message from `peer` with `tag` not yet received, without receiving it.
    ///
    /// # Errors
    /// [`Error::Aborted`](crate::Error::Aborted) on a poisoned communicator,
    /// [`Error::PeerLost`](crate::Error::PeerLost) when `peer` is gone and nothing is queued.
    fn probe(&self, peer: usize, tag: u32) -> Result<Option<MessageInfo>>;

    /// Collective over all ranks: ranks with the same `Some(color)` form a new communicator,
    /// ordered by `(key, rank)`; `None` takes no part and gets `None`.
    ///
    /// # Errors
    /// Communication errors of the exchange.
    fn split(&self, color: Option<u32>, key: i64, opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>>;

    /// Aborts the communicator: every wait on it, on any thread, returns
    /// [`Error::Aborted`](crate::Error::Aborted), and peers are told so they fail fast too.
    fn abort(&self, reason: &str);
}
