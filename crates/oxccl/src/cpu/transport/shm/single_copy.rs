//! Single-copy reads from and writes to another process of the host (Linux cross-memory
//! attach, `process_vm_readv` and `process_vm_writev`): the kernel copies straight between
//! the peer's buffer and ours, one copy where the segment's slots take two (into the slot,
//! out of it). Open MPI's shared
//! memory transport moves its large messages the same way (`btl_vader_single_copy_mechanism
//! = cma`).
//!
//! The kernel allows it where the reader may ptrace the peer (same user, and Yama's
//! `ptrace_scope` permitting, or `CAP_SYS_PTRACE`). Whether it does is found out once per
//! communicator ([`probe`], both ways); where it does not, the collectives keep their slots.

use std::io;

/// Reads `len` bytes at address `remote` of process `pid` into `local`.
///
/// # Safety
/// `local` must be valid for writes of `len` bytes, and nobody else may access it meanwhile.
///
/// # Errors
/// The system error of `process_vm_readv` (`EPERM`: not allowed; `ESRCH`: no such process;
/// `EFAULT`: the range is not mapped in the peer), or `UnexpectedEof` if the peer's range
/// ends early.
pub unsafe fn read(pid: u32, remote: u64, local: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: `ours` covers the rest of `local`, valid for writes (contract); the kernel
    // checks `theirs` against the peer's mappings and fails rather than fault.
    unsafe {
        copy_all(remote, local, len, |ours, theirs| libc::process_vm_readv(pid as libc::pid_t, ours, 1, theirs, 1, 0))
    }
}

/// Writes `len` bytes from `local` to address `remote` of process `pid`.
///
/// # Safety
/// `local` must be valid for reads of `len` bytes. The peer's range is the caller's to
/// vouch for: nobody may access it meanwhile (the kernel checks only that it is mapped and
/// writable).
///
/// # Errors
/// The system error of `process_vm_writev` (as [`read`]), or `UnexpectedEof` if the peer's
/// range ends early.
pub unsafe fn write(pid: u32, remote: u64, local: *const u8, len: usize) -> io::Result<()> {
    // SAFETY: `ours` covers the rest of `local`, valid for reads (contract; the kernel only
    // reads it); the kernel checks `theirs` against the peer's mappings and fails rather
    // than fault.
    unsafe {
        copy_all(remote, local.cast_mut(), len, |ours, theirs| {
            libc::process_vm_writev(pid as libc::pid_t, ours, 1, theirs, 1, 0)
        })
    }
}

/// Runs `call` (a `process_vm_readv` or `process_vm_writev` between the rest of `local` and
/// the rest of `remote`) until `len` bytes moved, retrying on `EINTR`.
///
/// # Safety
/// As the caller of `call` requires: `local` valid for `len` bytes in its direction.
unsafe fn copy_all(
    remote: u64,
    local: *mut u8,
    len: usize,
    call: impl Fn(&libc::iovec, &libc::iovec) -> isize,
) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let ours = libc::iovec { iov_base: local.wrapping_add(done).cast(), iov_len: len - done };
        let theirs = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
        match call(&ours, &theirs) {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer's buffer ended early")),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Whether this process may read and write process `pid`'s memory: reads the `u64` at
/// `remote`, compares it with `expect`, and writes it back unchanged (a seccomp filter may
/// allow one call and not the other).
pub fn probe(pid: u32, remote: u64, expect: u64) -> bool {
    let mut got = 0u64;
    // SAFETY: `got` is a local u64, valid for 8 bytes of writes.
    let r = unsafe { read(pid, remote, (&mut got as *mut u64).cast(), 8) };
    // SAFETY: `got` is valid for 8 bytes of reads; what it writes is what the word holds
    // (checked just before), which the peer keeps in an atomic for this.
    r.is_ok() && got == expect && unsafe { write(pid, remote, (&got as *const u64).cast(), 8) }.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_this_process_and_fails_cleanly_elsewhere() {
        let src: Vec<u8> = (0..300_001u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let pid = std::process::id();
        // SAFETY: `dst` is valid for its length and only this thread touches it.
        let r = unsafe { read(pid, src.as_ptr() as u64, dst.as_mut_ptr(), dst.len()) };
        match r {
            // Where the kernel allows it (the usual case for one's own process).
            Ok(()) => {
                assert_eq!(dst, src);
                let value = 0x1234_5678_9abc_def0u64;
                let word = std::sync::atomic::AtomicU64::new(value);
                assert!(probe(pid, word.as_ptr() as u64, value));
                assert!(!probe(pid, word.as_ptr() as u64, value + 1));
                assert_eq!(word.into_inner(), value, "the probe writes back what it read");
                // An unmapped address is an error, not a fault.
                let mut one = [0u8; 8];
                // SAFETY: `one` is valid for 8 bytes.
                assert!(unsafe { read(pid, 8, one.as_mut_ptr(), 8) }.is_err());
                // Writing: the same bytes back into a fresh buffer, at an odd offset.
                let mut back = vec![0u8; src.len() + 3];
                // SAFETY: `back` has room for `src` at offset 3 and nobody else touches it.
                unsafe { write(pid, back.as_mut_ptr() as u64 + 3, src.as_ptr(), src.len()) }.unwrap();
                assert_eq!(&back[3..], &src[..]);
                assert_eq!(&back[..3], &[0, 0, 0]);
                // SAFETY: `src` is valid for 8 bytes; the target is unmapped.
                assert!(unsafe { write(pid, 8, src.as_ptr(), 8) }.is_err());
            }
            // Seccomp or a kernel without it: the probe says no.
            Err(_) => assert!(!probe(pid, src.as_ptr() as u64, 0)),
        }
        // No such process.
        let mut one = [0u8; 8];
        // SAFETY: as above.
        assert!(unsafe { read(u32::MAX >> 2, 4096, one.as_mut_ptr(), 8) }.is_err());
        // SAFETY: `one` is valid for 8 bytes of reads.
        assert!(unsafe { write(u32::MAX >> 2, 4096, one.as_ptr(), 8) }.is_err());
    }
}
