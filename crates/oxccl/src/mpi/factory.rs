//! How `init` finds the `mpi` backend ([`MpiFactory`]): one rank per process, ranked above
//! `cpu` inside an MPI launch.

use std::sync::Arc;

use super::setup::init_process;
use super::{launched_by_mpi, NAME};
use crate::backend::factory::BackendFactory;
use crate::backend::Backend;
use crate::config::ResolvedConfig;
use crate::error::{Error, Result};

/// How `init` finds this backend ([`BackendFactory`]).
pub struct MpiFactory;

impl BackendFactory for MpiFactory {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Above `cpu` (50) inside an MPI launch; below `local` otherwise.
    fn priority(&self) -> u32 {
        if launched_by_mpi() {
            60
        } else {
            5
        }
    }

    fn availability(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn create_world(&self, _cfg: &ResolvedConfig, n: usize) -> Result<Vec<Arc<dyn Backend>>> {
        Err(Error::BackendUnavailable {
            backend: NAME.into(),
            why: format!(
                "the `mpi` backend (cargo feature `mpi`, built in) runs one rank per process and cannot \
                 host {n} ranks in one process; launch the program with `mpirun -np {n}` and call \
                 oxccl::init()"
            ),
        })
    }

    fn create_process(&self, cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(init_process(cfg)?))
    }
}
