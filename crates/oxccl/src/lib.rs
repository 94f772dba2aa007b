//! # oxccl: collective communication for distributed machine learning
//!
//! One safe, typed API (all_reduce, reduce, broadcast, all_gather, reduce_scatter,
//! all_to_all, gather, scatter, barrier, their uneven variants, tagged send/recv, probe and
//! batches) over several backends. Today: `local`, N ranks as threads in one process,
//! running the same algorithms the multi-process CPU backend will run.
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
//! Layers, top to bottom: [`Communicator`] (typed, checked) → [`backend::Backend`]
//! (type-erased) → [`cpu`] (engine, algorithms, transports). See `DESIGN.md`.

#![deny(missing_docs)]

pub mod algorithm;
pub mod backend;
pub mod bootstrap;
pub mod communicator;
pub mod config;
pub mod cpu;
pub mod device;
pub mod dtype;
pub mod error;
pub mod fingerprint;
mod init;
pub mod mesh;
pub mod mpi;
pub mod reduce_op;
mod sync;
pub mod tensor;

pub use algorithm::Algorithm;
pub use backend::MessageInfo;
pub use communicator::work;
pub use communicator::{Batch, Communicator};
pub use communicator::{Scope, Work};
pub use config::Config;
pub use device::Device;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use fingerprint::{Fingerprint, OpKind};
pub use half::{bf16, f16};
pub use init::local;
pub use init::{init, select};
pub use mesh::DeviceMesh;
pub use reduce_op::ReduceOp;
pub use tensor::Tensor;

/// The README's code, compiled and run as a doc test so the tour cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeTour;
