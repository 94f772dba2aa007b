//! [`TcpLinks`]: a rank's TCP connections to its peers, made on demand, and the [`Link`]
//! that sends frames over them.

use std::fmt;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, OnceLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::connection::Conn;
use super::connection::WriteState;
use super::handshake::{address_key, dial, lookup, DialError, Ident};
use super::incoming::{Direct, Incoming, LaneSockets, Pumped, Socket, Wait};
use super::interface::select_address;
use super::options::{TcpOptions, MAX_FRAME_ENV};
use super::peers::{Dialed, Next};
use super::progress::{self, Shared};
use super::readiness::Poller;
use super::remaining;
use super::writer::WriteFail;
use crate::bootstrap::auth::Secret;
use crate::bootstrap::Rendezvous;
use crate::cpu::transport::frame::{self, FrameKind};
use crate::cpu::transport::mailbox::Mailbox;
use crate::cpu::transport::routed::{Link, Polled, Want};
use crate::cpu::transport::{Header, LinkKind, Pieces, Stage, TransportError};
use crate::error::{Error, Result};

/// How long a caller that yielded to its peer's crossing dial waits before it dials again,
/// unless the table changes first (the peer's connection arriving changes it, normally
/// within milliseconds; on a crowded machine the peer's dial can take seconds, and each
/// dial again costs both ranks a handshake).
const CROSSED_PAUSE: Duration = Duration::from_secs(1);
/// Longest single wait for the connection table to change.
const TABLE_WAIT: Duration = Duration::from_millis(50);

/// A rank's TCP connections to its peers: a [`Link`] for
/// [`RoutedTransport`](crate::cpu::transport::routed::RoutedTransport). What arrives is
/// delivered into the mailbox given to [`TcpLinks::establish`].
///
/// Dropping it shuts every connection down (peers see it close and lose this rank) and joins
/// the progress thread.
pub struct TcpLinks {
    addr: SocketAddr,
    poll_for: Duration,
    /// See [`TcpOptions::yield_for`].
    yield_for: Duration,
    /// How long a dial may take, whatever its caller's deadline ([`TcpOptions::connect_timeout`]).
    dial_for: Duration,
    /// The rank, its mailbox, its frame limit and its connections, with the progress thread.
    pub(super) shared: Arc<Shared>,
    /// Where peers' addresses are looked up when they are first needed
    /// ([`TcpLinks::with_directory`]).
    rdv: Option<Arc<dyn Rendezvous>>,
    prefix: String,
    progress: Option<JoinHandle<()>>,
}

impl fmt::Debug for TcpLinks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpLinks")
            .field("rank", &self.shared.rank)
            .field("addr", &self.addr)
            .field("peers", &self.peers())
            .field("max_frame", &self.shared.max_frame)
            .finish()
    }
}

/// Whether the progress thread runs in the background ([`progress::run_in_background`]):
/// where the callers read their sockets themselves first, spinning or yielding.
pub(super) fn readers_in_background(opts: &TcpOptions) -> bool {
    !(opts.poll_for.is_zero() && opts.yield_for.is_zero())
}

impl TcpLinks {
    /// Sets rank `rank` of a world of `world` up to reach each rank in `peers` over TCP (the
    /// module documentation describes how): listens on [`select_address`]'s address,
    /// publishes `host:port` under `{prefix}/tcp/{rank}` through `rdv`, and starts the
    /// progress thread, which accepts the peers' connections and delivers what arrives into
    /// `mailbox`. No connection is made here: each is made the first time it is needed
    /// ([`TcpLinks::connect`]), its peer's address looked up then in the directory
    /// ([`TcpLinks::with_directory`]), and authenticated with `secret`. Every peer must call it with the same `world`, `prefix`
    /// and secret, and with peer lists that agree (`p` lists `q` exactly when `q` lists
    /// `p`). `prefix` should be unique per job launch: an address left under it by an
    /// earlier launch would be dialed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a rank or peer out of range, repeated or equal to
    /// `rank`; [`Error::Config`] for unusable options or interface choice; [`Error::Store`]
    /// when publishing fails; [`Error::Io`] when listening fails or the progress thread
    /// cannot start.
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
        let mut expected = vec![false; world];
        for &p in peers {
            if p >= world || p == rank || expected[p] {
                return Err(Error::invalid(format!(
                    "TCP transport: peer {p} of rank {rank} (world of {world}) is out of range, this rank, or listed twice"
                )));
            }
            expected[p] = true;
        }
        let ip = select_address(opts)?;
        let listener = TcpListener::bind((ip, 0))
            .map_err(|e| Error::io(format!("listening on {ip} for the TCP transport"), &e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("reading the TCP transport's listening address", &e))?;
        let poller = Poller::new().map_err(|e| Error::io("creating the TCP transport's epoll instance", &e))?;
        let shared = Arc::new(Shared::new(
            rank,
            world,
            Ident::new(rank, world, opts.lanes, prefix),
            secret.clone(),
            expected,
            opts.lanes,
            opts.max_frame,
            mailbox,
            poller,
        ));
        let thread = progress::spawn(Arc::clone(&shared), listener, readers_in_background(opts))
            .map_err(|e| Error::io("starting the TCP transport's progress thread", &e))?;
        let links = TcpLinks {
            addr,
            poll_for: opts.poll_for,
            yield_for: opts.yield_for,
            dial_for: opts.connect_timeout,
            shared,
            rdv: None,
            prefix: prefix.to_string(),
            progress: Some(thread),
        };
        // Published last: whoever finds the address finds a rank ready to answer.
        rdv.publish(&address_key(prefix, rank), addr.to_string().as_bytes())?;
        Ok(links)
    }

