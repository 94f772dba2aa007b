//! When the progress thread wakes: [`Poller`], the one epoll instance of a rank's TCP
//! links (the listener, the sockets in their handshake, every connection's lanes, and an
//! eventfd that wakes it on demand), and [`Readiness`], one connection's lanes in it.
//!
//! A connection's lanes are watched in one-shot mode: each wake-up disarms the lane that
//! fired; the progress thread re-arms the lanes it waits on after reading, unless a
//! receiving caller is reading the socket itself, and the last such caller re-arms them
//! when it stops. So a caller that polls its peer's socket takes the bytes without the
//! progress thread also waking for them (on a host with few cores, that wake-up costs the
//! caller its CPU), and whenever no caller reads, the connection is armed: nothing that
//! arrives is left unread. A disarmed lane keeps `EPOLLONESHOT` alone: a hang-up, which
//! epoll reports whether asked or not, then wakes the thread once, not at every wait.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// The events a lane is watched for while armed.
const ARMED: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32;
/// A lane's events while disarmed (see the module documentation).
const DISARMED: u32 = libc::EPOLLONESHOT as u32;

/// Bits of a token kept for the lane (lanes are at most `MAX_LANES`, 8).
const LANE_BITS: u32 = 4;
/// The token of the eventfd.
const WAKER: u64 = u64::MAX;
/// The token of the listening socket.
const LISTENER: u64 = u64::MAX - 1;
/// Tokens of sockets in their handshake carry this bit and an id.
const HANDSHAKE: u64 = 1 << 62;

/// What woke the progress thread, decoded from an event's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Token {
    /// Someone called [`Poller::wake`].
    Waker,
    /// A connection waits to be accepted.
    Listener,
    /// A socket in its handshake (the id the thread gave it).
    Handshake(u64),
    /// Lane `lane` of the connection to `peer`.
    Lane { peer: usize, lane: usize },
}

impl Token {
    fn encode(self) -> u64 {
        match self {
            Token::Waker => WAKER,
            Token::Listener => LISTENER,
            Token::Handshake(id) => HANDSHAKE | (id & (HANDSHAKE - 1)),
            Token::Lane { peer, lane } => ((peer as u64) << LANE_BITS) | lane as u64,
        }
    }

    fn decode(t: u64) -> Token {
        match t {
            WAKER => Token::Waker,
            LISTENER => Token::Listener,
            t if t & HANDSHAKE != 0 => Token::Handshake(t & (HANDSHAKE - 1)),
            t => Token::Lane { peer: (t >> LANE_BITS) as usize, lane: (t & ((1 << LANE_BITS) - 1)) as usize },
        }
    }
}

/// The epoll instance of a rank's TCP links, and its eventfd.
#[derive(Debug)]
pub(super) struct Poller {
    epoll: OwnedFd,
    waker: OwnedFd,
}

