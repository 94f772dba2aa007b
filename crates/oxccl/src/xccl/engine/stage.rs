//! Host buffers on a GPU communicator with `OXCCL_GPU_HOST_BUFFERS=stage`: each host range is
//! copied to a device temporary on the operation's stream, the operation runs on the
//! temporaries, and the outputs are copied back before the completion event, so the usual
//! rules hold (the buffers are borrowed until the operation completes).
//!
//! Buffers that alias (in-place forms: the same pointer, or a block inside the output) share
//! one temporary at the same offset, so NCCL sees the in-place call the caller made.

use std::sync::Arc;

use super::pending::DeviceTemp;
use super::Inner;
use crate::backend::{Op, P2p, RawBuf, RawBufMut};
use crate::device::Device;
use crate::error::Result;
use crate::xccl::runtime::{CopyKind, RawStream};

/// One copy between a host range and its device image.
#[derive(Debug, Clone, Copy)]
struct Copy {
    host: *mut u8,
    device: u64,
    bytes: usize,
}

/// An operation moved onto device temporaries.
pub(crate) struct Staged {
    /// The operation on device memory.
    pub(crate) op: Op,
    /// The temporaries (kept until completion).
    pub(crate) temps: Vec<DeviceTemp>,
    /// Whole temporaries to fill from the host first.
    ins: Vec<Copy>,
    /// Output ranges to copy back (collectives).
    outs: Vec<Copy>,
    /// Per receive of a batch, where its message is copied back (its count known later).
    recvs: Vec<Copy>,
}

// SAFETY: the host pointers describe the caller's buffers, which the submit contract keeps
// valid and untouched until completion; moving their description between threads is what
// that contract allows (as for `RawBuf`).
unsafe impl Send for Staged {}

/// Host ranges and the temporaries they map to.
struct Map {
    /// (host start, bytes, device start).
    ranges: Vec<(usize, usize, u64)>,
}

impl Map {
    /// The device address of the host range `[ptr, ptr+bytes)`, inside a mapped range.
    fn find(&self, ptr: *const u8, bytes: usize) -> Option<u64> {
        let p = ptr as usize;
        self.ranges
            .iter()
            .find(|&&(start, len, _)| p >= start && p + bytes <= start + len)
            .map(|&(start, _, dev)| dev + (p - start) as u64)
    }
}

