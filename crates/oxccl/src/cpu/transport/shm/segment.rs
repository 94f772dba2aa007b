//! Shared-memory segments: files in `/dev/shm`, mapped by every process of a host.
//!
//! A segment is created by one process, opened by the others, and *unlinked as soon as all
//! of them have mapped it*: the memory lives on while mapped, no name is left in /dev/shm
//! even if a process is killed later, and the kernel frees it when the last mapping goes.
//! The space is reserved up front (`posix_fallocate`), so a /dev/shm that is too small (a
//! classic container pitfall: Docker's default is 64 MiB) is an error that says so instead
//! of a SIGBUS in the middle of a collective.
//!
//! A creator killed outright (SIGKILL) while its peers were still to map the segment leaves
//! the name behind; every creator first removes such orphans ([`unique_name`]).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};

/// Where segments live.
pub const SHM_DIR: &str = "/dev/shm";

/// A mapped shared-memory segment.
#[derive(Debug)]
pub struct Segment {
    ptr: *mut u8,
    len: usize,
    path: PathBuf,
}

// SAFETY: the segment is plain shared memory; every access to it goes through atomics or
// through ranges whose ownership the protocols on top of it hand over with atomics.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn errno_error(context: String) -> Error {
    Error::io(context, &std::io::Error::last_os_error())
}

impl Segment {
    /// Creates a new segment file `name` in /dev/shm of `len` bytes (zeroed) and maps it.
    ///
    /// # Errors
    /// [`Error::Io`] when the file exists or cannot be created; an error naming the sizes
    /// when /dev/shm has not enough space.
    pub fn create(name: &str, len: usize) -> Result<Segment> {
        let path = Path::new(SHM_DIR).join(name);
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::invalid(format!("segment name {name:?} contains NUL")))?;
        // SAFETY: `c` is a valid NUL-terminated path; flags and mode are plain integers.
        let fd =
            unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o600) };
        if fd < 0 {
            return Err(errno_error(format!("creating the shared-memory segment {}", path.display())));
        }
        // SAFETY: `fd` is the descriptor just opened; the range is the segment's size.
        let rc = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
        if rc != 0 {
            // SAFETY: closing and unlinking what we just created.
            unsafe {
                libc::close(fd);
                libc::unlink(c.as_ptr());
            }
            let free = crate::topology::host::space(Path::new(SHM_DIR))
                .map(|s| s.free_bytes)
                .map_or("unknown".to_string(), |f| format!("{f}"));
            return Err(Error::Io {
                context: format!("reserving {len} bytes of shared memory in {SHM_DIR}"),
                kind: std::io::ErrorKind::StorageFull,
                message: format!(
                    "{} ({free} bytes free); {SHM_DIR} is too small: enlarge it (docker run --shm-size=1g, \
                     or mount -o remount,size=1G {SHM_DIR}), use fewer local ranks, or set OXCCL_TRANSPORT=tcp",
                    std::io::Error::from_raw_os_error(rc)
                ),
            });
        }
        Self::map(fd, len, path)
    }

    /// Opens and maps the existing segment `name` of `len` bytes.
    ///
    /// # Errors
    /// [`Error::Io`] when it does not exist, is smaller than `len`, or cannot be mapped.
    pub fn open(name: &str, len: usize) -> Result<Segment> {
        let path = Path::new(SHM_DIR).join(name);
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::invalid(format!("segment name {name:?} contains NUL")))?;
        // SAFETY: `c` is a valid NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(errno_error(format!("opening the shared-memory segment {}", path.display())));
        }
        // SAFETY: an all-zero stat is a valid value for the kernel to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` a valid out-pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || (st.st_size as u64) < len as u64 {
            // SAFETY: closing the descriptor we opened.
            unsafe { libc::close(fd) };
            return Err(Error::invalid(format!(
                "shared-memory segment {} is smaller than the {len} bytes expected (another job's file?)",
                path.display()
            )));
        }
        Self::map(fd, len, path)
    }

    fn map(fd: libc::c_int, len: usize, path: PathBuf) -> Result<Segment> {
        // SAFETY: mapping `len` bytes of an open file we own; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len.max(1), libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        // SAFETY: the mapping keeps the file alive; the descriptor is no longer needed.
        unsafe { libc::close(fd) };
        if ptr == libc::MAP_FAILED {
            return Err(errno_error(format!("mapping the shared-memory segment {}", path.display())));
        }
        Ok(Segment { ptr: ptr.cast(), len, path })
    }

    /// Removes the segment's name from /dev/shm (the memory stays mapped). Idempotent.
    pub fn unlink(&self) {
        if let Ok(c) = CString::new(self.path.as_os_str().as_encoded_bytes()) {
            // SAFETY: `c` is a valid NUL-terminated path; a missing file is fine.
            unsafe { libc::unlink(c.as_ptr()) };
        }
    }

    /// First byte of the mapping.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Maps the pages of the first `len` bytes into this process now, writable
    /// (`MADV_POPULATE_WRITE`, Linux 5.14), without touching their contents: the first
    /// operations that use them then take no page faults (measurements: docs/performance.md).
    /// Best effort: an older kernel refuses the advice and the pages fault in on first use.
    pub fn prefault(&self, len: usize) {
        let len = len.min(self.len);
        if len == 0 {
            return;
        }
        // SAFETY: the range is inside our mapping (page-aligned start, length clamped); the
        // advice only populates page tables and never changes the memory's contents.
        unsafe { libc::madvise(self.ptr.cast(), len, MADV_POPULATE_WRITE) };
    }
}

