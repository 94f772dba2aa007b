//! How `init` finds the GPU backends: `nccl` (CUDA driver + NCCL) and `rccl` (HIP + RCCL),
//! each one rank per process, or a world of threads (one device each, round robin).
//!
//! A rank picks its device from `OXCCL_GPU_DEVICE`, else `LOCAL_RANK` modulo the visible
//! devices (as torch does), else its rank modulo them. Its host side is the `cpu` backend
//! over the same ranks (`local` for a world of threads), which carries the NCCL unique id,
//! the envelopes of point-to-point messages, fingerprints and liveness.

use std::sync::{Arc, OnceLock};

use super::engine::{Engine, Parts};
use super::library::{Flavor, Library, SearchEnv};
use super::runtime::DeviceRuntime;
use super::staging_copy::{RuntimeCopy, RuntimePinner};
use crate::backend::factory::BackendFactory;
use crate::backend::Backend;
use crate::bootstrap::env::LaunchInfo;
use crate::config::{BackendChoice, HostBuffers, ResolvedConfig};
use crate::cpu::factory::CpuFactory;
use crate::error::{Error, Result};
use crate::staging::{self, DeviceKind};

/// The factory of one GPU backend.
pub(crate) struct GpuFactory {
    flavor: Flavor,
}

/// `nccl`.
pub(crate) static NCCL: GpuFactory = GpuFactory { flavor: Flavor::Nccl };
/// `rccl`.
pub(crate) static RCCL: GpuFactory = GpuFactory { flavor: Flavor::Rccl };

/// The vendor runtimes, loaded once per process (loading initializes the driver).
static CUDA: OnceLock<std::result::Result<Arc<dyn DeviceRuntime>, Error>> = OnceLock::new();
static HIP: OnceLock<std::result::Result<Arc<dyn DeviceRuntime>, Error>> = OnceLock::new();

/// The vendor runtime of `flavor` as its first load left it (loaded once per process).
fn loaded(flavor: Flavor) -> &'static std::result::Result<Arc<dyn DeviceRuntime>, Error> {
    let cell = match flavor {
        Flavor::Nccl => &CUDA,
        Flavor::Rccl => &HIP,
    };
    cell.get_or_init(|| load_runtime(flavor))
}

/// What `oxccl info` reports of one GPU stack, each part found or why not.
pub(crate) struct StackProbe {
    /// The vendor runtime: its description and its device count (or why it cannot count).
    pub(crate) runtime: std::result::Result<(String, std::result::Result<u32, String>), String>,
    /// The collective library: where it was loaded from and its version.
    pub(crate) library: std::result::Result<(std::path::PathBuf, String), String>,
    /// What the runtime says of each device it sees.
    pub(crate) devices: Vec<std::result::Result<super::runtime::DeviceInfo, String>>,
    /// Peer access between the devices: (device, peer, answer) for every ordered pair the
    /// runtime answers.
    pub(crate) peers: Vec<(u32, u32, bool)>,
}

/// Probes the runtime and library of the `nccl` or `rccl` backend (`None` for another
/// name), the way the backend would load them (`OXCCL_NCCL_LIBRARY`/`OXCCL_RCCL_LIBRARY`
/// from `explicit`, else the search).
pub(crate) fn probe(backend: &str, explicit: Option<std::path::PathBuf>) -> Option<StackProbe> {
    let flavor = match backend {
        "nccl" => Flavor::Nccl,
        "rccl" => Flavor::Rccl,
        _ => return None,
    };
    let loaded = loaded(flavor);
    let runtime = match loaded {
        Ok(rt) => Ok((rt.describe(), rt.device_count().map_err(|e| e.to_string()))),
        Err(e) => Err(e.clone().reason()),
    };
    let (mut devices, mut peers) = (Vec::new(), Vec::new());
    if let (Ok(rt), Ok((_, Ok(n)))) = (loaded, &runtime) {
        devices = (0..*n).map(|d| rt.device_info(d).map_err(|e| e.to_string())).collect();
        for a in 0..*n {
            for b in (0..*n).filter(|&b| b != a) {
                if let Ok(Some(yes)) = rt.can_access_peer(a, b) {
                    peers.push((a, b, yes));
                }
            }
        }
    }
    let mut env = SearchEnv::from_process();
    env.explicit = explicit;
    let library = Library::load(flavor, &env).map(|lib| (lib.path, lib.version.to_string())).map_err(Error::reason);
    Some(StackProbe { runtime, library, devices, peers })
}