impl Inner {
    /// Moves `op`'s host buffers onto device temporaries (see the module documentation).
    ///
    /// # Errors
    /// Out of device memory.
    pub(crate) fn stage(self: &Arc<Self>, op: Op) -> Result<Staged> {
        // Every range, largest first, so blocks land inside the buffer they belong to.
        let mut all: Vec<(*const u8, usize)> = op.buffers().iter().map(|b| (b.ptr, b.bytes())).collect();
        all.sort_by_key(|&(_, b)| std::cmp::Reverse(b));
        let mut map = Map { ranges: Vec::new() };
        let mut temps = Vec::new();
        let mut ins = Vec::new();
        for (p, b) in all {
            if map.find(p, b).is_some() {
                continue;
            }
            let t = self.temp(b.max(1))?;
            map.ranges.push((p as usize, b, t.ptr));
            ins.push(Copy { host: p.cast_mut(), device: t.ptr, bytes: b });
            temps.push(t);
        }
        let dev = self.kind;
        let mut outs = Vec::new();
        let mut recvs = Vec::new();
        let i = |b: &RawBuf| RawBuf { ptr: map.find(b.ptr, b.bytes()).unwrap_or(0) as *const u8, device: dev, ..*b };
        let mut o = |b: &RawBufMut| {
            let d = map.find(b.ptr, b.bytes()).unwrap_or(0);
            outs.push(Copy { host: b.ptr, device: d, bytes: b.bytes() });
            RawBufMut { ptr: d as *mut u8, device: dev, ..*b }
        };
        let op = match op {
            Op::AllReduce { input, output, op } => Op::AllReduce { input: i(&input), output: o(&output), op },
            Op::Reduce { input, output, op, root } => {
                Op::Reduce { input: i(&input), output: output.as_ref().map(&mut o), op, root }
            }
            Op::Broadcast { input, output, root } => {
                Op::Broadcast { input: input.as_ref().map(i), output: o(&output), root }
            }
            Op::AllGather { input, output } => Op::AllGather { input: i(&input), output: o(&output) },
            Op::AllGatherV { input, output, counts } => Op::AllGatherV { input: i(&input), output: o(&output), counts },
            Op::ReduceScatter { input, output, op } => Op::ReduceScatter { input: i(&input), output: o(&output), op },
            Op::AllToAll { input, output } => Op::AllToAll { input: i(&input), output: o(&output) },
            Op::AllToAllV { input, send_counts, output, recv_counts } => {
                Op::AllToAllV { input: i(&input), send_counts, output: o(&output), recv_counts }
            }
            Op::Gather { input, output, root } => {
                Op::Gather { input: i(&input), output: output.as_ref().map(&mut o), root }
            }
            Op::Scatter { input, output, root } => {
                Op::Scatter { input: input.as_ref().map(i), output: o(&output), root }
            }
            Op::Barrier => Op::Barrier,
            Op::Batch(ops) => Op::Batch(
                ops.iter()
                    .map(|p| match *p {
                        P2p::Send { buf, peer, tag } => P2p::Send { buf: i(&buf), peer, tag },
                        P2p::Recv { buf, peer, tag } => {
                            let d = map.find(buf.ptr, buf.bytes()).unwrap_or(0);
                            recvs.push(Copy { host: buf.ptr, device: d, bytes: buf.bytes() });
                            P2p::Recv { buf: RawBufMut { ptr: d as *mut u8, device: dev, ..buf }, peer, tag }
                        }
                        P2p::RecvAny { buf, tag } => {
                            let d = map.find(buf.ptr, buf.bytes()).unwrap_or(0);
                            recvs.push(Copy { host: buf.ptr, device: d, bytes: buf.bytes() });
                            P2p::RecvAny { buf: RawBufMut { ptr: d as *mut u8, device: dev, ..buf }, tag }
                        }
                    })
                    .collect(),
            ),
        };
        Ok(Staged { op, temps, ins, outs, recvs })
    }
}

impl Staged {
    /// Queues the host-to-device copies on `stream`.
    ///
    /// # Safety
    /// The host ranges are valid until the stream has run the copies (the submit contract).
    pub(crate) unsafe fn copy_in(&self, inner: &Inner, stream: RawStream) -> Result<()> {
        for c in self.ins.iter().filter(|c| c.bytes > 0) {
            // SAFETY: a host range of the caller's (valid until completion) into its
            // temporary of the same size.
            unsafe { inner.rt.copy_async(c.device, c.host as u64, c.bytes, CopyKind::HostToDevice, stream)? };
        }
        Ok(())
    }

    /// Queues the device-to-host copies of the outputs, and of each receive's `received`
    /// elements (of `elem` bytes), on `stream`.
    ///
    /// # Safety
    /// As for [`copy_in`](Self::copy_in).
    pub(crate) unsafe fn copy_out(&self, inner: &Inner, stream: RawStream, received: &[(usize, usize)]) -> Result<()> {
        let recvs =
            self.recvs.iter().zip(received).map(|(c, &(n, elem))| Copy { bytes: (n * elem).min(c.bytes), ..*c });
        for c in self.outs.iter().copied().chain(recvs).filter(|c| c.bytes > 0) {
            // SAFETY: the temporary's range back into the caller's host range (valid and
            // not used by others until completion).
            unsafe { inner.rt.copy_async(c.host as u64, c.device, c.bytes, CopyKind::DeviceToHost, stream)? };
        }
        Ok(())
    }
}

/// Whether every one of `buffers` is host memory (and there is one).
pub(crate) fn all_host(buffers: &[RawBuf]) -> bool {
    !buffers.is_empty() && buffers.iter().all(|b| b.device == Device::Cpu)
}
