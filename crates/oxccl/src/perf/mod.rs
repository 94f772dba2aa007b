//! Seeing what happens: the flight recorder every communicator keeps, and the decorator
//! that feeds it (`Observed`) from every backend's operations.
//!
//! - [`flight_recorder`]: the last `OXCCL_FR_SIZE` operations of a communicator (what they
//!   were, their state, their times, the peer waited on), always on and cheap (one lock and
//!   two counter reads per operation).
//! - [`dump`]: what a recorder writes (`OXCCL_FR_DIR`, one JSON file per rank and
//!   communicator) when an operation times out, mismatches, loses a peer or is aborted, and
//!   on `SIGUSR1` for a job that hangs without erroring; `oxccl trace analyze` reads them.
//! - The recorders' clock is `crate::clock` (the CPU's time-stamp counter where the kernel
//!   trusts it), below the backends, which time their waits for the profiler with it.
//! - [`profiler`]: statistics per operation and size, and Chrome traces (`OXCCL_PROFILE`).
//! - [`analyze`]: what a job's dumps say (`oxccl trace analyze`).
//! - `log`: the stderr subscriber for oxccl's `tracing` events (`OXCCL_LOG`).
//! - `observed`: the [`Backend`](crate::backend::Backend) decorator that records.
//! - `signal`: the `SIGUSR1` watcher.

pub mod analyze;
pub mod dump;
pub mod flight_recorder;
pub(crate) mod log;
mod observed;
pub mod profiler;
mod signal;

pub use crate::config::{PerfSettings, ProfileSettings};
pub use dump::{Dump, OpRecord, OpState};
pub use flight_recorder::FlightRecorder;
pub(crate) use observed::Observed;
pub use profiler::{ProfileReport, ProfileRow, Profiler};

#[cfg(test)]
mod tests;
