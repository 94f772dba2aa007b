//! Bootstrap through PMIx, where the launcher runs it (Slurm's `srun --mpi=pmix`, Open MPI's
//! `mpirun`, PRRTE's `prterun`): ranks exchange their setup data through the resource
//! manager's own tree of servers instead of oxccl's TCP store, which one rank would host and
//! every other rank would connect to.
//!
//! - [`Pmix`]: a PMIx client ([`Pmix::from_env`]), a [`Rendezvous`] whose
//!   [`publish`](Rendezvous::publish) is `PMIx_Put` (`PMIX_GLOBAL`) + `PMIx_Commit` and whose
//!   [`lookup_from`](Rendezvous::lookup_from) is `PMIx_Get` of the owner rank's key with a
//!   `PMIX_TIMEOUT`; [`Pmix::fence`] is `PMIx_Fence` over the whole namespace.
//! - [`choice`]: which bootstrap a job started here would use under `OXCCL_BOOTSTRAP`, and
//!   why (`oxccl info` shows it); [`Pmix::for_mode`] applies the same decision.
//! - `library.rs`: PMIx's C ABI and the `PMIx_*` table, loaded with `dlopen` from
//!   `OXCCL_PMIX_LIBRARY` (a file, or a folder holding `libpmix.so.2`) when set, else
//!   `libpmix.so.2` and `libpmix.so` through the loader's search path; every path tried is
//!   named when none loads.
//!
//! # Under PMIx or not
//!
//! A process was started under PMIx when its launcher set `PMIX_NAMESPACE`, `PMIX_RANK` or a
//! `PMIX_SERVER_URI*` variable (the URI of the local server: `PMIX_SERVER_URI2`, `...21`,
//! `...3`, `...4`, `...41` by protocol version). Without them [`Pmix::from_env`] is `None`
//! and nothing is loaded.
//!
//! # Keys belong to their rank
//!
//! PMIx stores each value with the process that put it: a key is looked up *from* a rank,
//! and every rank may publish the same key name. So [`Rendezvous::lookup_from`] is the call
//! to make; [`Rendezvous::lookup`] without an owner fails with [`Error::Store`] saying so
//! (there is no way to ask "whoever published this" in PMIx without a fence that collects
//! everybody's data, which is what this module avoids).
//!
//! # Fences and direct modex
//!
//! The point of PMIx here is scale, so nothing collects all data: [`Pmix::fence`] is a
//! barrier (`PMIX_COLLECT_DATA` false), and a lookup fetches the one value it needs on
//! demand from the owner's server ("direct modex"). [`Pmix::fence_collecting`] is there for
//! callers who will read most of everybody's values (then one collective exchange is cheaper
//! than many requests).
//!
//! What Open MPI 4.1's `mpirun` (ORTE 4.1.4 with its `ext3x` component over OpenPMIx
//! 4.2.2, Debian 12) does, measured with C programs of 2 to 4 ranks on one node
//! (`tests/library/pmix.rs` goes through the first five wherever Open MPI is installed):
//! - a `PMIx_Get` of another rank's key *without any fence* succeeds: when the owner has
//!   committed it, at once; when the owner commits it later, the get waits for it (a get
//!   with a 10 s `PMIX_TIMEOUT` issued 3 s before the owner's put returned after 3.00 s
//!   with the value);
//! - a get of a key the owner never publishes (even after it committed others) waits the
//!   whole `PMIX_TIMEOUT` and fails with `PMIX_ERR_TIMEOUT`, never `PMIX_ERR_NOT_FOUND`,
//!   also for the caller's own rank. *Without* `PMIX_TIMEOUT` a get of a key that is not
//!   there yet fails with `PMIX_ERR_TIMEOUT` after about 2 s, even when the owner commits
//!   it 5 s later (`--mca pmix_server_max_wait 8` did not change that): so every lookup
//!   here carries a timeout, which is what makes the get wait;
//! - but a get issued while the owner's commit is on its way may fail at once with
//!   `PMIX_ERR_NOT_FOUND` (in about one run of two where 4 ranks put, commit and get each
//!   other's key at once; the same get 10 ms later finds the value): so a lookup that gets
//!   `PMIX_ERR_NOT_FOUND` asks again, after 10 ms doubling up to 200 ms, until its
//!   timeout;
//! - after a fence without data collection, gets behave the same (the fence only
//!   synchronises);
//! - with `PMIX_IMMEDIATE`, a get answers at once from what the local server holds:
//!   the value if its owner has committed it, else `PMIX_ERR_NOT_FOUND`. A lookup with a
//!   zero timeout uses it ("is it there yet?"). Across nodes this sees only data the local
//!   server already has (fetched or collected), since it does not ask the owner's;
//! - a fence that a process of the job leaves (it exits, with status 0 or not, without
//!   fencing) returns `PMIX_ERR_PARTIAL_SUCCESS` at the others at once, with or without
//!   data collection; [`Pmix::fence`] says a process ended.
//!
//! Across nodes, by ORTE's design, a direct-modex request goes to the daemon of the owner's
//! node, whose PMIx server answers once the owner has committed; that path was not measured
//! (one machine), and the same timeout and retry apply to it.
//!
//! # Timeouts
//!
//! `PMIX_TIMEOUT` is a whole number of seconds: a lookup's timeout is rounded up to the next
//! second (at least 1 s, since 0 means "forever" to PMIx), except a zero timeout, which asks
//! with `PMIX_IMMEDIATE` instead. Fences and the job-level queries made by
//! [`Pmix::from_env`] wait at most [`Pmix::timeout`] (default
//! [`DEFAULT_TIMEOUT`](crate::config::DEFAULT_TIMEOUT); [`Pmix::with_timeout`]).
//!
//! # Threads
//!
//! OpenPMIx's client calls are thread-safe (since PMIx 2 every call is handed to the
//! library's progress thread and the caller waits for its answer), and the data calls
//! (`PMIx_Put`/`PMIx_Commit`, `PMIx_Get`, `PMIx_Fence`) are made concurrently from as many
//! threads as call them. `PMIx_Init` and `PMIx_Finalize` (reference counted by the library:
//! each [`Pmix`] does one of each) are serialized against every other call of this process
//! by one process-wide read-write lock, so that no call runs while another [`Pmix`] of the
//! process finalizes.

