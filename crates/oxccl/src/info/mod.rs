//! `oxccl info`, the doctor: what this machine and this build of oxccl can do, and exactly
//! why not where they cannot. Users run it first when something is slow or broken; tools read
//! it as JSON.
//!
//! [`Report::gather`] asks every part without starting anything: the backends' availability
//! (and for `nccl`/`rccl` the runtime and library each would load, with every path tried),
//! MPI's library and whether it is CUDA-aware, the GPUs, NICs and GPUDirect RDMA from the
//! kernel ([`crate::topology`]), `/dev/shm`, the memlock limit, the network interfaces and
//! the one `OXCCL_SOCKET_IFNAME` picks, the bootstrap a job started here would use (the
//! launcher's PMIx or oxccl's store, and why), and every `OXCCL_*`/`NCCL_*` variable in
//! effect, each checked. [`Report::problems`] lists what needs attention, in plain words.
//!
//! - `render.rs`: the human-readable form ([`std::fmt::Display`]).

mod render;

use serde::Serialize;

use crate::bootstrap::pmix::BootstrapChoice;
use crate::config::{registry, BootstrapMode, Config};
use crate::topology::{Distance, Topology};

/// `/dev/shm` below this many bytes is worth a warning (Docker's default is 64 MiB).
const SMALL_SHM: u64 = 256 << 20;
/// A memlock limit below this many bytes limits pinned staging buffers.
const SMALL_MEMLOCK: u64 = 64 << 20;

/// A backend: can it run here, and why not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendStatus {
    /// `cpu`, `local`, `mpi`, `nccl`, `rccl`.
    pub name: String,
    /// Whether it can run here.
    pub available: bool,
    /// What it found, or why it cannot run.
    pub detail: String,
}

/// A GPU stack (CUDA + NCCL, HIP + RCCL): what loads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuStack {
    /// `nccl` or `rccl`.
    pub backend: String,
    /// The runtime: its driver and library (`Ok`), or why it does not load.
    pub runtime: Result<String, String>,
    /// Devices the runtime sees, where it loads and can count them.
    pub devices: Option<u32>,
    /// The collective library: its path and version (`Ok`), or every path tried and why each
    /// failed.
    pub library: Result<String, String>,
    /// What the runtime says of each device it sees, by ordinal.
    pub device_details: Vec<Result<RuntimeDevice, String>>,
    /// Pairs of devices (device, peer) that can access each other's memory directly, and
    /// those that cannot, as the runtime answers.
    pub peer_access: Vec<(u32, u32, bool)>,
}

/// A device as its runtime describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuntimeDevice {
    /// Its model.
    pub name: Option<String>,
    /// Its memory, bytes.
    pub memory_bytes: Option<u64>,
    /// Its PCI address (matches [`crate::topology::Gpu::bus_id`]).
    pub pci_bus_id: Option<String>,
    /// Whether its driver supports dma-buf (GPUDirect RDMA without a peer-memory module).
    pub dma_buf: Option<bool>,
}

/// MPI as this build sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MpiStatus {
    /// Whether the `mpi` backend is built in (cargo feature `mpi`).
    pub built_in: bool,
    /// The library's version line, when built in.
    pub library: Option<String>,
    /// Whether device buffers go to MPI as they are (a CUDA-aware Open MPI), and why.
    pub cuda_aware: Option<(bool, String)>,
}

/// A network interface address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// Its IPv4 address.
    pub address: String,
    /// Whether it is up.
    pub up: bool,
}

/// One `OXCCL_*`, `NCCL_*` or `RCCL_*` variable of the environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Variable {
    /// Its name.
    pub name: String,
    /// Its value (secrets shown by length only).
    pub value: String,
    /// `ok`, or what is wrong with it (an unknown oxccl setting, a bad value).
    pub status: String,
}

