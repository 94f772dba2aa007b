//! Page-aligned anonymous memory: what the pool pins and hands out.

use std::ptr::NonNull;
use std::sync::OnceLock;

use crate::config::parse::format_size_exact;
use crate::error::{Error, Result};

/// The system's page size (4 KiB where it cannot be read).
pub(super) fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf only reads a system constant; it has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        match usize::try_from(p) {
            Ok(p) if p.is_power_of_two() => p,
            _ => 4096,
        }
    })
}

/// A private anonymous mapping owned by this value: `len` bytes at a page-aligned `ptr`,
/// readable and writable, zero-filled when made; unmapped on drop.
pub(super) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is plain process memory owned by this value alone; nothing about it is
// tied to the thread that mapped it, so it may be moved to and unmapped on another thread.
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` only yields the address and the length (plain values); reading or
// writing the memory goes through the lease that owns it (`&self`/`&mut self` borrows).
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes (a positive multiple of the page size).
    ///
    /// # Errors
    /// [`Error::Io`] when `mmap` fails (out of address space or memory).
    pub(super) fn new(len: usize) -> Result<Mapping> {
        if len == 0 {
            return Err(Error::Internal("the pinned pool asked for an empty mapping".into()));
        }
        // SAFETY: an anonymous private mapping at an address the kernel chooses touches no
        // existing memory; the result is checked against MAP_FAILED before any use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            return Err(Error::io(
                format!("mapping {} of host memory for the pinned pool (mmap)", format_size_exact(len)),
                &err,
            ));
        }
        match NonNull::new(p.cast::<u8>()) {
            Some(ptr) => Ok(Mapping { ptr, len }),
            None => Err(Error::Internal("mmap returned a mapping at address 0".into())),
        }
    }

    /// The first byte (page aligned).
    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: [ptr, ptr+len) is the mapping `new` made, owned by this value alone; it is
        // unmapped once, here, and no slice into it outlives its owner (a lease's slices
        // borrow the lease, which owns the Mapping).
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            tracing::warn!("pinned pool: munmap of {} failed: {err}", format_size_exact(self.len));
        }
    }
}