/// The vendor runtime of `flavor` (CUDA for NCCL, HIP for RCCL), loaded once per process,
/// with at least one device.
///
/// # Errors
/// [`Error::BackendUnavailable`] naming what is missing (the driver library, a device).
pub(crate) fn runtime(flavor: Flavor) -> Result<Arc<dyn DeviceRuntime>> {
    let unavailable = |why: String| Error::BackendUnavailable { backend: flavor.backend().to_string(), why };
    let rt = loaded(flavor).clone()?;
    let count = rt.device_count().map_err(|e| unavailable(format!("{} cannot count devices: {e}", rt.describe())))?;
    if count == 0 {
        return Err(unavailable(format!("{} sees no device", rt.describe())));
    }
    Ok(rt)
}

/// Loads the vendor runtime of `flavor`: the CUDA driver for NCCL, HIP for RCCL (from
/// `$ROCM_PATH`, read here: it is ROCm's variable, not an oxccl setting).
fn load_runtime(flavor: Flavor) -> std::result::Result<Arc<dyn DeviceRuntime>, Error> {
    let rt: Arc<dyn DeviceRuntime> = match flavor {
        Flavor::Nccl => Arc::new(super::runtime::cuda::CudaRuntime::load()?),
        Flavor::Rccl => {
            let rocm = std::env::var_os("ROCM_PATH").map(std::path::PathBuf::from);
            Arc::new(super::runtime::hip::HipRuntime::load(rocm)?)
        }
    };
    // The host backends stage this vendor's device buffers through it from now on.
    let kind = match flavor {
        Flavor::Nccl => DeviceKind::Cuda,
        Flavor::Rccl => DeviceKind::Rocm,
    };
    staging::register_device_copy(kind, Arc::new(RuntimeCopy::new(Arc::clone(&rt))));
    // The pinned pool registers its buffers with this runtime, if it has not started with
    // another pinner (then its buffers stay mlocked: still pinned, only not device-mapped).
    if let Err(e) = staging::pinned::install_pinner(Arc::new(RuntimePinner::new(Arc::clone(&rt)))) {
        tracing::debug!("the pinned pool keeps its pinner: {e}");
    }
    Ok(rt)
}

/// The copy functions of `kind`'s runtime for staging (loads the runtime on first use):
/// what [`staging::install_loader`] is given at initialisation.
///
/// # Errors
/// Why the runtime does not load (the paths tried), or sees no device.
pub(crate) fn staging_copy(kind: DeviceKind) -> std::result::Result<Arc<dyn staging::DeviceCopy>, String> {
    let flavor = match kind {
        DeviceKind::Cuda => Flavor::Nccl,
        DeviceKind::Rocm => Flavor::Rccl,
    };
    let rt = runtime(flavor).map_err(Error::reason)?;
    Ok(Arc::new(RuntimeCopy::new(rt)))
}

impl GpuFactory {
    /// The library, from the configured path or the search.
    fn library(&self, cfg: &ResolvedConfig) -> Result<Arc<Library>> {
        let mut env = SearchEnv::from_process();
        env.explicit = match self.flavor {
            Flavor::Nccl => cfg.gpu.nccl_library.clone(),
            Flavor::Rccl => cfg.gpu.rccl_library.clone(),
        };
        Ok(Arc::new(Library::load(self.flavor, &env)?))
    }

