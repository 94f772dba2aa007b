//! Device data through host memory: how a host backend (`cpu`, `local`, `mpi`) runs a
//! collective on GPU buffers. Device inputs are copied into pinned host temporaries, the
//! host algorithm runs on them, and outputs are copied back.
//!
//! - [`pinned`]: the process-wide pool of page-locked host buffers the temporaries are leased
//!   from (`OXCCL_PINNED_LIMIT`), and the [`Pinner`](pinned::Pinner) trait by which a device
//!   runtime registers them with the device; also public as `oxccl::pinned`.
//! - `copy.rs`: the [`DeviceCopy`] trait and its registry, one per [`DeviceKind`]
//!   ([`register_device_copy`], [`install_loader`], [`copier_for`]); `memcpy` for host memory,
//!   which is how every staging path is tested without a GPU.
//! - `temp.rs`: one host temporary, pinned where the pool serves, pageable otherwise.
//! - `whole.rs`: an operation's device buffers staged whole ([`stage`], [`Staged`]).
//! - `pipelined.rs`: a large collective's device buffers staged in chunks through three
//!   rotating pinned buffers, the copies overlapping the communication; the backend runs
//!   each chunk.
//!
//! What stays with the backends: *when* to stage and how a staged operation runs (the `cpu`
//! engine tries the pipeline, else stages whole, and poisons the communicator on a failed
//! copy; the `mpi` engine stages what a CUDA-aware MPI cannot take), and the vendor runtimes'
//! implementations of [`DeviceCopy`] and [`Pinner`](pinned::Pinner) (`xccl/staging_copy.rs`,
//! which the GPU backends register when they load a runtime): this layer sits below the
//! backends and names none of them.
//!
//! The public paths of before still name the same items: `oxccl::pinned` is this module's
//! [`pinned`], `oxccl::backend::staging` re-exports the items below, `oxccl::mpi` the copy
//! registry's.

mod copy;
pub mod pinned;
pub(crate) mod pipelined;
mod temp;
mod whole;

pub use copy::{copier_for, install_loader, register_device_copy, Copier, DeviceCopy, DeviceKind, Loader};
pub use whole::{stage, stage_with, Staged};