mod library;

use std::ffi::{c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::Duration;

use serde::Serialize;

use self::library::{Info, Loaded, Proc, Value};
use crate::bootstrap::Rendezvous;
use crate::config::registry;
use crate::config::BootstrapMode;
use crate::error::{Error, Result};

/// Init and finalize hold it for writing, every other call for reading (see the module
/// docs, "Threads").
static LIFECYCLE: RwLock<()> = RwLock::new(());

/// A read guard on [`LIFECYCLE`] (a panic elsewhere does not stop PMIx calls).
fn calls() -> std::sync::RwLockReadGuard<'static, ()> {
    LIFECYCLE.read().unwrap_or_else(|p| p.into_inner())
}

/// A write guard on [`LIFECYCLE`].
fn lifecycle() -> std::sync::RwLockWriteGuard<'static, ()> {
    LIFECYCLE.write().unwrap_or_else(|p| p.into_inner())
}

/// What the environment says of a PMIx server that started this process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PmixEnv {
    /// `PMIX_NAMESPACE`, when set.
    pub namespace: Option<String>,
    /// `PMIX_RANK`, when set.
    pub rank: Option<String>,
    /// The names of the `PMIX_SERVER_URI*` variables set, sorted.
    pub server_uris: Vec<String>,
}

impl PmixEnv {
    /// The signs of PMIx among `vars` (name, value); `None` when there are none. An empty
    /// variable counts as unset.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Option<PmixEnv> {
        let mut env = PmixEnv { namespace: None, rank: None, server_uris: Vec::new() };
        for (k, v) in vars {
            let v = v.trim();
            if v.is_empty() {
                continue;
            }
            match k.as_str() {
                "PMIX_NAMESPACE" => env.namespace = Some(v.to_string()),
                "PMIX_RANK" => env.rank = Some(v.to_string()),
                k if k.starts_with("PMIX_SERVER_URI") => env.server_uris.push(k.to_string()),
                _ => {}
            }
        }
        env.server_uris.sort();
        (env.namespace.is_some() || env.rank.is_some() || !env.server_uris.is_empty()).then_some(env)
    }

    /// The signs of PMIx in this process's environment (variables that are not UTF-8 are
    /// read lossily).
    pub fn from_env() -> Option<PmixEnv> {
        PmixEnv::from_vars(
            std::env::vars_os().map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned())),
        )
    }

    /// `PMIX_NAMESPACE=..., PMIX_RANK=..., PMIX_SERVER_URI4`: what was found.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = &self.namespace {
            parts.push(format!("PMIX_NAMESPACE={n}"));
        }
        if let Some(r) = &self.rank {
            parts.push(format!("PMIX_RANK={r}"));
        }
        parts.extend(self.server_uris.iter().cloned());
        parts.join(", ")
    }
}