    /// The device of local rank `local_rank` (see the module documentation): the rule of
    /// [`crate::topology::rank_gpu::ordinal`], which the `cpu` backend also uses to find the
    /// rank's GPU in sysfs without loading a driver.
    fn device(cfg: &ResolvedConfig, rt: &dyn DeviceRuntime, local_rank: usize) -> Result<u32> {
        let count = rt.device_count()?;
        crate::topology::rank_gpu::ordinal(cfg.gpu.device, count, local_rank).ok_or_else(|| match cfg.gpu.device {
            Some(d) => Error::Config(format!(
                "OXCCL_GPU_DEVICE={d}, but {} sees {count} device(s) (ordinals 0..{count}); check CUDA_VISIBLE_DEVICES \
                 / HIP_VISIBLE_DEVICES",
                rt.describe()
            )),
            // `runtime` only hands out a runtime that sees a device.
            None => Error::Internal(format!("{} sees no device", rt.describe())),
        })
    }
}

/// What the engine does with host buffers under `cfg`.
fn host_buffers(cfg: &ResolvedConfig) -> HostBuffers {
    cfg.gpu.host_buffers.unwrap_or(if cfg.backend == BackendChoice::Auto {
        HostBuffers::Cpu
    } else {
        HostBuffers::Refuse
    })
}

/// What one GPU rank is made of under `cfg`: its host side `host` and device `device`.
fn parts(
    name: &'static str,
    lib: &Arc<Library>,
    rt: &Arc<dyn DeviceRuntime>,
    host: Arc<dyn Backend>,
    cfg: &ResolvedConfig,
    device: u32,
) -> Parts {
    Parts {
        name,
        lib: Arc::clone(lib),
        rt: Arc::clone(rt),
        device,
        host,
        check: cfg.gpu.fingerprint,
        host_buffers: host_buffers(cfg),
        timeout: cfg.timeout,
        algorithms: cfg.algorithms.clone(),
    }
}

/// A world of `hosts.len()` GPU ranks in this process, one thread each (their creation is
/// collective), rank `i` on device `devices(i)`.
pub(crate) fn world_over(
    name: &'static str,
    lib: &Arc<Library>,
    rt: &Arc<dyn DeviceRuntime>,
    hosts: Vec<Arc<dyn Backend>>,
    cfg: &ResolvedConfig,
    devices: &dyn Fn(usize) -> u32,
) -> Result<Vec<Arc<dyn Backend>>> {
    let made: Vec<Result<Engine>> = std::thread::scope(|s| {
        let handles: Vec<_> = hosts
            .into_iter()
            .enumerate()
            .map(|(i, host)| {
                let parts = parts(name, lib, rt, host, cfg, devices(i));
                s.spawn(move || Engine::create(parts))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Internal("creating a GPU rank panicked".into()))))
            .collect()
    });
    made.into_iter().map(|r| r.map(|e| Arc::new(e) as Arc<dyn Backend>)).collect()
}

/// Rank `rank` of `n` GPU ranks whose host side (the `cpu` backend) meets through the
/// caller's store `rdv` (see [`crate::cpu::setup::init_rendezvous`]), on device
/// `OXCCL_GPU_DEVICE`, else the launcher's local rank, else `rank`, modulo the devices.
pub(crate) fn rendezvous_over(
    name: &'static str,
    lib: &Arc<Library>,
    rt: &Arc<dyn DeviceRuntime>,
    cfg: &ResolvedConfig,
    (rank, n): (usize, usize),
    rdv: &dyn crate::bootstrap::Rendezvous,
    secret: &str,
) -> Result<Arc<dyn Backend>> {
    let host: Arc<dyn Backend> = Arc::new(crate::cpu::setup::init_rendezvous(cfg, rank, n, rdv, secret)?);
    let local_rank = LaunchInfo::from_env().map(|l| l.local_rank).unwrap_or(rank);
    let device = GpuFactory::device(cfg, rt.as_ref(), local_rank)?;
    Ok(Arc::new(Engine::create(parts(name, lib, rt, host, cfg, device))?))
}

