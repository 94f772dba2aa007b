//! Configuration: one registry of settings ([`registry`]), one parser per kind of value
//! ([`parse`]), and a builder ([`Config`]) whose settings win over the `OXCCL_*` environment
//! variables, which win over the defaults. Everything is resolved once, by
//! [`Config::resolve`], into the [`ResolvedConfig`] that backends receive; no other code
//! reads an `OXCCL_*` variable (the launcher's own variables, `RANK`, `MASTER_ADDR`, ...,
//! are read by `bootstrap`). The `OXCCL_CONFORMANCE_*` rows of the table are the
//! conformance suite's ([`registry::CONFORMANCE`]), which `Config` leaves alone.
//!
//! An empty variable counts as unset. Every error names the variable (or says it was set
//! with the builder) and the value, and says what is accepted.
//!
#![doc = include_str!("SETTINGS.md")]

pub mod cpu;
pub mod gpu;
pub mod mpi;
pub mod parse;
pub mod perf;
mod profile;
mod reader;
pub mod registry;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::algorithm::{Algorithm, AlgorithmOverrides};
use crate::error::{Error, Result};
use crate::op_kind::OpKind;
use reader::{choice, micros, origin, size, text, Reader};

pub use cpu::{BootstrapMode, CpuSettings, SecretText, TransportChoice};
pub use gpu::{GpuSettings, HostBuffers};
pub use mpi::{CudaAware, HalfReduce, MpiConfig, ThreadLevel};
pub use parse::log_directives;
pub use perf::PerfSettings;
pub use profile::ProfileSettings;

/// The default deadline of every blocking wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Which backend to use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The available backend with the highest priority.
    #[default]
    Auto,
    /// The backend with this name (`local`, `cpu`, `nccl`, `rccl`, `mpi`).
    Named(String),
}

impl BackendChoice {
    /// Parses `auto` or a backend name (case-insensitive).
    pub fn parse(s: &str) -> BackendChoice {
        let s = s.trim().to_ascii_lowercase();
        if s.is_empty() || s == "auto" {
            BackendChoice::Auto
        } else {
            BackendChoice::Named(s)
        }
    }
}

/// Builder for communicators. Unset settings fall back to `OXCCL_*` environment variables,
/// then to defaults; every setting of the [`registry`] can be set, by name with
/// [`Config::set`] or with the typed methods.
///
/// ```
/// use std::time::Duration;
/// let cfg = oxccl::Config::new().backend("local").timeout(Duration::from_secs(10));
/// let comms = cfg.init_world(2).unwrap();
/// assert_eq!(comms[1].rank(), 1);
///
/// // Any setting by its variable's name; a bad value is refused at once.
/// let cfg = oxccl::Config::new().set("OXCCL_SHM_SLOT_BYTES", "256KiB").unwrap();
/// assert!(oxccl::Config::new().set("OXCCL_SPIN_US", "-5").is_err());
/// # drop(cfg);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Settings given by name, as text (already checked against their kind).
    values: BTreeMap<&'static str, String>,
    timeout: Option<Duration>,
    algorithms: Option<AlgorithmOverrides>,
    mpi: Option<MpiConfig>,
}

/// A configuration with every value decided (builder, else environment, else default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedConfig {
    /// The backend to use.
    pub backend: BackendChoice,
    /// Deadline of every blocking wait.
    pub timeout: Duration,
    /// Algorithm overrides.
    pub algorithms: AlgorithmOverrides,
    /// Settings of the `cpu` backend.
    pub cpu: CpuSettings,
    /// Settings of the `mpi` backend.
    pub mpi: MpiConfig,
    /// Settings of the `nccl` and `rccl` backends.
    pub gpu: GpuSettings,
    /// The log's filter directives (`OXCCL_LOG`, as [`parse::log_directives`] writes them).
    pub log: String,
    /// The flight recorder's settings.
    pub perf: PerfSettings,
}

impl Config {
    /// An empty builder: everything comes from the environment or defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets any setting of the [`registry`] by its variable's name (`OXCCL_SHM_SLOT_BYTES`,
    /// ...; case-insensitive), with a value in the variable's grammar. It wins over the
    /// environment.
    ///
    /// # Errors
    /// [`Error::Config`] when no setting has that name, or the value is not one it accepts.
    pub fn set(mut self, name: &str, value: &str) -> Result<Self> {
        let s = registry::find(name).ok_or_else(|| {
            Error::Config(format!(
                "there is no setting `{name}`; the settings are {}",
                registry::ALL.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
            ))
        })?;
        s.check(value).map_err(|why| Error::Config(format!("{}: {why}", origin(s, value, true))))?;
        match s.name {
            n if n == registry::TIMEOUT.name => self.timeout = Some(parse::duration(value).map_err(Error::Config)?),
            n if n == registry::ALGO.name => self.algorithms = Some(AlgorithmOverrides::parse(value)?),
            n if n.starts_with("OXCCL_MPI_") => {
                // The typed MPI settings, if given, stay the base; this one setting wins.
                self.values.insert(s.name, value.to_string());
            }
            _ => {
                self.values.insert(s.name, value.to_string());
            }
        }
        Ok(self)
    }

    /// Chooses the backend by name (`auto`, `local`, `cpu`, `nccl`, `rccl`, `mpi`); an
    /// unknown name is reported when the configuration is resolved.
    pub fn backend(mut self, name: &str) -> Self {
        self.values.insert(registry::BACKEND.name, name.to_string());
        self
    }

    /// Sets the deadline of every blocking wait (overridable per call).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Forces `algo` for every operation it applies to (the others choose automatically).
    pub fn algorithm(mut self, algo: Algorithm) -> Self {
        self.algorithms = Some(AlgorithmOverrides::global(algo));
        self
    }

