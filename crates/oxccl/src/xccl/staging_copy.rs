//! A vendor runtime as the copy functions of the host backends' staging
//! ([`crate::staging`]): when the `cpu` or `mpi` backend runs a collective on CUDA or
//! ROCm memory, it copies through these; and as the pinner of the pinned pool
//! ([`RuntimePinner`]), so staging buffers are registered with the device.
//!
//! Each copy goes on the legacy default stream and is waited for: a host backend reads its
//! host temporary right after, and the default stream orders the copy after the work the
//! application queued there (PyTorch's default), as gloo's CUDA path does.

use std::sync::Arc;

use super::runtime::{CopyKind, DeviceRuntime, RawStream, Vendor};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::staging::pinned::Pinner;
use crate::staging::DeviceCopy;

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

/// Pins the pinned pool's buffers by registering them with a vendor runtime
/// (`cuMemHostRegister`, `hipHostRegister`): page-locked like `mlock`, and mapped for the
/// device's copy engines, so copies from and to them run at full speed and asynchronously.
pub(crate) struct RuntimePinner {
    rt: Arc<dyn DeviceRuntime>,
    name: String,
}

impl RuntimePinner {
    /// Registers through `rt`.
    pub(crate) fn new(rt: Arc<dyn DeviceRuntime>) -> RuntimePinner {
        let name = match rt.vendor() {
            Vendor::Cuda => "CUDA (cuMemHostRegister)".to_string(),
            Vendor::Hip => "HIP (hipHostRegister)".to_string(),
            Vendor::Host => "the host double's host_register".to_string(),
        };
        RuntimePinner { rt, name }
    }
}

impl Pinner for RuntimePinner {
    fn name(&self) -> &str {
        &self.name
    }

    unsafe fn pin(&self, ptr: *mut u8, len: usize) -> Result<()> {
        // SAFETY: the pool's contract: a live, page-aligned mapping that stays mapped until
        // `unpin` returns.
        unsafe { self.rt.host_register(ptr, len) }.map_err(|e| {
            Error::io(
                format!("registering {len} bytes of host memory with {} for the pinned pool", self.name),
                &std::io::Error::new(std::io::ErrorKind::OutOfMemory, e.to_string()),
            )
        })
    }

    unsafe fn unpin(&self, ptr: *mut u8, _len: usize) -> Result<()> {
        // SAFETY: pinned by `pin` above, still mapped, nothing queued on it (the pool only
        // unpins free buffers).
        unsafe { self.rt.host_unregister(ptr) }
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

    #[test]
    fn the_pool_pins_through_the_runtime() {
        let rt: Arc<dyn DeviceRuntime> = Arc::new(HostRuntime::new(1));
        let pinner = Arc::new(RuntimePinner::new(Arc::clone(&rt)));
        let pool = crate::staging::pinned::PinnedPool::new(1 << 20, pinner);
        let mut a = pool.acquire(100_000).unwrap();
        a.as_mut_slice().fill(3);
        let s = pool.stats();
        assert_eq!((s.pinner.as_str(), s.buffers, s.misses), ("the host double's host_register", 1, 1));
        drop(a);
        assert_eq!(pool.trim(), 128 << 10, "the free buffer is unregistered and unmapped");
        assert_eq!(pool.stats().buffers, 0);
        // Registering the same memory twice is the runtime's error, which the pool reports.
        let p = RuntimePinner::new(Arc::clone(&rt));
        let mut page = vec![0u8; 4096];
        // SAFETY: `page` stays alive (mapped) across both calls and the unpin.
        unsafe {
            p.pin(page.as_mut_ptr(), 4096).unwrap();
            let e = p.pin(page.as_mut_ptr(), 4096).unwrap_err();
            assert!(e.to_string().contains("already registered"), "{e}");
            p.unpin(page.as_mut_ptr(), 4096).unwrap();
        }
    }
}
