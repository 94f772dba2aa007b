//! The system calls the store's event loop needs that std does not offer: epoll, an eventfd
//! that wakes the loop, the listen backlog and the descriptor limit. Linux only, like the
//! rest of the crate's transports.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Readiness to read (and, always reported by the kernel, errors and hang-ups).
pub(crate) const READ: u32 = libc::EPOLLIN as u32;
/// Readiness to write.
pub(crate) const WRITE: u32 = libc::EPOLLOUT as u32;
/// The connection failed or both directions are shut (reported whatever the interest).
pub(crate) const BROKEN: u32 = (libc::EPOLLERR | libc::EPOLLHUP) as u32;

/// How many connections may wait in the kernel's accept queue (clamped by the kernel to
/// `net.core.somaxconn`, 4096 by default since Linux 5.4).
const BACKLOG: libc::c_int = 65_535;

/// An epoll instance, level-triggered: a descriptor is reported for as long as it is ready
/// for what its interest names, so the loop may stop early and come back.
pub(crate) struct Epoll {
    fd: OwnedFd,
}

/// One readiness report: the token the descriptor was registered with, and its flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ready {
    pub(crate) token: u64,
    pub(crate) flags: u32,
}

impl Epoll {
    /// A new epoll instance (closed on exec).
    pub(crate) fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; EPOLL_CLOEXEC is a valid flag.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor the kernel just created for us; nothing else owns it.
        Ok(Epoll { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, interest: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: interest, u64: token };
        // SAFETY: `self.fd` is our epoll descriptor; `ev` is a valid epoll_event that outlives
        // the call (the kernel copies it); a stale `fd` makes the call fail with EBADF, it
        // cannot make it touch memory.
        let rc = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for `interest`, reporting it as `token`.
    pub(crate) fn add(&self, fd: RawFd, token: u64, interest: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, interest)
    }

    /// Changes what `fd` is watched for.
    pub(crate) fn modify(&self, fd: RawFd, token: u64, interest: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, interest)
    }

    /// Waits until something is ready or `timeout` passes (`None`: no limit), and fills
    /// `ready` with what is (emptied first; at most its capacity, at least one slot).
    /// An interrupted wait returns with nothing ready.
    pub(crate) fn wait(
        &self,
        events: &mut Vec<libc::epoll_event>,
        ready: &mut Vec<Ready>,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        ready.clear();
        events.clear();
        if events.capacity() == 0 {
            events.reserve(1);
        }
        // Rounded up, so that a timer is never found not yet due when the wait returns.
        let ms = timeout.map_or(-1, |t| i32::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX));
        let max = i32::try_from(events.capacity()).unwrap_or(i32::MAX);
        // SAFETY: `events` has room for `max` entries (its capacity); the kernel writes at
        // most that many and returns how many it wrote.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), max, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(e) };
        }
        // SAFETY: the kernel initialized the first `n` entries (n <= capacity), and
        // epoll_event is plain data.
        unsafe { events.set_len(n as usize) };
        // Fields of the packed epoll_event are copied out by value, never referenced.
        ready.extend(events.iter().map(|e| Ready { token: e.u64, flags: e.events }));
        Ok(())
    }
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// An eventfd: any thread [`wake`](Self::wake)s the loop, which [`drain`](Self::drain)s it.
pub(crate) struct Waker {
    file: File,
}

impl Waker {
    /// A new eventfd, non-blocking and closed on exec.
    pub(crate) fn new() -> io::Result<Waker> {
        // SAFETY: eventfd takes no pointers; the flags are valid.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor the kernel just created for us; nothing else owns it.
        Ok(Waker { file: File::from(unsafe { OwnedFd::from_raw_fd(fd) }) })
    }

    /// Makes the eventfd readable (a full counter is readable already, so errors are moot).
    pub(crate) fn wake(&self) {
        let _ = (&self.file).write(&1u64.to_ne_bytes());
    }

    /// Resets the eventfd to not readable.
    pub(crate) fn drain(&self) {
        let mut buf = [0u8; 8];
        let _ = (&self.file).read(&mut buf);
    }
}

impl AsRawFd for Waker {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// Lets `backlog` connections wait to be accepted on `listener` (std listens with 128, and
/// a thousand ranks connecting at once would see dropped SYNs and one-second retries).
/// Linux applies a second listen() to a listening socket as a new backlog.
pub(crate) fn widen_backlog(listener: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: listen takes no pointers; the descriptor is the caller's open socket.
    let rc = unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Raises this process's soft limit on open descriptors (`RLIMIT_NOFILE`) to its hard limit,
/// as Go's runtime does at start: the store holds one descriptor per client, and the soft
/// limit is often 1024. Returns the limits before and after (`None` when already equal);
/// errors when they cannot be read or set (the soft limit is then unchanged).
pub(crate) fn raise_fd_limit() -> io::Result<Option<(libc::rlim_t, libc::rlim_t)>> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit the kernel fills in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur >= lim.rlim_max {
        return Ok(None);
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid rlimit the kernel reads.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Some((before, lim.rlim_cur)))
}

/// Sets this process's soft limit on open descriptors (tests that run out of them).
#[cfg(test)]
pub(crate) fn set_soft_fd_limit(n: u64) -> io::Result<()> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit the kernel fills in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } < 0 {
        return Err(io::Error::last_os_error());
    }
    lim.rlim_cur = (n as libc::rlim_t).min(lim.rlim_max);
    // SAFETY: `lim` is a valid rlimit the kernel reads.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn epoll_reports_readiness_and_the_waker() {
        let ep = Epoll::new().unwrap();
        let waker = Waker::new().unwrap();
        ep.add(waker.as_raw_fd(), 7, READ).unwrap();
        let (mut events, mut ready) = (Vec::with_capacity(8), Vec::new());
        ep.wait(&mut events, &mut ready, Some(Duration::ZERO)).unwrap();
        assert!(ready.is_empty());
        waker.wake();
        ep.wait(&mut events, &mut ready, Some(Duration::from_secs(5))).unwrap();
        assert_eq!(ready.len(), 1);
        assert_eq!((ready[0].token, ready[0].flags & READ), (7, READ));
        waker.drain();
        ep.wait(&mut events, &mut ready, Some(Duration::ZERO)).unwrap();
        assert!(ready.is_empty(), "drained");

        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        widen_backlog(&l).unwrap();
        ep.add(l.as_raw_fd(), 9, READ).unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        ep.wait(&mut events, &mut ready, Some(Duration::from_secs(5))).unwrap();
        assert_eq!(ready.iter().map(|r| r.token).collect::<Vec<_>>(), [9]);
        ep.modify(l.as_raw_fd(), 9, 0).unwrap();
        ep.wait(&mut events, &mut ready, Some(Duration::ZERO)).unwrap();
        assert!(ready.is_empty(), "no interest, no report");
    }

    #[test]
    fn the_fd_limit_can_be_raised_to_the_hard_limit() {
        raise_fd_limit().unwrap();
        assert_eq!(raise_fd_limit().unwrap(), None, "already at the hard limit");
    }
}
