//! Which GPU a rank uses, read from sysfs and procfs without any vendor library: the host
//! backends listen on the NIC nearest it (NCCL's choice of a NIC per GPU).
//!
//! No GPU driver is loaded to answer: no `libcuda` or `libamdhip64`, no `cuInit`. A process
//! that uses only the `cpu` backend keeps a driver-free address space, so the workers it
//! forks (a DataLoader's) are safe, and it pays for no driver context. This module names no
//! other module of the crate but the topology's own (`tests/layering/` keeps the topology
//! below the GPU backends), and a test below checks its code loads nothing.
//!
//! The answer is a performance hint, never a matter of correctness: a wrong guess costs
//! PCI hops on the way to the NIC, not a wrong result. The rule follows the runtimes':
//!
//! 1. **The vendor.** NVIDIA when at least one NVIDIA GPU is visible, else AMD (the GPU
//!    backends try CUDA, then HIP).
//! 2. **The order.** The vendor's GPUs on the PCI bus ([`super::pci::gpus`]) by PCI address
//!    (domain, bus, device, function). That is `nvidia-smi`'s order, the one
//!    `CUDA_VISIBLE_DEVICES` indices count in, and CUDA's ordinals under
//!    `CUDA_DEVICE_ORDER=PCI_BUS_ID`. CUDA's default order, `FASTEST_FIRST`, puts faster
//!    models first: on a node with GPUs of different models its ordinals can differ from PCI
//!    order, and the guess can be another GPU. The nodes where the choice of NIC matters (8
//!    identical GPUs, a NIC per pair of them) are homogeneous, and there the two orders
//!    agree. ROCm counts its GPUs in its KFD topology's order, PCI order on the nodes we know.
//! 3. **The visibility variables**, read as the runtimes read them ([`VisibleDevices`]):
//!    NVIDIA `CUDA_VISIBLE_DEVICES`; AMD `ROCR_VISIBLE_DEVICES` first (indices into every
//!    GPU), then `HIP_VISIBLE_DEVICES`, else `CUDA_VISIBLE_DEVICES` (indices into what ROCr
//!    left). Unset: every GPU; empty: none; otherwise a comma list of indices. NVIDIA's
//!    also takes UUIDs (`GPU-8932f937-d72c-...`, or a prefix of one that names a single GPU,
//!    `GPU-` included), matched against the `GPU UUID:` line of
//!    `/proc/driver/nvidia/gpus/BUS/information`. An entry that names no GPU ends the list,
//!    CUDA's rule (`0,2,-1,1` shows 0 and 2), for every vendor: an index out of range or
//!    negative, a repeat, an unknown or ambiguous UUID, a MIG UUID (its GPU is not in
//!    procfs), an AMD UUID (not resolved here).
//! 4. **The device.** `OXCCL_GPU_DEVICE` when set (none when it is out of range: the GPU
//!    backends refuse it), else the local rank modulo the visible GPUs: [`ordinal`], the
//!    rule the GPU backends pick their device by.

use std::ffi::OsString;

use super::pci::{self, Gpu, GpuVendor};
use super::sysfs::Sysfs;

/// The variables that decide which GPUs a process sees and in what order, as the process
/// has them (`None`: unset; `Some("")`: set and empty, which hides every GPU).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VisibleDevices {
    /// `CUDA_VISIBLE_DEVICES` (NVIDIA; AMD too when `HIP_VISIBLE_DEVICES` is unset).
    pub cuda: Option<String>,
    /// `HIP_VISIBLE_DEVICES` (AMD, applied after `ROCR_VISIBLE_DEVICES`).
    pub hip: Option<String>,
    /// `ROCR_VISIBLE_DEVICES` (AMD, applied first).
    pub rocr: Option<String>,
}

impl VisibleDevices {
    /// This process's variables (a value that is not UTF-8 is kept lossily: its entries
    /// name no GPU, which hides the GPUs from that entry on).
    pub fn from_process() -> VisibleDevices {
        let var = |name: &str| std::env::var_os(name).map(|v: OsString| v.to_string_lossy().into_owned());
        VisibleDevices {
            cuda: var("CUDA_VISIBLE_DEVICES"),
            hip: var("HIP_VISIBLE_DEVICES"),
            rocr: var("ROCR_VISIBLE_DEVICES"),
        }
    }
}

