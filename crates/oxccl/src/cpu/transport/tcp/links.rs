//! [`TcpLinks`]: a rank's TCP connections to its peers, how they are established, and the
//! [`Link`] that sends frames over them.

use std::collections::HashSet;
use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::acceptor::Acceptor;
use super::connection::{set_liveness, Conn};
use super::handshake::{address_key, dial, lookup, Ident};
use super::incoming::{Direct, Incoming, LaneSockets, Pumped, Socket, Wait};
use super::interface::select_address;
use super::options::{TcpOptions, MAX_FRAME_ENV};
use super::reader::{report_end, spawn_reader};
use super::writer::{WriteFail, WriteState};
use crate::bootstrap::auth::Secret;
use crate::bootstrap::Rendezvous;
use crate::cpu::transport::frame::{self, FrameKind};
use crate::cpu::transport::mailbox::Mailbox;
use crate::cpu::transport::routed::{Link, Polled, Want};
use crate::cpu::transport::{Header, LinkKind, Pieces, Stage, TransportError};
use crate::error::{Error, Result};

/// A rank's TCP connections to its peers: a [`Link`] for
/// [`RoutedTransport`](crate::cpu::transport::routed::RoutedTransport). What arrives is
/// delivered into the mailbox given to [`TcpLinks::establish`].
///
/// Dropping it shuts every connection down (peers see it close and lose this rank) and joins
/// the reader threads.
pub struct TcpLinks {
    pub(super) rank: usize,
    addr: SocketAddr,
    pub(super) max_frame: usize,
    poll_for: Duration,
    /// See [`TcpOptions::yield_for`].
    yield_for: Duration,
    pub(super) mailbox: Arc<Mailbox>,
    /// Indexed by peer rank.
    conns: Vec<Option<Arc<Conn>>>,
    pub(super) closing: Arc<AtomicBool>,
    readers: Vec<JoinHandle<()>>,
}

impl fmt::Debug for TcpLinks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpLinks")
            .field("rank", &self.rank)
            .field("addr", &self.addr)
            .field("peers", &self.peers())
            .field("max_frame", &self.max_frame)
            .finish()
    }
}

/// Whether the reader threads run in the background ([`spawn_reader`]'s `in_background`):
/// where the callers read their sockets themselves first, spinning or yielding.
pub(super) fn readers_in_background(opts: &TcpOptions) -> bool {
    !(opts.poll_for.is_zero() && opts.yield_for.is_zero())
}

