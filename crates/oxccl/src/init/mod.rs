//! Where communicators are made: the one place above the backends that picks a backend
//! ([`select`]), asks it for ranks (`Arc<dyn Backend>`), and wraps them into
//! [`Communicator`]s: [`init`](crate::init), [`Config::init`], [`Config::init_world`] and
//! [`local::run`](crate::local::run). Backends never name the front door; they are named
//! only from here.

pub mod local;
pub mod select;

use std::sync::Arc;

use crate::backend::Backend;
use crate::communicator::Communicator;
use crate::config::{Config, ResolvedConfig};
use crate::error::Result;

fn wrap(b: Arc<dyn Backend>, cfg: &ResolvedConfig) -> Communicator {
    Communicator::observed(b, Arc::new(cfg.perf.clone()))
}

impl Config {
    /// Creates `n` communicators of one world inside this process (ranks 0..n), on the
    /// configured backend (`auto` picks the best one that can do this: `cpu`, over shared
    /// memory between threads).
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for unusable settings;
    /// [`Error::BackendUnavailable`](crate::Error::BackendUnavailable) when the chosen backend
    /// cannot run here or cannot host several ranks in one process;
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `n` is 0.
    pub fn init_world(&self, n: usize) -> Result<Vec<Communicator>> {
        let cfg = self.resolve()?;
        crate::perf::log::install(&cfg.log);
        Ok(select::init_world(&cfg, n)?.into_iter().map(|b| wrap(b, &cfg)).collect())
    }

    /// Creates this process's communicator, joining the world described by the
    /// environment (a process started alone is rank 0 of a world of 1). Under
    /// `OXCCL_JOIN=1` (a replacement that `oxccl run --max-restarts` started) it joins the
    /// running job instead, as [`Config::join`].
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for unusable settings;
    /// [`Error::BackendUnavailable`](crate::Error::BackendUnavailable) when no chosen backend
    /// can serve this launch, with the reason for each one skipped.
    pub fn init(&self) -> Result<Communicator> {
        let cfg = self.resolve()?;
        crate::perf::log::install(&cfg.log);
        if cfg.cpu.join {
            // A replacement the launcher started (`OXCCL_JOIN`): the members admit it.
            return Ok(wrap(select::join_process(&cfg)?, &cfg));
        }
        Ok(wrap(select::init_process(&cfg)?, &cfg))
    }
}

impl Config {
    /// Joins a running job as a newcomer (a replacement for a dead rank, or extra capacity):
    /// through the job's rendezvous store (found as [`Config::init`] finds it, from
    /// `OXCCL_STORE_ADDR` or `MASTER_ADDR`/`MASTER_PORT`), waits until the members admit it
    /// with [`Communicator::grow`], and returns its communicator in the grown world, whose
    /// ranks after the members' are the newcomers' in the order they reached the store.
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store) when no grow admits it within the setup
    /// timeout; [`Error::BackendUnavailable`](crate::Error::BackendUnavailable) on backends
    /// that cannot grow (only `cpu` can); as [`Config::init`].
    pub fn join(&self) -> Result<Communicator> {
        let cfg = self.resolve()?;
        crate::perf::log::install(&cfg.log);
        Ok(wrap(select::join_process(&cfg)?, &cfg))
    }
}

impl Config {
    /// Creates rank `rank` of a world of `world_size` processes that meet through
    /// `rendezvous`, a key-value store the caller already shares with the other ranks (a
    /// framework's store: oxccl's Python package passes torch.distributed's), instead of the
    /// launcher's environment; `secret` (the same text on every rank) authenticates their
    /// connections. Every rank must use its own keys' namespace of the store for each
    /// communicator made this way (a prefix), as torch gives each group.
    ///
    /// The `cpu` backend (what `auto` means here), or `nccl`/`rccl` when named: a GPU
    /// communicator on device `OXCCL_GPU_DEVICE` (else the launcher's local rank, else
    /// `rank`, modulo the devices), whose host side is a `cpu` communicator made through the
    /// same store. `mpi` and `local` bootstrap their own way.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for unusable settings, `mpi` or `local`, or an
    /// empty secret; [`Error::BackendUnavailable`](crate::Error::BackendUnavailable) when the
    /// named GPU backend cannot run here (why);
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for `rank >= world_size`;
    /// [`Error::Store`](crate::Error::Store) when a rank does not show up in time.
    pub fn init_rendezvous(
        &self,
        rank: usize,
        world_size: usize,
        rendezvous: &dyn crate::bootstrap::Rendezvous,
        secret: &str,
    ) -> Result<Communicator> {
        let cfg = self.resolve()?;
        crate::perf::log::install(&cfg.log);
        Ok(wrap(select::init_rendezvous(&cfg, rank, world_size, rendezvous, secret)?, &cfg))
    }
}

/// Joins a running job as a newcomer: `Config::new().join()`.
///
/// # Errors
/// As [`Config::join`].
pub fn join() -> Result<Communicator> {
    Config::new().join()
}

/// Creates this process's communicator from the environment (`OXCCL_*` variables and the
/// launcher's rank variables): `Config::new().init()`.
///
/// # Errors
/// As [`Config::init`].
pub fn init() -> Result<Communicator> {
    Config::new().init()
}