/// A PMIx client library that loads: where it is and what it says it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LibraryStatus {
    /// The file that opened (the name handed to the loader, e.g. `libpmix.so.2`, resolved
    /// to the file it found where the loader can tell).
    pub path: PathBuf,
    /// `PMIx_Get_version()`, e.g. `OpenPMIx 4.2.2 (PMIx Standard: 4.2, ...)`.
    pub version: String,
}

/// Loads the PMIx client library as [`Pmix::from_env`] would (`library`: the
/// `OXCCL_PMIX_LIBRARY` setting, a file or a folder), without initialising it.
///
/// # Errors
/// [`Error::Store`] naming every path tried and why each failed.
pub fn probe(library: Option<&Path>) -> Result<LibraryStatus> {
    let l = load(library)?;
    Ok(LibraryStatus { path: l.path, version: l.version })
}

/// Loads the library from `library` (a file or a folder) or the loader's search path.
fn load(library: Option<&Path>) -> Result<Loaded> {
    library::load(&library::candidates(library))
        .map(|mut l| {
            l.path = resolved_path(&l);
            l
        })
        .map_err(|tried| Error::Store(format!("the PMIx client library (libpmix) does not load; tried {tried}")))
}

/// The file the loader opened for `l` (through `dladdr` on `PMIx_Init`), or the candidate.
fn resolved_path(l: &Loaded) -> PathBuf {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let addr = l.lib.init as *const libc::c_void;
    // SAFETY: `addr` is the address of a function of a loaded (never closed) library, and
    // `info` is a writable Dl_info; dladdr only writes it.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) } != 0;
    if found {
        // SAFETY: dladdr succeeded, so it filled `info` (zeroed before, so every field is
        // initialised either way).
        let info = unsafe { info.assume_init() };
        if !info.dli_fname.is_null() {
            // SAFETY: dli_fname is the NUL-terminated path of the loaded object, owned by
            // the loader for as long as the object stays loaded (forever here).
            let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
            if name.starts_with('/') {
                return PathBuf::from(name);
            }
        }
    }
    l.path.clone()
}

/// How a job started here would bootstrap, and why ([`choice`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "via", rename_all = "snake_case")]
pub enum BootstrapChoice {
    /// Through the launcher's PMIx.
    Pmix {
        /// The PMIx library that loads.
        library: PathBuf,
        /// Its version line.
        version: String,
        /// The job's namespace (`PMIX_NAMESPACE`), or `unknown` where only a server URI was
        /// set.
        namespace: String,
        /// Why.
        reason: String,
    },
    /// Through oxccl's TCP store.
    Store {
        /// Why (and why not PMIx).
        reason: String,
        /// Whether this is `auto` falling back: the launcher runs PMIx but its library does
        /// not load (worth fixing: the store needs a reachable rank 0 and is one hub for
        /// every rank).
        fallback: bool,
    },
    /// Neither: `OXCCL_BOOTSTRAP=pmix` and PMIx cannot be used; setup fails with this reason.
    Unusable {
        /// What is missing.
        reason: String,
    },
}

impl BootstrapChoice {
    /// Why this choice.
    pub fn reason(&self) -> &str {
        match self {
            BootstrapChoice::Pmix { reason, .. }
            | BootstrapChoice::Store { reason, .. }
            | BootstrapChoice::Unusable { reason } => reason,
        }
    }