impl GpuFactory {
    /// This process's GPU rank over the host side `host` makes (the launcher's world, or,
    /// when `joining`, a newcomer's place in a grown one), on the device of its local rank.
    fn over_host(
        &self,
        cfg: &ResolvedConfig,
        host: impl FnOnce(&ResolvedConfig) -> Result<Arc<dyn Backend>>,
        joining: bool,
    ) -> Result<Arc<dyn Backend>> {
        let rt = runtime(self.flavor)?;
        let lib = self.library(cfg)?;
        let host = host(cfg)?;
        let local_rank = LaunchInfo::from_env().map(|l| l.local_rank).unwrap_or_else(|_| host.rank());
        let device = Self::device(cfg, rt.as_ref(), local_rank)?;
        let parts = parts(self.flavor.backend(), &lib, &rt, host, cfg, device);
        Ok(Arc::new(if joining { Engine::join(parts)? } else { Engine::create(parts)? }))
    }
}

impl BackendFactory for GpuFactory {
    fn name(&self) -> &'static str {
        self.flavor.backend()
    }

    fn priority(&self) -> u32 {
        // Above cpu (50): on a GPU host `auto` takes the GPU backend, whose host side is cpu.
        70
    }

    fn availability(&self) -> std::result::Result<(), String> {
        runtime(self.flavor).map(drop).map_err(Error::reason)
    }

    fn create_world(&self, cfg: &ResolvedConfig, n: usize) -> Result<Vec<Arc<dyn Backend>>> {
        let rt = runtime(self.flavor)?;
        let lib = self.library(cfg)?;
        let hosts: Vec<Arc<dyn Backend>> =
            crate::cpu::local::world(cfg, n)?.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect();
        let devices = (0..n).map(|i| Self::device(cfg, rt.as_ref(), i)).collect::<Result<Vec<u32>>>()?;
        world_over(self.flavor.backend(), &lib, &rt, hosts, cfg, &|i| devices[i])
    }

    fn create_process(&self, cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>> {
        self.over_host(cfg, |cfg| CpuFactory.create_process(cfg), false)
    }

    fn create_rendezvous(
        &self,
        cfg: &ResolvedConfig,
        rank: usize,
        n: usize,
        rdv: &dyn crate::bootstrap::Rendezvous,
        secret: &str,
    ) -> Result<Arc<dyn Backend>> {
        let rt = runtime(self.flavor)?;
        let lib = self.library(cfg)?;
        rendezvous_over(self.flavor.backend(), &lib, &rt, cfg, (rank, n), rdv, secret)
    }

    /// A newcomer: its host side joins through the cpu backend (admitted by the members'
    /// grow), then its NCCL communicator comes from `ncclCommGrow` with the members, or from
    /// a fresh id, as all of them decide (see `engine/recovery.rs`).
    fn join_process(&self, cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>> {
        self.over_host(cfg, |cfg| CpuFactory.join_process(cfg), true)
    }
}

#[cfg(test)]
mod device_tests {
    use super::*;
    use crate::xccl::runtime::host::HostRuntime;

    #[test]
    fn a_rank_gets_its_device_by_oxccl_gpu_device_else_its_local_rank() {
        let rt = HostRuntime::new(2);
        let cfg = crate::config::Config::new().resolve().unwrap();
        // Local ranks 0..3 on 2 devices: 0, 1, 0, 1.
        let devices: Vec<u32> = (0..4).map(|r| GpuFactory::device(&cfg, &rt, r).unwrap()).collect();
        assert_eq!(devices, [0, 1, 0, 1]);
        let pinned = crate::config::Config::new().set("OXCCL_GPU_DEVICE", "1").unwrap().resolve().unwrap();
        assert_eq!(GpuFactory::device(&pinned, &rt, 0).unwrap(), 1);
        let missing = crate::config::Config::new().set("OXCCL_GPU_DEVICE", "5").unwrap().resolve().unwrap();
        let e = GpuFactory::device(&missing, &rt, 0).unwrap_err();
        assert!(matches!(&e, Error::Config(m) if m.contains("OXCCL_GPU_DEVICE=5")), "{e}");
    }
}
