//! A vendor runtime as the copy functions of the host backends' staging
//! ([`crate::backend::staging`]): when the `cpu` or `mpi` backend runs a collective on CUDA or
//! ROCm memory, it copies through these.
//!
//! Each copy goes on the legacy default stream and is waited for: a host backend reads its
//! host temporary right after, and the default stream orders the copy after the work the
//! application queued there (PyTorch's default), as gloo's CUDA path does.

use std::sync::Arc;

use super::runtime::{CopyKind, DeviceRuntime, RawStream};
use crate::backend::staging::DeviceCopy;
use crate::device::Device;
use crate::error::{Error, Result};

/// Copies between device and host memory through one vendor runtime.
pub(crate) struct RuntimeCopy {
    rt: Arc<dyn DeviceRuntime>,
}

impl RuntimeCopy {
    /// Copies through `rt`.
    pub(crate) fn new(rt: Arc<dyn DeviceRuntime>) -> RuntimeCopy {
        RuntimeCopy { rt }
    }

    fn copy(&self, device: Device, dst: u64, src: u64, bytes: usize, kind: CopyKind) -> Result<()> {
        let ordinal =
            device.ordinal().ok_or_else(|| Error::Internal("a host buffer was staged as device memory".into()))?;
        self.rt.set_current(ordinal)?;
        // SAFETY: the staging contract (DeviceCopy's) gives `bytes` valid bytes at both ends,
        // untouched by others until this returns; the stream is synchronized before it does.
        unsafe { self.rt.copy_async(dst, src, bytes, kind, RawStream::DEFAULT)? };
        self.rt.stream_synchronize(RawStream::DEFAULT)
    }
}

impl DeviceCopy for RuntimeCopy {
    unsafe fn to_host(&self, device: Device, src: *const u8, dst: *mut u8, bytes: usize) -> Result<()> {
        self.copy(device, dst as u64, src as u64, bytes, CopyKind::DeviceToHost)
    }

    unsafe fn to_device(&self, device: Device, src: *const u8, dst: *mut u8, bytes: usize) -> Result<()> {
        self.copy(device, dst as u64, src as u64, bytes, CopyKind::HostToDevice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xccl::runtime::host::HostRuntime;

    #[test]
    fn copies_go_through_the_runtime_both_ways() {
        let rt: Arc<dyn DeviceRuntime> = Arc::new(HostRuntime::new(2));
        let dev = rt.alloc(1, 16).unwrap();
        let copy = RuntimeCopy::new(Arc::clone(&rt));
        let src: Vec<u8> = (0..16).collect();
        let mut back = vec![0u8; 16];
        // SAFETY: `dev` holds 16 bytes of device 1; the host vectors 16 bytes each.
        unsafe {
            copy.to_device(Device::Cuda(1), src.as_ptr(), dev as *mut u8, 16).unwrap();
            copy.to_host(Device::Cuda(1), dev as *const u8, back.as_mut_ptr(), 16).unwrap();
        }
        assert_eq!(back, src);
        // SAFETY: allocated above, freed once, nothing queued.
        unsafe { rt.free(1, dev).unwrap() };
        let e = copy.copy(Device::Cuda(5), 0, 0, 1, CopyKind::HostToDevice).unwrap_err();
        assert!(e.to_string().contains('5'), "{e}");
    }
}
