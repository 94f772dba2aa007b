//! Internals that tests outside this crate need, behind the cargo feature `testing`; not
//! part of oxccl's stable API.

use std::sync::Arc;

use crate::backend::Backend;
use crate::config::Config;
use crate::error::Result;

/// The context string of the TCP transport's secret handshake (for tests that speak the
/// handshake themselves, e.g. an impostor that must be refused).
pub const TCP_AUTH_CONTEXT: &[u8] = crate::cpu::transport::tcp::AUTH_CONTEXT;

/// The `n` ranks of a new `local` world as bare backends, named `name` (for tests that wrap
/// a real backend, e.g. to inject faults).
///
/// # Errors
/// [`Error::Config`](crate::Error::Config) for unusable settings;
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `n` is 0.
pub fn local_backends(cfg: &Config, n: usize, name: &'static str) -> Result<Vec<Arc<dyn Backend>>> {
    let world = crate::cpu::local::named_world(&cfg.resolve()?, n, name)?;
    Ok(world.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect())
}

/// A `cpu` world of threads whose rank `r` poses as being on host `hosts[r]` (shared memory
/// between the ranks of a host, TCP on loopback between hosts), as bare backends: for tests
/// of what spans hosts (the hierarchical algorithms) without machines or namespaces.
///
/// # Errors
/// [`Error::Config`](crate::Error::Config) for unusable settings; setup errors.
pub fn cpu_backends_on_hosts(cfg: &Config, hosts: &[&str]) -> Result<Vec<Arc<dyn Backend>>> {
    let cfg = cfg.resolve()?;
    let opts = crate::cpu::setup::CpuOptions::from_config(&cfg)?;
    let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
    let world = crate::cpu::setup::init_world_on(&cfg, &hosts, &opts)?;
    Ok(world.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect())
}

/// The `n` ranks of a new `nccl` world on test doubles, as bare backends: host memory posing
/// as device memory (rank `i` on fake device `i`), and a double of the NCCL library whose
/// collectives are computed sequentially on the host. The whole `nccl` engine runs (its
/// streams, events, non-blocking communicator, envelopes, fingerprints and failure paths);
/// only the library and the driver underneath are doubles.
///
/// `old_library` leaves out the calls newer NCCL releases added (`ncclCommSplit`,
/// `ncclAlltoAll`, `ncclGather`, `ncclScatter`, ...), so the engine's fallbacks run. The
/// settings come from `cfg` (e.g. `OXCCL_GPU_HOST_BUFFERS=stage` runs host buffers through
/// the device, `OXCCL_GPU_FINGERPRINT=1` checks every collective).
///
/// # Errors
/// [`Error::Config`](crate::Error::Config) for unusable settings; the engine's errors.
pub fn nccl_double_backends(cfg: &Config, n: usize, old_library: bool) -> Result<Vec<Arc<dyn Backend>>> {
    gpu_double_backends(cfg, n, "nccl", old_library)
}

/// As [`nccl_double_backends`], for `backend` `nccl` or `rccl`: with `rccl` the host double
/// poses as HIP (buffers on `rocm:N`) and the library is loaded as RCCL, which is the whole
/// difference between the two backends.
///
/// # Errors
/// As for [`nccl_double_backends`]; [`Error::InvalidArgument`](crate::Error::InvalidArgument)
/// for another backend name.
pub fn gpu_double_backends(cfg: &Config, n: usize, backend: &str, old_library: bool) -> Result<Vec<Arc<dyn Backend>>> {
    let (name, rt, lib) = double_of(backend, n, old_library)?;
    let cfg = cfg.resolve()?;
    let hosts = crate::cpu::local::world(&cfg, n)?.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect();
    crate::xccl::factory::world_over(name, &lib, &rt, hosts, &cfg, &|i| i as u32)
}

