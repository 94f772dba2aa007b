//! The `cpu` backend: ranks in separate processes, on one host or many, running the CPU
//! algorithms over shared memory (ranks on the same host) and TCP (ranks on other hosts).
//!
//! Setup of a process (`oxccl::init()`):
//! 1. rank and world from the launcher's environment ([`LaunchInfo`]);
//! 2. the rendezvous store: `OXCCL_STORE_ADDR` when the launcher hosts it (`oxccl run`);
//!    otherwise rank 0 hosts it at `MASTER_ADDR:(OXCCL_STORE_PORT or MASTER_PORT+1)`
//!    (MASTER_PORT itself belongs to torchrun's own store); every connection authenticates
//!    with `OXCCL_SECRET`;
//! 3. every rank publishes its host identity (hostname and network namespace, or
//!    `OXCCL_HOST_ID`) and learns everyone's;
//! 4. shared-memory links to the ranks of its host, TCP links to the others
//!    (`OXCCL_TRANSPORT=tcp` forces TCP everywhere, `shm` refuses to run across hosts);
//! 5. when every rank is on this host, collectives directly in shared memory;
//! 6. a barrier: when `init` returns, every link works.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::bootstrap::auth::Secret;
use crate::bootstrap::env::LaunchInfo;
use crate::bootstrap::store::{StoreClient, StoreServer};
use crate::bootstrap::{MemoryRendezvous, Rendezvous};
use crate::config::ResolvedConfig;
use crate::cpu::engine::{CpuBackend, WORLD_COMM_ID};
use crate::cpu::transport::mailbox::Mailbox;
use crate::cpu::transport::routed::{Link, RoutedTransport};
use crate::cpu::transport::shm::links::{ShmLinks, ShmOptions};
use crate::cpu::transport::tcp::{TcpLinks, TcpOptions};
use crate::error::{Error, Result};

/// The backend's name.
pub const NAME: &str = "cpu";
/// Default bytes per slot of the shared-memory collectives (`OXCCL_SHM_SLOT_BYTES`).
pub const DEFAULT_SLOT: usize = 1 << 20;

/// Which transports carry the traffic (`OXCCL_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportChoice {
    /// Shared memory within a host, TCP across hosts.
    Auto,
    /// Shared memory only (every rank must be on one host).
    Shm,
    /// TCP for everything, also within a host (for testing).
    Tcp,
}

/// Settings of the `cpu` backend read from the environment.
#[derive(Debug, Clone)]
pub struct CpuOptions {
    /// Which transports to use.
    pub transport: TransportChoice,
    /// Shared-memory link settings.
    pub shm: ShmOptions,
    /// Bytes per slot of the shared-memory collectives.
    pub slot_bytes: usize,
    /// TCP settings.
    pub tcp: TcpOptions,
    /// How long setup waits for the other ranks.
    pub setup_timeout: Duration,
}

fn parse_bytes(var: &str, v: &str) -> Result<usize> {
    let t = v.trim();
    let (num, mul) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::Config(format!("{var}={v:?} is not a size; use e.g. 262144, 256K, 1M")))
}

impl CpuOptions {
    /// Reads `OXCCL_TRANSPORT`, `OXCCL_SHM_RING_BYTES`, `OXCCL_SHM_SLOT_BYTES`,
    /// `OXCCL_SOCKET_IFNAME`, `OXCCL_MAX_FRAME` through `env`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable that cannot be used.
    pub fn from_env_with(env: impl Fn(&str) -> Option<String>, timeout: Duration) -> Result<CpuOptions> {
        let transport = match env("OXCCL_TRANSPORT").as_deref().map(str::trim) {
            None | Some("" | "auto") => TransportChoice::Auto,
            Some("shm") => TransportChoice::Shm,
            Some("tcp") => TransportChoice::Tcp,
            Some(v) => return Err(Error::Config(format!("OXCCL_TRANSPORT={v:?}: expected auto, shm or tcp"))),
        };
        let mut shm = ShmOptions { setup_timeout: timeout, ..ShmOptions::default() };
        if let Some(v) = env("OXCCL_SHM_RING_BYTES") {
            shm.ring_bytes = parse_bytes("OXCCL_SHM_RING_BYTES", &v)?;
        }
        let slot_bytes = match env("OXCCL_SHM_SLOT_BYTES") {
            Some(v) => parse_bytes("OXCCL_SHM_SLOT_BYTES", &v)?,
            None => DEFAULT_SLOT,
        };
        let mut tcp = TcpOptions::from_env_with(&env)?;
        tcp.connect_timeout = timeout;
        shm.max_frame = tcp.max_frame;
        Ok(CpuOptions { transport, shm, slot_bytes, tcp, setup_timeout: timeout })
    }
}