impl TcpLinks {
    /// Connects rank `rank` of a world of `world` to each rank in `peers` (the module docs
    /// describe how): listens on [`select_address`]'s address, publishes `host:port` under
    /// `{prefix}/tcp/{rank}` through `rdv`, dials the peers above `rank`, accepts the peers
    /// below it, authenticates every connection with `secret` and checks both ranks, and
    /// starts one reader thread per connection delivering into `mailbox`. Every peer must
    /// call it with the same `world`, `prefix` and secret, and with peer lists that agree
    /// (`p` lists `q` exactly when `q` lists `p`). `prefix` should be unique per job launch:
    /// an address left under it by an earlier launch would be dialed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a rank or peer out of range, repeated or equal to
    /// `rank`; [`Error::Config`] for unusable options or interface choice; [`Error::Store`]
    /// when the rendezvous fails or a published address is not `host:port`;
    /// [`Error::Io`] when listening or connecting fails, when authentication fails
    /// (`PermissionDenied`, naming `OXCCL_SECRET`), when a peer refuses this rank's identity
    /// (`InvalidData`), or when peers have not connected within `opts.connect_timeout`
    /// (`TimedOut`, listing the missing ranks and the connections that were refused and why).
    #[allow(clippy::too_many_arguments)]
    pub fn establish(
        rank: usize,
        world: usize,
        peers: &[usize],
        rdv: &dyn Rendezvous,
        prefix: &str,
        secret: &Secret,
        opts: &TcpOptions,
        mailbox: Arc<Mailbox>,
    ) -> Result<TcpLinks> {
        opts.check()?;
        if rank >= world {
            return Err(Error::invalid(format!("TCP transport: rank {rank} of a world of {world}")));
        }
        let mut listed = vec![false; world];
        for &p in peers {
            if p >= world || p == rank || listed[p] {
                return Err(Error::invalid(format!(
                    "TCP transport: peer {p} of rank {rank} (world of {world}) is out of range, this rank, or listed twice"
                )));
            }
            listed[p] = true;
        }
        let deadline = Instant::now() + opts.connect_timeout;
        let ip = select_address(opts)?;
        let listener = TcpListener::bind((ip, 0))
            .map_err(|e| Error::io(format!("listening on {ip} for the TCP transport"), &e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("reading the TCP transport's listening address", &e))?;
        rdv.publish(&address_key(prefix, rank), addr.to_string().as_bytes())?;

        let me = Ident::new(rank, world, opts.lanes, prefix);
        let lower: HashSet<usize> = peers.iter().copied().filter(|&p| p < rank).collect();
        let mut higher: Vec<usize> = peers.iter().copied().filter(|&p| p > rank).collect();
        higher.sort_unstable();
        let mut acceptor =
            if lower.is_empty() { None } else { Some(Acceptor::start(listener, secret, me, lower.clone(), deadline)?) };

        let mut streams = Vec::with_capacity(peers.len());
        for p in higher {
            let at = lookup(rdv, prefix, p, deadline)?;
            let lanes = (0..opts.lanes).map(|lane| dial(p, lane, at, secret, &me, deadline)).collect::<Result<_>>()?;
            streams.push((p, lanes));
        }
        if let Some(acc) = acceptor.as_mut() {
            streams.extend(acc.collect(rank, &lower, opts.lanes, addr, deadline, opts.connect_timeout)?);
        }
        drop(acceptor);

        let mut links = TcpLinks {
            rank,
            addr,
            max_frame: opts.max_frame,
            poll_for: opts.poll_for,
            yield_for: opts.yield_for,
            mailbox,
            conns: vec![None; world],
            closing: Arc::new(AtomicBool::new(false)),
            readers: Vec::with_capacity(streams.len()),
        };
        for (p, mut socks) in streams {
            for s in &socks {
                let ready = s
                    .set_nodelay(true)
                    .and_then(|()| set_liveness(s))
                    .and_then(|()| s.set_read_timeout(None))
                    .and_then(|()| s.set_write_timeout(None));
                ready.map_err(|e| Error::io(format!("preparing the TCP connection to rank {p}"), &e))?;
            }
            if socks.is_empty() {
                return Err(Error::Internal(format!("no TCP connection to rank {p} was made")));
            }
            let s = socks.remove(0);
            let conn = Arc::new(
                Conn::new(p, s, socks)
                    .map_err(|e| Error::io(format!("watching the TCP connection to rank {p}"), &e))?,
            );
            links.conns[p] = Some(Arc::clone(&conn));
            let reader = spawn_reader(
                rank,
                conn,
                Arc::clone(&links.mailbox),
                links.max_frame,
                Arc::clone(&links.closing),
                readers_in_background(opts),
            )
            .map_err(|e| Error::io("starting a TCP reader thread", &e))?;
            links.readers.push(reader);
        }
        Ok(links)
    }

    /// The address this rank listened on and published.
    #[cfg(test)]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The ranks this endpoint is connected to, ascending.
    pub fn peers(&self) -> Vec<usize> {
        self.conns.iter().enumerate().filter(|(_, c)| c.is_some()).map(|(p, _)| p).collect()
    }

    /// Shuts every connection down now, as if this process had ended: peers see the
    /// connections close and lose this rank, waits here on any peer end with
    /// `PeerLost`, and later sends fail with `PeerLost`. Dropping the links does this too.
    pub fn shutdown(&self) {
        self.closing.store(true, Ordering::Release);
        for conn in self.conns.iter().flatten() {
            let _ = conn.gone.set(format!("rank {} shut its TCP connections down", self.rank));
            conn.shutdown();
            // The reader may be disarmed while a caller reads: have it see the end now.
            conn.readiness.arm();
        }
    }

    /// Refuses a payload above the frame limit.
    pub(super) fn check_frame_len(&self, peer: usize, len: usize) -> std::result::Result<(), TransportError> {
        if len > self.max_frame {
            return Err(TransportError::Other(Error::Config(format!(
                "a message of {len} bytes to rank {peer} exceeds the frame limit of {} bytes; raise {MAX_FRAME_ENV} on every rank",
                self.max_frame
            ))));
        }
        Ok(())
    }

    /// `conn`'s sending side, locked, once it is known to be usable.
    ///
    /// # Errors
    /// `PeerLost` when the connection is gone, or an earlier send stopped in the middle of
    /// a frame (the connection is closed then).
    pub(super) fn writer_of<'c>(
        &self,
        conn: &'c Conn,
    ) -> std::result::Result<MutexGuard<'c, WriteState>, TransportError> {
        // A sender that panicked mid-frame leaves `mid_frame` set, which is checked below.
        let w = crate::sync::relock(&conn.writer);
        let peer = conn.peer;
        if let Some(detail) = conn.gone.get() {
            return Err(TransportError::PeerLost { peer, detail: detail.clone() });
        }
        if w.mid_frame {
            drop(w);
            let detail =
                self.break_conn(conn, format!("an earlier send to rank {peer} stopped in the middle of a frame"));
            return Err(TransportError::PeerLost { peer, detail });
        }
        Ok(w)
    }

    pub(super) fn conn(&self, peer: usize) -> Result<&Arc<Conn>, TransportError> {
        self.conns.get(peer).and_then(Option::as_ref).ok_or_else(|| {
            TransportError::Other(Error::invalid(format!("rank {} has no TCP connection to rank {peer}", self.rank)))
        })
    }

    /// Marks `conn` unusable, closes it, and loses its peer.
    pub(super) fn break_conn(&self, conn: &Conn, detail: String) -> String {
        let detail = conn.gone.get_or_init(|| detail).clone();
        conn.shutdown();
        self.mailbox.lose(conn.peer, &detail);
        detail
    }
}

