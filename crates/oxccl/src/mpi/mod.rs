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
//! * **Life cycle** (`setup.rs`): `MPI_Init_thread` once, asking for
//!   `MPI_THREAD_MULTIPLE`; below that, every MPI call is serialised behind one lock (a
//!   note on stderr says so; the `Runtime` every communicator holds: `runtime.rs`).
//!   `MPI_Finalize` once, when the last communicator is dropped.
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
//!
//! Files, from the bottom up (each calls only files below it): `check.rs` (MPI's return
//! codes as oxccl's errors, the library's version text), `comm.rs` (the communicator
//! handle), `backoff.rs` (how waiters poll), `dtype.rs`, `runtime.rs` (MPI, initialised),
//! `side.rs`, `ops.rs`, `state.rs` (what a communicator is made of), `graveyard.rs`,
//! `engine.rs` (how a communicator runs), `request.rs` (its `Pending`), `backend.rs`
//! (`MpiBackend`, the `Backend`), `setup.rs` (MPI's life cycle, `init_process`) and
//! `factory.rs` (`MpiFactory`). `ulfm/` sits beside them: its recovery state below
//! `state.rs`, its error classes (`ulfm/errors.rs`) below `engine.rs`, its operations above.

pub mod cuda;

#[cfg(feature = "mpi")]
mod backend;
#[cfg(feature = "mpi")]
mod backoff;
#[cfg(feature = "mpi")]
mod check;
#[cfg(feature = "mpi")]
mod comm;
#[cfg(feature = "mpi")]
mod dtype;
#[cfg(feature = "mpi")]
mod engine;
#[cfg(feature = "mpi")]
mod factory;
#[cfg(feature = "mpi")]
mod graveyard;
#[cfg(feature = "mpi")]
mod ops;
#[cfg(feature = "mpi")]
mod request;
#[cfg(feature = "mpi")]
mod runtime;
#[cfg(feature = "mpi")]
mod setup;
#[cfg(feature = "mpi")]
mod side;
#[cfg(feature = "mpi")]
mod state;
#[cfg(feature = "mpi")]
mod ulfm;

pub use crate::config::mpi::{CudaAware, HalfReduce, MpiConfig, ThreadLevel};
pub use crate::staging::{register_device_copy, DeviceCopy, DeviceKind};
#[cfg(feature = "mpi")]
pub use backend::MpiBackend;
pub use cuda::CudaSupport;
#[cfg(feature = "mpi")]
pub use factory::MpiFactory;
#[cfg(feature = "mpi")]
pub use setup::{init_process, init_with};

/// The backend's name.
pub const NAME: &str = "mpi";

/// Whether this process was started by an MPI launcher (`OMPI_COMM_WORLD_SIZE`,
/// `PMI_SIZE` or `PMIX_RANK` in the environment).
pub fn launched_by_mpi() -> bool {
    crate::bootstrap::env::launched_by_mpi(|k| std::env::var_os(k).is_some())
}

/// `MPI_Get_library_version`'s first line (callable before MPI is initialised).
#[cfg(feature = "mpi")]
pub(crate) fn library_version() -> String {
    check::library_version()
}