/// This process's host identity: `OXCCL_HOST_ID`, else the hostname and the network
/// namespace (processes in different network namespaces count as different hosts, which is
/// what they are to a network).
pub fn host_id() -> String {
    if let Ok(id) = std::env::var("OXCCL_HOST_ID") {
        return id;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net").map(|p| p.display().to_string()).unwrap_or_default();
    format!("{host}/{netns}")
}

/// Builds rank `rank` of a world of `n` over `rdv` (a collective: every rank calls it).
#[allow(clippy::too_many_arguments)]
fn build(
    rank: usize,
    n: usize,
    rdv: &dyn Rendezvous,
    prefix: &str,
    secret: &Secret,
    host: &str,
    opts: &CpuOptions,
    cfg: &ResolvedConfig,
) -> Result<CpuBackend> {
    rdv.publish(&format!("{prefix}/host/{rank}"), host.as_bytes())?;
    let hosts: Vec<Vec<u8>> =
        (0..n).map(|r| rdv.lookup(&format!("{prefix}/host/{r}"), opts.setup_timeout)).collect::<Result<_>>()?;
    let mine = hosts[rank].clone();
    let local: Vec<usize> = (0..n).filter(|&r| hosts[r] == mine).collect();
    let single_host = local.len() == n;
    if opts.transport == TransportChoice::Shm && !single_host {
        return Err(Error::Config("OXCCL_TRANSPORT=shm, but the ranks are on several hosts; use auto or tcp".into()));
    }
    let use_shm = opts.transport != TransportChoice::Tcp && local.len() > 1;
    let mailbox = Arc::new(Mailbox::new());
    let mut routes: Vec<Option<Arc<dyn Link>>> = vec![None; n];
    if use_shm {
        let shm: Arc<dyn Link> =
            Arc::new(ShmLinks::establish(rank, &local, rdv, prefix, &opts.shm, Arc::clone(&mailbox))?);
        for &p in local.iter().filter(|&&p| p != rank) {
            routes[p] = Some(Arc::clone(&shm));
        }
    }
    let remote: Vec<usize> = (0..n).filter(|&p| p != rank && routes[p].is_none()).collect();
    // Every rank builds TCP links when any rank needs them, so the address exchange matches.
    let anyone_remote = opts.transport == TransportChoice::Tcp || !single_host;
    if anyone_remote && n > 1 {
        let tcp: Arc<dyn Link> =
            Arc::new(TcpLinks::establish(rank, n, &remote, rdv, prefix, secret, &opts.tcp, Arc::clone(&mailbox))?);
        for &p in &remote {
            routes[p] = Some(Arc::clone(&tcp));
        }
    }
    let transport = Arc::new(RoutedTransport::new(rank, mailbox, routes)?);
    let backend = CpuBackend::new(NAME, transport, WORLD_COMM_ID, (0..n).collect(), rank, cfg.clone())?;
    if use_shm && single_host {
        backend.enable_shared_memory(opts.slot_bytes)?;
    }
    Ok(backend)
}

/// Counts this process's worlds so that each gets its own keys in a shared store.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The launcher's job identity, for launches without `OXCCL_SECRET`: torchrun's run id,
/// Open MPI's / PMIx's job, SLURM's job and step, Hydra's KVS name.
fn launcher_job_id(env: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let one = |k: &str| env(k).filter(|v| !v.is_empty()).map(|v| format!("{k}={v}"));
    one("TORCHELASTIC_RUN_ID")
        .or_else(|| one("OMPI_MCA_ess_base_jobid"))
        .or_else(|| one("PMIX_NAMESPACE"))
        .or_else(|| {
            let job = one("SLURM_JOB_ID")?;
            Some(format!("{job},{}", one("SLURM_STEP_ID").or_else(|| one("SLURM_STEPID")).unwrap_or_default()))
        })
        .or_else(|| one("PMI_KVSNAME"))
}

/// The job secret: `OXCCL_SECRET`, else one derived from the launcher's job id `job_id`
/// (with a warning on rank 0: anyone who knows the id can derive it).
fn job_secret(job_id: Option<&str>, rank: usize) -> Result<Secret> {
    if let Some(s) = Secret::from_env()? {
        return Ok(s);
    }
    let id = job_id.ok_or_else(secret_required)?;
    if rank == 0 {
        eprintln!(
            "oxccl: OXCCL_SECRET is not set; using a secret derived from the launcher's job id ({id}), \
             which anyone who knows that id can derive. Export the same random OXCCL_SECRET to every rank \
             (or launch with `oxccl run`) for real authentication."
        );
    }
    Secret::from_text(&format!("oxccl-job-id:{id}"))
}

/// A port for a store on loopback that every rank of this job computes alike.
fn derived_port(id: &str) -> u16 {
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    20000 + (h % 20000) as u16
}

fn secret_required() -> Error {
    Error::Config(
        "OXCCL_SECRET is not set: every rank must know the job's secret to join. Launch with \
         `oxccl run`, which sets it, or export the same OXCCL_SECRET (e.g. `openssl rand -hex 32`) \
         for every rank"
            .into(),
    )
}

/// Creates this process's rank from the launcher's environment.
///
/// # Errors
/// [`Error::Config`] for missing or contradictory variables (named in the message);
/// [`Error::Store`] when the store cannot be reached or a rank does not show up in time;
/// transport setup errors.
pub fn init_process(cfg: &ResolvedConfig) -> Result<CpuBackend> {
    let env = |k: &str| std::env::var(k).ok();
    let info = LaunchInfo::from_env()?;
    let opts = CpuOptions::from_env_with(env, cfg.timeout)?;
    let (rank, n) = (info.rank, info.world_size);
    if n == 1 {
        let mailbox = Arc::new(Mailbox::new());
        let transport = Arc::new(RoutedTransport::new(0, mailbox, vec![None])?);
        return CpuBackend::new(NAME, transport, WORLD_COMM_ID, Arc::from([0usize]), 0, cfg.clone());
    }
    let job_id = launcher_job_id(&env);
    let secret = job_secret(job_id.as_deref(), rank)?;
    let mut keep: Vec<Box<dyn Any + Send + Sync>> = Vec::new();
    // Without MASTER_ADDR, a job whose ranks are all on this host (mpirun/srun on one node)
    // meets on loopback, at a port derived from the launcher's job id.
    let single_host_fallback = (info.master_addr.is_none() && info.local_world_size == n)
        .then_some(job_id.as_deref())
        .flatten()
        .map(|id| ("127.0.0.1".to_string(), derived_port(id)));
    let addr = match env("OXCCL_STORE_ADDR") {
        Some(a) => a,
        None => {
            let host = info.master_addr.clone().or_else(|| single_host_fallback.as_ref().map(|f| f.0.clone()));
            let host = host.ok_or_else(|| {
                Error::Config(
                    "no rendezvous store: set OXCCL_STORE_ADDR (host:port of a running store), or \
                     MASTER_ADDR and MASTER_PORT (rank 0 then hosts the store), or launch with `oxccl run`"
                        .into(),
                )
            })?;
            let fallback_port = single_host_fallback.as_ref().map(|f| f.1);
            let port = match env("OXCCL_STORE_PORT") {
                Some(p) => p
                    .trim()
                    .parse::<u16>()
                    .map_err(|_| Error::Config(format!("OXCCL_STORE_PORT={p:?} is not a port")))?,
                None => info.master_port.and_then(|p| p.checked_add(1)).or(fallback_port).ok_or_else(|| {
                    Error::Config(
                        "MASTER_PORT is not set (rank 0 hosts the store on MASTER_PORT+1, or set OXCCL_STORE_PORT)"
                            .into(),
                    )
                })?,
            };
            if rank == 0 {
                keep.push(Box::new(StoreServer::bind(&format!("0.0.0.0:{port}"), secret.clone())?));
            }
            format!("{host}:{port}")
        }
    };
    let store = StoreClient::connect(&addr, &secret, opts.setup_timeout)?;
    let prefix = format!("oxccl/g{}", GENERATION.fetch_add(1, Ordering::Relaxed));
    let backend = build(rank, n, &store, &prefix, &secret, &host_id(), &opts, cfg)?;
    // Every link is up when `build` returns (TCP and shared-memory setup wait for all their
    // peers), so no extra barrier, which would take a sequence number the user sees.
    Ok(keep.into_iter().fold(backend, CpuBackend::keep_alive))
}

/// Creates the `n` ranks of a world of threads in this process over the real
/// transports (shared memory, or TCP on loopback with `OXCCL_TRANSPORT=tcp`).
///
/// # Errors
/// As [`init_process`], without the store.
pub fn init_world(cfg: &ResolvedConfig, n: usize) -> Result<Vec<CpuBackend>> {
    if n == 0 {
        return Err(Error::invalid("a world needs at least one rank"));
    }
    let opts = CpuOptions::from_env_with(|k| std::env::var(k).ok(), cfg.timeout)?;
    init_world_with(cfg, n, &opts)
}

/// [`init_world`] with explicit options.
///
/// # Errors
/// As [`init_world`].
pub fn init_world_with(cfg: &ResolvedConfig, n: usize, opts: &CpuOptions) -> Result<Vec<CpuBackend>> {
    if n == 0 {
        return Err(Error::invalid("a world needs at least one rank"));
    }
    let mut opts_local = opts.clone();
    if opts.tcp.bind_addr.is_none() {
        opts_local.tcp.bind_addr = Some(std::net::IpAddr::from([127, 0, 0, 1]));
    }
    let secret = Secret::generate()?;
    let rdv = MemoryRendezvous::default();
    let host = host_id();
    let results: Vec<Result<CpuBackend>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (rdv, secret, host, opts, cfg) = (&rdv, &secret, &host, &opts_local, cfg);
                s.spawn(move || build(r, n, rdv, "oxccl/world", secret, host, opts, cfg))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Internal("a setup thread panicked".into()))))
            .collect()
    });
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, Communicator, Config, ReduceOp};

    fn run_world(transport: TransportChoice, n: usize) {
        let cfg = Config::new().timeout(Duration::from_secs(30)).resolve_with(|_| None).unwrap();
        let mut opts = CpuOptions::from_env_with(|_| None, cfg.timeout).unwrap();
        opts.transport = transport;
        let comms: Vec<Communicator> = init_world_with(&cfg, n, &opts)
            .unwrap()
            .into_iter()
            .map(|b| Communicator::from_backend(Arc::new(b)))
            .collect();
        std::thread::scope(|s| {
            for comm in &comms {
                s.spawn(move || {
                    let r = comm.rank();
                    for algo in [Algorithm::Auto, Algorithm::Ring, Algorithm::Rabenseifner] {
                        let mut x: Vec<f64> = (0..3001).map(|i| (i + r) as f64).collect();
                        comm.with_algorithm(algo).all_reduce(&mut x, ReduceOp::Sum).unwrap();
                        let sum_r = (n * (n - 1) / 2) as f64;
                        assert!(x.iter().enumerate().all(|(i, v)| *v == (i * n) as f64 + sum_r), "{algo}");
                    }
                    let mut y = vec![0u8; 4 * n];
                    comm.all_to_all(&vec![r as u8; 4 * n], &mut y).unwrap();
                    assert!(y.chunks(4).enumerate().all(|(p, c)| c.iter().all(|v| *v as usize == p)));
                });
            }
        });
        assert!(comms.iter().all(|c| c.backend() == NAME));
    }

    #[test]
    fn a_world_of_threads_over_shared_memory() {
        run_world(TransportChoice::Auto, 3);
    }

    #[test]
    fn a_world_of_threads_over_tcp() {
        run_world(TransportChoice::Tcp, 3);
    }

    #[test]
    fn launcher_job_ids_give_a_secret_and_a_port() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(
            launcher_job_id(&env(&[("TORCHELASTIC_RUN_ID", "abc")])).as_deref(),
            Some("TORCHELASTIC_RUN_ID=abc")
        );
        assert_eq!(
            launcher_job_id(&env(&[("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0")])).as_deref(),
            Some("SLURM_JOB_ID=7,SLURM_STEP_ID=0")
        );
        assert_eq!(launcher_job_id(&env(&[("RANK", "0")])), None);
        let p = derived_port("OMPI_MCA_ess_base_jobid=123");
        assert!((20000..40000).contains(&p));
        assert_eq!(p, derived_port("OMPI_MCA_ess_base_jobid=123"));
    }

    #[test]
    fn options_name_bad_variables() {
        let e = CpuOptions::from_env_with(
            |k| (k == "OXCCL_TRANSPORT").then(|| "carrier-pigeon".into()),
            Duration::from_secs(1),
        );
        assert!(e.unwrap_err().to_string().contains("OXCCL_TRANSPORT"));
        let e =
            CpuOptions::from_env_with(|k| (k == "OXCCL_SHM_SLOT_BYTES").then(|| "lots".into()), Duration::from_secs(1));
        assert!(e.unwrap_err().to_string().contains("OXCCL_SHM_SLOT_BYTES"));
        assert_eq!(parse_bytes("X", "256K").unwrap(), 256 * 1024);
    }
}