    /// Whether the bootstrap goes through PMIx.
    pub fn is_pmix(&self) -> bool {
        matches!(self, BootstrapChoice::Pmix { .. })
    }
}

/// Which bootstrap a job started in this process's environment would use under `mode`
/// (`OXCCL_BOOTSTRAP`), with `library` the `OXCCL_PMIX_LIBRARY` setting. Loads the PMIx
/// library where the launcher runs PMIx, initialises nothing.
///
/// - `store`: the store, always.
/// - `auto`: PMIx when the launcher runs it and its library loads; else the store, saying
///   why not PMIx.
/// - `pmix`: PMIx, or [`BootstrapChoice::Unusable`] saying what is missing.
pub fn choice(mode: BootstrapMode, library: Option<&Path>) -> BootstrapChoice {
    choice_in(mode, library, PmixEnv::from_env())
}

/// [`choice`] with the signs of PMIx given (`None`: not started under PMIx).
pub fn choice_in(mode: BootstrapMode, library: Option<&Path>, env: Option<PmixEnv>) -> BootstrapChoice {
    const NO_VARS: &str = "no PMIX_NAMESPACE, PMIX_RANK or PMIX_SERVER_URI* in the environment";
    let Some(env) = env else {
        return match mode {
            BootstrapMode::Store => BootstrapChoice::Store { reason: "OXCCL_BOOTSTRAP=store".into(), fallback: false },
            BootstrapMode::Auto => {
                BootstrapChoice::Store { reason: format!("the launcher runs no PMIx ({NO_VARS})"), fallback: false }
            }
            BootstrapMode::Pmix => BootstrapChoice::Unusable {
                reason: format!(
                    "OXCCL_BOOTSTRAP=pmix but this process was not started under PMIx ({NO_VARS}); launch it \
                     with srun --mpi=pmix, mpirun or prterun, or set OXCCL_BOOTSTRAP=auto"
                ),
            },
        };
    };
    if mode == BootstrapMode::Store {
        return BootstrapChoice::Store {
            reason: format!("OXCCL_BOOTSTRAP=store (the launcher runs PMIx: {}, unused)", env.describe()),
            fallback: false,
        };
    }
    let setting = if mode == BootstrapMode::Pmix { "OXCCL_BOOTSTRAP=pmix" } else { "OXCCL_BOOTSTRAP=auto" };
    match probe(library) {
        Ok(lib) => BootstrapChoice::Pmix {
            reason: format!("{setting}: the launcher runs PMIx ({}) and its library loads", env.describe()),
            library: lib.path,
            version: lib.version,
            namespace: env.namespace.clone().unwrap_or_else(|| "unknown".into()),
        },
        Err(e) => {
            let why = format!(
                "the launcher runs PMIx ({}) but {}; install the PMIx client library (Debian: libpmix2) or \
                 point OXCCL_PMIX_LIBRARY at it",
                env.describe(),
                e.reason()
            );
            if mode == BootstrapMode::Pmix {
                BootstrapChoice::Unusable { reason: format!("{setting}: {why}") }
            } else {
                BootstrapChoice::Store { reason: format!("{setting}: {why}"), fallback: true }
            }
        }
    }
}

/// The first pause before a lookup asks again after `PMIX_ERR_NOT_FOUND`; it doubles up to
/// [`NOT_FOUND_MAX_PAUSE`].
const NOT_FOUND_FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between two asks of a lookup.
const NOT_FOUND_MAX_PAUSE: Duration = Duration::from_millis(200);

/// `timeout` as PMIx's whole seconds, rounded up, at least 1 (0 means "forever" to PMIx).
fn whole_seconds(timeout: Duration) -> c_int {
    let s = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
    c_int::try_from(s.max(1)).unwrap_or(c_int::MAX)
}

/// `key` as PMIx accepts it: not empty, at most 511 bytes, no NUL, not in PMIx's reserved
/// `pmix` prefix.
fn pmix_key(key: &str) -> Result<CString> {
    if key.is_empty() || key.len() > library::MAX_KEYLEN || key.starts_with("pmix") {
        return Err(Error::invalid(format!(
            "`{key}` cannot be a PMIx key: keys have 1 to {} bytes and do not start with `pmix` (reserved)",
            library::MAX_KEYLEN
        )));
    }
    CString::new(key).map_err(|_| Error::invalid(format!("the PMIx key {key:?} contains a NUL byte")))
}

