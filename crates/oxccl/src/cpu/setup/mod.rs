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
use crate::bootstrap::env::{job_id_from_env, LaunchInfo, Launcher};
use crate::bootstrap::pmix::Pmix;
use crate::bootstrap::store::{StoreClient, StoreServer};
use crate::bootstrap::{MemoryRendezvous, Rendezvous};
use crate::config::ResolvedConfig;
use crate::cpu::engine::{CpuBackend, WORLD_COMM_ID};
use crate::cpu::grow::{Board, Lineage, MemoryBoard};
use crate::cpu::host_table::HostTable;
use crate::cpu::selector::profile::Profile;
use crate::cpu::transport::mailbox::Mailbox;
use crate::cpu::transport::routed::{Link, RoutedTransport};
use crate::cpu::transport::shm::links::{ShmLinks, ShmOptions};
use crate::cpu::transport::shm::wait::{self, WaitPolicy};
use crate::cpu::transport::tcp::{TcpLinks, TcpOptions, MAX_POLL};
use crate::error::{Error, Result};

/// The backend's name.
pub const NAME: &str = "cpu";

pub use crate::config::TransportChoice;

/// The transports' options of the `cpu` backend, made from its resolved settings.
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
    /// The user's spin phase (`OXCCL_SPIN_US`), when set; otherwise setup chooses it from the
    /// host's ranks and CPUs.
    pub spin: Option<Duration>,
    /// The user's yield phase (`OXCCL_YIELD_US`), when set; otherwise chosen like `spin`.
    pub yield_for: Option<Duration>,
}

impl CpuOptions {
    /// The options `cfg` describes (its `cpu` settings, its timeout for setup).
    ///
    /// # Errors
    /// [`Error::Config`] when the settings contradict each other.
    pub fn from_config(cfg: &ResolvedConfig) -> Result<CpuOptions> {
        let c = &cfg.cpu;
        let shm = ShmOptions {
            ring_bytes: c.shm_ring_bytes,
            max_frame: c.max_frame,
            setup_timeout: cfg.timeout,
            wait: WaitPolicy::for_host(1, 1, c.spin, c.yield_for),
        };
        let tcp = TcpOptions {
            ifname: c.socket_ifname.clone(),
            prefer: gpu_nic(cfg),
            max_frame: c.max_frame,
            lanes: c.sockets_per_peer,
            connect_timeout: cfg.timeout,
            ..TcpOptions::default()
        };
        Ok(CpuOptions {
            transport: c.transport,
            shm,
            slot_bytes: c.shm_slot_bytes,
            tcp,
            setup_timeout: cfg.timeout,
            spin: c.spin,
            yield_for: c.yield_for,
        })
    }
}

/// The NIC nearest this rank's GPU, for the TCP transport to listen on (NCCL's choice of a
/// NIC per GPU: device data staged through host memory then crosses the fewest bridges),
/// when the choice is open: no `OXCCL_SOCKET_IFNAME`, TCP may carry traffic, more than one
/// interface could be picked, there is a GPU on the PCI bus, and this rank uses one of them.
/// `None` otherwise (the default rule).
///
/// The rank's GPU is found in sysfs and procfs ([`crate::topology::rank_gpu`]: PCI order,
/// `CUDA_VISIBLE_DEVICES` and its AMD kin, `OXCCL_GPU_DEVICE`, else the local rank modulo
/// the visible GPUs), never by loading a GPU driver: a process that uses only `cpu` has no
/// `cuInit` behind it (its forked workers are safe) and pays for no driver context.
fn gpu_nic(cfg: &ResolvedConfig) -> Option<String> {
    use crate::config::TransportChoice;
    let c = &cfg.cpu;
    if c.socket_ifname.is_some() || c.transport == TransportChoice::Shm {
        return None;
    }
    let names = crate::cpu::transport::tcp::default_candidates();
    if names.len() < 2 {
        return None;
    }
    let topology = crate::topology::Topology::detect();
    if topology.gpus.is_empty() {
        return None;
    }
    let local_rank = LaunchInfo::from_env().ok()?.local_rank;
    let sys = crate::topology::Sysfs::default();
    let visible = crate::topology::rank_gpu::VisibleDevices::from_process();
    let bus = &crate::topology::rank_gpu::rank_gpu(&sys, &topology.gpus, &visible, cfg.gpu.device, local_rank)?.bus_id;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (nic, distance) = topology.nic_near_gpu(bus, &refs)?;
    tracing::info!("TCP transport: {} is the interface nearest this rank's GPU {bus} ({distance})", nic.name);
    Some(nic.name.clone())
}