    /// Looks peers' addresses up in `directory` (under the prefix given to
    /// [`TcpLinks::establish`]) when each is first needed: the rendezvous itself when it
    /// outlives setup, else a copy of the addresses made during setup.
    pub fn with_directory(mut self, directory: Arc<dyn Rendezvous>) -> TcpLinks {
        self.rdv = Some(directory);
        self
    }

    /// The address this rank listened on and published.
    #[cfg(test)]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The ranks this endpoint is connected to now, ascending.
    pub fn peers(&self) -> Vec<usize> {
        (0..self.shared.conns.len()).filter(|&p| self.shared.conns[p].get().is_some()).collect()
    }

    /// Connects to every peer now, instead of when each is first needed (for tests and
    /// tools that want every connection checked up front).
    #[cfg(test)]
    ///
    /// # Errors
    /// As [`TcpLinks::connect`], as an [`Error`]: [`Error::PeerLost`] for a peer that is
    /// gone or refused, `Error::Io` (`TimedOut`) for one that did not answer by `deadline`.
    pub fn connect_all(&self, deadline: Instant) -> Result<()> {
        for p in (0..self.shared.expected.len()).filter(|&p| self.shared.expected[p]) {
            self.connect(p, deadline).map_err(|e| match e {
                TransportError::PeerLost { peer, detail } => Error::PeerLost { rank: peer, detail },
                TransportError::Timeout { peer } => Error::Io {
                    context: format!("connecting rank {} to rank {peer} over TCP", self.shared.rank),
                    kind: std::io::ErrorKind::TimedOut,
                    message: "no connection before the deadline".into(),
                },
                TransportError::Aborted(reason) => Error::Aborted { reason },
                TransportError::PeerFailed { error, .. } => error,
                TransportError::Other(e) => e,
            })?;
        }
        Ok(())
    }

    /// The connection to `peer`, made now if there is none yet: dialed by this caller, or
    /// accepted from the peer if it dials at the same moment and keeps its own (see
    /// `peers`).
    ///
    /// # Errors
    /// `PeerLost` when the peer is gone (its port refuses connections, its connection
    /// ended, or this rank shut down); `Timeout` when no connection is made by `deadline`;
    /// `Other` when the peer refuses this rank's secret or identity (named in the error), its
    /// address cannot be looked up, or `peer` is not a TCP peer of this rank.
    pub(super) fn connect(&self, peer: usize, deadline: Instant) -> std::result::Result<&Arc<Conn>, TransportError> {
        let sh = &*self.shared;
        if let Some(c) = sh.conns.get(peer).and_then(OnceLock::get) {
            return Ok(c);
        }
        if !sh.expected.get(peer).copied().unwrap_or(false) {
            return Err(TransportError::Other(Error::invalid(format!(
                "rank {} has no TCP route to rank {peer}",
                self.shared.rank
            ))));
        }
        loop {
            let mut t = sh.table();
            match t.want(peer) {
                Next::Ready => {
                    drop(t);
                    return sh.conns[peer].get().ok_or_else(|| {
                        TransportError::Other(Error::Internal(format!("rank {peer} is connected without a connection")))
                    });
                }
                Next::Gone(detail) => return Err(TransportError::PeerLost { peer, detail }),
                Next::Wait => {
                    let left = remaining(deadline);
                    if left.is_zero() {
                        return Err(TransportError::Timeout { peer });
                    }
                    drop(sh.wait_change(t, left.min(TABLE_WAIT)));
                }
                Next::Dial => {
                    drop(t);
                    // A dial, once begun, runs to its end, not to the caller's deadline: a
                    // receiver waits in slices of 50 ms (it looks at other peers between
                    // them), and a dial that a busy peer answers later than that would be
                    // given up and begun again, each time (at 1,024 ranks on 2 CPUs no dial
                    // ever completed).
                    let dial_deadline = deadline.max(Instant::now() + self.dial_for);
                    let r = self.dial_lanes(peer, dial_deadline);
                    tracing::debug!("rank {}: dialing rank {peer}: {:?}", self.shared.rank, r.as_ref().map(Vec::len));
                    self.dial_ended(peer, r, dial_deadline)?;
                }
            }
        }
    }

