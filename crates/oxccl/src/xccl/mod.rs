//! The GPU backends: `nccl` (NVIDIA) and `rccl` (AMD), one code path over one table of the
//! `nccl*` C API and a device runtime per vendor, all loaded at run time.
//!
//! Rooms:
//! - [`dl`]: opening a shared library from a list of candidates, saying what every try found.
//! - `library/`: the NCCL function table (NCCL and RCCL export the same names), its C types,
//!   where the libraries are searched, and the version rules.
//! - `runtime/`: the device runtimes (CUDA driver, HIP) behind one trait, and the host double
//!   that tests use in their place.
//!
//! Nothing here needs a CUDA toolkit, ROCm or NCCL to build: every library is opened with
//! `dlopen`, and a missing one is [`Error::BackendUnavailable`](crate::Error) naming every
//! path tried.

pub(crate) mod bytes;
#[cfg(feature = "cudarc")]
pub(crate) mod cudarc;
pub(crate) mod dl;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod double;
pub(crate) mod engine;
pub(crate) mod factory;
pub(crate) mod gpu;
pub(crate) mod host_side;
pub(crate) mod library;
pub mod memory;
pub(crate) mod runtime;
pub(crate) mod staging_copy;