/// A PMIx client of the launcher's server: this process's rank in its namespace, the job's
/// size, and a [`Rendezvous`] through PMIx. Finalized on drop.
///
/// ```no_run
/// use oxccl::bootstrap::{pmix::Pmix, Rendezvous};
/// use std::time::Duration;
/// let Some(pmix) = Pmix::from_env() else { return Ok(()) }; // not under PMIx
/// let pmix = pmix?;
/// pmix.publish("addr", b"10.0.0.7:41000")?;
/// pmix.fence()?; // optional: lookups wait for their key anyway
/// for r in (0..pmix.size()).filter(|&r| r != pmix.rank()) {
///     let addr = pmix.lookup_from(r, "addr", Duration::from_secs(60))?;
/// #   drop(addr);
/// }
/// # Ok::<(), oxccl::Error>(())
/// ```
#[derive(Debug)]
pub struct Pmix {
    lib: library::Library,
    path: PathBuf,
    version: String,
    me: Proc,
    namespace: String,
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    timeout: Duration,
}

impl Pmix {
    /// A client of the PMIx server that started this process, or `None` when it was not
    /// started under PMIx ([`PmixEnv::from_env`]). The library comes from
    /// `OXCCL_PMIX_LIBRARY` when set (read through the settings registry), else the
    /// loader's search path. `OXCCL_BOOTSTRAP` is not consulted: [`Pmix::for_mode`] does.
    ///
    /// # Errors
    /// `Some(Err)`: the library does not load (every path tried is named), `PMIx_Init`
    /// fails, or the job's size and local rank cannot be read.
    pub fn from_env() -> Option<Result<Pmix>> {
        PmixEnv::from_env()?;
        Some(registry::PMIX_LIBRARY.from_env().and_then(|lib| Pmix::init(lib.as_deref().map(Path::new))))
    }

    /// [`Pmix::from_env`] with the library given (`None`: the loader's search path), as a
    /// resolved configuration holds it.
    ///
    /// # Errors
    /// As [`Pmix::from_env`].
    pub fn from_env_with(library: Option<&Path>) -> Option<Result<Pmix>> {
        PmixEnv::from_env()?;
        Some(Pmix::init(library))
    }

    /// Applies `OXCCL_BOOTSTRAP` (`mode`) as [`choice`] decides: `Ok(Some)` to bootstrap
    /// through PMIx, `Ok(None)` to use the store.
    ///
    /// # Errors
    /// [`Error::Config`] when `mode` is `pmix` and PMIx cannot be used (not started under
    /// it, library missing); the errors of [`Pmix::from_env`] when the launcher runs PMIx,
    /// its library loads and the client does not start (also under `auto`: a launcher that
    /// runs PMIx and a client that cannot reach it is a problem to report, not to hide;
    /// `OXCCL_BOOTSTRAP=store` bypasses PMIx).
    pub fn for_mode(mode: BootstrapMode, library: Option<&Path>) -> Result<Option<Pmix>> {
        match choice(mode, library) {
            BootstrapChoice::Pmix { library, .. } => Pmix::init(Some(&library)).map(Some).map_err(|e| {
                Error::Store(format!("{} (set OXCCL_BOOTSTRAP=store to bootstrap through oxccl's store)", e.reason()))
            }),
            BootstrapChoice::Store { reason, fallback } => {
                if fallback {
                    tracing::warn!("bootstrap through oxccl's store: {reason}");
                } else {
                    tracing::debug!("bootstrap through oxccl's store: {reason}");
                }
                Ok(None)
            }
            BootstrapChoice::Unusable { reason } => Err(Error::Config(reason)),
        }
    }

