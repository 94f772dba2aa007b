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

/// One buffer of an [`Op`], lent by [`Op::for_each_buffer_mut`] to be read or replaced.
#[derive(Debug)]
pub enum BufferSlot<'a> {
    /// A buffer the operation reads (a collective's input, a send's data).
    Input(&'a mut RawBuf),
    /// A buffer the operation writes (a collective's output, a receive's destination).
    Output(&'a mut RawBufMut),
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

/// Where the buffers of an operation are, written once for [`Op::for_each_buffer`] (over
/// `&Op`) and [`Op::for_each_buffer_mut`] (over `&mut Op`): evaluates `$on_input` with `$i`
/// bound to each read-only buffer and `$on_output` with `$o` bound to each writable one
/// (references, shared or mutable as `$op` is), in argument order, `None`s skipped.
macro_rules! each_buffer {
    ($op:expr, |$i:ident| $on_input:expr, |$o:ident| $on_output:expr) => {
        match $op {
            Op::AllReduce { input, output, .. }
            | Op::AllGather { input, output }
            | Op::AllGatherV { input, output, .. }
            | Op::ReduceScatter { input, output, .. }
            | Op::AllToAll { input, output }
            | Op::AllToAllV { input, output, .. } => {
                let $i = input;
                $on_input;
                let $o = output;
                $on_output;
            }
            Op::Reduce { input, output, .. } | Op::Gather { input, output, .. } => {
                let $i = input;
                $on_input;
                if let Some($o) = output {
                    $on_output;
                }
            }
            Op::Broadcast { input, output, .. } | Op::Scatter { input, output, .. } => {
                if let Some($i) = input {
                    $on_input;
                }
                let $o = output;
                $on_output;
            }
            Op::Barrier => {}
            Op::Batch(ops) => {
                for p in ops {
                    match p {
                        P2p::Send { buf: $i, .. } => $on_input,
                        P2p::Recv { buf: $o, .. } | P2p::RecvAny { buf: $o, .. } => $on_output,
                    }
                }
            }
        }
    };
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
        each_buffer!(self, |i| f(*i), |o| f(o.as_const()));
    }

    /// Calls `f` with every buffer the operation passes, in
    /// [`for_each_buffer`](Self::for_each_buffer)'s order (`None`s skipped), each as a slot
    /// that `f` may overwrite: how an engine puts its own memory (temporaries, device
    /// copies) in place of the caller's. The other arguments (counts, roots, ops) stay.
    pub fn for_each_buffer_mut(&mut self, mut f: impl FnMut(BufferSlot<'_>)) {
        each_buffer!(self, |i| f(BufferSlot::Input(i)), |o| f(BufferSlot::Output(o)));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One operation of every shape, its buffers at addresses 1, 2, 3, ...
    fn every_shape() -> Vec<Op> {
        let mut next = 0usize;
        let mut b = || {
            next += 1;
            RawBufMut { ptr: next as *mut u8, count: next, dtype: DType::F32, device: Device::Cpu }
        };
        let (sum, root) = (ReduceOp::Sum, 0);
        vec![
            Op::AllReduce { input: b().as_const(), output: b(), op: sum },
            Op::Reduce { input: b().as_const(), output: Some(b()), op: sum, root },
            Op::Reduce { input: b().as_const(), output: None, op: sum, root },
            Op::Broadcast { input: Some(b().as_const()), output: b(), root },
            Op::Broadcast { input: None, output: b(), root },
            Op::AllGather { input: b().as_const(), output: b() },
            Op::AllGatherV { input: b().as_const(), output: b(), counts: vec![1] },
            Op::ReduceScatter { input: b().as_const(), output: b(), op: sum },
            Op::AllToAll { input: b().as_const(), output: b() },
            Op::AllToAllV { input: b().as_const(), send_counts: vec![1], output: b(), recv_counts: vec![1] },
            Op::Gather { input: b().as_const(), output: None, root },
            Op::Scatter { input: Some(b().as_const()), output: b(), root },
            Op::Barrier,
            Op::Batch(vec![
                P2p::Send { buf: b().as_const(), peer: 1, tag: 0 },
                P2p::Recv { buf: b(), peer: 1, tag: 0 },
                P2p::RecvAny { buf: b(), tag: 0 },
            ]),
        ]
    }

    #[test]
    fn the_mutable_walk_lends_the_buffers_in_order_and_writes_back() {
        for mut op in every_shape() {
            let before = op.buffers();
            let mut seen = Vec::new();
            op.for_each_buffer_mut(|slot| match slot {
                BufferSlot::Input(i) => {
                    seen.push((i.ptr as usize, false));
                    i.ptr = (i.ptr as usize + 1000) as *const u8;
                }
                BufferSlot::Output(o) => {
                    seen.push((o.ptr as usize, true));
                    o.ptr = (o.ptr as usize + 1000) as *mut u8;
                }
            });
            let ptrs: Vec<usize> = before.iter().map(|b| b.ptr as usize).collect();
            assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), ptrs, "{op:?}");
            let moved: Vec<usize> = op.buffers().iter().map(|b| b.ptr as usize - 1000).collect();
            assert_eq!(moved, ptrs, "every slot is written back: {op:?}");
            // Inputs come before outputs within a collective; a batch keeps its order.
            if !matches!(op, Op::Batch(_)) {
                assert!(seen.windows(2).all(|w| w[0].1 <= w[1].1), "{op:?}");
            }
        }
    }
}
