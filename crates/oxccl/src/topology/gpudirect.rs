//! GPUDirect RDMA: a NIC reading and writing GPU memory directly, without a copy through
//! host memory. It needs an RDMA device (`/sys/class/infiniband`) and a way for the RDMA
//! driver to map GPU memory: a peer-memory kernel module (`nvidia_peermem`, or the older
//! `nv_peer_mem`, listed in `/proc/modules`) or dma-buf, which the GPU driver reports per
//! device (the runtime's answer is added where one is loaded).

use serde::Serialize;

use super::pci::{self, Gpu, Nic};
use super::sysfs::Sysfs;

/// The peer-memory modules that let RDMA drivers map GPU memory, newest first.
pub const PEER_MEMORY_MODULES: [&str; 2] = ["nvidia_peermem", "nv_peer_mem"];

/// What GPUDirect RDMA has here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuDirect {
    /// The loaded peer-memory module, if any.
    pub peer_memory_module: Option<String>,
    /// The RDMA devices.
    pub rdma_devices: Vec<String>,
    /// Whether the GPU driver supports dma-buf for its memory: `None` until a device runtime
    /// answers.
    pub dma_buf: Option<bool>,
    /// Whether GPUDirect RDMA can work: GPUs, an RDMA device and a way to map GPU memory.
    pub usable: bool,
    /// Why not, or what it would use.
    pub why: String,
}

impl GpuDirect {
    /// Records the GPU driver's dma-buf answer and decides again.
    pub fn with_dma_buf(mut self, supported: bool, have_gpus: bool) -> GpuDirect {
        self.dma_buf = Some(supported);
        let (usable, why) = decide(have_gpus, &self.rdma_devices, self.peer_memory_module.as_deref(), self.dma_buf);
        self.usable = usable;
        self.why = why;
        self
    }
}

/// The loaded peer-memory module, from `/proc/modules`.
fn peer_module(sys: &Sysfs) -> Option<String> {
    let text = std::fs::read_to_string(sys.path("/proc/modules")).ok()?;
    PEER_MEMORY_MODULES
        .iter()
        .find(|m| text.lines().any(|l| l.split_whitespace().next() == Some(**m)))
        .map(|m| m.to_string())
}

fn decide(have_gpus: bool, rdma: &[String], module: Option<&str>, dma_buf: Option<bool>) -> (bool, String) {
    if !have_gpus {
        return (false, "no NVIDIA or AMD GPU on the PCI bus".into());
    }
    if rdma.is_empty() {
        return (
            false,
            "no RDMA device (/sys/class/infiniband is empty): traffic between hosts goes through TCP and host memory"
                .into(),
        );
    }
    match (module, dma_buf) {
        (Some(m), _) => (true, format!("{m} is loaded: RDMA devices {} can map GPU memory", rdma.join(", "))),
        (None, Some(true)) => {
            (true, format!("the GPU driver supports dma-buf: RDMA devices {} can map GPU memory", rdma.join(", ")))
        }
        (None, Some(false)) => (
            false,
            "neither a peer-memory module (modprobe nvidia_peermem) nor dma-buf support in the GPU driver".into(),
        ),
        (None, None) => (
            false,
            "no peer-memory module is loaded (modprobe nvidia_peermem); dma-buf support unknown without the GPU driver"
                .into(),
        ),
    }
}

/// What GPUDirect RDMA has on the machine `sys` shows, with its `gpus` and `nics`.
pub fn detect(sys: &Sysfs, gpus: &[Gpu], nics: &[Nic]) -> GpuDirect {
    let mut rdma_devices = pci::rdma_devices(sys);
    for n in nics.iter().filter_map(|n| n.rdma.as_ref()) {
        if !rdma_devices.contains(n) {
            rdma_devices.push(n.clone());
        }
    }
    let peer_memory_module = peer_module(sys);
    let (usable, why) = decide(!gpus.is_empty(), &rdma_devices, peer_memory_module.as_deref(), None);
    GpuDirect { peer_memory_module, rdma_devices, dma_buf: None, usable, why }
}