    /// Loads the library and starts the client (`PMIx_Init`), whatever the environment says.
    ///
    /// # Errors
    /// As [`Pmix::from_env`].
    pub fn init(library: Option<&Path>) -> Result<Pmix> {
        let loaded = load(library)?;
        let lib = loaded.lib;
        let mut me = Proc::undefined();
        let rc = {
            let _g = lifecycle();
            // SAFETY: `me` is a writable pmix_proc_t; a null info array with 0 entries is
            // allowed (pmix.h). The library stays loaded for the life of the process.
            unsafe { (lib.init)(&mut me, std::ptr::null_mut(), 0) }
        };
        if rc != library::SUCCESS {
            return Err(Error::Store(format!(
                "PMIx_Init of {} ({}) failed: {}; is the launcher's PMIx server running and reachable?",
                loaded.path.display(),
                loaded.version,
                lib.describe(rc)
            )));
        }
        let mut p = Pmix {
            lib,
            path: loaded.path,
            version: loaded.version,
            me,
            namespace: me.namespace(),
            rank: me.rank as usize,
            size: 0,
            local_rank: 0,
            local_size: 0,
            timeout: crate::config::DEFAULT_TIMEOUT,
        };
        // From here on, dropping `p` finalizes.
        let job = me.with_rank(library::RANK_WILDCARD);
        p.size = p.get_number(&job, library::KEY_JOB_SIZE)?;
        p.local_size = p.get_number(&job, library::KEY_LOCAL_SIZE)?;
        p.local_rank = p.get_number(&me, library::KEY_LOCAL_RANK)?;
        if p.rank >= p.size || p.local_rank >= p.local_size {
            return Err(Error::Store(format!(
                "PMIx says this is rank {} of {} (local rank {} of {}), which does not fit",
                p.rank, p.size, p.local_rank, p.local_size
            )));
        }
        Ok(p)
    }

    /// The deadline of fences, and of the job-level queries (default
    /// [`DEFAULT_TIMEOUT`](crate::config::DEFAULT_TIMEOUT)).
    pub fn with_timeout(mut self, timeout: Duration) -> Pmix {
        self.timeout = timeout;
        self
    }

    /// The deadline of fences.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// This process's rank in its namespace (the job).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes in the job (`PMIX_JOB_SIZE`).
    pub fn size(&self) -> usize {
        self.size
    }

    /// This process's rank among the job's processes on its node (`PMIX_LOCAL_RANK`).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The number of the job's processes on this node (`PMIX_LOCAL_SIZE`).
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    /// The job's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The PMIx library in use.
    pub fn library(&self) -> &Path {
        &self.path
    }

    /// The library's version line.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// A barrier of every process of the namespace, without collecting their data (lookups
    /// fetch what they need), within [`Pmix::timeout`].
    ///
    /// # Errors
    /// [`Error::Store`] when the fence fails or times out.
    pub fn fence(&self) -> Result<()> {
        self.fence_inner(false)
    }

    /// A barrier that also brings every process's published data to every node
    /// (`PMIX_COLLECT_DATA`): later lookups are answered locally. Worth it when most ranks
    /// read most values.
    ///
    /// # Errors
    /// As [`Pmix::fence`].
    pub fn fence_collecting(&self) -> Result<()> {
        self.fence_inner(true)
    }

    fn fence_inner(&self, collect: bool) -> Result<()> {
        let all = self.me.with_rank(library::RANK_WILDCARD);
        let info = [Info::collect_data(collect), Info::timeout(whole_seconds(self.timeout))];
        let rc = {
            let _g = calls();
            // SAFETY: one pmix_proc_t (the namespace, every rank) and two pmix_info_t that
            // live across the call and own no memory; PMIx only reads them.
            unsafe { (self.lib.fence)(&all, 1, info.as_ptr(), info.len()) }
        };
        match rc {
            library::SUCCESS => Ok(()),
            library::ERR_TIMEOUT => Err(Error::Store(format!(
                "the PMIx fence of the {} processes of namespace {} did not complete within {:?} (PMIx_Fence: {})",
                self.size,
                self.namespace,
                self.timeout,
                self.lib.describe(rc)
            ))),
            library::ERR_PARTIAL_SUCCESS => Err(Error::Store(format!(
                "the PMIx fence of namespace {} did not complete: a process of the job ended before reaching it \
                 (PMIx_Fence: {})",
                self.namespace,
                self.lib.describe(rc)
            ))),
            _ => Err(Error::Store(format!(
                "the PMIx fence of namespace {} failed: {}",
                self.namespace,
                self.lib.describe(rc)
            ))),
        }
    }

