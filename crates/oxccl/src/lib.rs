//! # oxccl: collective communication for distributed machine learning
//!
//! One safe, typed API (all_reduce, reduce, broadcast, all_gather, reduce_scatter,
//! all_to_all, gather, scatter, barrier, their uneven variants, tagged send/recv, probe and
//! batches) over several backends:
//!
//! | backend | what it is |
//! |---|---|
//! | `cpu` (default) | one rank per process, on one host or many: shared memory within a host, TCP across hosts |
//! | `local` | N ranks as threads of one process, the same algorithms over an in-memory transport |
//! | `mpi` | the system MPI (cargo feature `mpi`), picked under `mpirun` |
//! | `nccl`, `rccl` | NVIDIA NCCL / AMD RCCL on device buffers ([`Gpu`], [`DeviceBuffer`], device [`Tensor`]s), loaded at run time |
//!
//! A program started by a launcher (`oxccl run`, torchrun, `mpirun`, `srun`) joins its
//! job with [`init`]; one process can also run a world of threads with [`local::run`]:
//!
//! ```
//! use oxccl::ReduceOp;
//! let out = oxccl::local::run(4, |comm| -> oxccl::Result<Vec<f32>> {
//!     let mut grads = vec![comm.rank() as f32; 3];
//!     comm.all_reduce(&mut grads, ReduceOp::Avg)?;
//!     Ok(grads)
//! }).unwrap();
//! assert!(out.iter().all(|r| r.as_ref().unwrap() == &vec![1.5f32; 3]));
//! ```
//!
//! ```no_run
//! // Under `oxccl run -n 4 -- ./prog` (or torchrun, mpirun): one rank per process.
//! let comm = oxccl::init()?;
//! let mut grads = vec![comm.rank() as f32; 1024];
//! comm.all_reduce(&mut grads, oxccl::ReduceOp::Sum)?;
//! # Ok::<(), oxccl::Error>(())
//! ```
//!
//! Settings come from [`Config`] (builder) over `OXCCL_*` variables over defaults: see
//! [`config`] for the table. Errors are one [`Error`] enum whose variants say what to do.
//!
//! Layers, top to bottom (each calls only downward; `ARCHITECTURE.md` has the map):
//! [`init`]/[`local`] (make communicators) → [`Communicator`] (typed, checked, async with
//! [`Scope`]/[`Work`]) → the backends (`cpu`, [`mpi`]) → [`backend`] (the type-erased trait
//! and what every engine shares), [`staging`] (device buffers through pinned host memory)
//! and [`bootstrap`] (launchers, rendezvous store) → the vocabulary ([`DType`],
//! [`ReduceOp`], [`Error`], [`config`], ...).

#![deny(missing_docs)]

pub mod algorithm;
pub mod backend;
pub mod bootstrap;
mod clock;
pub mod communicator;
pub mod config;
mod cpu;
pub mod device;
pub mod dtype;
pub mod error;
pub mod fingerprint;
pub mod info;
mod init;
pub mod mesh;
pub mod mpi;
mod names;
mod op_kind;
pub mod perf;
pub mod reduce_op;
pub mod staging;
mod sync;
pub mod tensor;
#[cfg(feature = "testing")]
pub mod testing;
pub mod topology;
pub mod tuning;
mod xccl;

pub use algorithm::Algorithm;
pub use backend::{Agreement, MessageInfo, Stream, StreamOrder};
pub use communicator::work;
pub use communicator::{Batch, Buffer, BufferMut, Communicator};
pub use communicator::{OwnedWork, Scope, Work};
pub use config::Config;
pub use device::Device;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use fingerprint::{Fingerprint, OpKind};
pub use half::{bf16, f16};
pub use init::local;
pub use init::{init, join, select};
pub use mesh::DeviceMesh;
pub use reduce_op::ReduceOp;
/// The pinned (page-locked) host memory pool, at the path it has always had: the same module
/// as [`staging::pinned`].
pub use staging::pinned;
pub use tensor::Tensor;
pub use xccl::memory::{DeviceBuffer, DeviceView, DeviceViewMut, Gpu};

/// The README's code, compiled and run as a doc test so the tour cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeTour;
