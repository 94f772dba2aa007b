//! The TCP transport: one connection per pair of ranks, for ranks on different hosts, made
//! of one or more sockets (lanes, `OXCCL_SOCKETS_PER_PEER`, 2 by default).
//!
//! [`TcpLinks::establish`] sets a rank's connections up:
//!
//! 1. it listens on an address of the chosen interface ([`select_address`]: `bind_addr`,
//!    else `OXCCL_SOCKET_IFNAME`, else the first up non-loopback IPv4 interface, else
//!    127.0.0.1) and publishes `host:port` under `{prefix}/tcp/{rank}`;
//! 2. **the lower rank of each pair connects to the higher one**: a rank dials every peer
//!    above it, once per lane, and accepts the connections of every peer below it (accepting runs on its own
//!    thread while the rank dials, and every accepted connection is handled on a thread of
//!    its own, so a silent or hostile client cannot hold the others up);
//! 3. every connection starts with the mutual job-secret handshake of
//!    [`auth`](crate::bootstrap::auth) (context `oxccl-tcp`), then an identity exchange:
//!
//!    ```text
//!    client -> server  "OXTCPID2" src u64  dst u64  world u64  prefix-tag[8]  lanes u64  lane u64
//!    server -> client  "OXTCPID2" rank u64 verdict u8 (0: accepted)
//!    ```
//!
//!    The server accepts only a client that names it as its destination, agrees on the
//!    world size, the rendezvous prefix (an 8-byte hash of it) and the number of lanes, and
//!    is one of the lower peers it still expects (once per lane); the client accepts only the rank it dialed. So a connection
//!    cannot claim to be another rank's by mistake, nor join from another setup.
//! 4. every connection gets `TCP_NODELAY`, keepalive probes and a bound on unacknowledged
//!    data (see `set_liveness`: a host that vanishes, or a cut link, ends the connection
//!    within about half a minute even while nothing is being sent), and a reader thread.
//!
//! Receiving: a connection's incoming bytes are decoded by whoever holds its `Incoming`
//! (`incoming`: every field checked before use; a length field alone never makes it
//! allocate more than 64 MiB, the payload buffer grows as bytes arrive, up to `max_frame`).
//! A receiver waiting on a peer first reads that peer's socket itself, without waiting, for
//! [`TcpOptions::poll_for`] ([`Link::poll`](super::routed::Link::poll)), then, where the
//! ranks outnumber the CPUs, for [`TcpOptions::yield_for`] with a `sched_yield` between
//! reads: the frame it waits for lands straight in its buffer, and no thread has to wake
//! for it. Otherwise (and for
//! everything that arrives while nobody waits on that peer) the connection's reader thread
//! reads: it sleeps until the socket has bytes (`readiness`: an epoll instance that stays
//! disarmed while a receiver reads, so the two do not wake each other; where receivers poll,
//! it runs as `SCHED_BATCH`, so bytes that come between two operations do not make it
//! preempt its rank, `reader`), and delivers into
//! the rank's [`Mailbox`](super::mailbox::Mailbox): data with `deliver`, failure notices with
//! `fail`, release notices with `close`. When the stream ends (EOF, a read error, a
//! malformed frame) whoever found it calls `lose`; a malformed frame also closes the
//! connection.
//!
//! A message cut into pieces ([`pipeline`](crate::cpu::algorithms::pipeline)) sent to one
//! peer while another is received from is exchanged by the caller alone (`exchange`):
//! it writes without waiting as much as the socket takes, reads the incoming pieces into
//! their places, and sleeps in `poll` on both sockets when neither moves.
//!
//! Sends ([`Link::send_frame`](super::routed::Link::send_frame)) are serialized per
//! connection by a mutex, header and payload in one `sendmsg` (`MSG_NOSIGNAL`; `writev`
//! would raise `SIGPIPE` on a closed connection and kill a process that has not ignored it).
//! The deadline becomes the socket's write timeout.
//!
//! Several lanes (`stripes`): every frame's header goes on lane 0, and a payload from 128 KiB
//! on is cut into one stripe per lane, read by whoever decodes its header (so the other
//! lanes need no reader thread and cannot reorder frames). Over a veth pair on 2 cores, two
//! lanes carried a 16 MiB all_reduce up to 30% faster than one (see
//! `options::DEFAULT_LANES`).
//!
//! Connections are not re-established: a lost connection loses the peer for every
//! communicator that uses it.
//!
//! The files: `options` ([`TcpOptions`], from the environment), `interface` (choosing the
//! address), `handshake` (looking peers up, dialing, the identity exchange), `acceptor`
//! (accepting and vetting the lower peers' connections), `connection` (one connection and its
//! socket options), `writer` (sending), `incoming` (decoding what arrives, by whichever
//! thread reads), `reader` (the reader thread) and `readiness` (when it wakes), `stripes`
//! (payloads across lanes), `exchange`
//! (both directions driven by the caller), `links` ([`TcpLinks`]), and `tests`.

mod accepting;
mod connection;
mod exchange;
mod handshake;
mod incoming;
mod interface;
mod links;
mod options;
mod peers;
mod progress;
mod readiness;
mod stripes;
#[cfg(test)]
mod tests;
mod writer;

use std::time::{Duration, Instant};

pub use handshake::address_key;
#[cfg(any(test, feature = "testing"))]
pub use handshake::AUTH_CONTEXT;
pub use interface::{default_candidates, ipv4_interfaces, select_address};
pub use links::TcpLinks;
pub use options::{TcpOptions, MAX_POLL};
#[cfg(test)]
use options::{DEFAULT_MAX_FRAME, IFNAME_ENV, MAX_FRAME_ENV};

/// What is left of the time until `deadline` (zero once it has passed).
/// Sleeps in `poll` on `fds` until one is ready or `for_` passes (at least 1 ms); an
/// interrupted or failed poll returns early, and errors show when the sockets are next used.
fn poll_fds(fds: &mut [libc::pollfd], for_: Duration) -> std::io::Result<()> {
    let ms = for_.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` holds valid pollfds (a negative fd is ignored), and the count is its length.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    match std::io::Error::last_os_error() {
        e if r < 0 && e.kind() != std::io::ErrorKind::Interrupted => Err(e),
        _ => Ok(()),
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}