/// Rank `rank` of `n` `nccl` (or `rccl`) ranks on the test doubles of
/// [`gpu_double_backends`], made as `Config::init_rendezvous` makes them: the host side is a
/// `cpu` communicator meeting through the caller's store `rdv`, the device is
/// `OXCCL_GPU_DEVICE` else `rank` (of `n` fake devices). Ranks of one world must be threads
/// of this process (the double's communicators meet in memory).
///
/// # Errors
/// As [`gpu_double_backends`]; the store's and the cpu backend's setup errors.
pub fn gpu_double_rendezvous(
    cfg: &Config,
    (rank, n): (usize, usize),
    rdv: &dyn crate::bootstrap::Rendezvous,
    secret: &str,
    backend: &str,
) -> Result<Arc<dyn Backend>> {
    let (name, rt, lib) = double_of(backend, n, false)?;
    let cfg = cfg.resolve()?;
    crate::xccl::factory::rendezvous_over(name, &lib, &rt, &cfg, (rank, n), rdv, secret)
}

/// The GPU double of `backend` for `n` ranks: its name, a host runtime posing as the vendor's
/// with `n` devices, and the library double (`old_library`: without the optional calls).
#[allow(clippy::type_complexity)]
fn double_of(
    backend: &str,
    n: usize,
    old_library: bool,
) -> Result<(&'static str, Arc<dyn crate::xccl::runtime::DeviceRuntime>, Arc<crate::xccl::library::Library>)> {
    use crate::xccl::double::nccl::{table, DoubleOptions};
    use crate::xccl::library::{Flavor, Library};
    use crate::xccl::runtime::{host::HostRuntime, Vendor};
    let (name, flavor, vendor) = match backend {
        "nccl" => ("nccl", Flavor::Nccl, Vendor::Host),
        "rccl" => ("rccl", Flavor::Rccl, Vendor::Hip),
        other => return Err(crate::error::Error::invalid(format!("no GPU double of `{other}`; nccl or rccl"))),
    };
    let opts = if old_library {
        DoubleOptions {
            split: false,
            shrink: false,
            grow: false,
            all_to_all: false,
            gather_scatter: false,
            ..DoubleOptions::default()
        }
    } else {
        DoubleOptions::default()
    };
    let devices = u32::try_from(n).map_err(|_| crate::error::Error::invalid("too many ranks for the double"))?;
    let rt = Arc::new(HostRuntime::posing_as(devices, vendor));
    let lib = Arc::new(Library::from_table(table(&opts), flavor, format!("{name}-double"))?);
    Ok((name, rt, lib))
}

/// A [`Gpu`](crate::Gpu) over the host double (host memory posing as CUDA device `ordinal`
/// of `devices`), whose copy functions are also registered as the host backends' staging
/// copies for CUDA memory, as loading the real CUDA runtime does: collectives on the `cpu`,
/// `local` and `mpi` backends take its buffers and stage them through host memory. For
/// tests that run device-buffer code paths end to end without a GPU.
///
/// The staging copies are registered once per process, so every call with the same
/// `devices` shares one double: tests running side by side each see their buffers as live
/// allocations of it (with a double per call, the last one registered staged the others'
/// buffers and found them unknown). A call with another `devices` replaces the registration.
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `ordinal >= devices`.
pub fn host_gpu(devices: u32, ordinal: u32) -> Result<crate::xccl::memory::Gpu> {
    use crate::staging::{register_device_copy, DeviceKind};
    use crate::xccl::runtime::{host::HostRuntime, DeviceRuntime};
    static SHARED: std::sync::Mutex<Option<(u32, Arc<dyn DeviceRuntime>)>> = std::sync::Mutex::new(None);
    let rt = {
        let mut shared = crate::sync::relock(&SHARED);
        match &*shared {
            Some((d, rt)) if *d == devices => Arc::clone(rt),
            _ => {
                let rt: Arc<dyn DeviceRuntime> = Arc::new(HostRuntime::new(devices));
                register_device_copy(
                    DeviceKind::Cuda,
                    Arc::new(crate::xccl::staging_copy::RuntimeCopy::new(Arc::clone(&rt))),
                );
                *shared = Some((devices, Arc::clone(&rt)));
                rt
            }
        }
    };
    crate::xccl::memory::Gpu::new(rt, ordinal)
}
