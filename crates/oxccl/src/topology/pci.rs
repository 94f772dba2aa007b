//! GPUs and NICs on the PCI bus (`/sys/bus/pci/devices`, `/sys/class/net`,
//! `/sys/class/infiniband`) and how far apart two devices are.
//!
//! A device's place is its path under `/sys/devices` (`pci0000:00/0000:00:01.0/0000:01:00.0`):
//! the root complex first, then each bridge down to the device. Two devices that share a
//! bridge below the root complex talk through PCIe switches only (NCCL's PIX/PXB), two under
//! the same root complex through its host bridge (PHB); otherwise through the CPU: within a
//! NUMA node (NODE) or across the inter-socket link (SYS). GPUDirect RDMA is worth using at
//! switch distance, and usually not across a host bridge.

use std::fmt;
use std::path::Path;

use serde::Serialize;

use super::sysfs::Sysfs;

/// PCI vendor ids.
const NVIDIA: &str = "0x10de";
const AMD: &str = "0x1002";

/// Who made a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuVendor {
    /// NVIDIA (PCI vendor 0x10de): the `nccl` backend's devices.
    Nvidia,
    /// AMD (PCI vendor 0x1002): the `rccl` backend's devices.
    Amd,
}

impl fmt::Display for GpuVendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuVendor::Nvidia => "NVIDIA",
            GpuVendor::Amd => "AMD",
        })
    }
}

/// A GPU on the PCI bus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gpu {
    /// Its PCI address (`0000:3b:00.0`).
    pub bus_id: String,
    /// Its maker.
    pub vendor: GpuVendor,
    /// The PCI device id (`0x2330`).
    pub device_id: String,
    /// The NUMA node it hangs off, where the kernel says.
    pub numa_node: Option<u32>,
    /// Its model, where the driver says (NVIDIA: `/proc/driver/nvidia/gpus/BUS/information`;
    /// AMD: `product_name` in sysfs).
    pub name: Option<String>,
    /// Its memory in bytes, where the driver says in sysfs (AMD: `mem_info_vram_total`; the
    /// NVIDIA driver does not: the CUDA runtime knows).
    pub memory_bytes: Option<u64>,
    /// Its path under `/sys/devices` (root complex, bridges, itself).
    #[serde(skip)]
    pub path: Vec<String>,
}

/// The model name the GPU driver gives for the GPU at `bus_id` (sysfs directory `dir`).
fn gpu_name(sys: &Sysfs, vendor: GpuVendor, bus_id: &str, dir: &Path) -> Option<String> {
    match vendor {
        GpuVendor::Nvidia => nvidia_information(sys, bus_id, "Model:"),
        GpuVendor::Amd => sys.read(&dir.join("product_name")).filter(|m| !m.is_empty()),
    }
}

/// The value of the line starting with `key` (`Model:`, `GPU UUID:`) in what the NVIDIA
/// kernel module says of the GPU at `bus_id` (`/proc/driver/nvidia/gpus/BUS/information`:
/// a procfs file, read without the CUDA driver), trimmed; `None` when the file or the line
/// is missing or the value empty.
pub fn nvidia_information(sys: &Sysfs, bus_id: &str, key: &str) -> Option<String> {
    let info = sys.read(&sys.path(&format!("/proc/driver/nvidia/gpus/{bus_id}/information")))?;
    info.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// A network interface backed by a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Nic {
    /// The interface's name (`eth0`, `ib0`).
    pub name: String,
    /// The PCI address of its device, when it is on the PCI bus.
    pub bus_id: Option<String>,
    /// The NUMA node of its device, where the kernel says.
    pub numa_node: Option<u32>,
    /// Link speed in Mb/s, where the driver says.
    pub speed_mbps: Option<u64>,
    /// The RDMA device on the same PCI function (`mlx5_0`), if any.
    pub rdma: Option<String>,
    /// Its device's path under `/sys/devices`.
    #[serde(skip)]
    pub path: Vec<String>,
}

/// How far apart two PCI devices are, closest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Distance {
    /// Through PCIe switches only (they share a bridge below the root complex): NCCL's
    /// PIX/PXB.
    Switch,
    /// Through the root complex's host bridge: PHB.
    HostBridge,
    /// Through the CPU, within one NUMA node: NODE.
    Node,
    /// Across NUMA nodes (the inter-socket link), or unknown: SYS.
    System,
}

impl fmt::Display for Distance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Distance::Switch => "PIX/PXB (through PCIe switches)",
            Distance::HostBridge => "PHB (through the host bridge)",
            Distance::Node => "NODE (through the CPU, same NUMA node)",
            Distance::System => "SYS (across NUMA nodes)",
        })
    }
}

/// The distance between devices at paths `a` and `b` (see [`Gpu::path`]) on NUMA nodes
/// `na` and `nb`.
pub fn distance(a: &[String], na: Option<u32>, b: &[String], nb: Option<u32>) -> Distance {
    let shared = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    match shared {
        // The root complex and at least one bridge below it.
        s if s >= 2 => Distance::Switch,
        1 => Distance::HostBridge,
        _ if na.is_some() && na == nb => Distance::Node,
        _ => Distance::System,
    }
}

