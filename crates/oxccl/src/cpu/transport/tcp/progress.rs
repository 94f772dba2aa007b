//! The progress thread: one per rank's TCP links, whatever the number of peers. It sleeps
//! in the rank's [`Poller`] and, when woken,
//!
//! - accepts connections and runs each one's server handshake without blocking
//!   (`accepting`), as many at once as arrive, each bounded by [`HANDSHAKE_TIMEOUT`]; the
//!   connection table ([`PeerTable`]) decides which connection a pair keeps, and the
//!   connection is installed before its last lane is answered;
//! - reads every connection whose bytes no caller is reading ([`Incoming::pump`], never
//!   waiting: a payload that is still arriving resumes at the next wake-up), and delivers
//!   into the rank's mailbox; when a stream ends it loses the peer ([`Shared::report_end`],
//!   which a receiving caller that finds the end uses too).
//!
//! What it shares with the callers of the links is [`Shared`]. Where the callers read their
//! sockets themselves first, the thread runs as `SCHED_BATCH` ([`run_in_background`]).

use std::collections::HashMap;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::accepting::{Accepting, Read};
use super::connection::{set_liveness, Conn};
use super::handshake::{check_hello, refusal, reply, Ident, Verdict};
use super::incoming::{End, LaneSockets, Socket, Wait};
use super::peers::PeerTable;
use super::readiness::{Poller, Token};
use crate::bootstrap::auth::Secret;
use crate::cpu::transport::mailbox::Mailbox;

/// Longest time an accepted connection may take over its handshake, and a peer over the
/// lanes of its connection after the first.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the thread looks at every connection even without a wake-up (a safety net: it
/// is woken whenever bytes arrive while no caller reads).
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// Most connections in their handshake at once; more are closed at once (a flood of
/// clients that never speak cannot exhaust this rank's descriptors).
const MAX_HANDSHAKES: usize = 256;