impl TcpLinks {
    /// Reads `want.peer`'s socket on the caller's thread, holding its incoming side: frames
    /// for others go to the mailbox; the frame `want` waits for, when it is next, lands in
    /// `want.buf` directly, its payload waited for as `wait` says (`Now`: the caller keeps
    /// the incoming side and calls again with the same buffer, see `Direct`). A frame the
    /// reader delivered before is taken from the mailbox first, so the order holds; that
    /// look also reports how the stream ended, once it has.
    ///
    /// # Errors
    /// As [`Mailbox::try_recv`]; `Timeout` when the payload begun into `want.buf` did not
    /// all arrive by `want.deadline` (the rest goes to the mailbox).
    pub(super) fn read_for(
        &self,
        conn: &Conn,
        incoming: &mut Incoming,
        want: &mut Want<'_>,
        wait: Wait,
    ) -> std::result::Result<Polled, TransportError> {
        let peer = want.peer;
        if !incoming.reading_direct() {
            if let Some(r) = self.mailbox.try_recv(peer, want.comm_id, want.channel, want.at, want.buf)? {
                return Ok(Polled::Took(r));
            }
        }
        if incoming.ended {
            // Reported by the look above, once nothing is queued.
            return Ok(Polled::Moved);
        }
        let direct = Direct { comm_id: want.comm_id, channel: want.channel, buf: want.buf, wait };
        let r = incoming.pump(
            &mut Socket(&conn.sock),
            &mut LaneSockets::new(&conn.lanes),
            peer,
            &self.mailbox,
            self.max_frame,
            Some(direct),
            Wait::Now,
        );
        match r {
            Ok(Pumped::Took(r)) => Ok(Polled::Took(r)),
            Ok(Pumped::Delivered) => Ok(Polled::Moved),
            Ok(Pumped::Nothing) => Ok(Polled::Nothing),
            Ok(Pumped::TimedOut) => Err(TransportError::Timeout { peer }),
            Err(end) => {
                // The mailbox now says how the stream ended (the next look reports it).
                report_end(self.rank, conn, end, &self.mailbox, self.closing.load(Ordering::Acquire));
                Ok(Polled::Moved)
            }
        }
    }
}