/// The device ordinal a rank uses among `count` visible devices: `configured`
/// (`OXCCL_GPU_DEVICE`) when it is one of them, else `local_rank` modulo `count`. `None`
/// when `configured` is out of range or there is no device.
pub fn ordinal(configured: Option<u32>, count: u32, local_rank: usize) -> Option<u32> {
    match configured {
        Some(d) => (d < count).then_some(d),
        None if count == 0 => None,
        None => u32::try_from(local_rank % count as usize).ok(),
    }
}

/// The GPUs this process's runtime would see, in its ordinal order (see the module
/// documentation): `gpus` as [`super::pci::gpus`] found them in `sys`, filtered by `env`.
pub fn visible<'a>(sys: &Sysfs, gpus: &'a [Gpu], env: &VisibleDevices) -> Vec<&'a Gpu> {
    let nvidia = restrict(sys, in_pci_order(gpus, GpuVendor::Nvidia), env.cuda.as_deref());
    if !nvidia.is_empty() {
        return nvidia;
    }
    let rocr = restrict(sys, in_pci_order(gpus, GpuVendor::Amd), env.rocr.as_deref());
    restrict(sys, rocr, env.hip.as_deref().or(env.cuda.as_deref()))
}

/// The GPU local rank `local_rank` uses, `configured` being `OXCCL_GPU_DEVICE`: the
/// [`ordinal`] among the [`visible`] GPUs. `None` without a visible GPU or when
/// `configured` is out of range.
pub fn rank_gpu<'a>(
    sys: &Sysfs,
    gpus: &'a [Gpu],
    env: &VisibleDevices,
    configured: Option<u32>,
    local_rank: usize,
) -> Option<&'a Gpu> {
    let visible = visible(sys, gpus, env);
    let d = ordinal(configured, u32::try_from(visible.len()).ok()?, local_rank)?;
    visible.get(usize::try_from(d).ok()?).copied()
}

/// `vendor`'s GPUs among `gpus`, by PCI address (addresses that do not parse last, by name).
fn in_pci_order(gpus: &[Gpu], vendor: GpuVendor) -> Vec<&Gpu> {
    let mut v: Vec<&Gpu> = gpus.iter().filter(|g| g.vendor == vendor).collect();
    v.sort_by(|a, b| {
        let (ka, kb) = (pci::parse_bus_id(&a.bus_id), pci::parse_bus_id(&b.bus_id));
        ka.is_none().cmp(&kb.is_none()).then(ka.cmp(&kb)).then_with(|| a.bus_id.cmp(&b.bus_id))
    });
    v
}

/// What a visibility variable `list` leaves of `gpus` (all of them when unset), in its
/// order: each entry an index into `gpus` or an NVIDIA UUID (prefix); the first entry that
/// names no GPU, or one already listed, ends the list.
fn restrict<'a>(sys: &Sysfs, gpus: Vec<&'a Gpu>, list: Option<&str>) -> Vec<&'a Gpu> {
    let Some(list) = list else {
        return gpus;
    };
    let mut out: Vec<&Gpu> = Vec::new();
    if list.trim().is_empty() {
        return out;
    }
    for entry in list.split(',').map(str::trim) {
        match entry_gpu(sys, &gpus, entry) {
            Some(g) if !out.iter().any(|o| std::ptr::eq(*o, g)) => out.push(g),
            _ => break,
        }
    }
    out
}

