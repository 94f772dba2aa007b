//! `oxccl info`'s human-readable form: one section per part, a problems list at the end.

use std::fmt::{self, Write as _};

use super::Report;
use crate::bootstrap::pmix::BootstrapChoice;

/// Bytes as MiB or GiB.
fn size(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// A limit (`None`: unlimited).
fn limit(l: Option<u64>) -> String {
    l.map_or_else(|| "unlimited".to_string(), |b| if b < 1 << 20 { format!("{} KiB", b >> 10) } else { size(b) })
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        let features = if self.features.is_empty() { "none".to_string() } else { self.features.join(", ") };
        writeln!(s, "oxccl {} (cargo features: {features})", self.version)?;
        writeln!(s, "\nBackends")?;
        for b in &self.backends {
            let state = if b.available { "available" } else { "unavailable" };
            if b.available {
                writeln!(s, "  {:<6} {state}", b.name)?;
            } else if self.gpu_stacks.iter().any(|g| g.backend == b.name) {
                writeln!(s, "  {:<6} {state} (why: its runtime and library below)", b.name)?;
            } else {
                writeln!(s, "  {:<6} {state}: {}", b.name, b.detail)?;
            }
        }
        writeln!(s, "\nGPU runtimes and libraries")?;
        for g in &self.gpu_stacks {
            let runtime = match &g.runtime {
                Ok(r) => r.clone(),
                Err(e) => format!("not loaded: {e}"),
            };
            writeln!(s, "  {}: runtime {runtime}", g.backend)?;
            if let Some(n) = g.devices {
                writeln!(s, "  {}: {n} device(s) visible", g.backend)?;
            }
            for (i, d) in g.device_details.iter().enumerate() {
                match d {
                    Ok(d) => {
                        write!(s, "    device {i}: {}", d.name.as_deref().unwrap_or("(no name)"))?;
                        if let Some(m) = d.memory_bytes {
                            write!(s, ", {}", size(m))?;
                        }
                        if let Some(b) = &d.pci_bus_id {
                            write!(s, ", PCI {b}")?;
                        }
                        if let Some(x) = d.dma_buf {
                            write!(s, ", dma-buf {}", if x { "yes" } else { "no" })?;
                        }
                        writeln!(s)?;
                    }
                    Err(e) => writeln!(s, "    device {i}: {e}")?,
                }
            }
            let (yes, no): (Vec<_>, Vec<_>) = g.peer_access.iter().partition(|p| p.2);
            if !g.peer_access.is_empty() {
                let pairs = |v: &[&(u32, u32, bool)]| {
                    v.iter().map(|p| format!("{}->{}", p.0, p.1)).collect::<Vec<_>>().join(" ")
                };
                writeln!(
                    s,
                    "    peer access: {}{}",
                    if yes.is_empty() { "none".into() } else { pairs(&yes) },
                    if no.is_empty() { String::new() } else { format!("; not: {}", pairs(&no)) }
                )?;
            }
            match &g.library {
                Ok(l) => writeln!(s, "  {}: library {l}", g.backend)?,
                Err(e) => writeln!(s, "  {}: library not found: {e}", g.backend)?,
            }
        }
        writeln!(s, "\nMPI")?;
        match (&self.mpi.library, &self.mpi.cuda_aware) {
            (Some(lib), Some((aware, why))) => {
                writeln!(s, "  library: {lib}")?;
                writeln!(s, "  CUDA-aware: {} ({why})", if *aware { "yes" } else { "no" })?;
            }
            _ => writeln!(s, "  not built in (rebuild with the cargo feature `mpi` to use the system MPI)")?,
        }
        let t = &self.topology;
        writeln!(s, "\nGPUs on the PCI bus")?;
        if t.gpus.is_empty() {
            writeln!(s, "  none")?;
        }
        for (g, nic) in t.gpus.iter().zip(&self.gpu_nics) {
            let numa = g.numa_node.map_or_else(|| "?".to_string(), |n| n.to_string());
            write!(s, "  {}  {} {}", g.bus_id, g.vendor, g.device_id)?;
            if let Some(n) = &g.name {
                write!(s, " {n}")?;
            }
            if let Some(m) = g.memory_bytes {
                write!(s, ", {}", size(m))?;
            }
            write!(s, "  NUMA node {numa}")?;
            match nic {
                Some((name, d)) => writeln!(s, "  nearest NIC {name}: {d}")?,
                None => writeln!(s, "  no NIC")?,
            }
        }
        let gd = &t.gpudirect;
        writeln!(s, "GPUDirect RDMA: {} ({})", if gd.usable { "yes" } else { "no" }, gd.why)?;
        if let Some(m) = &self.mps {
            writeln!(s, "NVIDIA MPS: {}", m.describe())?;
        }
        writeln!(s, "\nNetwork")?;
        for i in &self.interfaces {
            write!(s, "  {:<12} {:<15} {}", i.name, i.address, if i.up { "up" } else { "down" })?;
            if let Some(n) = t.nics.iter().find(|n| n.name == i.name) {
                if let Some(b) = &n.bus_id {
                    write!(s, "  PCI {b}")?;
                }
                if let Some(m) = n.numa_node {
                    write!(s, "  NUMA node {m}")?;
                }
                if let Some(sp) = n.speed_mbps {
                    write!(s, "  {sp} Mb/s")?;
                }
                if let Some(r) = &n.rdma {
                    write!(s, "  RDMA {r}")?;
                }
            }
            writeln!(s)?;
        }
        let ifname = self.environment.iter().find(|v| v.name == crate::config::registry::SOCKET_IFNAME.name);
        let why = ifname
            .map_or_else(|| "OXCCL_SOCKET_IFNAME unset".to_string(), |v| format!("OXCCL_SOCKET_IFNAME={}", v.value));
        match &self.tcp_address {
            Ok(a) => writeln!(s, "  the cpu backend's TCP transport listens on {a} ({why})")?,
            Err(e) => writeln!(s, "  the cpu backend's TCP transport cannot pick an address: {e}")?,
        }
        let candidates = self.interfaces.iter().filter(|i| i.up && i.address != "127.0.0.1").count();
        if ifname.is_none() && !t.gpus.is_empty() && candidates > 1 {
            writeln!(s, "  (a rank whose GPU the runtime names listens on the NIC nearest that GPU, listed above)")?;
        }
        writeln!(s, "\nBootstrap")?;
        match &self.bootstrap {
            BootstrapChoice::Pmix { library, version, namespace, reason } => {
                writeln!(s, "  the launcher's PMIx, namespace {namespace}: {} ({version})", library.display())?;
                writeln!(s, "  why: {reason}")?;
            }
            BootstrapChoice::Store { reason, .. } => {
                writeln!(s, "  oxccl's TCP store")?;
                writeln!(s, "  why: {reason}")?;
            }
            BootstrapChoice::Unusable { reason } => writeln!(s, "  none can run: {reason}")?,
        }
        let h = &t.host;
        writeln!(s, "\nHost")?;
        writeln!(s, "  CPUs this process may use: {}; NUMA nodes: {}", h.cpus, h.numa_nodes)?;
        match h.dev_shm {
            Some(d) => writeln!(s, "  /dev/shm: {}, {} free", size(d.total_bytes), size(d.free_bytes))?,
            None => writeln!(s, "  /dev/shm: not mounted")?,
        }
        match h.memlock {
            Some(m) => writeln!(s, "  locked-memory limit (ulimit -l): {} (hard {})", limit(m.soft), limit(m.hard))?,
            None => writeln!(s, "  locked-memory limit: unknown")?,
        }
        writeln!(s, "\nEnvironment")?;
        if self.environment.is_empty() {
            writeln!(s, "  no OXCCL_*, NCCL_* or RCCL_* variable is set")?;
        }
        for v in &self.environment {
            writeln!(s, "  {}={}  {}", v.name, v.value, v.status)?;
        }
        writeln!(s, "\nProblems")?;
        if self.problems.is_empty() {
            writeln!(s, "  none found")?;
        }
        for p in &self.problems {
            writeln!(s, "  - {p}")?;
        }
        f.write_str(&s)
    }
}
