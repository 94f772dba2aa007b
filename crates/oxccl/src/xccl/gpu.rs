//! One GPU: [`Gpu`], a vendor runtime (CUDA or HIP, loaded at run time) and one of its
//! devices, what device memory ([`DeviceBytes`](super::bytes::DeviceBytes) and the public
//! [`DeviceBuffer`](super::memory::DeviceBuffer)) lives on.

use std::fmt;
use std::sync::Arc;

use super::runtime::{DeviceRuntime, RawStream, Vendor};
use crate::device::Device;
use crate::error::{Error, Result};

/// One GPU of a vendor runtime (CUDA or HIP, loaded at run time). Cloning is cheap.
#[derive(Clone)]
pub struct Gpu {
    rt: Arc<dyn DeviceRuntime>,
    ordinal: u32,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu").field("device", &self.device()).field("runtime", &self.rt.describe()).finish()
    }
}

impl Gpu {
    /// The GPU `device` names: `cuda:N` through the CUDA driver (`libcuda.so.1`), `rocm:N`
    /// through HIP (`libamdhip64.so`), each loaded once per process.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for [`Device::Cpu`] or an ordinal that does not exist;
    /// [`Error::BackendUnavailable`] when the runtime or any device is missing.
    pub fn of(device: Device) -> Result<Gpu> {
        use super::library::Flavor;
        match device {
            Device::Cuda(n) => Gpu::new(super::factory::runtime(Flavor::Nccl)?, n),
            Device::Rocm(n) => Gpu::new(super::factory::runtime(Flavor::Rccl)?, n),
            Device::Cpu => Err(Error::invalid("Gpu::of(Device::Cpu): the host is not a GPU")),
        }
    }

    /// CUDA device `ordinal` (see [`of`](Self::of)).
    ///
    /// # Errors
    /// As for [`of`](Self::of).
    pub fn cuda(ordinal: u32) -> Result<Gpu> {
        Gpu::of(Device::Cuda(ordinal))
    }

    /// HIP (ROCm) device `ordinal` (see [`of`](Self::of)).
    ///
    /// # Errors
    /// As for [`of`](Self::of).
    pub fn hip(ordinal: u32) -> Result<Gpu> {
        Gpu::of(Device::Rocm(ordinal))
    }

    /// Device `ordinal` of `rt`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the runtime has no such device; the runtime's error.
    pub(crate) fn new(rt: Arc<dyn DeviceRuntime>, ordinal: u32) -> Result<Gpu> {
        let count = rt.device_count()?;
        if ordinal >= count {
            return Err(Error::invalid(format!(
                "{} device {ordinal} does not exist: {count} device(s) are visible (ordinals 0..{count})",
                rt.vendor()
            )));
        }
        Ok(Gpu { rt, ordinal })
    }

    /// The runtime.
    pub(crate) fn runtime(&self) -> &Arc<dyn DeviceRuntime> {
        &self.rt
    }

    /// The device ordinal in the runtime.
    pub(crate) fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// How many devices this GPU's runtime sees (this one among them).
    ///
    /// # Errors
    /// The runtime's error.
    pub fn device_count(&self) -> Result<u32> {
        self.rt.device_count()
    }

    /// The device, as buffers name it (`cuda:N`, `rocm:N`; the test double poses as CUDA).
    pub fn device(&self) -> Device {
        match self.rt.vendor() {
            Vendor::Cuda | Vendor::Host => Device::Cuda(self.ordinal),
            Vendor::Hip => Device::Rocm(self.ordinal),
        }
    }

    /// Blocks until everything queued on the device's legacy default stream has run.
    ///
    /// # Errors
    /// The runtime's error, including one of earlier queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.rt.set_current(self.ordinal)?;
        self.rt.stream_synchronize(RawStream::DEFAULT)
    }
}
