//! What this machine offers the collectives, read from the kernel (sysfs and procfs) without
//! any vendor library: the GPUs on the PCI bus, the network interfaces and RDMA devices and
//! how close each is to each GPU, whether GPUDirect RDMA is possible, and the host's limits
//! that matter to shared memory and pinned memory.
//!
//! NCCL reads the same files to build its topology; `oxccl info` prints what is found here,
//! and the `cpu` backend's TCP transport listens on the NIC nearest the rank's GPU
//! ([`rank_gpu`], [`Topology::nic_near_gpu`]).
//!
//! - [`pci`]: GPUs and NICs on the PCI bus, and the PCI distance between two devices;
//! - [`rank_gpu`]: which of those GPUs a rank uses (`CUDA_VISIBLE_DEVICES` and its AMD
//!   kin, `OXCCL_GPU_DEVICE`, the local rank), without loading a GPU driver;
//! - [`gpudirect`]: the peer-memory kernel modules and RDMA devices GPUDirect RDMA needs;
//! - [`host`]: /dev/shm, the memlock limit, CPUs and NUMA nodes.
//!
//! Every reader takes a [`Sysfs`] root, `/` on a real machine: tests build a fake tree.

pub mod gpudirect;
pub mod host;
pub mod mps;
pub mod pci;
pub mod rank_gpu;
mod sysfs;

use serde::Serialize;

pub use gpudirect::GpuDirect;
pub use host::HostLimits;
pub use mps::Mps;
pub use pci::{Distance, Gpu, GpuVendor, Nic};
pub use sysfs::Sysfs;

/// The machine as the collectives see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Topology {
    /// GPUs on the PCI bus (NVIDIA and AMD display and 3D controllers), by PCI address.
    pub gpus: Vec<Gpu>,
    /// Network interfaces backed by a device (virtual ones, like `lo` or bridges, left out).
    pub nics: Vec<Nic>,
    /// Whether GPUDirect RDMA can work here, and why not.
    pub gpudirect: GpuDirect,
    /// Shared memory, memlock limit, CPUs, NUMA nodes.
    pub host: HostLimits,
}

impl Topology {
    /// Reads the machine from `sys` (never fails: what cannot be read is left out or `None`).
    pub fn read(sys: &Sysfs) -> Topology {
        let gpus = pci::gpus(sys);
        let nics = pci::nics(sys);
        let gpudirect = gpudirect::detect(sys, &gpus, &nics);
        Topology { gpus, nics, gpudirect, host: HostLimits::read(sys) }
    }

    /// This machine.
    pub fn detect() -> Topology {
        Topology::read(&Sysfs::default())
    }

    /// Among the interfaces named `names` (those a transport may use), the NIC closest to
    /// the GPU at PCI address `bus_id` (any case, 4- or 8-digit domain), and its distance;
    /// `None` when no GPU here has that address or none of `names` is a NIC here.
    pub fn nic_near_gpu(&self, bus_id: &str, names: &[&str]) -> Option<(&Nic, Distance)> {
        let want = pci::normalize_bus_id(bus_id)?;
        let gpu = self.gpus.iter().find(|g| pci::normalize_bus_id(&g.bus_id).as_deref() == Some(want.as_str()))?;
        self.nics
            .iter()
            .filter(|n| names.contains(&n.name.as_str()))
            .map(|n| (n, pci::distance(&gpu.path, gpu.numa_node, &n.path, n.numa_node)))
            .min_by(|a, b| {
                a.1.cmp(&b.1).then(b.0.rdma.is_some().cmp(&a.0.rdma.is_some())).then(a.0.name.cmp(&b.0.name))
            })
    }

    /// The NIC closest to `gpu` on the PCI bus and its distance: RDMA-capable NICs first at
    /// equal distance, then by name. `None` without NICs.
    pub fn nearest_nic(&self, gpu: &Gpu) -> Option<(&Nic, Distance)> {
        self.nics.iter().map(|n| (n, pci::distance(&gpu.path, gpu.numa_node, &n.path, n.numa_node))).min_by(|a, b| {
            a.1.cmp(&b.1).then(b.0.rdma.is_some().cmp(&a.0.rdma.is_some())).then(a.0.name.cmp(&b.0.name))
        })
    }
}

#[cfg(test)]
mod tests;
