//! How `init` finds the two CPU backends: `cpu` (processes over shared memory and TCP) and
//! `local` (threads of one process).

use std::sync::Arc;

use super::{local, setup};
use crate::backend::factory::BackendFactory;
use crate::backend::Backend;
use crate::bootstrap::env::requested_world_size;
use crate::bootstrap::Rendezvous;
use crate::config::ResolvedConfig;
use crate::error::{Error, Result};

/// The `local` backend's factory: any number of ranks in this process, or a world of one.
pub struct LocalFactory;

impl BackendFactory for LocalFactory {
    fn name(&self) -> &'static str {
        local::NAME
    }

    fn priority(&self) -> u32 {
        10
    }

    fn availability(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn create_world(&self, cfg: &ResolvedConfig, n: usize) -> Result<Vec<Arc<dyn Backend>>> {
        Ok(local::world(cfg, n)?.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect())
    }

    fn create_process(&self, cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>> {
        match requested_world_size(|k| std::env::var(k).ok()) {
            Some((var, n)) if n > 1 => Err(Error::BackendUnavailable {
                backend: local::NAME.into(),
                why: format!(
                    "{var}={n} asks for {n} processes, but `local` runs every rank as a thread of one \
                     process; use oxccl::local::run / Config::init_world, or a multi-process backend"
                ),
            }),
            _ => local::world(cfg, 1)?
                .pop()
                .map(|b| Arc::new(b) as Arc<dyn Backend>)
                .ok_or_else(|| Error::invalid("a world of one rank came back empty (internal error)")),
        }
    }
}

/// The `cpu` backend's factory: one rank per process, or a world of threads over the real
/// transports.
pub struct CpuFactory;

impl BackendFactory for CpuFactory {
    fn name(&self) -> &'static str {
        setup::NAME
    }

    fn priority(&self) -> u32 {
        50
    }

    fn availability(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn create_world(&self, cfg: &ResolvedConfig, n: usize) -> Result<Vec<Arc<dyn Backend>>> {
        Ok(setup::init_world(cfg, n)?.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect())
    }

    fn create_process(&self, cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(setup::init_process(cfg)?))
    }

    fn create_rendezvous(
        &self,
        cfg: &ResolvedConfig,
        rank: usize,
        n: usize,
        rdv: &dyn Rendezvous,
        secret: &str,
    ) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(setup::init_rendezvous(cfg, rank, n, rdv, secret)?))
    }

    fn join_process(&self, cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(setup::join_process(cfg)?))
    }
}
