//! What the ranks of a new communicator exchange over its host side before NCCL makes it:
//! the way it is made and the unique id, which host rank 0 makes and broadcasts (so every
//! rank, a newcomer included, learns both in one step), and gathers of one value per rank,
//! with which the ranks decide together.

use std::time::Duration;

use crate::backend::{Backend, Op, RawBuf, RawBufMut};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::xccl::host_side::run_blocking;
use crate::xccl::library::types::{NcclUniqueId, NCCL_UNIQUE_ID_BYTES};
use crate::xccl::library::Library;

/// How NCCL makes a new communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Make {
    /// `ncclCommInitRankConfig` with a fresh id from `ncclGetUniqueId`.
    Init,
    /// `ncclCommGrow` with the id of the old communicator's `ncclCommGetUniqueId`.
    Grow,
}

impl Make {
    /// The byte that carries it.
    fn code(self) -> u8 {
        match self {
            Make::Init => 0,
            Make::Grow => 1,
        }
    }
}

/// The byte host rank 0 sends when it could not make the id.
const FAILED: u8 = 0xff;

/// A fresh id (`ncclGetUniqueId`).
///
/// # Errors
/// NCCL's error.
pub(super) fn fresh_id(lib: &Library) -> Result<NcclUniqueId> {
    let mut id = NcclUniqueId::zeroed();
    // SAFETY: ncclGetUniqueId writes one `ncclUniqueId` through a valid pointer.
    let r = unsafe { (lib.table.get_unique_id)(&mut id) };
    lib.check("ncclGetUniqueId", r, std::ptr::null_mut())?;
    Ok(id)
}

/// Host rank 0 decides how the new communicator is made and makes its id with `root`;
/// every rank of `host` receives both over the host communicator (whose connections were
/// authenticated with the job's secret when it was set up). When `root` fails, rank 0 says
/// so in the broadcast, so the others fail at once instead of waiting for their timeout.
///
/// # Errors
/// `root`'s error (on rank 0), [`Error::Aborted`] saying rank 0 could not make the id (on
/// the others); the host communicator's errors.
pub(super) fn exchange(
    host: &dyn Backend,
    timeout: Duration,
    root: impl FnOnce() -> Result<(Make, NcclUniqueId)>,
) -> Result<(Make, NcclUniqueId)> {
    let mut bytes = [0u8; 1 + NCCL_UNIQUE_ID_BYTES];
    let mut failed = None;
    if host.rank() == 0 {
        match root() {
            Ok((how, id)) => {
                bytes[0] = how.code();
                bytes[1..].copy_from_slice(id.as_bytes());
            }
            Err(e) => {
                bytes[0] = FAILED;
                failed = Some(e);
            }
        }
    }
    let output = RawBufMut { ptr: bytes.as_mut_ptr(), count: bytes.len(), dtype: DType::U8, device: Device::Cpu };
    let input = (host.rank() == 0).then(|| output.as_const());
    // SAFETY: `bytes` outlives the blocking call.
    unsafe { run_blocking(host, Op::Broadcast { input, output, root: 0 }, timeout)? };
    if let Some(e) = failed {
        return Err(e);
    }
    let how = match bytes[0] {
        0 => Make::Init,
        1 => Make::Grow,
        FAILED => {
            return Err(Error::Aborted {
                reason: "host rank 0 could not make the NCCL unique id of the new communicator (its error says why)"
                    .into(),
            })
        }
        other => return Err(Error::Internal(format!("host rank 0 sent {other} as the way to make a communicator"))),
    };
    Ok((how, NcclUniqueId::from_bytes(&bytes[1..])?))
}

/// Every rank's `value`, gathered over the host communicator.
///
/// # Errors
/// The host communicator's errors.
pub(super) fn host_all_gather(host: &dyn Backend, value: u64, timeout: Duration) -> Result<Vec<u64>> {
    let mine = [value];
    let mut all = vec![0u64; host.world_size()];
    let op = Op::AllGather {
        input: RawBuf { ptr: mine.as_ptr().cast(), count: 1, dtype: DType::U64, device: Device::Cpu },
        output: RawBufMut { ptr: all.as_mut_ptr().cast(), count: all.len(), dtype: DType::U64, device: Device::Cpu },
    };
    // SAFETY: both buffers outlive the blocking call.
    unsafe { run_blocking(host, op, timeout)? };
    Ok(all)
}

/// Whether every rank of `host` says `yes` (the same answer on all of them).
///
/// # Errors
/// The host communicator's errors.
pub(super) fn everyone(host: &dyn Backend, yes: bool, timeout: Duration) -> Result<bool> {
    Ok(host_all_gather(host, u64::from(yes), timeout)?.iter().all(|&v| v == 1))
}