impl Link for TcpLinks {
    fn kind(&self) -> LinkKind {
        LinkKind::Tcp
    }

    /// Writes the frame's header and payload to `peer`'s connection, after every earlier
    /// frame to `peer`.
    ///
    /// # Errors
    /// `Timeout` when `deadline` passes first (if part of the frame was written the
    /// connection is closed, since the stream is out of step); `PeerLost` when the
    /// connection is gone or breaks; `Other` ([`Error::Config`]) for a payload above the
    /// frame limit, or ([`Error::InvalidArgument`]) for a rank without a connection.
    fn send_frame(
        &self,
        peer: usize,
        kind: FrameKind,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> std::result::Result<(), TransportError> {
        let conn = self.conn(peer)?;
        self.check_frame_len(peer, payload.len())?;
        let head = frame::encode_header(kind, header, payload.len());
        let mut w = self.writer_of(conn)?;
        match w.write_frame_to(conn, &head, payload, deadline) {
            Ok(()) => Ok(()),
            Err(WriteFail::Timeout) => {
                if w.mid_frame {
                    self.break_conn(
                        conn,
                        format!("a send to rank {peer} timed out in the middle of a frame; the connection was closed"),
                    );
                }
                Err(TransportError::Timeout { peer })
            }
            Err(WriteFail::Io(e)) => {
                let detail = self.break_conn(conn, format!("sending to rank {peer} over TCP failed: {e}"));
                Err(TransportError::PeerLost { peer, detail })
            }
        }
    }

    /// Reads `want.peer`'s socket on the caller's thread without waiting (see `read_for`),
    /// unless someone else (its reader thread, another caller) is reading it.
    ///
    /// # Errors
    /// As `read_for`.
    fn poll(&self, want: &mut Want<'_>) -> std::result::Result<Polled, TransportError> {
        let conn = self.conn(want.peer)?;
        match conn.incoming.try_lock() {
            Ok(mut g) => self.read_for(conn, &mut g, want, Wait::Until(want.deadline)),
            Err(TryLockError::Poisoned(p)) => {
                self.read_for(conn, &mut p.into_inner(), want, Wait::Until(want.deadline))
            }
            Err(TryLockError::WouldBlock) => Ok(Polled::Nothing),
        }
    }

    /// The caller-driven exchange (`exchange`).
    ///
    /// # Errors
    /// As [`Transport::exchange`](crate::cpu::transport::Transport::exchange).
    fn exchange(
        &self,
        to: usize,
        from: usize,
        header: &Header,
        at: Option<Stage>,
        pieces: &mut dyn Pieces,
        deadline: Instant,
    ) -> std::result::Result<bool, TransportError> {
        self.drive_exchange(to, from, header, at, pieces, deadline).map(|()| true)
    }

    fn poll_for(&self) -> Duration {
        self.poll_for
    }

    fn yield_for(&self) -> Duration {
        self.yield_for
    }

    fn start_polling(&self, peer: usize) {
        if let Ok(conn) = self.conn(peer) {
            if conn.pollers.fetch_add(1, Ordering::SeqCst) == 0 {
                conn.readiness.disarm();
            }
        }
    }

    fn stop_polling(&self, peer: usize) {
        if let Ok(conn) = self.conn(peer) {
            // The reader re-arms after reading only while no caller polls: the last one to
            // stop re-arms it here, so bytes that arrived meanwhile wake it.
            if conn.pollers.fetch_sub(1, Ordering::SeqCst) == 1 {
                conn.readiness.arm();
            }
        }
    }
}

impl Drop for TcpLinks {
    fn drop(&mut self) {
        self.shutdown();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}
