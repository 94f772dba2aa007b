//! The sending side of a connection: [`WriteState`] writes each frame, header and payload
//! together, with `sendmsg` under a deadline, and remembers a frame left half-written.
//!
//! Header and payload go out in one system call from their own memory (two `iovec`s), so a
//! frame is contiguous on the wire without first being copied together. `sendmsg` takes
//! `MSG_NOSIGNAL`, unlike `writev`, which raises `SIGPIPE` on a closed connection and kills
//! a process that has not ignored it. A striped payload (`stripes`) goes out as the header
//! and stripe 0 on lane 0 and stripe j alone on lane j, each lane written as it takes bytes.
//! (One call per frame was faster than a copy or two writes: `docs/performance.md`.)

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::connection::{Conn, WriteState};
use super::stripes::{lanes_for, Stripes};
use super::{poll_fds, remaining};
use crate::cpu::transport::frame::HEADER_LEN;

/// How far past its deadline a blocked write may run before the socket's timeout is re-armed.
const TIMEOUT_SLACK: Duration = Duration::from_millis(50);

/// How far a frame being written has gone: its header (on lane 0) and each stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sending {
    head: usize,
    stripes: Stripes,
}

impl Sending {
    /// A frame with a payload of `len` bytes to `conn`, nothing written yet.
    pub(super) fn new(len: usize, conn: &Conn) -> Sending {
        Sending { head: 0, stripes: Stripes::of(len, conn.lane_count()) }
    }

    /// Whether lane `j` still has bytes of the frame to take.
    pub(super) fn pending(&self, j: usize) -> bool {
        (j == 0 && self.head < HEADER_LEN) || self.stripes.pending(j)
    }

    fn started(&self) -> bool {
        self.head > 0 || (0..self.stripes.lanes()).any(|j| self.stripes.done(j) > 0)
    }

    fn complete(&self) -> bool {
        self.head == HEADER_LEN && self.stripes.complete()
    }
}

/// Sleeps until one of `conn`'s lanes that `s` still writes can take bytes, or `for_`
/// passes.
fn writable_within(conn: &Conn, s: &Sending, for_: Duration) {
    let mut fds: Vec<libc::pollfd> = (0..conn.lane_count())
        .filter(|&j| s.pending(j))
        .map(|j| libc::pollfd { fd: conn.lane(j).as_raw_fd(), events: libc::POLLOUT, revents: 0 })
        .collect();
    // A failed poll shows at the next write.
    let _ = poll_fds(&mut fds, for_);
}

pub(super) enum WriteFail {
    Timeout,
    Io(io::Error),
}

/// One `sendmsg` of `parts` (in order, the empty ones skipped) with `flags` besides
/// `MSG_NOSIGNAL`; the bytes written.
fn send_parts(sock: &TcpStream, parts: &[&[u8]; 2], flags: libc::c_int) -> io::Result<usize> {
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2];
    let mut n = 0;
    for p in parts.iter().filter(|p| !p.is_empty()) {
        iov[n] = libc::iovec { iov_base: p.as_ptr().cast_mut().cast(), iov_len: p.len() };
        n += 1;
    }
    // SAFETY: an all-zero msghdr is valid (no address, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: the iovecs point into `parts`, borrowed for the call and only read by the
    // kernel; the descriptor is open for as long as the borrowed stream lives.
    let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | flags) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