/// The GPU among `gpus` that `entry` names: an index, or the one NVIDIA GPU whose UUID
/// starts with it (`GPU-...`, letters in any case).
fn entry_gpu<'a>(sys: &Sysfs, gpus: &[&'a Gpu], entry: &str) -> Option<&'a Gpu> {
    if let Ok(i) = entry.parse::<usize>() {
        return gpus.get(i).copied();
    }
    let prefix = entry.to_ascii_lowercase();
    if !prefix.starts_with("gpu-") {
        return None;
    }
    let mut named = gpus.iter().copied().filter(|g| {
        g.vendor == GpuVendor::Nvidia
            && pci::nvidia_information(sys, &g.bus_id, "GPU UUID:")
                .is_some_and(|uuid| uuid.to_ascii_lowercase().starts_with(&prefix))
    });
    match (named.next(), named.next()) {
        (Some(g), None) => Some(g),
        _ => None, // unknown, or ambiguous
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A GPU at `bus_id` (nothing else of it matters here).
    fn gpu(bus_id: &str, vendor: GpuVendor) -> Gpu {
        Gpu {
            bus_id: bus_id.into(),
            vendor,
            device_id: "0x2330".into(),
            numa_node: None,
            name: None,
            memory_bytes: None,
            path: vec![bus_id.into()],
        }
    }

    /// Four NVIDIA GPUs, listed out of PCI order, with their UUIDs in a fake procfs under a
    /// temporary root (removed on drop).
    struct Node {
        root: PathBuf,
        gpus: Vec<Gpu>,
    }

    impl Node {
        fn new(name: &str) -> Node {
            let root = std::env::temp_dir().join(format!("oxccl-rank-gpu-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            let buses = ["0000:c1:00.0", "0000:1b:00.0", "0000:9a:00.0", "0000:3d:00.0"];
            let uuids = [
                "GPU-c1c1c1c1-0000-0000-0000-000000000000",
                "GPU-1b1b1b1b-0000-0000-0000-000000000000",
                "GPU-9a9a9a9a-0000-0000-0000-000000000000",
                "GPU-1b2c3d4e-0000-0000-0000-000000000000",
            ];
            for (bus, uuid) in buses.iter().zip(uuids) {
                let dir = root.join(format!("proc/driver/nvidia/gpus/{bus}"));
                std::fs::create_dir_all(&dir).unwrap();
                let info = format!("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: 1\nGPU UUID: \t {uuid}\nBus Type: PCIe\n");
                std::fs::write(dir.join("information"), info).unwrap();
            }
            Node { root, gpus: buses.iter().map(|b| gpu(b, GpuVendor::Nvidia)).collect() }
        }

        fn sys(&self) -> Sysfs {
            Sysfs::at(&self.root)
        }

        /// The bus of the GPU local rank `local_rank` uses.
        fn bus(&self, env: &VisibleDevices, configured: Option<u32>, local_rank: usize) -> Option<&str> {
            rank_gpu(&self.sys(), &self.gpus, env, configured, local_rank).map(|g| g.bus_id.as_str())
        }

        /// The buses the process sees, in ordinal order.
        fn seen(&self, env: &VisibleDevices) -> Vec<&str> {
            visible(&self.sys(), &self.gpus, env).into_iter().map(|g| g.bus_id.as_str()).collect()
        }
    }

    impl Drop for Node {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    fn cuda(list: &str) -> VisibleDevices {
        VisibleDevices { cuda: Some(list.into()), ..VisibleDevices::default() }
    }

    #[test]
    fn ranks_take_the_gpus_in_pci_order_modulo_their_count() {
        let n = Node::new("order");
        let all = VisibleDevices::default();
        assert_eq!(n.seen(&all), ["0000:1b:00.0", "0000:3d:00.0", "0000:9a:00.0", "0000:c1:00.0"]);
        let ranks: Vec<Option<&str>> = (0..6).map(|r| n.bus(&all, None, r)).collect();
        let want = ["0000:1b:00.0", "0000:3d:00.0", "0000:9a:00.0", "0000:c1:00.0", "0000:1b:00.0", "0000:3d:00.0"];
        assert_eq!(ranks, want.map(Some));
        // A domain of 5 digits sorts by number, not as text ("10000" < "2000" as text).
        let wide = [gpu("10000:01:00.0", GpuVendor::Nvidia), gpu("2000:01:00.0", GpuVendor::Nvidia)];
        let order: Vec<&str> = visible(&n.sys(), &wide, &all).into_iter().map(|g| g.bus_id.as_str()).collect();
        assert_eq!(order, ["2000:01:00.0", "10000:01:00.0"]);
    }

    #[test]
    fn oxccl_gpu_device_picks_among_the_visible_gpus() {
        let n = Node::new("configured");
        let all = VisibleDevices::default();
        assert_eq!(n.bus(&all, Some(2), 0), Some("0000:9a:00.0"));
        assert_eq!(n.bus(&all, Some(2), 3), Some("0000:9a:00.0"), "the local rank does not matter");
        assert_eq!(n.bus(&cuda("3,1"), Some(1), 0), Some("0000:3d:00.0"), "an ordinal among the visible");
        assert_eq!(n.bus(&all, Some(4), 0), None, "out of range: the GPU backends refuse it");
        assert_eq!(n.bus(&cuda("0,1"), Some(2), 0), None);
    }

    #[test]
    fn cuda_visible_devices_indices_select_and_reorder() {
        let n = Node::new("indices");
        assert_eq!(n.seen(&cuda("2,0")), ["0000:9a:00.0", "0000:1b:00.0"]);
        assert_eq!(n.seen(&cuda(" 3 , 1 ")), ["0000:c1:00.0", "0000:3d:00.0"]);
        // Local ranks 0..3 over the 2 visible GPUs.
        let ranks: Vec<Option<&str>> = (0..3).map(|r| n.bus(&cuda("2,0"), None, r)).collect();
        assert_eq!(ranks, ["0000:9a:00.0", "0000:1b:00.0", "0000:9a:00.0"].map(Some));
        // Set and empty: nothing visible.
        assert!(n.seen(&cuda("")).is_empty());
        assert_eq!(n.bus(&cuda(""), None, 0), None);
    }

    #[test]
    fn an_entry_that_names_no_gpu_ends_the_list() {
        let n = Node::new("invalid");
        // CUDA's own example: `0,2,-1,1` shows 0 and 2.
        assert_eq!(n.seen(&cuda("0,2,-1,1")), ["0000:1b:00.0", "0000:9a:00.0"]);
        assert_eq!(n.seen(&cuda("1,7,0")), ["0000:3d:00.0"], "out of range");
        assert_eq!(n.seen(&cuda("1,1,0")), ["0000:3d:00.0"], "a repeat");
        assert_eq!(n.seen(&cuda("0,MIG-5c2b1f2e-0000,1")), ["0000:1b:00.0"], "a MIG UUID");
        assert_eq!(n.seen(&cuda("0,,1")), ["0000:1b:00.0"], "an empty entry");
        assert!(n.seen(&cuda("-1")).is_empty(), "the usual way to hide every GPU");
        assert_eq!(n.bus(&cuda("-1"), None, 0), None);
    }

    #[test]
    fn cuda_visible_devices_uuids_are_read_from_procfs() {
        let n = Node::new("uuids");
        let full = "GPU-9a9a9a9a-0000-0000-0000-000000000000";
        assert_eq!(n.seen(&cuda(full)), ["0000:9a:00.0"]);
        // A prefix naming one GPU, in any case, mixed with indices.
        assert_eq!(n.seen(&cuda("GPU-C1C1,0,GPU-1b2")), ["0000:c1:00.0", "0000:1b:00.0", "0000:3d:00.0"]);
        // `GPU-1b` names two GPUs, `GPU-ffff` none: each ends the list.
        assert_eq!(n.seen(&cuda("3,GPU-1b,0")), ["0000:c1:00.0"]);
        assert_eq!(n.seen(&cuda("GPU-ffff,0")), Vec::<&str>::new());
        assert_eq!(n.seen(&cuda("GPU-9a,2")), ["0000:9a:00.0"], "the same GPU twice");
        assert_eq!(n.bus(&cuda("GPU-c1c1,GPU-9a9a"), None, 1), Some("0000:9a:00.0"));
        // Without procfs (no NVIDIA kernel module) no UUID resolves; indices still do.
        let bare = Sysfs::at(n.root.join("nothing-here"));
        assert!(visible(&bare, &n.gpus, &cuda(full)).is_empty());
        assert_eq!(visible(&bare, &n.gpus, &cuda("1")).len(), 1);
    }

    #[test]
    fn amd_gpus_follow_rocr_then_hip_or_cuda_visible_devices() {
        let sys = Sysfs::at(std::env::temp_dir().join("oxccl-rank-gpu-amd-nothing-here"));
        let gpus: Vec<Gpu> =
            ["0000:c1:00.0", "0000:05:00.0", "0000:65:00.0"].iter().map(|b| gpu(b, GpuVendor::Amd)).collect();
        let seen = |env: &VisibleDevices| -> Vec<&str> {
            visible(&sys, &gpus, env).into_iter().map(|g| g.bus_id.as_str()).collect()
        };
        assert_eq!(seen(&VisibleDevices::default()), ["0000:05:00.0", "0000:65:00.0", "0000:c1:00.0"]);
        let rocr = VisibleDevices { rocr: Some("2,1".into()), ..VisibleDevices::default() };
        assert_eq!(seen(&rocr), ["0000:c1:00.0", "0000:65:00.0"]);
        // HIP's indices count in what ROCr left; CUDA_VISIBLE_DEVICES stands in for HIP's.
        let both = VisibleDevices { rocr: Some("2,1".into()), hip: Some("1".into()), cuda: None };
        assert_eq!(seen(&both), ["0000:65:00.0"]);
        assert_eq!(seen(&cuda("1")), ["0000:65:00.0"]);
        let hip_first = VisibleDevices { hip: Some("0".into()), cuda: Some("2".into()), rocr: None };
        assert_eq!(seen(&hip_first), ["0000:05:00.0"]);
        // An AMD UUID is not resolved here: the list ends at it.
        assert_eq!(seen(&VisibleDevices { rocr: Some("1,GPU-deadbeef".into()), ..VisibleDevices::default() }).len(), 1);
        assert_eq!(rank_gpu(&sys, &gpus, &rocr, None, 3).map(|g| g.bus_id.as_str()), Some("0000:65:00.0"));
    }

    #[test]
    fn nvidia_first_then_amd_and_no_gpu_is_none() {
        let sys = Sysfs::at(std::env::temp_dir().join("oxccl-rank-gpu-mixed-nothing-here"));
        let gpus = [gpu("0000:81:00.0", GpuVendor::Amd), gpu("0000:02:00.0", GpuVendor::Nvidia)];
        let bus = |env: &VisibleDevices, rank: usize| rank_gpu(&sys, &gpus, env, None, rank).map(|g| g.bus_id.as_str());
        assert_eq!(
            (bus(&VisibleDevices::default(), 0), bus(&VisibleDevices::default(), 1)),
            (Some("0000:02:00.0"), Some("0000:02:00.0"))
        );
        // NVIDIA hidden: HIP reads CUDA_VISIBLE_DEVICES too, unless HIP_VISIBLE_DEVICES is set.
        assert_eq!(bus(&cuda(""), 0), None);
        let hip = VisibleDevices { cuda: Some(String::new()), hip: Some("0".into()), rocr: None };
        assert_eq!(bus(&hip, 0), Some("0000:81:00.0"));
        assert_eq!(rank_gpu(&sys, &[], &VisibleDevices::default(), None, 0), None, "no GPU");
        assert_eq!(rank_gpu(&sys, &[], &VisibleDevices::default(), Some(0), 0), None);
    }

    #[test]
    fn ordinals_are_the_gpu_backends_rule() {
        assert_eq!((0..5).map(|r| ordinal(None, 2, r)).collect::<Vec<_>>(), [0, 1, 0, 1, 0].map(Some));
        assert_eq!(ordinal(Some(1), 2, 0), Some(1));
        assert_eq!(ordinal(Some(2), 2, 0), None);
        assert_eq!(ordinal(None, 0, 3), None, "no device, and no division by zero");
        assert_eq!(ordinal(None, 8, usize::MAX), Some(7));
    }

    /// The reader loads no GPU driver: the code of this module and of the PCI reader it uses
    /// (comments and tests left out) names no dynamic loading, no foreign call, and nothing
    /// of the crate beyond the topology (the GPU backends are where the drivers load).
    #[test]
    fn the_bus_id_is_found_without_a_driver() {
        for (file, text) in [("rank_gpu.rs", include_str!("rank_gpu.rs")), ("pci.rs", include_str!("pci.rs"))] {
            let code: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap_or_default()
                .lines()
                .map(|l| l.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            for banned in ["crate::", "libloading", "dlopen", "libc::", "extern", "unsafe", "std::process"] {
                assert!(!code.contains(banned), "{file} names `{banned}`");
            }
        }
    }
}
