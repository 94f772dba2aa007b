//! An MPI communicator handle that may cross threads ([`Comm`]): what the side channel, the
//! engine and the graveyard pass around.

use mpi::ffi;

/// An MPI communicator handle.
#[derive(Clone, Copy)]
pub(crate) struct Comm(pub ffi::MPI_Comm);
// SAFETY: MPI handles are process-wide identifiers; all use is serialised by the
// communicator's state lock (and the runtime's lock below MPI_THREAD_MULTIPLE).
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}