/// What the progress thread and the links' callers share.
pub(super) struct Shared {
    pub(super) rank: usize,
    pub(super) ident: Ident,
    pub(super) secret: Secret,
    /// Which ranks may connect (the TCP peers), by rank.
    pub(super) expected: Vec<bool>,
    pub(super) lanes: usize,
    pub(super) max_frame: usize,
    pub(super) mailbox: Arc<Mailbox>,
    pub(super) poller: Arc<Poller>,
    /// The connection to each rank, once made (never replaced: a lost peer stays lost).
    pub(super) conns: Vec<OnceLock<Arc<Conn>>>,
    table: Mutex<PeerTable<TcpStream>>,
    /// Signalled whenever the table changes.
    changed: Condvar,
    /// This rank shut its connections down.
    pub(super) closing: AtomicBool,
    /// The links are dropped: the thread ends.
    stop: AtomicBool,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        rank: usize,
        world: usize,
        ident: Ident,
        secret: Secret,
        expected: Vec<bool>,
        lanes: usize,
        max_frame: usize,
        mailbox: Arc<Mailbox>,
        poller: Arc<Poller>,
    ) -> Shared {
        Shared {
            rank,
            ident,
            secret,
            expected,
            lanes,
            max_frame,
            mailbox,
            poller,
            conns: (0..world).map(|_| OnceLock::new()).collect(),
            table: Mutex::new(PeerTable::new(rank, world)),
            changed: Condvar::new(),
            closing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        }
    }

    /// The connection table, locked.
    pub(super) fn table(&self) -> MutexGuard<'_, PeerTable<TcpStream>> {
        crate::sync::relock(&self.table)
    }

    /// Waits (up to `for_`) for the table to change, and relocks it.
    pub(super) fn wait_change<'a>(
        &self,
        t: MutexGuard<'a, PeerTable<TcpStream>>,
        for_: Duration,
    ) -> MutexGuard<'a, PeerTable<TcpStream>> {
        self.changed.wait_timeout(t, for_).map_or_else(|e| e.into_inner().0, |(g, _)| g)
    }

    /// Wakes every caller waiting for the table.
    pub(super) fn table_changed(&self) {
        self.changed.notify_all();
    }

    /// Makes `socks` (lane 0 first) the connection to `peer`: socket options, watched by the
    /// poller, and published in `conns`. The caller holds the table and marks the peer
    /// connected.
    ///
    /// # Errors
    /// When a socket option or the watch is refused, or `peer` already has a connection.
    pub(super) fn install(&self, peer: usize, mut socks: Vec<TcpStream>) -> io::Result<Arc<Conn>> {
        for s in &socks {
            s.set_nonblocking(false)?;
            s.set_nodelay(true)?;
            set_liveness(s)?;
            s.set_read_timeout(None)?;
            s.set_write_timeout(None)?;
        }
        if socks.is_empty() {
            return Err(io::Error::other("a connection without sockets"));
        }
        let sock = socks.remove(0);
        let conn = Arc::new(Conn::new(peer, sock, socks, &self.poller)?);
        self.conns[peer].set(Arc::clone(&conn)).map_err(|_| io::Error::other("a second connection"))?;
        // Armed only once published: the peer may have written already (its side of the
        // handshake ended first), and a wake-up before this point would find no connection
        // and be spent, leaving those bytes to the thread's once-a-second look.
        conn.readiness.arm_where(|lane| lane == 0);
        Ok(conn)
    }

    /// Records how `conn`'s stream ended: the connection is unusable (a malformed frame also
    /// closes it), and the peer is lost for every communicator, with what was observed (or,
    /// when this rank is closing, that it shut its connections down). Returns the detail.
    pub(super) fn report_end(&self, conn: &Conn, end: End) -> String {
        let peer = conn.peer;
        if matches!(end, End::Malformed(_)) {
            conn.shutdown();
        }
        let detail = if self.closing.load(Ordering::Acquire) {
            format!("rank {} shut its TCP connections down", self.rank)
        } else {
            match end {
                End::Closed => format!(
                    "the TCP connection to rank {peer} closed (its process ended, or it shut its connections down)"
                ),
                End::Truncated => format!("the TCP connection to rank {peer} closed in the middle of a frame"),
                End::Failed(e) => format!("reading from rank {peer} over TCP failed: {e}"),
                End::Malformed(m) => format!("rank {peer} sent {m}; the connection was closed"),
            }
        };
        let detail = conn.gone.get_or_init(|| detail).clone();
        self.lose(peer, &detail);
        detail
    }

    /// Marks `conn` unusable, closes it, and loses its peer.
    pub(super) fn break_conn(&self, conn: &Conn, detail: String) -> String {
        let detail = conn.gone.get_or_init(|| detail).clone();
        conn.shutdown();
        self.lose(conn.peer, &detail);
        detail
    }

    /// `peer` is lost: for every communicator (the mailbox), and for good (the table).
    pub(super) fn lose(&self, peer: usize, detail: &str) {
        self.mailbox.lose(peer, detail);
        self.table().lose(peer, detail);
        self.table_changed();
    }

    /// Shuts every connection down and refuses new ones (see `TcpLinks::shutdown`).
    pub(super) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        let detail = format!("rank {} shut its TCP connections down", self.rank);
        for conn in self.conns.iter().filter_map(OnceLock::get) {
            let _ = conn.gone.set(detail.clone());
            conn.shutdown();
        }
        {
            let mut t = self.table();
            for p in (0..self.expected.len()).filter(|&p| self.expected[p]) {
                t.lose(p, &detail);
            }
        }
        for p in (0..self.expected.len()).filter(|&p| self.expected[p]) {
            self.mailbox.lose(p, &detail);
        }
        self.table_changed();
        // The thread closes the listener.
        self.poller.wake();
    }

    /// Ends the thread (after [`Shared::close`]).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.poller.wake();
    }
}

/// Starts the progress thread of `shared`, accepting on `listener`.
///
/// # Errors
/// When the thread cannot be started or the listener cannot be watched.
pub(super) fn spawn(shared: Arc<Shared>, listener: TcpListener, in_background: bool) -> io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    shared.poller.watch(listener.as_raw_fd(), Token::Listener)?;
    std::thread::Builder::new().name(format!("oxccl-tcp{}", shared.rank)).spawn(move || {
        if in_background {
            run_in_background();
        }
        Loop { shared: &shared, listener: Some(listener), handshakes: HashMap::new(), next_id: 0 }.run();
    })
}

