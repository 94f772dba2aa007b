//! The TCP transport: one connection per pair of ranks that talk, for ranks on different
//! hosts, made of one or more sockets (lanes, `OXCCL_SOCKETS_PER_PEER`, 2 by default), made
//! the first time the pair needs it, and served by one progress thread per rank whatever
//! the number of peers.
//!
//! [`TcpLinks::establish`] sets a rank up: it listens on an address of the chosen interface
//! ([`select_address`]: `bind_addr`, else `OXCCL_SOCKET_IFNAME`, else the first up
//! non-loopback IPv4 interface, else 127.0.0.1), starts the progress thread, and publishes
//! `host:port` under `{prefix}/tcp/{rank}`. Nothing is connected then.
//!
//! **Connections on demand** (`peers`, `links`): the first send to a peer, or the first wait
//! for one ([`Link::reach`](super::routed::Link::reach): a receiver dials too, so a peer that
//! is gone is found even if it never sent), looks the peer's address up and dials it on the
//! caller's thread. Ring, tree and recursive-doubling algorithms so hold O(1) or O(log N)
//! connections per rank; an all_to_all reaches everyone. Two ranks that dial each other at
//! the same moment end with one connection: the lower rank's dial wins, and the higher one
//! takes the connection it accepts instead (the table in `peers` is the whole protocol,
//! tested without sockets). Failure and release notices go only where a connection exists.
//!
//! Every connection starts with the mutual job-secret handshake of
//! [`auth`](crate::bootstrap::auth) (context `oxccl-tcp`), then an identity exchange:
//!
//! ```text
//! client -> server  "OXTCPID2" src u64  dst u64  world u64  prefix-tag[8]  lanes u64  lane u64
//! server -> client  "OXTCPID2" rank u64 verdict u8 (0: accepted; 6: crossed, 7: duplicate)
//! ```
//!
//! The server accepts only a client that names it as its destination, agrees on the world
//! size, the rendezvous prefix (an 8-byte hash of it) and the number of lanes, and is one of
//! its TCP peers; the client accepts only the rank it dialed. So a connection cannot claim to
//! be another rank's by mistake, nor join from another setup. A dial that finds the peer's
//! port closed (its process ended) or the connection reset loses the peer; a wrong secret or
//! identity is an error naming both ranks.
//!
//! **The progress thread** (`progress`) sleeps in one epoll instance (`readiness`) holding
//! the listener, the sockets in their handshake and every connection's lanes. It runs each
//! server handshake without blocking (`accepting`: the server's half as a state machine
//! without I/O, bytes in and bytes out), many at once, each bounded by 10 s; and it reads
//! every connection no caller is reading, never waiting for a payload's rest (it resumes at
//! the next wake-up). Every connection gets `TCP_NODELAY`, keepalive probes and a bound on
//! unacknowledged data (`set_liveness`: a host that vanishes, or a cut link, ends the
//! connection within about half a minute even while nothing is being sent).
//!
//! Receiving: a connection's incoming bytes are decoded by whoever holds its `Incoming`
//! (`incoming`: every field checked before use; a length field alone never makes it
//! allocate more than 64 MiB, the payload buffer grows as bytes arrive, up to `max_frame`).
//! A receiver waiting on a peer first reads that peer's socket itself, without waiting, for
//! [`TcpOptions::poll_for`] ([`Link::poll`](super::routed::Link::poll)), then, where the
//! ranks outnumber the CPUs, for [`TcpOptions::yield_for`] with a `sched_yield` between
//! reads: the frame it waits for lands straight in its buffer, and no thread has to wake
//! for it. Otherwise (and for everything that arrives while nobody waits on that peer) the
//! progress thread reads: a connection's lanes are watched one-shot and left disarmed while
//! a receiver reads, so the two do not wake each other; where receivers poll, the thread
//! runs as `SCHED_BATCH`, so bytes that come between two operations do not make it preempt
//! its rank. It delivers into the rank's [`Mailbox`](super::mailbox::Mailbox): data with
//! `deliver`, failure notices with `fail`, release notices with `close`. When the stream
//! ends (EOF, a read error, a malformed frame) whoever found it loses the peer; a malformed
//! frame also closes the connection.
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
//! lanes cannot reorder frames). Over a veth pair on 2 cores, two lanes carried a 16 MiB
//! all_reduce up to 30% faster than one (see `options::DEFAULT_LANES`).
//!
//! Connections are not re-established: a lost connection loses the peer for every
//! communicator that uses it.
//!
//! The files: `options` ([`TcpOptions`], from the environment), `interface` (choosing the
//! address), `handshake` (looking peers up, dialing, the identity exchange), `peers` (which
//! connection a pair keeps), `accepting` (the server's handshake), `progress` (the progress
//! thread and what it shares with callers), `readiness` (the epoll instance), `connection`
//! (one connection and its socket options), `writer` (sending), `incoming` (decoding what
//! arrives, by whichever thread reads), `stripes` (payloads across lanes), `exchange` (both
//! directions driven by the caller), `links` ([`TcpLinks`]), and `tests`.

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
