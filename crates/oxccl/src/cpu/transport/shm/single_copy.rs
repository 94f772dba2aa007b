//! Single-copy reads from another process of the host (Linux cross-memory attach,
//! `process_vm_readv`): the kernel copies straight from the peer's buffer into ours, one
//! copy where the segment's slots take two (into the slot, out of it). Open MPI's shared
//! memory transport moves its large messages the same way (`btl_vader_single_copy_mechanism
//! = cma`).
//!
//! The kernel allows it where the reader may ptrace the peer (same user, and Yama's
//! `ptrace_scope` permitting, or `CAP_SYS_PTRACE`). Whether it does is found out once per
//! communicator ([`probe`]); where it does not, the collectives keep their slots.

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
    let mut done = 0;
    while done < len {
        let ours = libc::iovec { iov_base: local.wrapping_add(done).cast(), iov_len: len - done };
        let theirs = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: `ours` is valid for writes of `len - done` bytes (contract); the kernel
        // checks `theirs` against the peer's mappings and fails rather than fault.
        let got = unsafe { libc::process_vm_readv(pid as libc::pid_t, &ours, 1, &theirs, 1, 0) };
        match got {
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

/// Whether this process may read process `pid`'s memory: reads the `u64` at `remote` and
/// compares it with `expect`.
pub fn probe(pid: u32, remote: u64, expect: u64) -> bool {
    let mut got = 0u64;
    // SAFETY: `got` is a local u64, valid for 8 bytes of writes.
    let r = unsafe { read(pid, remote, (&mut got as *mut u64).cast(), 8) };
    r.is_ok() && got == expect
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_fails_cleanly_elsewhere() {
        let src: Vec<u8> = (0..300_001u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let pid = std::process::id();
        // SAFETY: `dst` is valid for its length and only this thread touches it.
        let r = unsafe { read(pid, src.as_ptr() as u64, dst.as_mut_ptr(), dst.len()) };
        match r {
            // Where the kernel allows it (the usual case for one's own process).
            Ok(()) => {
                assert_eq!(dst, src);
                let word = 0x1234_5678_9abc_def0u64;
                assert!(probe(pid, &word as *const u64 as u64, word));
                assert!(!probe(pid, &word as *const u64 as u64, word + 1));
                // An unmapped address is an error, not a fault.
                let mut one = [0u8; 8];
                // SAFETY: `one` is valid for 8 bytes.
                assert!(unsafe { read(pid, 8, one.as_mut_ptr(), 8) }.is_err());
            }
            // Seccomp or a kernel without it: the probe says no.
            Err(_) => assert!(!probe(pid, src.as_ptr() as u64, 0)),
        }
        // No such process.
        let mut one = [0u8; 8];
        // SAFETY: as above.
        assert!(unsafe { read(u32::MAX >> 2, 4096, one.as_mut_ptr(), 8) }.is_err());
    }
}