/// `MADV_POPULATE_WRITE` from the kernel's uapi (not in every libc crate release).
const MADV_POPULATE_WRITE: libc::c_int = 23;

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `map`; nothing uses it after drop.
        unsafe { libc::munmap(self.ptr.cast(), self.len.max(1)) };
    }
}

/// How old a segment of a dead creator must be before another creator removes its name: an
/// orphan is never mapped again by anyone, but a creator in another PID namespace sharing
/// /dev/shm (a container) looks dead from here, and its peers may be about to open its name
/// (they do within the set-up, seconds).
const ORPHAN_AGE: Duration = Duration::from_secs(600);

/// Removes from `dir` the segment names (`oxccl-<kind>-<pid>-<n>`) whose creating process no
/// longer exists and that are older than `min_age`; returns how many it removed. Names it
/// cannot read or remove are left alone.
fn remove_orphans_in(dir: &Path, min_age: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let creator = |name: &str| -> Option<libc::pid_t> {
        let mut parts = name.strip_prefix("oxccl-")?.split('-');
        let (_kind, pid, n) = (parts.next()?, parts.next()?, parts.next()?);
        (parts.next().is_none() && n.bytes().all(|b| b.is_ascii_digit())).then_some(())?;
        pid.parse().ok()
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(creator) else { continue };
        // SAFETY: signal 0 only checks that the process exists; nothing is sent.
        let dead =
            unsafe { libc::kill(pid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        let old = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|a| a >= min_age));
        if dead && old && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// A name for a new segment that no other job on this host uses. Removes the names of
/// orphaned segments first (see [`ORPHAN_AGE`]).
pub fn unique_name(kind: &str) -> Result<String> {
    let orphans = remove_orphans_in(Path::new(SHM_DIR), ORPHAN_AGE);
    if orphans > 0 {
        tracing::info!("removed {orphans} shared-memory segment(s) of ended processes from {SHM_DIR}");
    }
    let mut r = [0u8; 8];
    getrandom::getrandom(&mut r).map_err(|e| Error::Io {
        context: "naming a shared-memory segment".into(),
        kind: std::io::ErrorKind::Other,
        message: e.to_string(),
    })?;
    Ok(format!("oxccl-{kind}-{}-{}", std::process::id(), u64::from_le_bytes(r)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_left_by_ended_creators_are_removed_once_old() {
        let dir = std::env::temp_dir().join(format!("oxccl-orphans-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A process that has ended: its pid, just reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        let make = |name: &str, old: bool| {
            let f = std::fs::File::create(dir.join(name)).unwrap();
            if old {
                f.set_modified(an_hour_ago).unwrap();
            }
        };
        make(&format!("oxccl-coll-{gone}-123"), true); // an orphan
        make(&format!("oxccl-links-{gone}-456"), false); // too young: its peers may still open it
        make(&format!("oxccl-coll-{me}-789"), true); // its creator runs
        make(&format!("oxccl-coll-{gone}-x1"), true); // not a segment name of ours
        make("other-file", true);
        assert_eq!(remove_orphans_in(&dir, Duration::from_secs(600)), 1);
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        let mut want =
            vec![format!("oxccl-coll-{gone}-x1"), format!("oxccl-coll-{me}-789"), format!("oxccl-links-{gone}-456")];
        want.push("other-file".into());
        want.sort();
        assert_eq!(left, want);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn create_open_unlink() {
        let name = unique_name("test").unwrap();
        let a = Segment::create(&name, 4096).unwrap();
        let b = Segment::open(&name, 4096).unwrap();
        // SAFETY: both map the same 4096 bytes; this test is their only user.
        unsafe {
            *a.ptr().add(100) = 42;
            assert_eq!(*b.ptr().add(100), 42);
        }
        assert!(Segment::open(&name, 8192).is_err(), "a larger size than the file must be refused");
        a.unlink();
        assert!(!Path::new(SHM_DIR).join(&name).exists());
        assert!(Segment::open(&name, 4096).is_err());
        // SAFETY: still mapped after unlink.
        unsafe { assert_eq!(*b.ptr().add(100), 42) };
    }

    #[test]
    fn too_large_a_segment_says_why() {
        let name = unique_name("huge").unwrap();
        let e = Segment::create(&name, usize::MAX / 4).unwrap_err().to_string();
        assert!(e.contains("shared memory") || e.contains("/dev/shm"), "{e}");
        assert!(!Path::new(SHM_DIR).join(&name).exists(), "a failed create must not leave a file");
    }
}
