//! Untyped device memory: [`DeviceBytes`], a byte allocation on one [`Gpu`], freed on drop.
//!
//! The typed [`DeviceBuffer`](super::memory::DeviceBuffer) knows its element type at compile
//! time; a [`Tensor`](crate::Tensor) knows its dtype only at run time, so its device storage
//! is this: bytes, copied to and from the host and within the device, and described to the
//! collectives by the tensor (which knows what the bytes hold).
//!
//! Every call queues its copies on the device's legacy default stream and waits for them
//! before returning, like `DeviceBuffer`'s: nothing is in flight once a call has returned, so
//! dropping (freeing) the memory is always safe.

use std::fmt;
use std::sync::Arc;

use super::gpu::Gpu;
use super::runtime::{CopyKind, RawStream};
use crate::error::{Error, Result};

/// `len` bytes of device memory on `gpu`, freed on drop.
pub(crate) struct DeviceBytes {
    gpu: Gpu,
    /// Device address of byte 0.
    ptr: u64,
    len: usize,
}

impl fmt::Debug for DeviceBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBytes").field("device", &self.gpu.device()).field("len", &self.len).finish()
    }
}

/// One copy of a batch: `len` bytes from byte `src` of the source to byte `dst` of the
/// destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) src: usize,
    pub(crate) dst: usize,
    pub(crate) len: usize,
}

/// Whether `a` and `b` are the same device of the same runtime.
pub(crate) fn same_gpu(a: &Gpu, b: &Gpu) -> bool {
    Arc::ptr_eq(a.runtime(), b.runtime()) && a.ordinal() == b.ordinal()
}

impl DeviceBytes {
    /// `len` bytes on `gpu` whose contents are unspecified (whatever the device memory held);
    /// the caller fills them before anyone reads them.
    ///
    /// # Errors
    /// Out of device memory, or the runtime's error.
    pub(crate) fn uninit(gpu: &Gpu, len: usize) -> Result<DeviceBytes> {
        let ptr = gpu.runtime().alloc(gpu.ordinal(), len)?;
        Ok(DeviceBytes { gpu: gpu.clone(), ptr, len })
    }

    /// `len` zero bytes on `gpu`.
    ///
    /// # Errors
    /// Out of host or device memory, or the runtime's error.
    pub(crate) fn zeroed(gpu: &Gpu, len: usize) -> Result<DeviceBytes> {
        DeviceBytes::from_host(gpu, &vec![0u8; len])
    }

    /// A copy of `data` on `gpu`.
    ///
    /// # Errors
    /// Out of device memory, or the runtime's error.
    pub(crate) fn from_host(gpu: &Gpu, data: &[u8]) -> Result<DeviceBytes> {
        let mut out = DeviceBytes::uninit(gpu, data.len())?;
        out.write(0, data)?;
        Ok(out)
    }

    /// The GPU the memory is on.
    pub(crate) fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The device address of byte 0.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The number of bytes.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies all the bytes into `dst`, which must have the same length.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the lengths differ; the runtime's error.
    pub(crate) fn to_host(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() != self.len {
            return Err(Error::invalid(format!(
                "DeviceBytes::to_host: {} bytes of device memory into {} host bytes",
                self.len,
                dst.len()
            )));
        }
        self.read(0, dst)
    }

