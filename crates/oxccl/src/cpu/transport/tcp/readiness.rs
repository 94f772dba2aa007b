//! When a connection's reader thread wakes: [`Readiness`], an epoll instance watching one
//! socket in one-shot mode. Each wake-up disarms it; the reader re-arms it after reading,
//! unless a receiving caller is reading the socket itself, and the last such caller re-arms
//! it when it stops. So a caller that polls its peer's socket takes the bytes without the
//! reader thread also waking for them (on a host with few cores, that wake-up costs the
//! caller its CPU), and whenever no caller reads, the reader is armed: nothing that arrives
//! is left unread.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The events a socket is watched for while armed.
const ARMED: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32;

/// An epoll instance watching one socket (see the module documentation).
#[derive(Debug)]
pub(super) struct Readiness {
    epoll: OwnedFd,
    sock: RawFd,
}

impl Readiness {
    /// Watches `sock`, armed. The socket must outlive the returned value.
    ///
    /// # Errors
    /// When the kernel refuses an epoll instance.
    pub(super) fn new(sock: &TcpStream) -> io::Result<Readiness> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by nobody else.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let r = Readiness { epoll, sock: sock.as_raw_fd() };
        r.ctl(libc::EPOLL_CTL_ADD, ARMED)?;
        Ok(r)
    }

    fn ctl(&self, op: libc::c_int, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: 0 };
        // SAFETY: both descriptors are open (the socket outlives this value); `ev` is a live
        // epoll_event for the duration of the call.
        let r = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, self.sock, &mut ev) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Wakes the reader at the socket's next bytes (at once if some are waiting, or if the
    /// connection has ended). Errors are ignored: the reader also looks on its own every
    /// [`Readiness::wait`] timeout.
    pub(super) fn arm(&self) {
        let _ = self.ctl(libc::EPOLL_CTL_MOD, ARMED);
    }

    /// Stops waking the reader (a caller reads the socket now).
    pub(super) fn disarm(&self) {
        let _ = self.ctl(libc::EPOLL_CTL_MOD, 0);
    }

    /// Sleeps until the armed socket has something to read (which disarms it), or `timeout`
    /// passes; whether it woke for the socket.
    pub(super) fn wait(&self, timeout: Duration) -> bool {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: room for one event, and the count says one.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), &mut ev, 1, ms) };
        n > 0
    }
}