impl Poller {
    /// A new instance, its eventfd watched.
    ///
    /// # Errors
    /// When the kernel refuses an epoll instance or an eventfd.
    pub(super) fn new() -> io::Result<Arc<Poller>> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by nobody else.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
        let waker = unsafe { OwnedFd::from_raw_fd(fd) };
        let p = Poller { epoll, waker };
        p.ctl(libc::EPOLL_CTL_ADD, p.waker.as_raw_fd(), Token::Waker, libc::EPOLLIN as u32)?;
        Ok(Arc::new(p))
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: Token, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token.encode() };
        // SAFETY: the epoll descriptor is open (owned by self), `fd` is open (the callers hold
        // the socket it belongs to); `ev` is a live epoll_event for the duration of the call.
        let r = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Watches `fd` for bytes (level-triggered), as `token`.
    ///
    /// # Errors
    /// When the kernel refuses.
    pub(super) fn watch(&self, fd: RawFd, token: Token) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, (libc::EPOLLIN | libc::EPOLLRDHUP) as u32)
    }

    /// Stops watching `fd` (errors ignored: closing it stops the watch too).
    pub(super) fn forget(&self, fd: RawFd) {
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, Token::Waker, 0);
    }

    /// Wakes the thread in [`Poller::wait`].
    pub(super) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one` to the eventfd, which self owns. A full counter
        // (EAGAIN) means a wake-up is pending anyway.
        let _ = unsafe { libc::write(self.waker.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Empties the eventfd after a wake-up.
    pub(super) fn drain_waker(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into `v`; the eventfd is non-blocking and owned by self.
        let _ = unsafe { libc::read(self.waker.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// Sleeps until something is ready or `timeout` passes; the tokens that fired go into
    /// `out` (cleared first).
    pub(super) fn wait(&self, events: &mut [libc::epoll_event], timeout: Duration, out: &mut Vec<Token>) {
        out.clear();
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: `events` has room for its length in events, and the count says so.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, ms) };
        for ev in events.iter().take(n.max(0) as usize) {
            let t = ev.u64;
            out.push(Token::decode(t));
        }
    }
}

/// One connection's lanes in the rank's [`Poller`] (see the module documentation).
#[derive(Debug)]
pub(super) struct Readiness {
    poller: Arc<Poller>,
    peer: usize,
    fds: Vec<RawFd>,
}

impl Readiness {
    /// Watches the lanes `fds` of the connection to `peer`, none armed: the owner arms lane 0
    /// once the connection can be found (a wake-up for a connection the thread cannot find
    /// yet would be spent, and the peer's first bytes would wait for the thread's
    /// once-a-second look). The sockets must outlive the returned value.
    ///
    /// # Errors
    /// When the kernel refuses.
    pub(super) fn new(poller: &Arc<Poller>, peer: usize, fds: Vec<RawFd>) -> io::Result<Readiness> {
        let r = Readiness { poller: Arc::clone(poller), peer, fds };
        for (lane, &fd) in r.fds.iter().enumerate() {
            r.poller.ctl(libc::EPOLL_CTL_ADD, fd, Token::Lane { peer, lane }, DISARMED)?;
        }
        Ok(r)
    }

    fn set(&self, lane: usize, events: u32) {
        // Errors are ignored: the progress thread also looks on its own every second.
        let _ = self.poller.ctl(libc::EPOLL_CTL_MOD, self.fds[lane], Token::Lane { peer: self.peer, lane }, events);
    }

    /// Arms every lane: the thread wakes at the next bytes (at once if some are waiting, or
    /// if the connection has ended).
    pub(super) fn arm(&self) {
        for lane in 0..self.fds.len() {
            self.set(lane, ARMED);
        }
    }

    /// Arms the lanes `wanted` says the connection waits on, and disarms the others (whose
    /// bytes are read when a header on lane 0 calls for them).
    pub(super) fn arm_where(&self, wanted: impl Fn(usize) -> bool) {
        for lane in 0..self.fds.len() {
            self.set(lane, if wanted(lane) { ARMED } else { DISARMED });
        }
    }

    /// Stops waking the thread (a caller reads the sockets now).
    pub(super) fn disarm(&self) {
        for lane in 0..self.fds.len() {
            self.set(lane, DISARMED);
        }
    }
}

impl Drop for Readiness {
    fn drop(&mut self) {
        for &fd in &self.fds {
            self.poller.forget(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip() {
        for t in [
            Token::Waker,
            Token::Listener,
            Token::Handshake(0),
            Token::Handshake(123_456),
            Token::Lane { peer: 0, lane: 0 },
            Token::Lane { peer: 99_999, lane: 7 },
        ] {
            assert_eq!(Token::decode(t.encode()), t);
        }
    }

    #[test]
    fn a_wake_reaches_the_waiting_thread_and_lanes_fire_once_armed() {
        let p = Poller::new().unwrap();
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 8];
        let mut out = Vec::new();
        p.wait(&mut events, Duration::from_millis(1), &mut out);
        assert!(out.is_empty());
        p.wake();
        p.wait(&mut events, Duration::from_secs(5), &mut out);
        assert_eq!(out, vec![Token::Waker]);
        p.drain_waker();
        // A socket pair: bytes that came before lane 0 was armed wake nobody until it is;
        // then they fire once, and not again until re-armed.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        use std::io::Write;
        (&b).write_all(b"x").unwrap();
        let r = Readiness::new(&p, 5, vec![a.as_raw_fd()]).unwrap();
        p.wait(&mut events, Duration::from_millis(20), &mut out);
        assert!(out.is_empty(), "watched, not armed");
        r.arm_where(|lane| lane == 0);
        p.wait(&mut events, Duration::from_secs(5), &mut out);
        assert_eq!(out, vec![Token::Lane { peer: 5, lane: 0 }]);
        p.wait(&mut events, Duration::from_millis(20), &mut out);
        assert!(out.is_empty(), "one-shot");
        r.disarm();
        p.wait(&mut events, Duration::from_millis(20), &mut out);
        assert!(out.is_empty(), "disarmed");
        r.arm();
        p.wait(&mut events, Duration::from_secs(5), &mut out);
        assert_eq!(out, vec![Token::Lane { peer: 5, lane: 0 }]);
        drop(r);
        drop(b);
        p.wait(&mut events, Duration::from_millis(20), &mut out);
        assert!(out.is_empty(), "forgotten");
    }
}
