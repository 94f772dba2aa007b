//! How a backend makes itself known: each backend folder provides a [`BackendFactory`];
//! `init` lists them, picks one by name or priority, and wraps what it creates into
//! communicators. Backends create [`Backend`] objects only, never communicators.

use std::sync::Arc;

use super::Backend;
use crate::bootstrap::Rendezvous;
use crate::config::ResolvedConfig;
use crate::error::{Error, Result};

/// Every backend name oxccl knows, built into this binary or not.
pub const KNOWN: [&str; 5] = ["nccl", "rccl", "mpi", "cpu", "local"];

/// A backend that can be created.
pub trait BackendFactory: Sync {
    /// The backend's name.
    fn name(&self) -> &'static str;
    /// Higher wins on `auto`.
    fn priority(&self) -> u32;
    /// `Ok` when the backend can run here, else why not.
    fn availability(&self) -> std::result::Result<(), String>;
    /// Creates the `n` ranks of one world inside this process (rank i at index i).
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] when the backend
    /// cannot host several ranks in one process; setup errors.
    fn create_world(&self, cfg: &ResolvedConfig, n: usize) -> Result<Vec<Arc<dyn Backend>>>;
    /// Creates this process's rank of the world the environment describes.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] when the backend
    /// cannot serve this launch; setup errors.
    fn create_process(&self, cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>>;
    /// Creates rank `rank` of `n` processes that meet through `rdv`, a store the caller
    /// shares with the other ranks (a framework's), their connections authenticated with
    /// `secret`. Backends that bootstrap their own way (`mpi`, `local`) keep this default,
    /// which refuses.
    ///
    /// # Errors
    /// [`Error::Config`] naming the backend when it cannot be made this way; setup errors.
    fn create_rendezvous(
        &self,
        cfg: &ResolvedConfig,
        rank: usize,
        n: usize,
        rdv: &dyn Rendezvous,
        secret: &str,
    ) -> Result<Arc<dyn Backend>> {
        let _ = (cfg, rank, n, rdv, secret);
        Err(Error::Config(format!(
            "OXCCL_BACKEND={}: a communicator made through a caller's store runs on the cpu, nccl or rccl \
             backend; unset OXCCL_BACKEND or set it to one of them",
            self.name()
        )))
    }
    /// Joins a running job as a newcomer, admitted by its members' `grow` through the job's
    /// store. Backends that cannot grow keep this default, which refuses.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] naming the backend; setup errors.
    fn join_process(&self, cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>> {
        let _ = cfg;
        Err(Error::BackendUnavailable {
            backend: self.name().to_string(),
            why: "this backend cannot grow a communicator, so no process can join one; use the cpu backend".into(),
        })
    }
}