/// Whether `s` looks like a PCI address (`0000:00:01.0`).
fn is_bus_id(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars().enumerate().all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// The path under `/sys/devices` of the device `link` (a symlink into it) resolves to.
fn device_path(sys: &Sysfs, link: &Path) -> Option<Vec<String>> {
    let real = std::fs::canonicalize(link).ok()?;
    let devices = std::fs::canonicalize(sys.path("/sys/devices")).ok()?;
    let rest = real.strip_prefix(&devices).ok()?;
    Some(rest.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect())
}

/// A NUMA node number as the kernel writes it (`-1`: none).
fn numa(sys: &Sysfs, dir: &Path) -> Option<u32> {
    sys.read(&dir.join("numa_node")).and_then(|s| s.parse::<i64>().ok()).and_then(|n| u32::try_from(n).ok())
}

/// The GPUs on the PCI bus (NVIDIA and AMD display and 3D controllers).
pub fn gpus(sys: &Sysfs) -> Vec<Gpu> {
    let mut out = Vec::new();
    for (bus_id, dir) in sys.entries("/sys/bus/pci/devices") {
        let class = sys.read(&dir.join("class")).unwrap_or_default();
        // 0x03: display controllers (0x0300 VGA, 0x0302 3D, 0x0380 other).
        if !class.starts_with("0x03") {
            continue;
        }
        let vendor = match sys.read(&dir.join("vendor")).as_deref() {
            Some(NVIDIA) => GpuVendor::Nvidia,
            Some(AMD) => GpuVendor::Amd,
            _ => continue,
        };
        out.push(Gpu {
            device_id: sys.read(&dir.join("device")).unwrap_or_default(),
            numa_node: numa(sys, &dir),
            name: gpu_name(sys, vendor, &bus_id, &dir),
            memory_bytes: sys.read(&dir.join("mem_info_vram_total")).and_then(|m| m.parse().ok()),
            path: device_path(sys, &dir).unwrap_or_else(|| vec![bus_id.clone()]),
            bus_id,
            vendor,
        });
    }
    out
}

/// The network interfaces backed by a device, with their RDMA devices.
pub fn nics(sys: &Sysfs) -> Vec<Nic> {
    // RDMA device -> the PCI function it sits on.
    let rdma: Vec<(String, Option<String>)> = sys
        .entries("/sys/class/infiniband")
        .into_iter()
        .map(|(name, dir)| {
            let bus = device_path(sys, &dir.join("device")).and_then(|p| p.into_iter().rev().find(|c| is_bus_id(c)));
            (name, bus)
        })
        .collect();
    let mut out = Vec::new();
    for (name, dir) in sys.entries("/sys/class/net") {
        let Some(path) = device_path(sys, &dir.join("device")) else {
            continue; // virtual: lo, bridges, veth, bonds
        };
        let bus_at = path.iter().rposition(|c| is_bus_id(c));
        let bus_id = bus_at.map(|i| path[i].clone());
        let numa_node = bus_at.and_then(|i| {
            let pci_dir = path[..=i].iter().fold(sys.path("/sys/devices"), |d, c| d.join(c));
            numa(sys, &pci_dir)
        });
        let speed_mbps =
            sys.read(&dir.join("speed")).and_then(|s| s.parse::<i64>().ok()).and_then(|s| u64::try_from(s).ok());
        let rdma = rdma.iter().find(|(_, b)| b.is_some() && *b == bus_id).map(|(n, _)| n.clone());
        out.push(Nic { name, bus_id, numa_node, speed_mbps, rdma, path });
    }
    out
}

/// The RDMA devices (`/sys/class/infiniband`), by name.
pub fn rdma_devices(sys: &Sysfs) -> Vec<String> {
    sys.entries("/sys/class/infiniband").into_iter().map(|(n, _)| n).collect()
}

/// A PCI address in sysfs's form (`0000:3b:00.0`: 4-digit domain, lower case) from any of
/// the forms drivers print (`00000000:3B:00.0`, `0000:3b:00.0`); `None` when it is not one.
pub fn normalize_bus_id(id: &str) -> Option<String> {
    let (domain, bus, dev, func) = parse_bus_id(id)?;
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// A PCI address as numbers, (domain, bus, device, function), in any of the forms
/// [`normalize_bus_id`] reads; `None` when it is not one. Ordering these tuples is PCI
/// order (what `nvidia-smi` and `CUDA_DEVICE_ORDER=PCI_BUS_ID` count in), also where
/// domains have more than 4 digits and their names do not sort as text.
pub fn parse_bus_id(id: &str) -> Option<(u32, u8, u8, u8)> {
    let mut parts = id.trim().rsplitn(3, ':');
    let (devfn, bus, domain) = (parts.next()?, parts.next()?, parts.next()?);
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let (dev, func) = devfn.split_once('.')?;
    let (dev, func) = (u8::from_str_radix(dev, 16).ok()?, u8::from_str_radix(func, 16).ok()?);
    Some((domain, bus, dev, func))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_and_distances() {
        assert!(is_bus_id("0000:3b:00.0") && !is_bus_id("pci0000:00") && !is_bus_id("virtio2"));
        let p = |s: &str| s.split('/').map(String::from).collect::<Vec<_>>();
        let gpu = p("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0");
        assert_eq!(
            distance(&gpu, Some(0), &p("pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0"), Some(0)),
            Distance::Switch
        );
        assert_eq!(distance(&gpu, Some(0), &p("pci0000:00/0000:00:02.0/0000:05:00.0"), Some(0)), Distance::HostBridge);
        assert_eq!(distance(&gpu, Some(0), &p("pci0000:40/0000:40:01.0"), Some(0)), Distance::Node);
        assert_eq!(distance(&gpu, Some(0), &p("pci0000:80/0000:80:01.0"), Some(1)), Distance::System);
        assert_eq!(distance(&gpu, None, &p("pci0000:80/0000:80:01.0"), None), Distance::System);
        assert!(Distance::Switch < Distance::HostBridge && Distance::Node < Distance::System);
    }
}
