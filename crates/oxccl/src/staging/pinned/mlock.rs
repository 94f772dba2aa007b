//! The pinner without a device runtime: `mlock(2)`, and the error that names
//! `RLIMIT_MEMLOCK` when the kernel refuses.

use super::pinner::Pinner;
use crate::config::parse::format_size_exact;
use crate::error::{Error, Result};

/// Pins with `mlock(2)`/`munlock(2)`: the pages stay resident (never swapped out), which is
/// what a DMA engine or an RDMA NIC reading host memory needs. Without `CAP_IPC_LOCK` the
/// kernel caps the bytes a process may lock at its `RLIMIT_MEMLOCK` (`ulimit -l`).
///
/// A device runtime, when one is loaded, pins with its own host registration instead
/// (`cuMemHostRegister`, `hipHostRegister`), which also maps the pages for its DMA engines.
#[derive(Debug, Clone, Copy, Default)]
pub struct MlockPinner;

impl Pinner for MlockPinner {
    fn name(&self) -> &str {
        "mlock"
    }

    unsafe fn pin(&self, ptr: *mut u8, len: usize) -> Result<()> {
        // SAFETY: by `Pinner::pin`'s contract [ptr, ptr+len) is a live mapping the caller
        // owns; mlock only changes the residency of those pages, never their contents.
        if unsafe { libc::mlock(ptr.cast_const().cast(), len) } == 0 {
            return Ok(());
        }
        Err(memlock_error(len, &std::io::Error::last_os_error()))
    }

    unsafe fn unpin(&self, ptr: *mut u8, len: usize) -> Result<()> {
        // SAFETY: by `Pinner::unpin`'s contract [ptr, ptr+len) is a live mapping this pinner
        // locked; munlock only changes the residency of those pages.
        if unsafe { libc::munlock(ptr.cast_const().cast(), len) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        Err(Error::io(format!("unlocking {} of pinned host memory (munlock)", format_size_exact(len)), &err))
    }
}

/// The bytes this process has locked (`VmLck` of `/proc/self/status`), where the kernel
/// shows it.
pub(super) fn locked_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmLck:"))?;
    let kib: usize = line.trim_start_matches("VmLck:").trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// The error for an `mlock` of `bytes` that failed with `err`. A refusal for lack of
/// locked-memory allowance (`EPERM`, `ENOMEM`, `EAGAIN`) names `RLIMIT_MEMLOCK`, its soft and
/// hard values and how to raise it; anything else is a plain [`Error::Io`].
pub(super) fn memlock_error(bytes: usize, err: &std::io::Error) -> Error {
    let context = format!("locking {} of host memory in RAM for the pinned pool (mlock)", format_size_exact(bytes));
    let kind = match err.raw_os_error() {
        Some(libc::EPERM) => std::io::ErrorKind::PermissionDenied,
        Some(libc::ENOMEM) | Some(libc::EAGAIN) => std::io::ErrorKind::OutOfMemory,
        _ => return Error::io(context, err),
    };
    let limit = |x: Option<u64>| match x {
        None => "unlimited".to_string(),
        Some(b) => usize::try_from(b).map(format_size_exact).unwrap_or_else(|_| format!("{b} bytes")),
    };
    let limits = match crate::topology::host::memlock() {
        Some(l) => format!("soft {}, hard {}", limit(l.soft), limit(l.hard)),
        None => "unreadable".to_string(),
    };
    let locked = match locked_bytes() {
        Some(b) => format!("; this process already locks {}", format_size_exact(b)),
        None => String::new(),
    };
    let message = format!(
        "{err}: the kernel caps the memory a process may lock at its RLIMIT_MEMLOCK ({limits}{locked}) unless \
         it has CAP_IPC_LOCK. Raise the limit where the job starts: `ulimit -l unlimited` (or a size in KiB, \
         up to the hard limit) in the launching shell; `* - memlock unlimited` in /etc/security/limits.conf \
         (then log in again); LimitMEMLOCK=infinity for a systemd service; `docker run --ulimit memlock=-1` \
         in a container. Or lower OXCCL_PINNED_LIMIT below the limit"
    );
    Error::Io { context, kind, message }
}
