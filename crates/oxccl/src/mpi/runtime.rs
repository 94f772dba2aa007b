//! MPI, initialised: the [`Runtime`] every communicator holds, and the process-wide lock of
//! MPI calls below `MPI_THREAD_MULTIPLE` ([`Runtime::lock`]). How it comes and goes
//! (`MPI_Init_thread`, `MPI_Finalize`) is `setup.rs`.

use crate::sync::relock;
use std::sync::{Mutex, MutexGuard};

use mpi::ffi;

use super::cuda::CudaSupport;
use super::dtype::UserOps;
use crate::config::{MpiConfig, ThreadLevel};

/// MPI, initialised; dropped (finalised) with the last communicator.
pub(crate) struct Runtime {
    /// The thread level MPI granted.
    pub level: ThreadLevel,
    pub(super) serialized: bool,
    /// The value of `MPI_IN_PLACE` of this library (`(void*)1` for Open MPI, `(void*)-1` for
    /// MPICH and its derivatives); `None` when unknown: in-place forms then use temporaries.
    pub in_place: Option<usize>,
    /// The largest tag (`MPI_TAG_UB`).
    pub tag_ub: i32,
    /// The user operations.
    pub ops: UserOps,
    /// Device-pointer support.
    pub cuda: CudaSupport,
    /// `MPI_Get_library_version`, first line.
    pub library: String,
    /// The configuration MPI was initialised with.
    pub cfg: MpiConfig,
    /// Whether oxccl initialised MPI (and so finalises it).
    pub(super) owns: bool,
}

static SERIAL: Mutex<()> = Mutex::new(());

impl Runtime {
    /// Held around MPI calls: the process-wide lock when MPI is not thread-multiple.
    pub(crate) fn lock(&self) -> Option<MutexGuard<'static, ()>> {
        self.serialized.then(|| relock(&SERIAL))
    }

    /// `MPI_COMM_WORLD`'s handle.
    pub(crate) fn world() -> ffi::MPI_Comm {
        // SAFETY: reading the rsmpi shim's constant.
        unsafe { ffi::RSMPI_COMM_WORLD }
    }
}
