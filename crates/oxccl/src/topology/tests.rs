use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::*;

/// A fake machine: two GPUs (NVIDIA behind a PCIe switch shared with an InfiniBand NIC on
/// NUMA node 0, AMD on node 1), an Intel display (not a GPU of ours), a virtio NIC, `lo`.
struct Fake {
    root: PathBuf,
}

impl Fake {
    fn new(name: &str, peermem: bool) -> Fake {
        let root = std::env::temp_dir().join(format!("oxccl-topo-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let f = Fake { root };
        f.pci("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0", "0x030200", "0x10de", "0x2330", "0");
        f.pci("pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0", "0x020700", "0x15b3", "0x101b", "0");
        f.pci("pci0000:00/0000:00:02.0", "0x030000", "0x8086", "0x1234", "0");
        f.pci("pci0000:00/0000:00:03.0", "0x020000", "0x1af4", "0x1000", "0");
        f.pci("pci0000:80/0000:80:01.0/0000:81:00.0", "0x038000", "0x1002", "0x740f", "1");
        std::fs::create_dir_all(f.dir("sys/devices/pci0000:00/0000:00:03.0/virtio2")).unwrap();
        f.net("eth0", Some("pci0000:00/0000:00:03.0/virtio2"), "-1");
        f.net("ib0", Some("pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0"), "100000");
        f.net("lo", None, "");
        std::fs::create_dir_all(f.dir("sys/class/infiniband/mlx5_0")).unwrap();
        symlink(
            f.dir("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0"),
            f.dir("sys/class/infiniband/mlx5_0/device"),
        )
        .unwrap();
        for n in ["node0", "node1", "online"] {
            std::fs::create_dir_all(f.dir(&format!("sys/devices/system/node/{n}"))).unwrap();
        }
        std::fs::create_dir_all(f.dir("proc")).unwrap();
        let modules = if peermem {
            "nvidia_peermem 16384 0 - Live 0x0\nnvidia 1 0 - Live 0x0\n"
        } else {
            "nvidia 1 0 - Live 0x0\n"
        };
        std::fs::write(f.dir("proc/modules"), modules).unwrap();
        std::fs::create_dir_all(f.dir("dev/shm")).unwrap();
        std::fs::create_dir_all(f.dir("proc/driver/nvidia/gpus/0000:02:00.0")).unwrap();
        std::fs::write(
            f.dir("proc/driver/nvidia/gpus/0000:02:00.0/information"),
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: 1\n",
        )
        .unwrap();
        let amd = f.dir("sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0");
        std::fs::write(amd.join("product_name"), "AMD Instinct MI300X\n").unwrap();
        std::fs::write(amd.join("mem_info_vram_total"), "205822885888\n").unwrap();
        f
    }

    fn dir(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn pci(&self, path: &str, class: &str, vendor: &str, device: &str, numa: &str) {
        let d = self.dir(&format!("sys/devices/{path}"));
        std::fs::create_dir_all(&d).unwrap();
        for (k, v) in [("class", class), ("vendor", vendor), ("device", device), ("numa_node", numa)] {
            std::fs::write(d.join(k), format!("{v}\n")).unwrap();
        }
        let bus = Path::new(path).file_name().unwrap();
        std::fs::create_dir_all(self.dir("sys/bus/pci/devices")).unwrap();
        symlink(&d, self.dir("sys/bus/pci/devices").join(bus)).unwrap();
    }

    fn net(&self, name: &str, device: Option<&str>, speed: &str) {
        let d = self.dir(&format!("sys/class/net/{name}"));
        std::fs::create_dir_all(&d).unwrap();
        if let Some(dev) = device {
            symlink(self.dir(&format!("sys/devices/{dev}")), d.join("device")).unwrap();
        }
        std::fs::write(d.join("speed"), speed).unwrap();
    }

    fn sys(&self) -> Sysfs {
        Sysfs::at(&self.root)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[test]
fn gpus_nics_and_their_distances_come_from_sysfs() {
    let f = Fake::new("full", true);
    let t = Topology::read(&f.sys());
    let gpus: Vec<(&str, GpuVendor, &str, Option<u32>)> =
        t.gpus.iter().map(|g| (g.bus_id.as_str(), g.vendor, g.device_id.as_str(), g.numa_node)).collect();
    assert_eq!(
        gpus,
        [("0000:02:00.0", GpuVendor::Nvidia, "0x2330", Some(0)), ("0000:81:00.0", GpuVendor::Amd, "0x740f", Some(1))]
    );
    assert_eq!((t.gpus[0].name.as_deref(), t.gpus[0].memory_bytes), (Some("NVIDIA H100 80GB HBM3"), None));
    assert_eq!(
        (t.gpus[1].name.as_deref(), t.gpus[1].memory_bytes),
        (Some("AMD Instinct MI300X"), Some(205_822_885_888))
    );
    type Row<'a> = (&'a str, Option<&'a str>, Option<u32>, Option<u64>, Option<&'a str>);
    let nics: Vec<Row> = t
        .nics
        .iter()
        .map(|n| (n.name.as_str(), n.bus_id.as_deref(), n.numa_node, n.speed_mbps, n.rdma.as_deref()))
        .collect();
    assert_eq!(
        nics,
        [
            ("eth0", Some("0000:00:03.0"), Some(0), None, None),
            ("ib0", Some("0000:03:00.0"), Some(0), Some(100_000), Some("mlx5_0")),
        ],
        "lo is virtual and left out"
    );
    let (nic, d) = t.nearest_nic(&t.gpus[0]).unwrap();
    assert_eq!((nic.name.as_str(), d), ("ib0", Distance::Switch));
    // The AMD GPU is on node 1, every NIC on node 0: across the sockets, the RDMA one first.
    let (nic, d) = t.nearest_nic(&t.gpus[1]).unwrap();
    assert_eq!((nic.name.as_str(), d), ("ib0", Distance::System));
    // A transport that may use eth0 and ib0 listens on the one nearest the rank's GPU, named
    // as the CUDA driver prints it; a GPU that is not here, or no NIC among the names: none.
    assert_eq!(t.nic_near_gpu("00000000:02:00.0", &["eth0", "ib0"]).map(|(n, _)| n.name.as_str()), Some("ib0"));
    assert_eq!(
        t.nic_near_gpu("0000:02:00.0", &["eth0"]).map(|(n, d)| (n.name.as_str(), d)),
        Some(("eth0", Distance::HostBridge))
    );
    assert!(t.nic_near_gpu("0000:09:00.0", &["eth0", "ib0"]).is_none());
    assert!(t.nic_near_gpu("0000:02:00.0", &["lo"]).is_none());
    assert_eq!(t.host.numa_nodes, 2);
    assert!(t.host.dev_shm.is_some_and(|s| s.total_bytes > 0));
    assert_eq!(t.gpudirect.peer_memory_module.as_deref(), Some("nvidia_peermem"));
    assert_eq!(t.gpudirect.rdma_devices, ["mlx5_0"]);
    assert!(t.gpudirect.usable, "{}", t.gpudirect.why);
}

#[test]
fn gpudirect_says_what_is_missing() {
    let f = Fake::new("nomod", false);
    let t = Topology::read(&f.sys());
    assert!(!t.gpudirect.usable && t.gpudirect.why.contains("modprobe nvidia_peermem"), "{}", t.gpudirect.why);
    let with = t.gpudirect.clone().with_dma_buf(true, true);
    assert!(with.usable && with.why.contains("dma-buf"), "{}", with.why);
    let without = t.gpudirect.with_dma_buf(false, true);
    assert!(!without.usable && without.why.contains("neither"), "{}", without.why);
    let empty = Topology::read(&Sysfs::at(std::env::temp_dir().join("oxccl-topo-nothing-here")));
    assert!(empty.gpus.is_empty() && empty.nics.is_empty() && empty.host.dev_shm.is_none());
    assert_eq!(empty.host.numa_nodes, 1);
    assert!(!empty.gpudirect.usable && empty.gpudirect.why.contains("no NVIDIA or AMD GPU"));
}

#[test]
fn this_machine_is_read_without_errors() {
    let t = Topology::detect();
    assert!(t.host.cpus >= 1 && t.host.numa_nodes >= 1);
    if Path::new("/dev/shm").is_dir() {
        assert!(t.host.dev_shm.is_some_and(|s| s.total_bytes >= s.free_bytes));
    }
    assert!(t.host.memlock.is_some());
    assert!(t.nics.iter().all(|n| n.name != "lo"), "{:?}", t.nics);
    let json = serde_json::to_value(&t).unwrap();
    assert!(json["gpudirect"]["why"].is_string());
}

#[test]
fn mps_is_found_by_its_control_pipe() {
    let dir = std::env::temp_dir().join(format!("oxccl-mps-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = super::Mps::find(Some(&dir));
    assert!(!m.running && m.describe().contains("nvidia-cuda-mps-control -d"), "{m:?}");
    // The daemon's pipe is a FIFO; any file of that name says the daemon runs.
    std::fs::write(dir.join("control"), b"").unwrap();
    let m = super::Mps::find(Some(&dir));
    assert!(m.running && m.describe().starts_with("running"), "{m:?}");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(super::Mps::find(None).pipe_dir, std::path::PathBuf::from("/tmp/nvidia-mps"));
}

#[test]
fn pci_addresses_are_compared_in_one_form() {
    use super::pci::normalize_bus_id as n;
    assert_eq!(n("00000000:3B:00.0").as_deref(), Some("0000:3b:00.0"));
    assert_eq!(n("0000:3b:00.0").as_deref(), Some("0000:3b:00.0"));
    assert_eq!(n(" 0001:81:1f.7 ").as_deref(), Some("0001:81:1f.7"));
    for bad in ["", "3b:00.0", "0000:3b:00", "0000:zz:00.0", "x:3b:00.0"] {
        assert_eq!(n(bad), None, "{bad}");
    }
}

#[test]
fn a_rank_finds_its_gpu_and_nic_in_sysfs() {
    use super::rank_gpu::{rank_gpu, VisibleDevices};
    let f = Fake::new("rank-gpu", true);
    let (sys, t) = (f.sys(), Topology::read(&f.sys()));
    let all = VisibleDevices::default();
    // The NVIDIA GPU first (the GPU backends try CUDA, then HIP); its nearest NIC is ib0.
    let gpu = rank_gpu(&sys, &t.gpus, &all, None, 1).unwrap();
    assert_eq!(gpu.bus_id, "0000:02:00.0");
    assert_eq!(t.nic_near_gpu(&gpu.bus_id, &["eth0", "ib0"]).map(|(n, _)| n.name.as_str()), Some("ib0"));
    // NVIDIA hidden from CUDA, the AMD GPU shown to HIP.
    let amd = VisibleDevices { cuda: Some(String::new()), hip: Some("0".into()), rocr: None };
    assert_eq!(rank_gpu(&sys, &t.gpus, &amd, None, 0).map(|g| g.bus_id.as_str()), Some("0000:81:00.0"));
    assert_eq!(rank_gpu(&sys, &t.gpus, &all, Some(1), 0), None, "one NVIDIA GPU: OXCCL_GPU_DEVICE=1 names none");
}