    /// `PMIx_Get(proc, key)`: the value, copied out and released. `timeout`: `None` for
    /// `PMIX_IMMEDIATE`.
    fn get(&self, proc_: &Proc, key: &CStr, timeout: Option<c_int>) -> std::result::Result<Got, library::Status> {
        let info = match timeout {
            Some(s) => Info::timeout(s),
            None => Info::immediate(),
        };
        let mut out: *mut Value = std::ptr::null_mut();
        let _g = calls();
        // SAFETY: `proc_`, `key` (NUL-terminated) and the info live across the call, which
        // only reads them; `out` receives a value PMIx allocates, released below.
        let rc = unsafe { (self.lib.get)(proc_, key.as_ptr(), &info, 1, &mut out) };
        if rc != library::SUCCESS {
            // SAFETY: null, or a value of this library's PMIx_Get, not used afterwards.
            unsafe { self.lib.release(out) };
            return Err(rc);
        }
        if out.is_null() {
            return Ok(Got::Other(library::UNDEF));
        }
        // SAFETY: PMIx_Get succeeded, so `out` points to a value it filled.
        let v = unsafe { &*out };
        let got = match v.kind {
            // SAFETY: the byte object member is set (`kind`), pointing at `size` bytes (or
            // null with size 0) owned by the value until it is released below.
            library::BYTE_OBJECT => Got::Bytes(unsafe {
                let bo = v.data.bo;
                if bo.bytes.is_null() || bo.size == 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(bo.bytes.cast::<u8>(), bo.size).to_vec()
                }
            }),
            // SAFETY: the string member is set (`kind`): null or NUL-terminated, owned by
            // the value until it is released below.
            library::STRING => Got::Bytes(unsafe {
                let s = v.data.string;
                if s.is_null() {
                    Vec::new()
                } else {
                    CStr::from_ptr(s).to_bytes().to_vec()
                }
            }),
            _ => match v.as_u64() {
                Some(n) => Got::Number(n),
                None => Got::Other(v.kind),
            },
        };
        // SAFETY: the value PMIx_Get returned, not used after this.
        unsafe { self.lib.release(out) };
        Ok(got)
    }

    /// A job-level number (`PMIX_JOB_SIZE`, ...), within [`Pmix::timeout`].
    fn get_number(&self, proc_: &Proc, key: &CStr) -> Result<usize> {
        let name = key.to_string_lossy();
        match self.get(proc_, key, Some(whole_seconds(self.timeout))) {
            Ok(Got::Number(n)) => usize::try_from(n).map_err(|_| Error::Store(format!("PMIx's {name} is {n}"))),
            Ok(other) => Err(Error::Store(format!("PMIx's {name} is not a number but {}", other.describe()))),
            Err(rc) => Err(Error::Store(format!(
                "PMIx gives no {name} for {:?}: {}; the launcher's PMIx server should provide it",
                proc_,
                self.lib.describe(rc)
            ))),
        }
    }
}

/// What a get returned.
#[derive(Debug)]
enum Got {
    Bytes(Vec<u8>),
    Number(u64),
    /// Another type (`PMIX_*` data type).
    Other(library::DataType),
}

impl Got {
    /// What it is, for an error message.
    fn describe(&self) -> String {
        match self {
            Got::Bytes(b) => format!("{} bytes", b.len()),
            Got::Number(n) => format!("the number {n}"),
            Got::Other(t) => format!("a value of PMIx data type {t}"),
        }
    }
}