    /// Looks `peer`'s address up and opens every lane of a connection to it.
    fn dial_lanes(&self, peer: usize, deadline: Instant) -> std::result::Result<Vec<TcpStream>, DialError> {
        let Some(rdv) = &self.rdv else {
            return Err(DialError::NoAddress(Error::Internal(format!(
                "rank {}'s TCP links have no directory to look rank {peer}'s address up in",
                self.shared.rank
            ))));
        };
        let at = lookup(&**rdv, &self.prefix, peer, deadline);
        // Lookups come one per new peer, far apart: the store need not hold a connection for
        // this rank between them.
        rdv.rest();
        let at = at.map_err(DialError::NoAddress)?;
        let me = &self.shared.ident;
        let refused_since = self.shared.table().refused_since(peer);
        // Only the first lane can be refused for a while: the others follow an accepted one.
        (0..self.shared.lanes)
            .map(|lane| dial(peer, lane, at, &self.shared.secret, me, deadline, refused_since.filter(|_| lane == 0)))
            .collect()
    }

    /// Records how a dial ended; an error when the caller should give up now.
    fn dial_ended(
        &self,
        peer: usize,
        r: std::result::Result<Vec<TcpStream>, DialError>,
        deadline: Instant,
    ) -> std::result::Result<(), TransportError> {
        let sh = &*self.shared;
        let mut t = sh.table();
        let outcome = match r {
            Ok(socks) => match sh.install(peer, socks) {
                Ok(_) => {
                    t.dialed(peer, Dialed::Connected);
                    Ok(())
                }
                Err(e) => {
                    let detail = format!("setting up the TCP connection to rank {peer} failed: {e}");
                    t.dialed(peer, Dialed::Failed(detail.clone()));
                    drop(t);
                    sh.lose(peer, &detail);
                    return Err(TransportError::PeerLost { peer, detail });
                }
            },
            Err(DialError::Yielded) => {
                t.dialed(peer, Dialed::Yielded);
                // The peer's own connection is on its way: give it a moment to arrive, unless
                // it arrived already (between the dial's end and this lock: its notice was
                // then sent before this wait, which would sleep the whole pause).
                if !t.connected(peer) {
                    let pause = remaining(deadline).min(CROSSED_PAUSE);
                    t = sh.wait_change(t, pause);
                }
                drop(t);
                sh.table_changed();
                return Ok(());
            }
            Err(DialError::TimedOut { refused_since: Some(since) }) => {
                t.dialed(peer, Dialed::Refused { since });
                Err(TransportError::Timeout { peer })
            }
            Err(DialError::TimedOut { refused_since: None }) => {
                t.dialed(peer, Dialed::GaveUp);
                Err(TransportError::Timeout { peer })
            }
            Err(DialError::NoAddress(e)) => {
                t.dialed(peer, Dialed::GaveUp);
                Err(TransportError::Other(e))
            }
            Err(DialError::Failed(e)) => {
                let detail = e.to_string();
                t.dialed(peer, Dialed::Failed(detail.clone()));
                drop(t);
                sh.lose(peer, &detail);
                use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionRefused, ConnectionReset};
                return Err(match e {
                    // Nothing listens, or the listener went away during the handshake.
                    Error::Io {
                        kind: ConnectionRefused | ConnectionReset | ConnectionAborted | BrokenPipe, ..
                    } => TransportError::PeerLost { peer, detail },
                    e => TransportError::Other(e),
                });
            }
        };
        drop(t);
        sh.table_changed();
        outcome
    }

    /// Shuts every connection down now, as if this process had ended: peers see the
    /// connections close and lose this rank, new connections are refused, waits here on
    /// any peer end with `PeerLost`, and later sends fail with `PeerLost`. Dropping the
    /// links does this too.
    #[cfg(test)]
    pub fn shutdown(&self) {
        self.shared.close();
    }

    /// Refuses a payload above the frame limit.
    pub(super) fn check_frame_len(&self, peer: usize, len: usize) -> std::result::Result<(), TransportError> {
        if len > self.shared.max_frame {
            return Err(TransportError::Other(Error::Config(format!(
                "a message of {len} bytes to rank {peer} exceeds the frame limit of {} bytes; raise {MAX_FRAME_ENV} on every rank",
                self.shared.max_frame
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

    /// The connection to `peer`, if it exists now.
    pub(super) fn conn(&self, peer: usize) -> Option<&Arc<Conn>> {
        self.shared.conns.get(peer).and_then(OnceLock::get)
    }

    /// Marks `conn` unusable, closes it, and loses its peer.
    pub(super) fn break_conn(&self, conn: &Conn, detail: String) -> String {
        self.shared.break_conn(conn, detail)
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
            if let Some(r) = self.shared.mailbox.try_recv(peer, want.comm_id, want.channel, want.at, want.buf)? {
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
            &self.shared.mailbox,
            self.shared.max_frame,
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
                self.shared.report_end(conn, end);
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
    /// frame to `peer`; a data frame to a peer without a connection makes one first. A
    /// notice (failure, release) goes only over a connection that exists: a peer that never
    /// exchanged anything with this rank waits on nothing from it.
    ///
    /// # Errors
    /// `Timeout` when `deadline` passes first (if part of the frame was written the
    /// connection is closed, since the stream is out of step); `PeerLost` when the
    /// connection is gone or breaks; `Other` ([`Error::Config`]) for a payload above the
    /// frame limit; as [`TcpLinks::connect`].
    fn send_frame(
        &self,
        peer: usize,
        kind: FrameKind,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> std::result::Result<(), TransportError> {
        self.check_frame_len(peer, payload.len())?;
        let conn = match (kind, self.conn(peer)) {
            (_, Some(c)) => c,
            (FrameKind::Data, None) => self.connect(peer, deadline)?,
            (_, None) => return Ok(()),
        };
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

    /// Makes the connection to `peer` if there is none yet ([`TcpLinks::connect`]).
    ///
    /// # Errors
    /// As [`TcpLinks::connect`].
    fn reach(&self, peer: usize, deadline: Instant) -> std::result::Result<(), TransportError> {
        self.connect(peer, deadline).map(drop)
    }

    /// Reads `want.peer`'s socket on the caller's thread without waiting (see `read_for`),
    /// unless someone else (the progress thread, another caller) is reading it, or there is
    /// no connection yet.
    ///
    /// # Errors
    /// As `read_for`.
    fn poll(&self, want: &mut Want<'_>) -> std::result::Result<Polled, TransportError> {
        let Some(conn) = self.conn(want.peer) else { return Ok(Polled::Nothing) };
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
        if let Some(conn) = self.conn(peer) {
            if conn.pollers.fetch_add(1, Ordering::SeqCst) == 0 {
                conn.readiness.disarm();
            }
        }
    }

    fn stop_polling(&self, peer: usize) {
        if let Some(conn) = self.conn(peer) {
            // The progress thread re-arms after reading only while no caller polls: the last
            // one to stop re-arms here, so bytes that arrived meanwhile wake it. A count that
            // is already zero (the connection was made after this caller started, so it
            // polled uncounted) stays zero, and re-arms too: the thread, woken by bytes while
            // this caller held the connection, found it taken and did not re-arm, and the
            // next bytes would otherwise wait for its once-a-second look.
            let was = conn.pollers.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if matches!(was, Ok(1) | Err(0)) {
                conn.readiness.arm();
            }
        }
    }
}

impl Drop for TcpLinks {
    fn drop(&mut self) {
        self.shared.close();
        self.shared.stop();
        if let Some(t) = self.progress.take() {
            let _ = t.join();
        }
    }
}
