//! The `mpi` backend: oxccl's API over the system MPI (Open MPI, MPICH and derivatives),
//! through the [`mpi`](https://docs.rs/mpi) crate (rsmpi's raw bindings, `mpi::ffi`).
//! Built with the cargo feature `mpi`; [`MpiConfig`] and the device-buffer helpers of
//! [`cuda`] exist in every build so that code using them compiles either way.
//!
//! ```text
//! cargo build --release -p oxccl-cli --features mpi
//! OXCCL_BACKEND=mpi mpirun -np 4 target/release/oxccl bench --backend mpi
//! ```
//!
//! * **Selection**: `oxccl::init()` with `OXCCL_BACKEND=mpi`, or `auto` when an MPI launch
//!   is detected (`OMPI_COMM_WORLD_SIZE`, `PMI_SIZE` or `PMIX_RANK` set): then `mpi` ranks
//!   above `cpu`. Rank and world size come from `MPI_COMM_WORLD`. Outside an MPI launch the
//!   backend is available by name (a singleton world) but `auto` prefers `cpu`.
//! * **Life cycle** (`init.rs`): `MPI_Init_thread` once, asking for
//!   `MPI_THREAD_MULTIPLE`; below that, every MPI call is serialised behind one lock (a
//!   note on stderr says so). `MPI_Finalize` once, when the last communicator is dropped.
//! * **Operations** (`ops.rs`): every collective is MPI's non-blocking form (`MPI_Iallreduce`,
//!   `MPI_Ireduce_scatter_block`, `MPI_Iallgatherv`, `MPI_Ialltoallv`, ...), also for the
//!   blocking API, so that every wait has a deadline and can be aborted. Point-to-point
//!   uses `MPI_Isend`/`MPI_Irecv` after a small header; `probe` reads the headers.
//!   Types and reductions: `dtype.rs` (f16/bf16 and float min/max through user operations;
//!   `Avg` = `Sum`, then a division).
//! * **Errors**: every communicator has `MPI_ERRORS_RETURN`; MPI's failures come back as
//!   [`Error::Backend`](crate::Error::Backend) with MPI's own error string, except ULFM's
//!   classes where the MPI has ULFM (a failed process: [`Error::PeerLost`](crate::Error::PeerLost);
//!   a revoked communicator: [`Error::Revoked`](crate::Error::Revoked)). Argument
//!   errors are the front door's (and this backend's limit checks), before any communication.
//!   Mismatches, timeouts, aborts and lost peers: see `engine.rs` (a fingerprint exchange
//!   before each collective, polling against deadlines) and `side.rs` (the side channel:
//!   fingerprints, message headers, notices of aborts, failures and departures).
//!   A dropped communicator waits in `graveyard.rs` until every peer has left before
//!   `MPI_Comm_free`.
//! * **Groups**: `split`/`new_group` are `MPI_Comm_split` (colours and keys are exchanged
//!   first, so `i64` keys and any `u32` colour work); a [`DeviceMesh`](crate::DeviceMesh)
//!   works on top unchanged.
//! * **Device buffers**: [`cuda`].
//!
//! * **Recovery** (`ulfm/`): `revoke`, `agree`, `shrink` and `shrink_excluding` through
//!   ULFM where the MPI that runs exports it and implements it (Open MPI 5, launched with
//!   `mpiexec --with-ft ulfm` so that a dead rank does not end the job; found at run time, so
//!   the crate still builds against MPIs without it). Elsewhere (Debian's Open MPI 4.1;
//!   MPICH's ch4 device, which exports ULFM's functions but aborts in them) these calls
//!   answer [`Error::BackendUnavailable`](crate::Error::BackendUnavailable) saying why.
//!   `grow` never works here (ULFM has none): use the cpu backend.
//!
//! Not provided: without ULFM a dead *process* cannot be reported as `PeerLost` (`mpirun`
//! ends the whole job), and counts above 2^31-1 elements are refused (no MPI-4 large-count
//! calls).

pub mod cuda;

#[cfg(feature = "mpi")]
mod dtype;
#[cfg(feature = "mpi")]
mod engine;
#[cfg(feature = "mpi")]
mod graveyard;
#[cfg(feature = "mpi")]
mod init;

/// `MPI_Get_library_version`'s first line (callable before MPI is initialised).
#[cfg(feature = "mpi")]
pub(crate) fn library_version() -> String {
    init::library_version()
}
#[cfg(feature = "mpi")]
mod ops;
#[cfg(feature = "mpi")]
mod request;
#[cfg(feature = "mpi")]
mod side;
#[cfg(feature = "mpi")]
mod ulfm;

pub use crate::backend::staging::{register_device_copy, DeviceCopy, DeviceKind};
pub use crate::config::mpi::{CudaAware, HalfReduce, MpiConfig, ThreadLevel};
pub use cuda::CudaSupport;

/// The backend's name.
pub const NAME: &str = "mpi";

/// Whether this process was started by an MPI launcher (`OMPI_COMM_WORLD_SIZE`,
/// `PMI_SIZE` or `PMIX_RANK` in the environment).
pub fn launched_by_mpi() -> bool {
    crate::bootstrap::env::launched_by_mpi(|k| std::env::var_os(k).is_some())
}

#[cfg(feature = "mpi")]
pub use with_mpi::*;

#[cfg(feature = "mpi")]
mod with_mpi {
    use std::ffi::c_int;
    use std::sync::Arc;
    use std::time::Duration;

    use mpi::ffi;

    use super::engine::{Comm, Shared};
    use super::init::{self, check, Runtime};
    use super::request::MpiPending;
    use super::{launched_by_mpi, ulfm, MpiConfig, NAME};
    use crate::backend::factory::BackendFactory;
    use crate::backend::CallOptions;
    use crate::backend::{Backend, MessageInfo, Mode, Op, Pending};
    use crate::config::ResolvedConfig;
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
        pub fn thread_level(&self) -> super::ThreadLevel {
            self.shared.rt.level
        }

        /// What was detected about device-pointer support.
        pub fn cuda_support(&self) -> &super::CudaSupport {
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

    fn from_comm(rt: Arc<Runtime>, comm: Comm, cfg: ResolvedConfig) -> Result<MpiBackend> {
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

    /// Creates this process's rank of (a duplicate of) `MPI_COMM_WORLD` with the resolved
    /// `mpi` settings (`cfg.mpi`: the builder's, else the `OXCCL_MPI_*` variables).
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] when MPI does not initialise (or was finalised
    /// already); MPI's errors.
    pub fn init_process(cfg: &ResolvedConfig) -> Result<MpiBackend> {
        init_with(cfg, &cfg.mpi)
    }

    /// [`init_process`] with an explicit [`MpiConfig`] (used when this call initialises MPI;
    /// later communicators share the first one's MPI).
    ///
    /// # Errors
    /// As [`init_process`].
    pub fn init_with(cfg: &ResolvedConfig, mpi_cfg: &MpiConfig) -> Result<MpiBackend> {
        let rt = init::acquire(mpi_cfg)?;
        // SAFETY: a zeroed handle is overwritten by MPI_Comm_dup.
        let mut comm: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
        {
            let _g = rt.lock();
            // SAFETY: MPI is initialised; duplicating the world gives oxccl its own context.
            check(unsafe { ffi::MPI_Comm_dup(Runtime::world(), &mut comm) }, "MPI_Comm_dup")?;
            // SAFETY: `comm` was just created.
            check(unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler")?;
        }
        from_comm(rt, Comm(comm), cfg.clone())
    }

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
}