impl Rendezvous for Pmix {
    /// `PMIx_Put(PMIX_GLOBAL, key, value)` as a byte object, then `PMIx_Commit`: the value
    /// is with the local PMIx server when this returns, for any rank to fetch.
    fn publish(&self, key: &str, value: &[u8]) -> Result<()> {
        let k = pmix_key(key)?;
        let mut v = Value::bytes(value);
        let _g = calls();
        // SAFETY: `k` is NUL-terminated and `v` a byte object over `value`, both alive
        // across the call; PMIx_Put copies the value into its cache (it does not keep our
        // pointers).
        let rc = unsafe { (self.lib.put)(library::GLOBAL, k.as_ptr(), &mut v) };
        if rc != library::SUCCESS {
            return Err(Error::Store(format!("PMIx_Put of `{key}` failed: {}", self.lib.describe(rc))));
        }
        // SAFETY: no arguments; pushes what was put to the local server.
        let rc = unsafe { (self.lib.commit)() };
        if rc != library::SUCCESS {
            return Err(Error::Store(format!("PMIx_Commit of `{key}` failed: {}", self.lib.describe(rc))));
        }
        Ok(())
    }

    /// PMIx keeps each value with its owner: use [`Rendezvous::lookup_from`]. Always fails.
    fn lookup(&self, key: &str, _timeout: Duration) -> Result<Vec<u8>> {
        Err(Error::Store(format!(
            "a PMIx lookup needs the rank that published `{key}` (PMIx stores each value with its owner): \
             call lookup_from(owner, key, timeout)"
        )))
    }

    /// `PMIx_Get` of `owner`'s `key` with `PMIX_TIMEOUT` (whole seconds, rounded up), asked
    /// again after `PMIX_ERR_NOT_FOUND` until `timeout` has passed; a zero `timeout` asks
    /// once with `PMIX_IMMEDIATE` instead (what the local server holds now).
    fn lookup_from(&self, owner: usize, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let k = pmix_key(key)?;
        let rank = u32::try_from(owner).ok().filter(|_| owner < self.size).ok_or_else(|| {
            Error::invalid(format!("rank {owner} is not in this PMIx job of {} processes", self.size))
        })?;
        let target = self.me.with_rank(rank);
        // No deadline for a timeout too long to add (it is "forever" in practice).
        let deadline = std::time::Instant::now().checked_add(timeout);
        let mut pause = NOT_FOUND_FIRST_PAUSE;
        let mut tries = 0u32;
        let (got, seconds) = loop {
            let left = deadline.map_or(timeout, |d| d.saturating_duration_since(std::time::Instant::now()));
            let seconds = (!timeout.is_zero()).then(|| whole_seconds(left));
            tries += 1;
            match self.get(&target, &k, seconds) {
                // A get that meets the owner's commit on its way answers NOT_FOUND at once
                // (see the module docs): ask again until the deadline.
                Err(library::ERR_NOT_FOUND) if seconds.is_some() && left > pause => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(NOT_FOUND_MAX_PAUSE);
                }
                got => break (got, seconds),
            }
        };
        if tries > 1 {
            tracing::debug!("PMIx_Get of rank {owner}'s `{key}`: {tries} tries (PMIX_ERR_NOT_FOUND before)");
        }
        match got {
            Ok(Got::Bytes(b)) => Ok(b),
            Ok(other) => Err(Error::Store(format!(
                "rank {owner}'s `{key}` is not bytes or a string in PMIx but {}",
                other.describe()
            ))),
            Err(rc @ (library::ERR_TIMEOUT | library::ERR_NOT_FOUND)) => {
                let waited = match seconds {
                    Some(_) => format!("within {timeout:?} ({tries} PMIx_Get, whose timeouts are whole seconds)"),
                    None => "yet (a zero timeout asks the local PMIx server once)".to_string(),
                };
                Err(Error::Store(format!(
                    "rank {owner} did not publish `{key}` {waited}; PMIx_Get: {}",
                    self.lib.describe(rc)
                )))
            }
            Err(rc) => {
                Err(Error::Store(format!("PMIx_Get of rank {owner}'s `{key}` failed: {}", self.lib.describe(rc))))
            }
        }
    }
}

impl Drop for Pmix {
    fn drop(&mut self) {
        let rc = {
            let _g = lifecycle();
            // SAFETY: this value's PMIx_Init succeeded and is matched by this one finalize
            // (PMIx counts them); a null info array with 0 entries is allowed.
            unsafe { (self.lib.finalize)(std::ptr::null(), 0) }
        };
        if rc != library::SUCCESS {
            tracing::debug!("PMIx_Finalize: {}", self.lib.describe(rc));
        }
    }
}

#[cfg(test)]
mod tests;