/// Everything `oxccl info` says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// oxccl's version.
    pub version: String,
    /// The cargo features this build has.
    pub features: Vec<String>,
    /// Every backend oxccl knows, available or not.
    pub backends: Vec<BackendStatus>,
    /// The GPU stacks.
    pub gpu_stacks: Vec<GpuStack>,
    /// MPI.
    pub mpi: MpiStatus,
    /// GPUs, NICs, GPUDirect, host limits.
    pub topology: Topology,
    /// The nearest NIC of each GPU (by position in `topology.gpus`): its name and distance.
    pub gpu_nics: Vec<Option<(String, Distance)>>,
    /// NVIDIA's Multi-Process Service, where there are NVIDIA GPUs.
    pub mps: Option<crate::topology::Mps>,
    /// The IPv4 interfaces.
    pub interfaces: Vec<Interface>,
    /// The address the `cpu` backend's TCP transport would listen on (`OXCCL_SOCKET_IFNAME`
    /// applied), or why it cannot pick one.
    pub tcp_address: Result<String, String>,
    /// How a job started here would bootstrap (`OXCCL_BOOTSTRAP` applied): through the
    /// launcher's PMIx (its library and namespace) or oxccl's store, and why.
    pub bootstrap: BootstrapChoice,
    /// The variables in effect.
    pub environment: Vec<Variable>,
    /// Whether the whole environment resolves into a configuration, or the first error.
    pub configuration: Result<(), String>,
    /// What needs attention, in plain words.
    pub problems: Vec<String>,
}

/// The features this build was compiled with.
fn features() -> Vec<String> {
    let mut f = Vec::new();
    if cfg!(feature = "mpi") {
        f.push("mpi".to_string());
    }
    if cfg!(feature = "testing") {
        f.push("testing".to_string());
    }
    f
}

/// Whether a variable's value is a secret (shown by length only).
fn secret(name: &str) -> bool {
    name == registry::SECRET.name || name.contains("SECRET") || name.contains("TOKEN") || name.contains("PASSWORD")
}

