//! Where an operation runs: NCCL on the caller's device buffers, the host communicator, or
//! NCCL on staged copies of host buffers (see the module documentation of `engine`), and the
//! errors for buffers on the wrong device.

use super::stage;
use super::state::Engine;
use crate::backend::{Op, RawBuf};
use crate::config::HostBuffers;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::xccl::runtime::Residence;

/// Where an operation runs.
pub(super) enum Route {
    /// NCCL, on the caller's device buffers.
    Device,
    /// The host communicator (host buffers, `OXCCL_GPU_HOST_BUFFERS=cpu`).
    HostComm,
    /// NCCL, on device copies of host buffers (`OXCCL_GPU_HOST_BUFFERS=stage`).
    Stage,
}

impl Engine {
    /// Where `op` runs, or why it cannot (see the module documentation).
    pub(super) fn route(&self, op: &Op) -> Result<Route> {
        let i = &self.inner;
        let buffers = op.buffers();
        if stage::all_host(&buffers) {
            match i.host_buffers {
                HostBuffers::Cpu => return Ok(Route::HostComm),
                HostBuffers::Stage => return Ok(Route::Stage),
                HostBuffers::Refuse => {}
            }
        }
        if let Some(b) = buffers.iter().find(|b| b.device != i.kind) {
            return Err(self.wrong_device(b.device));
        }
        if i.host.checks() {
            self.check_residence(&buffers)?;
        }
        Ok(Route::Device)
    }

    /// With the fingerprint check on (a debugging mode), also asks the driver where each
    /// buffer's memory really is, catching a `Buffer` that claims the wrong device (one
    /// driver call per buffer, which is why it is not done on every call).
    fn check_residence(&self, buffers: &[RawBuf]) -> Result<()> {
        let i = &self.inner;
        for b in buffers.iter().filter(|b| b.bytes() > 0) {
            let where_ = match i.rt.residence(b.ptr.cast())? {
                Residence::Device(d) if d == i.device => continue,
                Residence::Device(d) => format!("device {d}"),
                Residence::Host => "host memory".to_string(),
            };
            return Err(Error::invalid(format!(
                "a buffer given to this {} communicator as {} memory is {where_} according to {}",
                i.name,
                i.kind,
                i.rt.describe()
            )));
        }
        Ok(())
    }

    pub(super) fn wrong_device(&self, d: Device) -> Error {
        let i = &self.inner;
        match d {
            Device::Cpu if i.host_buffers != HostBuffers::Refuse => Error::invalid(format!(
                "this operation mixes host memory and {} memory; give every buffer of one call the same place",
                i.kind
            )),
            Device::Cpu => Error::invalid(format!(
                "the {} backend takes device memory on {}, and this buffer is host memory; copy it to the GPU \
                 (e.g. Gpu::copy_from_host), or set OXCCL_GPU_HOST_BUFFERS=cpu (the default under OXCCL_BACKEND=auto) \
                 to run host buffers on the cpu backend",
                i.name, i.kind
            )),
            other => Error::invalid(format!(
                "this {} communicator uses {}, and this buffer is on {other}; each rank's buffers must be on its \
                 communicator's device",
                i.name, i.kind
            )),
        }
    }
}