    /// Checks that `len` bytes from byte `offset` lie inside the allocation.
    fn check_range(&self, what: &str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::invalid(format!(
                "DeviceBytes::{what}: {len} bytes from byte {offset} do not fit in {} bytes of device memory",
                self.len
            ))),
        }
    }

    /// Copies `dst.len()` bytes from byte `offset` into `dst`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the allocation; the runtime's error.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range("read", offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let rt = self.gpu.runtime();
        rt.set_current(self.gpu.ordinal())?;
        // SAFETY: the range lies inside this live allocation (checked above) and `dst` is a
        // host slice of its size, borrowed exclusively; `finish` waits for the stream before
        // the borrow ends (also when queueing failed), so nobody reads `dst` before the copy
        // ran.
        let queued = unsafe {
            rt.copy_async(
                dst.as_mut_ptr() as u64,
                self.ptr + offset as u64,
                dst.len(),
                CopyKind::DeviceToHost,
                RawStream::DEFAULT,
            )
        };
        self.finish(queued)
    }

    /// Copies `src` to the bytes from byte `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the allocation; the runtime's error.
    pub(crate) fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range("write", offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let rt = self.gpu.runtime();
        rt.set_current(self.gpu.ordinal())?;
        // SAFETY: the range lies inside this live allocation (checked above), borrowed
        // exclusively, and `src` is a host slice of its size; `finish` waits for the stream
        // before `src`'s borrow ends (also when queueing failed), so the copy has read it.
        let queued = unsafe {
            rt.copy_async(
                self.ptr + offset as u64,
                src.as_ptr() as u64,
                src.len(),
                CopyKind::HostToDevice,
                RawStream::DEFAULT,
            )
        };
        self.finish(queued)
    }

    /// A copy of the bytes in a new allocation on the same GPU.
    ///
    /// # Errors
    /// Out of device memory, or the runtime's error.
    pub(crate) fn try_clone(&self) -> Result<DeviceBytes> {
        let mut out = DeviceBytes::uninit(&self.gpu, self.len)?;
        out.copy_blocks_from(self, [Block { src: 0, dst: 0, len: self.len }])?;
        Ok(out)
    }

    /// Copies every block of `blocks` from `src` into `self` (device to device), then waits
    /// for the copies. Both must be on the same GPU; empty blocks are skipped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for memory on different GPUs or a block outside either
    /// allocation (checked for every block before anything is queued); the runtime's error.
    pub(crate) fn copy_blocks_from(
        &mut self,
        src: &DeviceBytes,
        blocks: impl IntoIterator<Item = Block> + Clone,
    ) -> Result<()> {
        if !same_gpu(&self.gpu, &src.gpu) {
            return Err(Error::invalid(format!(
                "DeviceBytes::copy_blocks_from: the source is on {} and the destination on {} \
                 (or another runtime); device-to-device copies stay on one GPU",
                src.gpu.device(),
                self.gpu.device()
            )));
        }
        let fits = |off: usize, len: usize, total: usize| off.checked_add(len).is_some_and(|end| end <= total);
        if let Some(b) =
            blocks.clone().into_iter().find(|b| !fits(b.src, b.len, src.len) || !fits(b.dst, b.len, self.len))
        {
            return Err(Error::invalid(format!(
                "DeviceBytes::copy_blocks_from: the block {b:?} does not fit in a source of {} bytes and a destination \
                 of {} bytes",
                src.len, self.len
            )));
        }
        let rt = self.gpu.runtime();
        rt.set_current(self.gpu.ordinal())?;
        let mut queued = Ok(());
        for b in blocks.into_iter().filter(|b| b.len > 0) {
            // SAFETY: both ranges lie inside live allocations on this device (checked above);
            // `src` is borrowed shared and `self` exclusively until `finish` has waited for
            // the stream (also when a later copy failed to queue), so the memory stays valid
            // and untouched by others until the copies have run.
            queued = unsafe {
                rt.copy_async(
                    self.ptr + b.dst as u64,
                    src.ptr + b.src as u64,
                    b.len,
                    CopyKind::DeviceToDevice,
                    RawStream::DEFAULT,
                )
            };
            if queued.is_err() {
                break;
            }
        }
        self.finish(queued)
    }

    /// Waits for the default stream, whatever `queued` says (copies queued before a failure
    /// may still be running, and their memory must outlive them), then returns the first
    /// error.
    fn finish(&self, queued: Result<()>) -> Result<()> {
        let synced = self.gpu.runtime().stream_synchronize(RawStream::DEFAULT);
        queued.and(synced)
    }
}

impl Drop for DeviceBytes {
    fn drop(&mut self) {
        let rt = self.gpu.runtime();
        // Every copy waits before returning, and collectives wait before handing borrowed
        // memory back, so no queued work uses the memory; a failed free leaks rather than
        // panics.
        if rt.set_current(self.gpu.ordinal()).is_ok() {
            // SAFETY: `ptr` came from `alloc` on this device and is freed once, here.
            let _ = unsafe { rt.free(self.gpu.ordinal(), self.ptr) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xccl::runtime::host::HostRuntime;

    fn gpu(ordinal: u32) -> Gpu {
        Gpu::new(Arc::new(HostRuntime::new(2)), ordinal).unwrap()
    }

    #[test]
    fn round_trips_and_block_copies() {
        let g = gpu(1);
        let data: Vec<u8> = (0..23).collect();
        let d = DeviceBytes::from_host(&g, &data).unwrap();
        assert_eq!(d.len(), 23);
        let mut back = vec![0u8; 23];
        d.to_host(&mut back).unwrap();
        assert_eq!(back, data);
        assert!(matches!(d.to_host(&mut [0u8; 3]), Err(Error::InvalidArgument(_))));

        let mut z = DeviceBytes::zeroed(&g, 10).unwrap();
        z.copy_blocks_from(&d, [Block { src: 20, dst: 0, len: 3 }, Block { src: 0, dst: 7, len: 3 }]).unwrap();
        let mut got = vec![9u8; 10];
        z.to_host(&mut got).unwrap();
        assert_eq!(got, vec![20, 21, 22, 0, 0, 0, 0, 0, 1, 2]);
        // A block out of range is refused before anything is copied.
        let e = z.copy_blocks_from(&d, [Block { src: 0, dst: 0, len: 1 }, Block { src: 22, dst: 0, len: 2 }]);
        assert!(matches!(e, Err(Error::InvalidArgument(_))), "{e:?}");
        let e = z.copy_blocks_from(&d, [Block { src: usize::MAX, dst: 0, len: 2 }]);
        assert!(matches!(e, Err(Error::InvalidArgument(_))), "{e:?}");
        z.to_host(&mut got).unwrap();
        assert_eq!(got, vec![20, 21, 22, 0, 0, 0, 0, 0, 1, 2]);

        let c = d.try_clone().unwrap();
        assert_ne!(c.device_ptr(), d.device_ptr());
        c.to_host(&mut back).unwrap();
        assert_eq!(back, data);

        // Empty allocations work.
        let e = DeviceBytes::from_host(&g, &[]).unwrap();
        e.to_host(&mut []).unwrap();
        assert_eq!(e.try_clone().unwrap().len(), 0);
    }

    #[test]
    fn copies_stay_on_one_gpu() {
        let (a, b) = (gpu(0), gpu(1));
        let src = DeviceBytes::zeroed(&a, 4).unwrap();
        let mut dst = DeviceBytes::zeroed(&b, 4).unwrap();
        let e = dst.copy_blocks_from(&src, [Block { src: 0, dst: 0, len: 4 }]);
        assert!(matches!(e, Err(Error::InvalidArgument(_))), "{e:?}");
        assert!(same_gpu(&a, &a.clone()) && !same_gpu(&a, &b));
    }
}
