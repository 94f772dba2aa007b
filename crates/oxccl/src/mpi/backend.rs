//! The [`Backend`] of the `mpi` backend: [`MpiBackend`], one rank's membership in one
//! communicator, over the engine's [`Shared`] (`engine.rs`) and ULFM's recovery (`ulfm/`).

use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

use mpi::ffi;

use super::check::check;
use super::comm::Comm;
use super::cuda::CudaSupport;
use super::request::MpiPending;
use super::runtime::Runtime;
use super::state::Shared;
use super::{ulfm, NAME};
use crate::backend::CallOptions;
use crate::backend::{Backend, MessageInfo, Mode, Op, Pending};
use crate::config::{ResolvedConfig, ThreadLevel};
use crate::error::{Error, Result};

/// One rank's membership in one communicator of the `mpi` backend.
pub struct MpiBackend {
    shared: Arc<Shared>,
}

impl MpiBackend {
    /// The MPI library in use (`MPI_Get_library_version`, first line).
    pub fn library(&self) -> &str {
        &self.shared.rt.library
    }

    /// The thread level MPI granted.
    pub fn thread_level(&self) -> ThreadLevel {
        self.shared.rt.level
    }

    /// What was detected about device-pointer support.
    pub fn cuda_support(&self) -> &CudaSupport {
        &self.shared.rt.cuda
    }
}

impl Backend for MpiBackend {
    fn name(&self) -> &'static str {
        NAME
    }
    fn rank(&self) -> usize {
        self.shared.rank
    }
    fn world_size(&self) -> usize {
        self.shared.n
    }
    fn timeout(&self) -> Duration {
        self.shared.timeout()
    }
    /// Any memory: device buffers go to a CUDA-aware MPI directly or are staged through
    /// host memory (see [`cuda`](super::cuda)).
    fn check_device(&self, _device: crate::device::Device) -> Result<()> {
        Ok(())
    }
    unsafe fn submit(&self, op: Op, _mode: Mode, opts: &CallOptions) -> Result<Arc<dyn Pending>> {
        // Blocking and async calls run alike (non-blocking MPI, polled by the waiter).
        // SAFETY: forwarded from the caller, who upholds the same contract.
        let cell = unsafe { self.shared.submit(op, opts)? };
        Ok(Arc::new(MpiPending { shared: Arc::clone(&self.shared), cell }))
    }
    fn probe(&self, peer: usize, tag: u32) -> Result<Option<MessageInfo>> {
        self.shared.probe(peer, tag)
    }
    fn split(&self, color: Option<u32>, key: i64, opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        let Some(comm) = self.shared.split(color, key, opts)? else { return Ok(None) };
        let rt = Arc::clone(&self.shared.rt);
        let b = from_comm(rt, comm, self.shared.cfg.clone())?;
        Ok(Some(Arc::new(b) as Arc<dyn Backend>))
    }
    fn abort(&self, reason: &str) {
        self.shared.abort(reason)
    }
    /// `MPIX_Comm_revoke` where the MPI has ULFM (see `ulfm/`); else
    /// [`Error::BackendUnavailable`] naming what it lacks.
    fn revoke(&self, reason: &str) -> Result<()> {
        ulfm::revoke(&self.shared, reason)
    }
    /// Rounds of `MPIX_Comm_agree` where the MPI has ULFM; `joiners` is always 0.
    fn agree(&self, flag: u64, opts: &CallOptions) -> Result<crate::backend::Agreement> {
        ulfm::agree(&self.shared, flag, opts)
    }
    /// `MPIX_Comm_shrink`, then `MPI_Comm_split` without `exclude`, where the MPI has ULFM.
    fn shrink(&self, exclude: &[usize], opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        let Some(comm) = ulfm::shrink(&self.shared, exclude, opts)? else { return Ok(None) };
        let rt = Arc::clone(&self.shared.rt);
        let b = from_comm(rt, comm, self.shared.cfg.clone())?;
        Ok(Some(Arc::new(b) as Arc<dyn Backend>))
    }
    /// ULFM has no grow: [`Error::BackendUnavailable`].
    fn grow(&self, _joiners: usize, _opts: &CallOptions) -> Result<Arc<dyn Backend>> {
        Err(ulfm::no_grow())
    }
}

/// This rank's membership in `comm` (a communicator of this process with
/// `MPI_ERRORS_RETURN`).
pub(super) fn from_comm(rt: Arc<Runtime>, comm: Comm, cfg: ResolvedConfig) -> Result<MpiBackend> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    {
        let _g = rt.lock();
        // SAFETY: `comm` is a valid communicator of this process.
        check(unsafe { ffi::MPI_Comm_rank(comm.0, &mut rank) }, "MPI_Comm_rank")?;
        // SAFETY: as above.
        check(unsafe { ffi::MPI_Comm_size(comm.0, &mut size) }, "MPI_Comm_size")?;
    }
    let rank = usize::try_from(rank).map_err(|_| Error::Internal("negative MPI rank".into()))?;
    let size = usize::try_from(size).map_err(|_| Error::Internal("negative MPI size".into()))?;
    Ok(MpiBackend { shared: Arc::new(Shared::new(rt, comm, rank, size, cfg)) })
}