impl WriteState {
    /// Writes `parts` in order, setting the socket's write timeout from `deadline` when needed.
    fn write_all(
        &mut self,
        sock: &TcpStream,
        mut parts: [&[u8]; 2],
        deadline: Instant,
    ) -> std::result::Result<(), WriteFail> {
        while parts.iter().any(|p| !p.is_empty()) {
            let left = remaining(deadline);
            if left.is_zero() {
                return Err(WriteFail::Timeout);
            }
            // Re-arming the timeout costs a system call: keep the one set while it overshoots
            // what is left by no more than TIMEOUT_SLACK.
            if self.timeout.is_none_or(|t| t > left + TIMEOUT_SLACK) {
                sock.set_write_timeout(Some(left.max(Duration::from_millis(1)))).map_err(WriteFail::Io)?;
                self.timeout = Some(left);
            }
            match send_parts(sock, &parts, 0) {
                Ok(0) => return Err(WriteFail::Io(io::ErrorKind::WriteZero.into())),
                Ok(mut n) => {
                    self.mid_frame = true;
                    for p in parts.iter_mut() {
                        let k = n.min(p.len());
                        *p = &p[k..];
                        n -= k;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The socket's timeout may be shorter than what is left: set it afresh.
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    self.timeout = None;
                }
                Err(e) => return Err(WriteFail::Io(e)),
            }
        }
        Ok(())
    }

    /// Writes what `conn`'s lanes take now of the frame `head` + `payload`, from where `s`
    /// says on (advancing it), without waiting; whether the frame is complete. A frame left
    /// incomplete sets `mid_frame` until it is finished.
    ///
    /// # Errors
    /// When a socket fails.
    pub(super) fn write_now(
        &mut self,
        conn: &Conn,
        head: &[u8; HEADER_LEN],
        payload: &[u8],
        s: &mut Sending,
    ) -> io::Result<bool> {
        for j in 0..s.stripes.lanes() {
            loop {
                let (r, done) = (s.stripes.range(j), s.stripes.done(j));
                let rest = &payload[r.start + done..r.end];
                let parts: [&[u8]; 2] =
                    if j == 0 && s.head < HEADER_LEN { [&head[s.head..], rest] } else { [rest, &[]] };
                if parts.iter().all(|p| p.is_empty()) {
                    break;
                }
                match send_parts(conn.lane(j), &parts, libc::MSG_DONTWAIT) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(mut n) => {
                        if j == 0 {
                            let h = n.min(HEADER_LEN - s.head);
                            s.head += h;
                            n -= h;
                        }
                        s.stripes.set_done(j, done + n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        self.mid_frame = true;
                        return Err(e);
                    }
                }
            }
        }
        let complete = s.complete();
        self.mid_frame = !complete && s.started();
        Ok(complete)
    }

    /// Finishes the frame `head` + `payload` that `s` says is partly written, by `deadline`;
    /// whether it is complete (`mid_frame` then cleared). A socket error or the deadline:
    /// `false`, and the caller closes the connection.
    pub(super) fn finish_frame(
        &mut self,
        conn: &Conn,
        head: &[u8; HEADER_LEN],
        payload: &[u8],
        s: &mut Sending,
        deadline: Instant,
    ) -> bool {
        loop {
            match self.write_now(conn, head, payload, s) {
                Ok(true) => return true,
                Ok(false) => {}
                Err(_) => return false,
            }
            let left = remaining(deadline);
            if left.is_zero() {
                return false;
            }
            writable_within(conn, s, left.min(Duration::from_millis(100)));
        }
    }

    /// Writes the frame `head` + `payload` to `conn` by `deadline`, striped across its
    /// lanes when its length says so.
    pub(super) fn write_frame_to(
        &mut self,
        conn: &Conn,
        head: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> std::result::Result<(), WriteFail> {
        if lanes_for(payload.len(), conn.lane_count()) == 1 {
            return self.write_frame(&conn.sock, head, payload, deadline);
        }
        let mut s = Sending::new(payload.len(), conn);
        loop {
            if self.write_now(conn, head, payload, &mut s).map_err(WriteFail::Io)? {
                return Ok(());
            }
            let left = remaining(deadline);
            if left.is_zero() {
                return Err(WriteFail::Timeout);
            }
            writable_within(conn, &s, left.min(Duration::from_millis(100)));
        }
    }

    /// Writes the frame `head` + `payload` to `sock` by `deadline`.
    fn write_frame(
        &mut self,
        sock: &TcpStream,
        head: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> std::result::Result<(), WriteFail> {
        self.write_all(sock, [head, payload], deadline)?;
        self.mid_frame = false;
        Ok(())
    }
}
