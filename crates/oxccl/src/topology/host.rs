//! The host's limits that shared memory and pinned memory run into: the size of `/dev/shm`
//! (the shared-memory transport's segments live there; Docker's default is 64 MiB), the
//! locked-memory limit (`RLIMIT_MEMLOCK`: pinned staging buffers count against it), the CPUs
//! this process may run on and the NUMA nodes.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

use serde::Serialize;

use super::sysfs::Sysfs;

/// Space in a file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Space {
    /// Its size, bytes.
    pub total_bytes: u64,
    /// What an unprivileged process may still use, bytes.
    pub free_bytes: u64,
}

/// A resource limit: `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limit {
    /// The soft limit (what applies), bytes.
    pub soft: Option<u64>,
    /// The hard limit (how far the soft one may be raised without privileges), bytes.
    pub hard: Option<u64>,
}

/// The host's limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostLimits {
    /// `/dev/shm`, when it is mounted.
    pub dev_shm: Option<Space>,
    /// `RLIMIT_MEMLOCK` of this process.
    pub memlock: Option<Limit>,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// NUMA nodes (`/sys/devices/system/node/node*`; 1 where the kernel shows none).
    pub numa_nodes: usize,
}

/// The host's name (`/proc/sys/kernel/hostname`), if it can be read.
pub fn name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string())
}

/// The space of the file system holding `path` (`statvfs`), if it can be asked.
pub fn space(path: &std::path::Path) -> Option<Space> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some(Space { total_bytes: st.f_blocks as u64 * frsize, free_bytes: st.f_bavail as u64 * frsize })
}

/// `RLIMIT_MEMLOCK` of this process.
pub fn memlock() -> Option<Limit> {
    // SAFETY: an all-zero rlimit is a valid value of this plain C struct.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return None;
    }
    // rlim_t is u64 on Linux; the cast keeps this building where it is narrower.
    #[allow(clippy::unnecessary_cast)]
    let v = |x: libc::rlim_t| (x != libc::RLIM_INFINITY).then_some(x as u64);
    Some(Limit { soft: v(r.rlim_cur), hard: v(r.rlim_max) })
}

impl HostLimits {
    /// Reads the limits (`/dev/shm` and NUMA nodes under `sys`; the memlock limit and CPUs
    /// of this process).
    pub fn read(sys: &Sysfs) -> HostLimits {
        let dev_shm = sys.path("/dev/shm");
        let numa_nodes = sys
            .entries("/sys/devices/system/node")
            .iter()
            .filter(|(n, _)| {
                n.strip_prefix("node").is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
            .count();
        HostLimits {
            dev_shm: dev_shm.is_dir().then(|| space(&dev_shm)).flatten(),
            memlock: memlock(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            numa_nodes: numa_nodes.max(1),
        }
    }
}
