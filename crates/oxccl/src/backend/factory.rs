//! How a backend makes itself known: each backend folder provides a [`BackendFactory`];
//! `init` lists them, picks one by name or priority, and wraps what it creates into
//! communicators. Backends create [`Backend`] objects only, never communicators.

use std::sync::Arc;

use super::Backend;
use crate::config::ResolvedConfig;
use crate::error::Result;

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
    /// [`Error::BackendUnavailable`](crate::Error::BackendUnavailable) when the backend
    /// cannot host several ranks in one process; setup errors.
    fn create_world(&self, cfg: &ResolvedConfig, n: usize) -> Result<Vec<Arc<dyn Backend>>>;
    /// Creates this process's rank of the world the environment describes.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`](crate::Error::BackendUnavailable) when the backend
    /// cannot serve this launch; setup errors.
    fn create_process(&self, cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>>;
}
