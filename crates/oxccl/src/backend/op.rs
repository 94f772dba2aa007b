//! One operation, type-erased: the buffers ([`RawBuf`], [`RawBufMut`]) and the [`Op`] a
//! backend receives from the front door, with the facts every engine derives from it (its
//! fingerprint, the size its selector looks at).

use crate::algorithm::Algorithm;
use crate::device::Device;
use crate::dtype::DType;
use crate::fingerprint::Fingerprint;
use crate::op_kind::OpKind;
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
    /// Receive the next message with `tag` from whichever rank sent one (like
    /// `MPI_ANY_SOURCE`); the completion says which ([`Completion::sources`]). Only ever
    /// alone in its batch.
    ///
    /// [`Completion::sources`]: super::Completion::sources
    RecvAny {
        /// Where the data goes.
        buf: RawBufMut,
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
                [P2p::Recv { .. } | P2p::RecvAny { .. }] => OpKind::Recv,
                _ => OpKind::Batch,
            },
        }
    }

    /// The fingerprint of collective `op` as sequence number `seq`, run by `algorithm`.
    pub fn fingerprint(&self, seq: u64, algorithm: Algorithm) -> Fingerprint {
        let (dtype, count, root, reduce) = match self {
            Op::AllReduce { output, op, .. } => (output.dtype, output.count, None, Some(*op)),
            Op::Reduce { input, op, root, .. } => (input.dtype, input.count, Some(*root), Some(*op)),
            Op::Broadcast { output, root, .. } => (output.dtype, output.count, Some(*root), None),
            Op::AllGather { input, .. } => (input.dtype, input.count, None, None),
            Op::AllGatherV { output, .. } => (output.dtype, output.count, None, None),
            Op::ReduceScatter { output, op, .. } => (output.dtype, output.count, None, Some(*op)),
            Op::AllToAll { input, .. } => (input.dtype, input.count, None, None),
            // Per-pair counts differ legitimately; the receiver checks each block's length.
            Op::AllToAllV { input, .. } => (input.dtype, 0, None, None),
            Op::Gather { input, root, .. } => (input.dtype, input.count, Some(*root), None),
            Op::Scatter { output, root, .. } => (output.dtype, output.count, Some(*root), None),
            Op::Barrier | Op::Batch(_) => (DType::U8, 0, None, None),
        };
        Fingerprint {
            seq,
            op: self.kind(),
            dtype,
            count: count as u64,
            root: root.map(|r| r as u32),
            reduce,
            algorithm,
        }
    }

    /// Calls `f` with every buffer the operation passes (inputs and outputs, `None`s
    /// skipped; outputs read-only), in argument order, without allocating.
    pub fn for_each_buffer(&self, mut f: impl FnMut(RawBuf)) {
        let o = RawBufMut::as_const;
        match self {
            Op::AllReduce { input, output, .. }
            | Op::AllGather { input, output }
            | Op::AllGatherV { input, output, .. }
            | Op::ReduceScatter { input, output, .. }
            | Op::AllToAll { input, output }
            | Op::AllToAllV { input, output, .. } => {
                f(*input);
                f(o(output));
            }
            Op::Reduce { input, output, .. } | Op::Gather { input, output, .. } => {
                f(*input);
                output.as_ref().map(o).into_iter().for_each(f);
            }
            Op::Broadcast { input, output, .. } | Op::Scatter { input, output, .. } => {
                input.iter().copied().for_each(&mut f);
                f(o(output));
            }
            Op::Barrier => {}
            Op::Batch(ops) => ops.iter().for_each(|p| match p {
                P2p::Send { buf, .. } => f(*buf),
                P2p::Recv { buf, .. } | P2p::RecvAny { buf, .. } => f(buf.as_const()),
            }),
        }
    }

    /// Every buffer the operation passes ([`for_each_buffer`](Self::for_each_buffer)'s order).
    pub fn buffers(&self) -> Vec<RawBuf> {
        let mut v = Vec::with_capacity(2);
        self.for_each_buffer(|b| v.push(b));
        v
    }

    /// The device of every buffer the operation passes, in argument order
    /// ([`buffers`](Self::buffers)).
    pub fn devices(&self) -> Vec<Device> {
        self.buffers().iter().map(|b| b.device).collect()
    }

    /// The per-rank size in bytes that the selector looks at.
    pub fn message_bytes(&self) -> usize {
        match self {
            Op::AllReduce { output, .. } => output.bytes(),
            Op::Reduce { input, .. } | Op::AllGather { input, .. } | Op::Gather { input, .. } => input.bytes(),
            Op::AllToAll { input, .. } | Op::AllToAllV { input, .. } | Op::ReduceScatter { input, .. } => input.bytes(),
            Op::Broadcast { output, .. } | Op::Scatter { output, .. } | Op::AllGatherV { output, .. } => output.bytes(),
            Op::Barrier | Op::Batch(_) => 0,
        }
    }
}