/// The `OXCCL_*`, `NCCL_*` and `RCCL_*` variables of `env`, each checked (oxccl's against
/// the settings registry, the conformance suite's included; NCCL's and RCCL's are passed to
/// those libraries as they are).
pub fn check_environment(env: impl IntoIterator<Item = (String, String)>) -> Vec<Variable> {
    let mut out: Vec<Variable> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with("OXCCL_") || k.starts_with("NCCL_") || k.starts_with("RCCL_"))
        .map(|(name, value)| {
            let status = if !name.starts_with("OXCCL_") {
                "ok (read by the NCCL/RCCL library itself)".to_string()
            } else if registry::find(&name).is_some() {
                match Config::new().set(&name, &value) {
                    Ok(_) => "ok".to_string(),
                    Err(e) => e.to_string(),
                }
            } else if let Some(s) = registry::find_declared(&name) {
                // The conformance suite's: checked as the suite reads it.
                match s.check(&value) {
                    Ok(()) => "ok (read by the conformance suite)".to_string(),
                    Err(why) => format!("{}={value:?}: {why}; the suite ignores it", s.name),
                }
            } else {
                let near = registry::declared()
                    .map(|s| s.name)
                    .min_by_key(|s| edit_distance(s, &name))
                    .filter(|s| edit_distance(s, &name) <= 3);
                match near {
                    Some(n) => format!("not an oxccl setting (did you mean {n}?); it is ignored"),
                    None => "not an oxccl setting; it is ignored".to_string(),
                }
            };
            let value = if secret(&name) { format!("({} characters, hidden)", value.chars().count()) } else { value };
            Variable { name, value, status }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Levenshtein distance (for "did you mean").
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn mpi_status() -> MpiStatus {
    #[cfg(feature = "mpi")]
    {
        let support = crate::mpi::cuda::detect(crate::config::CudaAware::Auto, crate::mpi::cuda::lookup_loaded);
        let (aware, why) = match support {
            crate::mpi::cuda::CudaSupport::Yes(w) => (true, w),
            crate::mpi::cuda::CudaSupport::No(w) => (false, w),
        };
        MpiStatus { built_in: true, library: Some(crate::mpi::library_version()), cuda_aware: Some((aware, why)) }
    }
    #[cfg(not(feature = "mpi"))]
    {
        MpiStatus { built_in: false, library: None, cuda_aware: None }
    }
}

fn gpu_stack(backend: &str) -> Option<GpuStack> {
    let explicit = |name: &str| std::env::var_os(name).map(std::path::PathBuf::from);
    let lib_var = if backend == "nccl" { registry::NCCL_LIBRARY.name } else { registry::RCCL_LIBRARY.name };
    let p = crate::xccl::factory::probe(backend, explicit(lib_var))?;
    let (runtime, devices) = match p.runtime {
        Ok((describe, count)) => {
            let devices = count.as_ref().ok().copied();
            let runtime = match count {
                Ok(_) => Ok(describe),
                Err(e) => Ok(format!("{describe}; cannot count devices: {e}")),
            };
            (runtime, devices)
        }
        Err(e) => (Err(e), None),
    };
    let library = p.library.map(|(path, version)| format!("{version} from {}", path.display()));
    let device_details = p
        .devices
        .into_iter()
        .map(|d| {
            d.map(|i| RuntimeDevice {
                name: i.name,
                memory_bytes: i.memory_bytes,
                pci_bus_id: i.pci_bus_id,
                dma_buf: i.dma_buf,
            })
        })
        .collect();
    Some(GpuStack { backend: backend.to_string(), runtime, devices, library, device_details, peer_access: p.peers })
}

/// The bootstrap a job started in this environment would use: `OXCCL_BOOTSTRAP` and
/// `OXCCL_PMIX_LIBRARY` read through the registry (a bad value is the choice's reason).
fn bootstrap_choice() -> BootstrapChoice {
    let mode = match registry::BOOTSTRAP.from_env() {
        Ok(Some(v)) => match v.trim().to_ascii_lowercase().as_str() {
            "store" => BootstrapMode::Store,
            "pmix" => BootstrapMode::Pmix,
            _ => BootstrapMode::Auto,
        },
        Ok(None) => BootstrapMode::Auto,
        Err(e) => return BootstrapChoice::Unusable { reason: e.to_string() },
    };
    let library = registry::PMIX_LIBRARY.from_env().ok().flatten().map(std::path::PathBuf::from);
    crate::bootstrap::pmix::choice(mode, library.as_deref())
}

/// The dma-buf answers of every device the runtimes describe.
fn gpu_stacks_dma_buf(stacks: &[GpuStack]) -> Vec<bool> {
    stacks.iter().flat_map(|g| &g.device_details).filter_map(|d| d.as_ref().ok()?.dma_buf).collect()
}

impl Report {
    /// Asks every part of this machine and build (a few ms; loads the GPU runtimes and
    /// libraries where present, initialises nothing else).
    pub fn gather() -> Report {
        let backends = crate::init::select::status()
            .into_iter()
            .map(|(name, s)| BackendStatus {
                name: name.to_string(),
                available: s.is_ok(),
                detail: s.err().unwrap_or_else(|| "available".to_string()),
            })
            .collect();
        let gpu_stacks: Vec<GpuStack> = ["nccl", "rccl"].iter().filter_map(|b| gpu_stack(b)).collect();
        let mut topology = Topology::detect();
        // The GPU driver's dma-buf answer completes the GPUDirect picture.
        let dma_buf: Vec<bool> = gpu_stacks_dma_buf(&gpu_stacks);
        if !dma_buf.is_empty() {
            let have_gpus = !topology.gpus.is_empty();
            topology.gpudirect = topology.gpudirect.clone().with_dma_buf(dma_buf.iter().any(|&d| d), have_gpus);
        }
        let gpu_nics =
            topology.gpus.iter().map(|g| topology.nearest_nic(g).map(|(n, d)| (n.name.clone(), d))).collect();
        let nvidia = topology.gpus.iter().any(|g| g.vendor == crate::topology::GpuVendor::Nvidia)
            || gpu_stacks.iter().any(|g| g.backend == "nccl" && g.devices.is_some_and(|n| n > 0));
        let mps = nvidia.then(crate::topology::Mps::detect);
        let interfaces = crate::cpu::transport::tcp::ipv4_interfaces()
            .map(|v| v.into_iter().map(|(name, ip, up)| Interface { name, address: ip.to_string(), up }).collect())
            .unwrap_or_default();
        let opts = crate::cpu::transport::tcp::TcpOptions {
            ifname: std::env::var(registry::SOCKET_IFNAME.name).ok(),
            ..Default::default()
        };
        let tcp_address =
            crate::cpu::transport::tcp::select_address(&opts).map(|a| a.to_string()).map_err(|e| e.to_string());
        let environment = check_environment(std::env::vars());
        let configuration = Config::new().resolve_with(|k| std::env::var(k).ok()).map(drop).map_err(|e| e.to_string());
        let mut r = Report {
            version: env!("CARGO_PKG_VERSION").to_string(),
            features: features(),
            backends,
            gpu_stacks,
            mpi: mpi_status(),
            topology,
            gpu_nics,
            mps,
            interfaces,
            tcp_address,
            bootstrap: bootstrap_choice(),
            environment,
            configuration,
            problems: Vec::new(),
        };
        r.problems = r.find_problems();
        r
    }

    /// What needs attention, from the facts gathered.
    fn find_problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let h = &self.topology.host;
        match h.dev_shm {
            None => p.push(
                "/dev/shm is not mounted: ranks on one host cannot use shared memory and fall back to TCP \
                 (mount a tmpfs there; Docker: --ipc=host or --shm-size)"
                    .to_string(),
            ),
            Some(s) if s.total_bytes < SMALL_SHM => p.push(format!(
                "/dev/shm is only {} MiB: shared-memory segments of many ranks or large OXCCL_SHM_SLOT_BYTES may not \
                 fit (Docker: --shm-size=1g or --ipc=host)",
                s.total_bytes >> 20
            )),
            _ => {}
        }
        if let Some(soft) = h.memlock.and_then(|m| m.soft) {
            if soft < SMALL_MEMLOCK && !self.topology.gpus.is_empty() {
                p.push(format!(
                    "the locked-memory limit (ulimit -l) is {} KiB: pinned staging buffers for GPU data are limited \
                     to it (raise it: ulimit -l unlimited, /etc/security/limits.conf, Docker --ulimit memlock=-1)",
                    soft >> 10
                ));
            }
        }
        for v in self.environment.iter().filter(|v| v.status != "ok" && !v.status.starts_with("ok (")) {
            p.push(format!("{}: {}", v.name, v.status));
        }
        if let Err(e) = &self.configuration {
            if !self.environment.iter().any(|v| e.contains(&v.name) && v.status != "ok") {
                p.push(format!("the configuration from the environment does not resolve: {e}"));
            }
        }
        if let Err(e) = &self.tcp_address {
            p.push(format!("the TCP transport cannot pick an address: {e}"));
        }
        match &self.bootstrap {
            BootstrapChoice::Unusable { reason } => p.push(format!("no bootstrap can run: {reason}")),
            // The launcher runs PMIx but its library does not load: the store is used, which
            // needs a reachable rank 0 and is one hub for every rank.
            BootstrapChoice::Store { reason, fallback: true } => {
                p.push(format!("the bootstrap falls back to oxccl's store: {reason}"))
            }
            _ => {}
        }
        if !self.topology.gpus.is_empty() {
            let usable = self.backends.iter().any(|b| (b.name == "nccl" || b.name == "rccl") && b.available);
            if !usable {
                p.push(format!(
                    "{} GPU(s) on the PCI bus but neither the nccl nor the rccl backend can run (see their lines above)",
                    self.topology.gpus.len()
                ));
            }
            if !self.topology.gpudirect.usable && !self.topology.gpudirect.rdma_devices.is_empty() {
                p.push(format!("GPUDirect RDMA is not available: {}", self.topology.gpudirect.why));
            }
        }
        p
    }
}

#[cfg(test)]
mod tests;