/// Makes the calling thread `SCHED_BATCH`: woken by bytes, it does not preempt the rank's
/// running thread, and runs once that thread sleeps (in a wait that outlasted its poll) or
/// at its next time slice. Ranks bound to one CPU each otherwise paid two context switches
/// whenever a peer's frame came between two operations, and on a crowded host the frames
/// of the next round come while the rank still finishes this one (`docs/performance.md`).
/// Where the kernel refuses, the thread stays as it was.
pub(super) fn run_in_background() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call (a
    // non-real-time policy takes priority 0).
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if r != 0 {
        tracing::debug!("the TCP progress thread stays in the normal scheduling class: {}", io::Error::last_os_error());
    }
}

/// The progress thread's state.
struct Loop<'a> {
    shared: &'a Shared,
    listener: Option<TcpListener>,
    handshakes: HashMap<u64, Accepting>,
    next_id: u64,
}

impl Loop<'_> {
    fn run(mut self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        let mut fired = Vec::with_capacity(events.len());
        let mut last_look = Instant::now();
        while !self.shared.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let mut sleep = LOOK_EVERY.saturating_sub(now.duration_since(last_look));
            if let Some(d) = self.handshakes.values().map(|h| h.deadline).min() {
                sleep = sleep.min(d.saturating_duration_since(now));
            }
            self.shared.poller.wait(&mut events, sleep, &mut fired);
            for &t in &fired {
                match t {
                    Token::Waker => self.woken(),
                    Token::Listener => self.accept(),
                    Token::Handshake(id) => self.handshake(id),
                    Token::Lane { peer, .. } => self.read(peer),
                }
            }
            let now = Instant::now();
            self.expire_handshakes(now);
            if now.duration_since(last_look) >= LOOK_EVERY {
                last_look = now;
                // Once a second, not at every wake-up: the table is shared with the callers,
                // and a stalled acceptance may wait a second past its 10 s.
                self.expire_acceptances(now);
                for peer in 0..self.shared.conns.len() {
                    if self.shared.conns[peer].get().is_some() {
                        self.read(peer);
                    }
                }
            }
        }
    }

    fn woken(&mut self) {
        self.shared.poller.drain_waker();
        if self.shared.closing.load(Ordering::Acquire) {
            if let Some(l) = self.listener.take() {
                self.shared.poller.forget(l.as_raw_fd());
            }
            for (_, h) in self.handshakes.drain() {
                self.shared.poller.forget(h.sock.as_raw_fd());
            }
        }
    }

    /// Takes every connection waiting on the listener into its handshake.
    fn accept(&mut self) {
        let Some(listener) = &self.listener else { return };
        loop {
            match listener.accept() {
                Ok((sock, from)) => {
                    if self.handshakes.len() >= MAX_HANDSHAKES {
                        tracing::warn!(
                            "rank {}: {MAX_HANDSHAKES} TCP connections are in their handshake; {from} was closed",
                            self.shared.rank
                        );
                        continue;
                    }
                    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
                    let started = Accepting::start(sock, from, deadline).and_then(|a| {
                        self.next_id += 1;
                        self.shared.poller.watch(a.sock.as_raw_fd(), Token::Handshake(self.next_id)).map(|()| a)
                    });
                    match started {
                        Ok(a) => {
                            self.handshakes.insert(self.next_id, a);
                        }
                        Err(e) => tracing::debug!("rank {}: a connection from {from} failed: {e}", self.shared.rank),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // WouldBlock: all taken. Anything else (out of descriptors, a connection
                // reset before it was accepted): the listener stays ready and is tried at the
                // next wake-up, after a pause that keeps the thread from spinning.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!("rank {}: accepting a TCP connection failed: {e}", self.shared.rank);
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            }
        }
    }

    /// Moves handshake `id` on.
    fn handshake(&mut self, id: u64) {
        let Some(a) = self.handshakes.get_mut(&id) else { return };
        match a.readable(&self.shared.secret) {
            Read::Pending => {}
            Read::Failed(why) => {
                let a = self.drop_handshake(id);
                if let Some(a) = a {
                    tracing::debug!("rank {}: refused {}: {why}", self.shared.rank, a.from);
                }
            }
            Read::Hello(hello) => {
                let Some(a) = self.drop_handshake(id) else { return };
                self.decide(a, &hello);
            }
        }
    }

    fn drop_handshake(&mut self, id: u64) -> Option<Accepting> {
        let a = self.handshakes.remove(&id)?;
        self.shared.poller.forget(a.sock.as_raw_fd());
        Some(a)
    }

    /// Answers an identity message: refused, or accepted as a lane of a connection (the
    /// connection installed first when it is the last lane).
    fn decide(&mut self, a: Accepting, hello: &[u8; super::handshake::HELLO_LEN]) {
        let sh = self.shared;
        let (verdict, src, lane) = check_hello(hello, &sh.ident, &sh.expected);
        if verdict != Verdict::Accepted || sh.closing.load(Ordering::Acquire) {
            // A rank shutting down has lost every peer.
            let v = if verdict == Verdict::Accepted { Verdict::Lost } else { verdict };
            let _ = a.answer(&reply(&sh.ident, v));
            tracing::warn!("rank {}: {} (from {})", sh.rank, refusal(&sh.ident, v, src), a.from);
            return;
        }
        let (peer, lane) = (src as usize, lane as usize);
        let mut t = sh.table();
        let v = t.hello(peer, lane, sh.lanes, Instant::now());
        tracing::debug!("rank {}: connection {lane} from rank {peer}: {v:?}", sh.rank);
        if v != Verdict::Accepted {
            drop(t);
            let _ = a.answer(&reply(&sh.ident, v));
            return;
        }
        // Each lane is answered before it joins the table, and the table stays locked until
        // the connection is installed: no caller of this rank can write on a lane before its
        // answer (the client would read frame bytes for it), and a client whose dial
        // succeeded finds the connection here.
        if let Err(e) = a.answer(&reply(&sh.ident, Verdict::Accepted)) {
            // It never arrives: the acceptance expires.
            tracing::debug!("rank {}: answering rank {peer}'s connection {lane} failed: {e}", sh.rank);
            return;
        }
        let Some(socks) = t.lane_arrived(peer, lane, a.sock) else { return };
        let installed = sh.install(peer, socks);
        drop(t);
        if let Err(e) = installed {
            sh.lose(peer, &format!("setting up the TCP connection from rank {peer} failed: {e}"));
        }
        sh.table_changed();
    }

    /// Closes handshakes past their deadline.
    fn expire_handshakes(&mut self, now: Instant) {
        let late: Vec<u64> = self.handshakes.iter().filter(|(_, h)| h.deadline <= now).map(|(id, _)| *id).collect();
        for id in late {
            if let Some(a) = self.drop_handshake(id) {
                tracing::debug!("rank {}: {} did not finish its handshake in time", self.shared.rank, a.from);
            }
        }
    }

    /// Gives up on connections whose lanes stopped coming.
    fn expire_acceptances(&mut self, now: Instant) {
        let gone = self.shared.table().expire(now, HANDSHAKE_TIMEOUT);
        if !gone.is_empty() {
            tracing::debug!("rank {}: the connections of ranks {gone:?} stopped arriving", self.shared.rank);
            self.shared.table_changed();
        }
    }

    /// Reads `peer`'s connection if no caller is reading it (see the module documentation).
    fn read(&mut self, peer: usize) {
        let sh = self.shared;
        let Some(conn) = sh.conns.get(peer).and_then(OnceLock::get) else { return };
        // A caller holding the incoming side counts as polling: it re-arms when it stops.
        let Ok(mut incoming) = conn.incoming.try_lock() else { return };
        if incoming.ended {
            return;
        }
        let mut lanes = LaneSockets::new(&conn.lanes);
        let r = incoming.pump(&mut Socket(&conn.sock), &mut lanes, peer, &sh.mailbox, sh.max_frame, None, Wait::Now);
        if let Err(end) = r {
            drop(incoming);
            sh.report_end(conn, end);
            return;
        }
        let wanted: Vec<bool> = (0..conn.lane_count()).map(|j| incoming.awaits(j)).collect();
        drop(incoming);
        // Pairs with the callers' count (see `Conn::pollers`): the last caller to stop
        // re-arms too, so whichever of us looks last leaves the connection armed.
        if conn.pollers.load(Ordering::SeqCst) == 0 {
            conn.readiness.arm_where(|j| wanted[j]);
        }
    }
}
