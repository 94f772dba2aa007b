//! One established connection ([`Conn`]: its sockets, both directions' state, how it
//! ended) and the socket options that make a dead peer end it ([`set_liveness`]).

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::incoming::Incoming;
use super::readiness::{Poller, Readiness};

/// One established connection to a peer: lane 0's socket, and the sockets of the other
/// lanes when there are several (`stripes`: they carry stripes of large payloads only, and
/// are read and written only by whoever holds lane 0's incoming side or writer).
pub(super) struct Conn {
    pub(super) peer: usize,
    /// When the progress thread wakes for it (first: dropped before the sockets it watches).
    pub(super) readiness: Readiness,
    pub(super) sock: TcpStream,
    /// Lanes 1 and up.
    pub(super) lanes: Vec<TcpStream>,
    pub(super) writer: Mutex<WriteState>,
    /// The receiving side, read by the progress thread or by a receiving caller, in turn.
    pub(super) incoming: Mutex<Incoming>,
    /// Callers reading the socket themselves now ([`Link::start_polling`]): while there are
    /// any, the connection is left disarmed.
    ///
    /// [`Link::start_polling`]: crate::cpu::transport::routed::Link::start_polling
    pub(super) pollers: AtomicUsize,
    /// Set once the connection is unusable, with what was observed.
    pub(super) gone: OnceLock<String>,
}

/// The sending side of a connection, behind its mutex.
#[derive(Default)]
pub(super) struct WriteState {
    /// The socket's current write timeout.
    pub(super) timeout: Option<Duration>,
    /// A frame was begun and not finished: the stream is out of step.
    pub(super) mid_frame: bool,
}

impl Conn {
    /// A connection to `peer` over `sock` (lane 0) and `lanes` (lanes 1 and up), watched by
    /// `poller`, no lane armed (see [`Readiness::new`]).
    ///
    /// # Errors
    /// When the kernel refuses to watch a socket.
    pub(super) fn new(peer: usize, sock: TcpStream, lanes: Vec<TcpStream>, poller: &Arc<Poller>) -> io::Result<Conn> {
        let fds = std::iter::once(sock.as_raw_fd()).chain(lanes.iter().map(AsRawFd::as_raw_fd)).collect();
        let readiness = Readiness::new(poller, peer, fds)?;
        Ok(Conn {
            peer,
            readiness,
            sock,
            lanes,
            writer: Mutex::default(),
            incoming: Mutex::default(),
            pollers: AtomicUsize::new(0),
            gone: OnceLock::new(),
        })
    }
}

impl Conn {
    /// How many lanes the connection has.
    pub(super) fn lane_count(&self) -> usize {
        1 + self.lanes.len()
    }

    /// Lane `j`'s socket (`j` below [`Conn::lane_count`], as every stripe's lane is:
    /// `stripes::lanes_for` never gives more lanes than the connection has).
    pub(super) fn lane(&self, j: usize) -> &TcpStream {
        j.checked_sub(1).and_then(|i| self.lanes.get(i)).unwrap_or(&self.sock)
    }

    /// Shuts every lane down.
    pub(super) fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        for s in &self.lanes {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Idle time before the first keepalive probe, seconds.
pub(super) const KEEPALIVE_IDLE_S: libc::c_int = 10;
/// Time between keepalive probes, seconds.
pub(super) const KEEPALIVE_INTERVAL_S: libc::c_int = 5;
/// Unanswered probes before the connection is declared dead.
pub(super) const KEEPALIVE_PROBES: libc::c_int = 3;
/// Longest time sent data may stay unacknowledged before the connection is declared dead.
pub(super) const USER_TIMEOUT_MS: libc::c_int = 30_000;

/// Makes a dead peer end the connection even when nothing is being sent: keepalive probes
/// after 10 s of silence (dead after 3 unanswered probes 5 s apart) and `TCP_USER_TIMEOUT`
/// (data unacknowledged for 30 s). The progress thread then sees the error and the peer is
/// lost for every communicator (`PeerLost`), instead of each wait running to its deadline.
///
/// # Errors
/// When the socket refuses an option.
pub(super) fn set_liveness(s: &TcpStream) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| -> io::Result<()> {
        // SAFETY: setsockopt on an open socket with a pointer to a live c_int and its size.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_S)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES)?;
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
}
