//! [`GpuSettings`]: the settings of the `nccl` and `rccl` backends.

use std::path::PathBuf;

use super::parse;
use super::reader::{choice, text, Reader};
use super::registry as r;
use crate::error::Result;

/// Settings of the GPU backends (`nccl`, `rccl`).
///
/// | variable | field |
/// |---|---|
/// | `OXCCL_NCCL_LIBRARY` | [`nccl_library`](Self::nccl_library) |
/// | `OXCCL_RCCL_LIBRARY` | [`rccl_library`](Self::rccl_library) |
/// | `OXCCL_GPU_DEVICE` | [`device`](Self::device) |
/// | `OXCCL_GPU_FINGERPRINT` | [`fingerprint`](Self::fingerprint) |
/// | `OXCCL_GPU_HOST_BUFFERS` | [`host_buffers`](Self::host_buffers) |
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuSettings {
    /// The NCCL library to load instead of searching (a file, or a folder holding
    /// `libnccl.so.2`).
    pub nccl_library: Option<PathBuf>,
    /// The RCCL library to load instead of searching.
    pub rccl_library: Option<PathBuf>,
    /// The device this process uses (default: `LOCAL_RANK` modulo the visible devices).
    pub device: Option<u32>,
    /// Exchange a fingerprint before each collective (a 24-byte host all_gather), so that
    /// ranks calling different collectives get [`Error::Mismatch`](crate::Error::Mismatch)
    /// instead of a hang: NCCL itself cannot tell.
    pub fingerprint: bool,
    /// What happens to host buffers (`None`: `cpu` under the `auto` backend, else
    /// `refuse`).
    pub host_buffers: Option<HostBuffers>,
}

/// What a GPU communicator does with an operation whose buffers are host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostBuffers {
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) saying device memory is
    /// expected.
    Refuse,
    /// The operation runs on the host communicator (the `cpu` backend), in the same call
    /// order: one communicator serves both, like torch's `cpu:gloo,cuda:nccl`.
    Cpu,
    /// The buffers are copied to device memory, the operation runs on NCCL, and the results
    /// are copied back (slow; for tests and tools that hold host data).
    Stage,
}

/// Reads the GPU settings.
pub(super) fn resolve<E: Fn(&str) -> Option<String>>(rd: &Reader<'_, E>) -> Result<GpuSettings> {
    let path = |v: &str| text(v).map(PathBuf::from);
    Ok(GpuSettings {
        nccl_library: rd.get(&r::NCCL_LIBRARY, path)?,
        rccl_library: rd.get(&r::RCCL_LIBRARY, path)?,
        device: rd.get(&r::GPU_DEVICE, |v| {
            parse::count(v, 0, 1 << 16).and_then(|n| u32::try_from(n).map_err(|e| e.to_string()))
        })?,
        fingerprint: rd.or_default(&r::GPU_FINGERPRINT, parse::flag)?,
        host_buffers: match rd.or_default(&r::GPU_HOST_BUFFERS, choice(&r::GPU_HOST_BUFFERS))? {
            "refuse" => Some(HostBuffers::Refuse),
            "cpu" => Some(HostBuffers::Cpu),
            "stage" => Some(HostBuffers::Stage),
            _ => None,
        },
    })
}
