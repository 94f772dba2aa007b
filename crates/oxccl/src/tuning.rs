//! Measured machine costs for the `cpu` backend's algorithm choice.
//!
//! The `cpu` backend prices every applicable algorithm of each call with an α-β-γ model and
//! runs the cheapest. The model reads a [`Profile`]: latency and bandwidth per transport,
//! the step cost of the shared-memory collectives, one core's copy and reduction speed.
//! `oxccl tune` measures them on a machine and writes a profile file; `OXCCL_TUNE_FILE`
//! points the backend at one (rank 0's is used by every rank). Without one the backend uses
//! the profile `oxccl tune --save` cached for the host ([`Profile::host_cache_path`]), else
//! [`Profile::default`]. [`Communicator::algorithm_for`](crate::Communicator::algorithm_for)
//! tells which algorithm a call would run.

pub use crate::cpu::selector::profile::{LinkCost, Profile};
/// The CPUs this thread may run on (what `oxccl tune` pins its switch-cost threads to, and
/// what the ranks of a host exchange to tell whether they outnumber their CPUs).
pub use crate::cpu::transport::shm::wait::allowed_cpus;
/// A list of CPU numbers in the compact form (`0-3,8,10-11`) that `taskset` and
/// `/proc/self/status` use.
pub use crate::cpu::transport::shm::wait::format_cpus;
/// How long a rank's waits yield before they sleep where the ranks outnumber the CPUs
/// (`OXCCL_YIELD_US`'s automatic value there; `oxccl tune` measures crowded steps with it).
pub use crate::cpu::transport::shm::wait::YIELD_CROWDED;
