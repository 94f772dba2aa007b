//! Host buffers on a GPU communicator with `OXCCL_GPU_HOST_BUFFERS=stage`: each host range is
//! copied to a device temporary, the operation runs on the temporaries, and the outputs are
//! copied back, so the usual rules hold (the buffers are borrowed until the operation
//! completes).
//!
//! Every copy goes through pinned host memory (the engine's cache, `pool.rs`): the caller's
//! range is copied by the CPU into a pinned block at submission, and from it to the device
//! on the stream; outputs come back from the device into the pinned block on the stream, and
//! into the caller's range when the operation's event has fired (in the wait). A copy
//! between the device and pageable memory returns only once the stream has run it, so the
//! submitting thread would wait inside the driver for the NCCL kernel itself, with no
//! deadline and no watch for lost peers.
//!
//! Buffers that alias (in-place forms: the same pointer, or a block inside the output) share
//! one temporary at the same offset, so NCCL sees the in-place call the caller made.

use std::sync::Arc;

use super::state::{Copy, HostCopy, Inner, Staged};
use crate::backend::{BufferSlot, Op, RawBuf, RawBufMut};
use crate::device::Device;
use crate::error::Result;
use crate::xccl::runtime::{CopyKind, RawStream};

/// Host ranges and the temporaries they map to.
struct Map {
    /// (host start, bytes, device start, pinned start).
    ranges: Vec<(usize, usize, u64, usize)>,
}

impl Map {
    /// The device and pinned addresses of the host range `[ptr, ptr+bytes)`, inside a
    /// mapped range.
    fn find2(&self, ptr: *const u8, bytes: usize) -> Option<(u64, *mut u8)> {
        let p = ptr as usize;
        self.ranges.iter().find(|&&(start, len, _, _)| p >= start && p + bytes <= start + len).map(
            |&(start, _, dev, pin)| {
                (dev + (p - start) as u64, std::ptr::with_exposed_provenance_mut::<u8>(pin + (p - start)))
            },
        )
    }

    /// The device address of the host range `[ptr, ptr+bytes)`, inside a mapped range.
    fn find(&self, ptr: *const u8, bytes: usize) -> Option<u64> {
        self.find2(ptr, bytes).map(|(d, _)| d)
    }

    /// The copy of the host range `b` (inside a mapped range).
    fn copy_of(&self, host: *mut u8, bytes: usize) -> Copy {
        let (device, pinned) = self.find2(host, bytes).unwrap_or((0, std::ptr::null_mut()));
        Copy { host, pinned, device, bytes }
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
        let mut pinned = Vec::new();
        let mut ins = Vec::new();
        for (p, b) in all {
            if map.find(p, b).is_some() {
                continue;
            }
            let t = self.temp(b.max(1))?;
            let h = self.pinned(b.max(1))?;
            map.ranges.push((p as usize, b, t.ptr, h.ptr.expose_provenance()));
            ins.push(Copy { host: p.cast_mut(), pinned: h.ptr, device: t.ptr, bytes: b });
            temps.push(t);
            pinned.push(h);
        }
        let dev = self.kind;
        let (mut outs, mut recvs) = (Vec::new(), Vec::new());
        // A batch's outputs are its receives (copied back as much as arrived).
        let batch = matches!(op, Op::Batch(_));
        let mut op = op;
        op.for_each_buffer_mut(|slot| match slot {
            BufferSlot::Input(i) => {
                *i = RawBuf { ptr: map.find(i.ptr, i.bytes()).unwrap_or(0) as *const u8, device: dev, ..*i };
            }
            BufferSlot::Output(o) => {
                let c = map.copy_of(o.ptr, o.bytes());
                if batch { &mut recvs } else { &mut outs }.push(c);
                *o = RawBufMut { ptr: c.device as *mut u8, device: dev, ..*o };
            }
        });
        Ok(Staged { op, temps, pinned, ins, outs, recvs })
    }
}

impl Staged {
    /// Copies the host ranges into their pinned mirrors (here, by the CPU), and queues the
    /// copies from those to the device on `stream`.
    ///
    /// # Safety
    /// The host ranges are valid now (the submit contract).
    pub(crate) unsafe fn copy_in(&self, inner: &Inner, stream: RawStream) -> Result<()> {
        for c in self.ins.iter().filter(|c| c.bytes > 0) {
            // SAFETY: a host range of the caller's into its pinned mirror of at least its
            // size (distinct allocations).
            unsafe { std::ptr::copy_nonoverlapping(c.host.cast_const(), c.pinned, c.bytes) };
            // SAFETY: the pinned mirror (kept with the operation) into its temporary of the
            // same size.
            unsafe { inner.rt.copy_async(c.device, c.pinned as u64, c.bytes, CopyKind::HostToDevice, stream)? };
        }
        Ok(())
    }

    /// Queues the device-to-pinned copies of the outputs, and of each receive's `received`
    /// elements (of `elem` bytes), on `stream`; returns the copies into the caller's ranges
    /// to make once the stream has run them.
    ///
    /// # Safety
    /// The pinned mirrors and temporaries are kept until the stream has run the copies.
    pub(crate) unsafe fn copy_out(
        &self,
        inner: &Inner,
        stream: RawStream,
        received: &[(usize, usize)],
    ) -> Result<Vec<HostCopy>> {
        let recvs =
            self.recvs.iter().zip(received).map(|(c, &(n, elem))| Copy { bytes: (n * elem).min(c.bytes), ..*c });
        let mut back = Vec::new();
        for c in self.outs.iter().copied().chain(recvs).filter(|c| c.bytes > 0) {
            // SAFETY: the temporary's range into its pinned mirror (kept with the operation).
            unsafe { inner.rt.copy_async(c.pinned as u64, c.device, c.bytes, CopyKind::DeviceToHost, stream)? };
            back.push(HostCopy { dst: c.host, src: c.pinned.cast_const(), bytes: c.bytes });
        }
        Ok(back)
    }
}

/// Whether every one of `buffers` is host memory (and there is one).
pub(crate) fn all_host(buffers: &[RawBuf]) -> bool {
    !buffers.is_empty() && buffers.iter().all(|b| b.device == Device::Cpu)
}
