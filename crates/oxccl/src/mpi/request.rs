//! The [`Pending`] of the `mpi` backend: an operation's completion slot, advanced by
//! polling the communicator (`MPI_Test` on its requests, the side channel, the deadline)
//! from `wait` and `is_completed`. No thread per operation: whoever waits drives progress
//! (through the engine's [`wait_cell`]).

use std::sync::Arc;
use std::time::Duration;

use super::engine::wait_cell;
use super::state::{Cell, Shared};
use crate::backend::{Completion, Pending};
use crate::error::Result;

/// A submitted operation of the `mpi` backend.
pub(crate) struct MpiPending {
    pub(crate) shared: Arc<Shared>,
    pub(crate) cell: Arc<Cell>,
}

impl Pending for MpiPending {
    fn wait(&self, timeout: Option<Duration>) -> Option<Result<Completion>> {
        wait_cell(&self.shared, &self.cell, timeout)
    }

    fn is_completed(&self) -> bool {
        if self.cell.result().is_some() {
            return true;
        }
        self.shared.poll();
        self.cell.result().is_some()
    }
}