/// This process's host identity: `OXCCL_HOST_ID` (`configured`), else the hostname and the
/// network namespace (processes in different network namespaces count as different hosts,
/// which is what they are to a network).
pub fn host_id(configured: Option<&str>) -> String {
    if let Some(id) = configured {
        return id.to_string();
    }
    let host = crate::topology::host::name().unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net").map(|p| p.display().to_string()).unwrap_or_default();
    format!("{host}/{netns}")
}

/// Every rank's host identity, as each published it on arrival. A rank that does not
/// arrive within `timeout` is named as such (with every other rank still missing), not as a
/// store key.
fn arrivals(rank: usize, n: usize, rdv: &dyn Rendezvous, prefix: &str, timeout: Duration) -> Result<Vec<Vec<u8>>> {
    let key = |r: usize| format!("{prefix}/host/{r}");
    let mut hosts = Vec::with_capacity(n);
    for r in 0..n {
        match rdv.lookup_from(r, &key(r), timeout) {
            Ok(h) => hosts.push(h),
            Err(Error::Store(detail)) => {
                let missing: Vec<String> = (r..n)
                    .filter(|&q| rdv.lookup_from(q, &key(q), Duration::ZERO).is_err())
                    .map(|q| q.to_string())
                    .collect();
                if missing.is_empty() {
                    return Err(Error::Store(detail)); // not a missing rank: the store failed
                }
                let who = if missing.len() == 1 {
                    format!("rank {}", missing[0])
                } else {
                    format!("ranks {}", missing.join(", "))
                };
                return Err(Error::Store(format!(
                    "{who} never arrived: rank {rank} of a world of {n} waited {timeout:?} for it. Check that \
                     every rank was started (world size {n}), with the same MASTER_ADDR/MASTER_PORT (or \
                     OXCCL_STORE_ADDR) and OXCCL_SECRET, and look at the missing ranks' own output"
                )));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(hosts)
}

/// This machine's identity: the running kernel's boot id, which every process under that
/// kernel shares (containers and network namespaces included, as they share its CPUs), else
/// the host name.
fn machine_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The machine line of an arrival's host part (`host` then `machine`: see [`build`]).
fn machine_of(host: &[u8]) -> &[u8] {
    host.iter().rposition(|&b| b == b'\n').map_or(host, |at| &host[at + 1..])
}

/// A rank's arrival message, `host`, `machine`, then a line with its CPUs
/// ([`wait::format_cpus`]), split into the host part (host and machine: equal for the ranks
/// of one host) and the CPUs (none when the line is missing or malformed).
fn host_and_cpus(arrival: &[u8]) -> (&[u8], Vec<usize>) {
    let at = arrival.iter().rposition(|&b| b == b'\n').unwrap_or(arrival.len());
    let cpus = std::str::from_utf8(arrival.get(at + 1..).unwrap_or_default()).ok().and_then(wait::parse_cpus);
    (&arrival[..at], cpus.unwrap_or_default())
}

/// How long a receiver looks for its frame itself before it sleeps until its link's thread
/// (TCP) or its sender (in-process) delivers it: the machine's spin, at most [`MAX_POLL`]
/// (zero where the ranks outnumber the CPUs).
pub(crate) fn receive_poll(policy: &WaitPolicy) -> Duration {
    policy.spin.min(MAX_POLL)
}

/// The costs every rank's algorithm choice reads: rank 0 loads `OXCCL_TUNE_FILE` (or takes
/// the defaults) and publishes the result, so ranks whose hosts hold different files still
/// choose alike. A file rank 0 cannot use fails every rank with rank 0's reason.
fn shared_profile(
    rank: usize,
    rdv: &dyn Rendezvous,
    prefix: &str,
    cfg: &ResolvedConfig,
    opts: &CpuOptions,
) -> Result<Arc<Profile>> {
    let key = format!("{prefix}/profile");
    if rank == 0 {
        let loaded = match &cfg.cpu.tune_file {
            Some(path) => Profile::load(path),
            None => Ok(Profile::for_this_host()),
        };
        let published = match &loaded {
            Ok(p) => format!("ok {}\n{}", p.source, p.to_text("")),
            Err(e) => format!("error {e}"),
        };
        rdv.publish(&key, published.as_bytes())?;
        return loaded.map(Arc::new);
    }
    let got = rdv.lookup_from(0, &key, opts.setup_timeout)?;
    let text = String::from_utf8_lossy(&got);
    match text.split_once(' ') {
        Some(("ok", rest)) => {
            let (source, body) = rest.split_once('\n').unwrap_or((rest, ""));
            let mut p = Profile::parse(body)
                .map_err(|why| Error::Internal(format!("rank 0's profile does not parse here: {why}")))?;
            p.source = format!("{source} (from rank 0)");
            Ok(Arc::new(p))
        }
        Some(("error", why)) => Err(Error::Config(format!("rank 0 could not load its profile: {why}"))),
        _ => Err(Error::Internal("rank 0 published a malformed profile".into())),
    }
}

/// The job's host table ([`HostTable`]): rank 0 reads every rank's arrival and publishes
/// the table; every other rank reads the table alone. A rank that does not arrive is named
/// by rank 0, and every rank fails with rank 0's words.
fn host_table(rank: usize, n: usize, rdv: &dyn Rendezvous, prefix: &str, timeout: Duration) -> Result<HostTable> {
    let key = format!("{prefix}/hosts");
    if rank == 0 {
        let table = arrivals(0, n, rdv, prefix, timeout).map(|arrived| {
            let (hosts, masks): (Vec<&[u8]>, Vec<Vec<usize>>) = arrived.iter().map(|a| host_and_cpus(a)).unzip();
            let machines: Vec<&[u8]> = hosts.iter().map(|h| machine_of(h)).collect();
            HostTable::new(&hosts, &machines, &masks)
        });
        let text = match &table {
            Ok(t) => t.encode(),
            Err(e) => format!("error {e}"),
        };
        rdv.publish(&key, text.as_bytes())?;
        return table;
    }
    let raw = rdv.lookup_from(0, &key, timeout).map_err(|e| {
        Error::Store(format!(
            "rank 0 did not publish the job's host table within {timeout:?} ({e}). Check that rank 0 was \
             started, with the same MASTER_ADDR/MASTER_PORT (or OXCCL_STORE_ADDR) and OXCCL_SECRET, and \
             look at rank 0's own output"
        ))
    })?;
    let text = String::from_utf8_lossy(&raw);
    match text.strip_prefix("error ") {
        Some(why) => Err(Error::Store(format!("rank 0 could not gather the job's hosts: {why}"))),
        None => HostTable::parse(&text, n),
    }
}

/// Where the TCP links look peers' addresses up after setup: `shared`, a rendezvous that
/// lives on (the store's client, an in-process map), or else a copy of the addresses of
/// `peers` read from `rdv` now (a caller's store is only lent for the duration of setup).
fn directory(
    rdv: &dyn Rendezvous,
    shared: Option<&Arc<dyn Rendezvous>>,
    prefix: &str,
    peers: &[usize],
    timeout: Duration,
) -> Result<Arc<dyn Rendezvous>> {
    if let Some(s) = shared {
        return Ok(Arc::clone(s));
    }
    let copy = MemoryRendezvous::default();
    for &p in peers {
        let key = crate::cpu::transport::tcp::address_key(prefix, p);
        copy.publish(&key, &rdv.lookup_from(p, &key, timeout)?)?;
    }
    Ok(Arc::new(copy))
}

/// Builds rank `rank` of a world of `n` over `rdv` (a collective: every rank calls it);
/// `shared` is the same rendezvous when it outlives setup (peers' addresses are then looked
/// up when each is first needed).
#[allow(clippy::too_many_arguments)]
fn build(
    rank: usize,
    n: usize,
    rdv: &dyn Rendezvous,
    shared: Option<&Arc<dyn Rendezvous>>,
    prefix: &str,
    secret: &Secret,
    host: &str,
    opts: &CpuOptions,
    cfg: &ResolvedConfig,
) -> Result<CpuBackend> {
    // Each rank announces its host, its machine and the CPUs it may run on: the ranks of a
    // host talk through shared memory, and they choose how they wait from how many ranks
    // share the machine's CPUs (hosts emulated with network namespaces, or containers, share
    // them too).
    let cpus = wait::format_cpus(&wait::allowed_cpus());
    rdv.publish(&format!("{prefix}/host/{rank}"), format!("{host}\n{}\n{cpus}", machine_id()).as_bytes())?;
    let table = host_table(rank, n, rdv, prefix, opts.setup_timeout)?;
    let local = table.local(rank);
    let (machine_ranks, machine_cpus) = table.machine(rank);
    let policy = WaitPolicy::for_host(machine_ranks, machine_cpus, opts.spin, opts.yield_for);
    let single_host = local.len() == n;
    if opts.transport == TransportChoice::Shm && !single_host {
        return Err(Error::Config("OXCCL_TRANSPORT=shm, but the ranks are on several hosts; use auto or tcp".into()));
    }
    let use_shm = opts.transport != TransportChoice::Tcp && local.len() > 1;
    let mailbox = Arc::new(Mailbox::new());
    let mut routes: Vec<Option<Arc<dyn Link>>> = vec![None; n];
    if use_shm {
        let shm_opts = ShmOptions { wait: policy, ..opts.shm.clone() };
        let shm: Arc<dyn Link> =
            Arc::new(ShmLinks::establish(rank, &local, rdv, prefix, &shm_opts, Arc::clone(&mailbox))?);
        for &p in local.iter().filter(|&&p| p != rank) {
            routes[p] = Some(Arc::clone(&shm));
        }
    }
    let remote: Vec<usize> = (0..n).filter(|&p| p != rank && routes[p].is_none()).collect();
    let any_tcp = opts.transport == TransportChoice::Tcp || !single_host;
    // Every peer's TCP address, filled once every rank has published its own.
    let known = Arc::new(MemoryRendezvous::default());
    if !remote.is_empty() {
        let tcp_opts = TcpOptions { poll_for: receive_poll(&policy), yield_for: policy.yield_for, ..opts.tcp.clone() };
        // Connections are made when first needed; only the listener is set up here.
        let tcp = TcpLinks::establish(rank, n, &remote, rdv, prefix, secret, &tcp_opts, Arc::clone(&mailbox))?;
        let directory = directory(rdv, shared, prefix, &remote, opts.setup_timeout)?;
        let tcp: Arc<dyn Link> = Arc::new(
            tcp.with_directory(Arc::new(super::addresses::KnownAddresses { copy: Arc::clone(&known), directory })),
        );
        for &p in &remote {
            routes[p] = Some(Arc::clone(&tcp));
        }
    }
    if any_tcp {
        // Every rank's address is published before any rank returns: a peer's first call
        // then never waits on (or, with a short deadline, fails on) a rank still setting up.
        let all = super::addresses::all_published(rank, n, rdv, prefix, opts.setup_timeout)?;
        for (p, a) in all.iter().enumerate().filter(|(p, a)| *p != rank && !a.is_empty()) {
            known.publish(&crate::cpu::transport::tcp::address_key(prefix, p), a)?;
        }
    }
    let transport = Arc::new(RoutedTransport::new(rank, mailbox, routes)?.with_hosts(table.host_of.clone())?);
    let profile = shared_profile(rank, rdv, prefix, cfg, opts)?;
    let mut backend = CpuBackend::new(NAME, transport, WORLD_COMM_ID, (0..n).collect(), rank, cfg.clone())?
        .with_machine(profile, table.crowd)?;
    if use_shm && single_host {
        backend.enable_shared_memory(opts.slot_bytes, policy)?;
    } else if use_shm {
        // Spanning hosts: each host's ranks share memory among themselves.
        backend = backend.with_host_shared_memory(opts.slot_bytes, policy)?;
    }
    Ok(backend)
}

/// Counts this process's worlds so that each gets its own keys in a shared store.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The job secret: `OXCCL_SECRET`, else one derived from the launcher's job id `job_id`
/// (with a warning on rank 0: anyone who knows the id can derive it).
fn job_secret(configured: Option<&str>, job_id: Option<&str>, rank: usize) -> Result<Secret> {
    if let Some(s) = configured {
        return Secret::from_text(s);
    }
    let id = job_id.ok_or_else(secret_required)?;
    if rank == 0 {
        tracing::warn!(
            "OXCCL_SECRET is not set; using a secret derived from the launcher's job id ({id}), \
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

/// Claims `rank` in the store: each rank does once, so a second claimer is a second process
/// started with the same rank.
fn claim_rank(store: &StoreClient, prefix: &str, rank: usize, n: usize, launcher: &str) -> Result<()> {
    if store.add(&format!("{prefix}/claim/{rank}"), 1)? > 1 {
        return Err(Error::Config(format!(
            "two processes were started as rank {rank} of a world of {n} ({launcher} says so for both): every \
             process needs its own rank in 0..{n}; check the launcher's rank variables (RANK, \
             OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID)"
        )));
    }
    Ok(())
}

/// Creates this process's rank from the launcher's environment.
///
/// # Errors
/// [`Error::Config`] for missing or contradictory variables (named in the message);
/// [`Error::Store`] when the store cannot be reached or a rank does not show up in time;
/// transport setup errors.
pub fn init_process(cfg: &ResolvedConfig) -> Result<CpuBackend> {
    let info = LaunchInfo::from_env()?;
    let opts = CpuOptions::from_config(cfg)?;
    let (rank, n) = (info.rank, info.world_size);
    if n == 1 {
        return alone(cfg);
    }
    let job_id = job_id_from_env();
    let secret = job_secret(cfg.cpu.secret.as_ref().map(|s| s.0.as_str()), job_id.as_deref(), rank)?;
    if let Some(pmix) = Pmix::for_mode(cfg.cpu.bootstrap, cfg.cpu.pmix_library.as_deref())? {
        return init_pmix(pmix, rank, n, &secret, &opts, cfg);
    }
    let (addr, keep) = store_address(cfg, &info, job_id.as_deref(), &secret, rank == 0)?;
    let store = Arc::new(StoreClient::connect(&addr, &secret, opts.setup_timeout)?);
    let prefix = format!("oxccl/g{}", GENERATION.fetch_add(1, Ordering::Relaxed));
    claim_rank(&store, &prefix, rank, n, &info.launcher.to_string())?;
    let host = host_id(cfg.cpu.host_id.as_deref());
    let shared: Arc<dyn Rendezvous> = Arc::clone(&store) as Arc<dyn Rendezvous>;
    let backend = build(rank, n, &*store, Some(&shared), &prefix, &secret, &host, &opts, cfg)?;
    // The store is needed again only when a peer is first connected to: its server need not
    // hold a descriptor per idle rank meanwhile (a later lookup reconnects).
    store.rest();
    // Every link is up when `build` returns (TCP and shared-memory setup wait for all their
    // peers), so no extra barrier, which would take a sequence number the user sees.
    let lineage = store_lineage(store, &prefix, secret, host, opts, cfg, keep);
    // Under `oxccl run`, the first peer a rank loses is reported to the launcher.
    let lineage = if info.launcher == Launcher::Oxccl { lineage.reporting_as(rank) } else { lineage };
    backend.set_lineage(Arc::new(lineage));
    Ok(backend)
}

/// The lineage of a world made through `store` under `prefix`: grown worlds meet under its
/// keys, built as this one was.
fn store_lineage(
    store: Arc<StoreClient>,
    prefix: &str,
    secret: Secret,
    host: String,
    opts: CpuOptions,
    cfg: &ResolvedConfig,
    keep: Vec<Box<dyn Any + Send + Sync>>,
) -> Lineage<CpuBackend> {
    let board: Arc<dyn Board> = Arc::clone(&store) as Arc<dyn Board>;
    let cfg = cfg.clone();
    let build_again = move |rank: usize, n: usize, prefix: &str| {
        let shared: Arc<dyn Rendezvous> = Arc::clone(&store) as Arc<dyn Rendezvous>;
        let b = build(rank, n, &*store, Some(&shared), prefix, &secret, &host, &opts, &cfg)?;
        store.rest();
        Ok(b)
    };
    Lineage::new(board, prefix, Box::new(build_again), keep)
}

/// Joins the world of a running job as a newcomer: through the job's store (found as
/// [`init_process`] finds it, never hosted here), it waits for the members to admit it with
/// `grow` and gets its communicator in the grown world.
///
/// # Errors
/// As [`init_process`]; [`Error::Store`] when no grow admits it within the setup timeout.
pub fn join_process(cfg: &ResolvedConfig) -> Result<CpuBackend> {
    let info = LaunchInfo::from_env()?;
    let opts = CpuOptions::from_config(cfg)?;
    let job_id = job_id_from_env();
    let secret = job_secret(cfg.cpu.secret.as_ref().map(|s| s.0.as_str()), job_id.as_deref(), info.rank)?;
    let (addr, keep) = store_address(cfg, &info, job_id.as_deref(), &secret, false)?;
    let store = Arc::new(StoreClient::connect(&addr, &secret, opts.setup_timeout)?);
    // The members' first world in their processes, as this one's first here.
    let prefix = format!("oxccl/g{}", GENERATION.fetch_add(1, Ordering::Relaxed));
    let host = host_id(cfg.cpu.host_id.as_deref());
    let wait = opts.setup_timeout;
    let lineage = Arc::new(store_lineage(store, &prefix, secret, host, opts, cfg, keep));
    let backend = super::grow::join(&lineage, wait)?;
    backend.set_lineage(lineage);
    Ok(backend)
}

/// Where the job's store is: `OXCCL_STORE_ADDR`, else `MASTER_ADDR` and `MASTER_PORT`+1
/// (or, on one host without them, loopback at a port derived from the job id). When `serve`
/// (rank 0 of a world that is starting) and the store is not given by address, this process
/// starts it, returned to be kept alive.
///
/// # Errors
/// [`Error::Config`] naming what is missing; [`Error::Io`] when the store's port is taken.
fn store_address(
    cfg: &ResolvedConfig,
    info: &LaunchInfo,
    job_id: Option<&str>,
    secret: &Secret,
    serve: bool,
) -> Result<(String, Vec<Box<dyn Any + Send + Sync>>)> {
    let n = info.world_size;
    let mut keep: Vec<Box<dyn Any + Send + Sync>> = Vec::new();
    // Without MASTER_ADDR, a job whose ranks are all on this host (mpirun/srun on one node)
    // meets on loopback, at a port derived from the launcher's job id.
    let single_host_fallback = (info.master_addr.is_none() && info.local_world_size == n)
        .then_some(job_id)
        .flatten()
        .map(|id| ("127.0.0.1".to_string(), derived_port(id)));
    let addr = match &cfg.cpu.store_addr {
        Some(a) => a.clone(),
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
            let port = match (cfg.cpu.store_port, info.master_port) {
                (Some(p), _) => p,
                (None, Some(m)) => m.checked_add(1).ok_or_else(|| {
                    Error::Config(format!(
                        "MASTER_PORT={m}: rank 0 hosts the store on MASTER_PORT+1, which is not a port; \
                         choose a lower MASTER_PORT or set OXCCL_STORE_PORT"
                    ))
                })?,
                (None, None) => fallback_port.ok_or_else(|| {
                    Error::Config(
                        "MASTER_PORT is not set (rank 0 hosts the store on MASTER_PORT+1, or set OXCCL_STORE_PORT)"
                            .into(),
                    )
                })?,
            };
            if serve {
                let server = StoreServer::bind(&format!("0.0.0.0:{port}"), secret.clone()).map_err(|e| match e {
                    Error::Io { context, kind: std::io::ErrorKind::AddrInUse, message } => Error::Io {
                        context: format!(
                            "{context}: rank 0 hosts the store, and port {port} is taken: either another job \
                             uses it (choose another MASTER_PORT, or set OXCCL_STORE_PORT), or two processes \
                             were started as rank 0 (check that each process has its own RANK)"
                        ),
                        kind: std::io::ErrorKind::AddrInUse,
                        message,
                    },
                    e => e,
                })?;
                keep.push(Box::new(server));
            }
            format!("{host}:{port}")
        }
    };
    Ok((addr, keep))
}

/// Creates this process's rank through the launcher's PMIx (`OXCCL_BOOTSTRAP`, see
/// [`Pmix::for_mode`]): every value is put and committed with PMIx and read from the rank
/// that put it, and the launcher's rank and size must agree with PMIx's.
///
/// # Errors
/// [`Error::Config`] when the launcher's variables and PMIx disagree; as [`init_process`].
fn init_pmix(
    pmix: Pmix,
    rank: usize,
    n: usize,
    secret: &Secret,
    opts: &CpuOptions,
    cfg: &ResolvedConfig,
) -> Result<CpuBackend> {
    if (pmix.rank(), pmix.size()) != (rank, n) {
        return Err(Error::Config(format!(
            "the launcher's variables say rank {rank} of {n}, PMIx says rank {} of {}; set OXCCL_BOOTSTRAP=store \
             to ignore PMIx, or fix the launcher's variables",
            pmix.rank(),
            pmix.size()
        )));
    }
    let pmix: Arc<dyn Rendezvous> = Arc::new(pmix);
    let prefix = format!("oxccl/g{}", GENERATION.fetch_add(1, Ordering::Relaxed));
    let host = host_id(cfg.cpu.host_id.as_deref());
    let backend = build(rank, n, &*pmix, Some(&pmix), &prefix, secret, &host, opts, cfg)?;
    Ok(backend.keep_alive(Box::new(pmix)))
}

/// The only rank of a world of one (no store, no transport to set up).
///
/// # Errors
/// The transport's or the backend's construction errors.
fn alone(cfg: &ResolvedConfig) -> Result<CpuBackend> {
    let transport = Arc::new(RoutedTransport::new(0, Arc::new(Mailbox::new()), vec![None])?);
    CpuBackend::new(NAME, transport, WORLD_COMM_ID, Arc::from([0usize]), 0, cfg.clone())
}

/// Creates rank `rank` of `n` processes that meet through `rdv`, a store the caller shares
/// with the other ranks (a framework's store), their connections authenticated with
/// `secret`.
///
/// # Errors
/// [`Error::InvalidArgument`] for `rank >= n`; [`Error::Config`] for an empty secret;
/// [`Error::Store`] when a rank does not show up in time; transport setup errors.
pub fn init_rendezvous(
    cfg: &ResolvedConfig,
    rank: usize,
    n: usize,
    rdv: &dyn Rendezvous,
    secret: &str,
) -> Result<CpuBackend> {
    if rank >= n {
        return Err(Error::invalid(format!("rank {rank} is not below the world size {n}")));
    }
    let opts = CpuOptions::from_config(cfg)?;
    if n == 1 {
        return alone(cfg);
    }
    let secret = Secret::from_text(secret)?;
    build(rank, n, rdv, None, "oxccl/rendezvous", &secret, &host_id(cfg.cpu.host_id.as_deref()), &opts, cfg)
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
    init_world_with(cfg, n, &CpuOptions::from_config(cfg)?)
}

/// [`init_world`] with explicit options.
///
/// # Errors
/// As [`init_world`].
pub fn init_world_with(cfg: &ResolvedConfig, n: usize, opts: &CpuOptions) -> Result<Vec<CpuBackend>> {
    let host = host_id(cfg.cpu.host_id.as_deref());
    init_world_on(cfg, &vec![host; n], opts)
}

/// A world of threads in this process whose rank `r` poses as being on host `hosts[r]`:
/// ranks of one host talk through shared memory, the others over TCP on loopback, as ranks
/// on several machines would (for tests of what spans hosts).
///
/// # Errors
/// As [`init_world`].
pub fn init_world_on(cfg: &ResolvedConfig, hosts: &[String], opts: &CpuOptions) -> Result<Vec<CpuBackend>> {
    let n = hosts.len();
    if n == 0 {
        return Err(Error::invalid("a world needs at least one rank"));
    }
    let mut opts_local = opts.clone();
    if opts.tcp.bind_addr.is_none() {
        opts_local.tcp.bind_addr = Some(std::net::IpAddr::from([127, 0, 0, 1]));
    }
    let secret = Secret::generate()?;
    let rdv: Arc<dyn Rendezvous> = Arc::new(MemoryRendezvous::default());
    let results: Vec<Result<CpuBackend>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (rdv, secret, host, opts, cfg) = (&rdv, &secret, &hosts[r], &opts_local, cfg);
                s.spawn(move || build(r, n, &**rdv, Some(rdv), WORLD_PREFIX, secret, host, opts, cfg))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Internal("a setup thread panicked".into()))))
            .collect()
    });
    let ranks: Vec<CpuBackend> = results.into_iter().collect::<Result<_>>()?;
    // The world's lineage: newcomer threads join it through an in-process board (tests).
    let board: Arc<dyn Board> = Arc::new(MemoryBoard::default());
    for (r, b) in ranks.iter().enumerate() {
        let (rdv, secret, host, opts, cfg) =
            (Arc::clone(&rdv), secret.clone(), hosts[r].clone(), opts_local.clone(), cfg.clone());
        let build_again = move |rank: usize, n: usize, prefix: &str| {
            build(rank, n, &*rdv, Some(&rdv), prefix, &secret, &host, &opts, &cfg)
        };
        b.set_lineage(Arc::new(Lineage::new(Arc::clone(&board), WORLD_PREFIX, Box::new(build_again), Vec::new())));
    }
    Ok(ranks)
}

/// The store prefix of worlds of threads.
const WORLD_PREFIX: &str = "oxccl/world";

#[cfg(test)]
mod tests;