    /// Forces `algo` for `op`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `algo` cannot run `op`.
    pub fn algorithm_for(mut self, op: OpKind, algo: Algorithm) -> Result<Self> {
        let mut o = self.algorithms.take().unwrap_or_default();
        o.set(op, algo)?;
        self.algorithms = Some(o);
        Ok(self)
    }

    /// Chooses the transports of the `cpu` backend (`OXCCL_TRANSPORT`).
    pub fn transport(mut self, t: TransportChoice) -> Self {
        let v = match t {
            TransportChoice::Auto => "auto",
            TransportChoice::Shm => "shm",
            TransportChoice::Tcp => "tcp",
        };
        self.values.insert(registry::TRANSPORT.name, v.to_string());
        self
    }

    /// Sets every setting of the `mpi` backend at once (the `OXCCL_MPI_*` variables are then
    /// ignored, except those also given to [`Config::set`]).
    pub fn mpi(mut self, mpi: MpiConfig) -> Self {
        self.mpi = Some(mpi);
        self
    }

    /// Decides every value, reading the process environment for unset ones.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable (or builder setting) whose value cannot be used.
    pub fn resolve(&self) -> Result<ResolvedConfig> {
        self.resolve_with(|k| std::env::var(k).ok())
    }

    /// Like [`Config::resolve`], reading variables through `env` (for tests and embedding).
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable (or builder setting) whose value cannot be used.
    pub fn resolve_with(&self, env: impl Fn(&str) -> Option<String>) -> Result<ResolvedConfig> {
        use registry as r;
        let rd = Reader { builder: &self.values, env };
        // Every setting is checked, also those this process only passes on (OXCCL_NODE_RANK).
        // A setting the typed builder methods decided is not read from the environment.
        for s in registry::ALL {
            let typed = (s.name == r::TIMEOUT.name && self.timeout.is_some())
                || (s.name == r::ALGO.name && self.algorithms.is_some())
                || (s.name.starts_with("OXCCL_MPI_") && self.mpi.is_some());
            if !typed || self.values.contains_key(s.name) {
                rd.get(s, |_| Ok(()))?;
            }
        }
        let backend = BackendChoice::parse(rd.or_default(&r::BACKEND, choice(&r::BACKEND))?);
        let timeout = match self.timeout {
            Some(t) if t.is_zero() => {
                return Err(Error::Config("the timeout set with Config::timeout must be greater than zero".into()))
            }
            Some(t) => t,
            None => rd.or_default(&r::TIMEOUT, parse::duration)?,
        };
        let algorithms = match &self.algorithms {
            Some(a) => a.clone(),
            None => rd.get(&r::ALGO, |v| AlgorithmOverrides::parse(v).map_err(|e| e.to_string()))?.unwrap_or_default(),
        };
        let transport = match rd.or_default(&r::TRANSPORT, choice(&r::TRANSPORT))? {
            "shm" => TransportChoice::Shm,
            "tcp" => TransportChoice::Tcp,
            _ => TransportChoice::Auto,
        };
        let cpu = CpuSettings {
            transport,
            shm_slot_bytes: rd.or_default(&r::SHM_SLOT_BYTES, size)?,
            shm_single_copy: rd.or_default(&r::SHM_SINGLE_COPY, parse::flag)?,
            shm_ring_bytes: rd.or_default(&r::SHM_RING_BYTES, size)?,
            spin: rd.get(&r::SPIN_US, micros)?,
            yield_for: rd.get(&r::YIELD_US, micros)?,
            tune_file: rd.get(&r::TUNE_FILE, text)?.map(std::path::PathBuf::from),
            socket_ifname: rd.get(&r::SOCKET_IFNAME, text)?,
            max_frame: rd.or_default(&r::MAX_FRAME, size)?,
            sockets_per_peer: rd.or_default(&r::SOCKETS_PER_PEER, |v| parse::count(v, 1, 8).map(|n| n as usize))?,
            host_id: rd.get(&r::HOST_ID, text)?,
            force_staging: rd.or_default(&r::CPU_FORCE_STAGING, parse::flag)?,
            store_addr: rd.get(&r::STORE_ADDR, text)?,
            store_port: rd.get(&r::STORE_PORT, parse::port)?,
            secret: rd.get(&r::SECRET, |v| Ok(SecretText(v.to_string())))?,
            bootstrap: match rd.or_default(&r::BOOTSTRAP, choice(&r::BOOTSTRAP))? {
                "store" => BootstrapMode::Store,
                "pmix" => BootstrapMode::Pmix,
                _ => BootstrapMode::Auto,
            },
            pmix_library: rd.get(&r::PMIX_LIBRARY, text)?.map(std::path::PathBuf::from),
            join: rd.or_default(&r::JOIN, parse::flag)?,
        };
        let mpi = mpi::resolve(self.mpi.clone(), &rd)?;
        let gpu = gpu::resolve(&rd)?;
        let log = rd.or_default(&r::LOG, parse::log_directives)?;
        let perf = PerfSettings {
            flight_records: rd.or_default(&r::FR_SIZE, |v| v.trim().parse::<usize>().map_err(|e| e.to_string()))?,
            dump_dir: rd.get(&r::FR_DIR, text)?.map(std::path::PathBuf::from),
            profile: rd.get(&r::PROFILE, ProfileSettings::parse)?.unwrap_or_default(),
        };
        Ok(ResolvedConfig { backend, timeout, algorithms, cpu, mpi, gpu, log, perf })
    }
}

/// Parses `30`, `1.5`, `1.5s`, `250ms`, `2m`, `1h` into a duration (bare numbers are seconds):
/// the grammar of every duration setting ([`parse::duration`]).
///
/// # Errors
/// A message saying what is accepted.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    parse::duration(s)
}

#[cfg(test)]
mod tests;
