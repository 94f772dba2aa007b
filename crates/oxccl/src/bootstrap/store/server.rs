//! The store server: [`StoreServer`], and the event loop its one thread runs.
//!
//! The loop waits on one epoll instance (level-triggered) for the listener, every
//! connection and an eventfd that [`StoreServer::shutdown`] writes. Sockets are
//! non-blocking; each connection's protocol is a [`Conn`] (bytes in, events and bytes out),
//! the data and the parked waits are a [`Store`]; this file moves bytes between them and the
//! sockets and keeps the timers (authentication deadlines, stalled writes, accept pauses;
//! wait deadlines are the store's).
//!
//! Diagnostics go to a [`Log`] (stderr unless a test captures them), each line prefixed
//! `oxccl store:`. Refused connections (a wrong secret, garbage, silence) are rate-limited
//! ([`Refusals`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Once};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::conn::{Conn, Event};
use super::map::{Outcome, Store, WaitId};
use super::poll::{self, Epoll, Ready, Waker, BROKEN, READ, WRITE};
use super::protocol::Response;
#[cfg(test)]
pub(crate) use super::refusals::refusal_line;
pub(crate) use super::refusals::Log;
use super::refusals::{Refusals, Throttled};
use crate::bootstrap::auth::{AuthError, Challenge, Secret};
use crate::error::{Error, Result};

/// How long a new connection may take to authenticate before it is dropped.
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection's output may stay stuck (the client takes none of its responses)
/// before the connection is closed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// After the first refused connection, how often at most a line counts the later ones.
const REFUSAL_REPORT_EVERY: Duration = Duration::from_secs(10);
/// How long the listener rests after accept failed for want of descriptors or memory.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Connections accepted per readiness report, and bytes read from one connection per
/// report: the loop then serves the others and comes back (level-triggered).
const ACCEPTS_PER_TURN: usize = 256;
const READ_PER_TURN: usize = 1 << 20;
/// Size of the buffer every read goes through.
const SCRATCH: usize = 64 * 1024;
/// Readiness reports taken per wait.
const EVENTS: usize = 1024;

const LISTENER: u64 = 0;
const WAKER: u64 = 1;
const FIRST_CONN: u64 = 2;

/// How a server runs, beyond its address and secret.
#[derive(Clone)]
pub(crate) struct ServerOptions {
    /// How long a new connection may take to authenticate.
    pub(crate) auth_timeout: Duration,
    /// Where diagnostics go.
    pub(crate) log: Log,
    /// After the first refusal, the shortest time between two lines counting later ones.
    pub(crate) report_every: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions { auth_timeout: AUTH_TIMEOUT, log: Log::stderr(), report_every: REFUSAL_REPORT_EVERY }
    }
}

/// A TCP key-value store for rendezvous, served by one background thread.
///
/// See the [module documentation](super) for the protocol and the design.
pub struct StoreServer {
    addr: SocketAddr,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreServer").field("addr", &self.addr).field("serving", &self.thread.is_some()).finish()
    }
}

impl StoreServer {
    /// Binds (e.g. `"0.0.0.0:29500"` or `"127.0.0.1:0"`) and serves in a background thread.
    ///
    /// The server holds one descriptor per connected client, so binding raises this
    /// process's soft limit on open files (`RLIMIT_NOFILE`) to its hard limit, as Go's
    /// runtime does (logged at debug level; children started later inherit the raised
    /// limit).
    ///
    /// # Errors
    /// [`Error::Io`] when the address cannot be bound (in use, not local, malformed) or the
    /// serving thread cannot be started.
    pub fn bind(addr: &str, secret: Secret) -> Result<StoreServer> {
        Self::bind_with(addr, secret, ServerOptions::default())
    }

    /// [`bind`](Self::bind) with other options (tests use a short authentication timeout,
    /// or capture the log).
    pub(crate) fn bind_with(addr: &str, secret: Secret, opts: ServerOptions) -> Result<StoreServer> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::AddrInUse {
                " (is another job's store using this port? choose another MASTER_PORT)"
            } else {
                ""
            };
            Error::io(format!("binding the store to {addr}{hint}"), &e)
        })?;
        let local = listener.local_addr().map_err(|e| Error::io("reading the store's bound address", &e))?;
        raise_fd_limit_once();
        if let Err(e) = poll::widen_backlog(&listener) {
            tracing::debug!("oxccl store: cannot widen the accept queue of {local}: {e}");
        }
        let setup = |what: &str, e: io::Error| Error::io(format!("setting up the store's event loop: {what}"), &e);
        listener.set_nonblocking(true).map_err(|e| setup("a non-blocking listener", e))?;
        let epoll = Epoll::new().map_err(|e| setup("epoll_create1", e))?;
        let waker = Arc::new(Waker::new().map_err(|e| setup("eventfd", e))?);
        epoll.add(listener.as_raw_fd(), LISTENER, READ).map_err(|e| setup("watching the listener", e))?;
        epoll.add(waker.as_raw_fd(), WAKER, READ).map_err(|e| setup("watching the eventfd", e))?;
        let event_loop = Loop {
            epoll,
            listener,
            waker: Arc::clone(&waker),
            secret,
            auth_timeout: opts.auth_timeout,
            refusals: Refusals::new(opts.report_every),
            accept_failures: Throttled::new(opts.report_every),
            log: opts.log,
            store: Store::new(),
            conns: HashMap::new(),
            next_token: FIRST_CONN,
            timers: BinaryHeap::new(),
            scratch: vec![0; SCRATCH].into_boxed_slice(),
        };
        let thread = thread::Builder::new()
            .name("oxccl-store".into())
            .spawn(move || event_loop.run())
            .map_err(|e| Error::io("starting the store's thread", &e))?;
        Ok(StoreServer { addr: local, waker, thread: Some(thread) })
    }

    /// The address the server listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving (also on drop): answers every parked wait with an error, closes the
    /// listener and every connection, and waits for the server's thread. Connected clients
    /// then see errors.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(thread) = self.thread.take() else { return };
        self.waker.wake();
        let _ = thread.join();
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Raises `RLIMIT_NOFILE`'s soft limit to the hard limit, once per process.
fn raise_fd_limit_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| match poll::raise_fd_limit() {
        Ok(Some((from, to))) => tracing::debug!(
            "oxccl store: raised the soft limit on open files (RLIMIT_NOFILE) from {from} to the hard limit {to}: \
             the store holds one descriptor per client"
        ),
        Ok(None) => {}
        Err(e) => tracing::debug!("oxccl store: cannot raise the soft limit on open files (RLIMIT_NOFILE): {e}"),
    });
}

/// A connection and what the loop keeps about it.
struct ClientConn {
    stream: TcpStream,
    conn: Conn,
    /// What epoll watches it for.
    interest: u32,
    /// Its parked wait, if any.
    wait: Option<WaitId>,
    /// When its output last made progress, or got stuck after being empty.
    last_write: Instant,
    /// A write timer is in the heap for it.
    write_timer: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// The connection must have authenticated by now.
    Auth(u64),
    /// The connection's output must have made progress since `WRITE_TIMEOUT` ago.
    Write(u64),
    /// Accepting again after a pause.
    Accept,
}

/// The event loop's state, owned by its thread.
struct Loop {
    epoll: Epoll,
    listener: TcpListener,
    waker: Arc<Waker>,
    secret: Secret,
    auth_timeout: Duration,
    log: Log,
    refusals: Refusals,
    accept_failures: Throttled,
    store: Store,
    /// Live connections by token (tokens are never reused, so a stale timer or readiness
    /// report finds nothing).
    conns: HashMap<u64, ClientConn>,
    next_token: u64,
    /// Connection and listener timers; an entry that no longer applies is skipped.
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    scratch: Box<[u8]>,
}

/// Writes what `conn` has to send until done or the socket is full.
fn flush(stream: &TcpStream, conn: &mut Conn) -> io::Result<()> {
    loop {
        let out = conn.unsent();
        if out.is_empty() {
            return Ok(());
        }
        match (&*stream).write(out) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => conn.sent(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Errors that mean the client went away, not worth a line.
fn normal(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe)
}

impl Loop {
    fn run(mut self) {
        let mut events = Vec::with_capacity(EVENTS);
        let mut ready: Vec<Ready> = Vec::with_capacity(EVENTS);
        'serve: loop {
            let timeout = self.timeout(Instant::now());
            if let Err(e) = self.epoll.wait(&mut events, &mut ready, timeout) {
                self.log.line(&format!("oxccl store: stopped serving: waiting for events failed: {e}"));
                break;
            }
            for r in &ready {
                match r.token {
                    LISTENER => self.accept(),
                    WAKER => break 'serve,
                    token => self.readable(token, r.flags),
                }
            }
            let now = Instant::now();
            self.fire_timers(now);
            self.store.expire(now);
            self.deliver();
        }
        self.waker.drain();
        self.finish();
    }

    /// How long to wait for events: until the earliest timer.
    fn timeout(&mut self, now: Instant) -> Option<Duration> {
        let conn_timer = self.timers.peek().map(|Reverse((at, _))| *at);
        let next = match (conn_timer, self.store.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        next.map(|at| at.saturating_duration_since(now))
    }

    fn accept(&mut self) {
        for _ in 0..ACCEPTS_PER_TURN {
            match self.listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => {}
                Err(e) => {
                    // Out of descriptors (EMFILE, ENFILE) or memory: the connection stays in
                    // the queue and the listener stays readable, so rest rather than spin.
                    let now = Instant::now();
                    let hint = match e.raw_os_error() {
                        Some(libc::EMFILE | libc::ENFILE) => {
                            " (too many open files: raise the hard limit, ulimit -Hn, for this many clients)"
                        }
                        _ => "",
                    };
                    let what = format!("accept failed: {e}{hint}; pausing accepts for {ACCEPT_PAUSE:?}");
                    self.accept_failures.note(&self.log, now, &what);
                    if self.epoll.modify(self.listener.as_raw_fd(), LISTENER, 0).is_ok() {
                        self.timers.push(Reverse((now + ACCEPT_PAUSE, Timer::Accept)));
                    }
                    return;
                }
            }
        }
    }

    /// A new connection: watch it, start its handshake and its authentication deadline.
    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        let token = self.next_token;
        self.next_token += 1;
        let challenge = match stream
            .set_nonblocking(true)
            .map_err(|e| e.to_string())
            .and_then(|()| Challenge::new().map_err(|e| e.to_string()))
        {
            Ok(c) => c,
            Err(e) => return self.refusals.refused(&self.log, peer, &format!("cannot set up the connection: {e}")),
        };
        let _ = stream.set_nodelay(true);
        if let Err(e) = self.epoll.add(stream.as_raw_fd(), token, READ) {
            return self.refusals.refused(&self.log, peer, &format!("cannot watch the connection: {e}"));
        }
        let now = Instant::now();
        let slot = ClientConn {
            stream,
            conn: Conn::new(peer, challenge),
            interest: READ,
            wait: None,
            last_write: now,
            write_timer: false,
        };
        self.conns.insert(token, slot);
        if let Some(at) = now.checked_add(self.auth_timeout) {
            self.timers.push(Reverse((at, Timer::Auth(token))));
        }
        self.drive(token);
    }

    /// A readiness report for a connection: read what it wants read, then drive it.
    fn readable(&mut self, token: u64, flags: u32) {
        let Some(slot) = self.conns.get_mut(&token) else { return };
        if flags & (READ | BROKEN) != 0 && slot.conn.wants_read() {
            let mut budget = READ_PER_TURN;
            while budget > 0 && slot.conn.wants_read() {
                match (&slot.stream).read(&mut self.scratch) {
                    Ok(0) => slot.conn.end_of_input(),
                    Ok(n) => {
                        slot.conn.received(&self.scratch[..n]);
                        budget = budget.saturating_sub(n);
                        if n < self.scratch.len() {
                            // Most likely all there was: save the read that would say so
                            // (if more came, the level-triggered epoll reports it again).
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let peer = slot.conn.peer();
                        if slot.conn.authenticating() {
                            self.refusals.refused(&self.log, peer, &AuthError::Io(e));
                        } else if !normal(&e) {
                            self.log.line(&slot.conn.closed_line(&e));
                        }
                        return self.close(token);
                    }
                }
            }
        } else if flags & BROKEN != 0 {
            // Failed or hung up while not read (a parked wait, a closing connection): nothing
            // more can be exchanged, and the report would repeat.
            return self.close(token);
        }
        self.drive(token);
    }

    /// Runs a connection's events (requests against the store) and sends its output, until
    /// neither makes progress; then closes it if it is done, or updates what it is watched for.
    fn drive(&mut self, token: u64) {
        let Some(slot) = self.conns.get_mut(&token) else { return };
        let was_pending = !slot.conn.unsent().is_empty();
        loop {
            while let Some(event) = slot.conn.next_event(&self.secret) {
                match event {
                    Event::Authenticated => {}
                    Event::Refused(e) => self.refusals.refused(&self.log, slot.conn.peer(), &e),
                    Event::Request(req) => match self.store.apply(token, req, Instant::now()) {
                        Outcome::Answer(r) => slot.conn.respond(&r),
                        Outcome::Parked(id) => slot.wait = Some(id),
                    },
                    Event::Closed(line) => {
                        if let Some(line) = line {
                            self.log.line(&line);
                        }
                    }
                }
            }
            let before = slot.conn.unsent().len();
            if let Err(e) = flush(&slot.stream, &mut slot.conn) {
                if slot.conn.authenticating() {
                    self.refusals.refused(&self.log, slot.conn.peer(), &AuthError::Io(e));
                } else if !normal(&e) {
                    self.log.line(&slot.conn.closed_line(&e));
                }
                return self.close(token);
            }
            let left = slot.conn.unsent().len();
            if left < before {
                slot.last_write = Instant::now();
            }
            // Sending everything may let paused requests run.
            if left > 0 || left == before {
                break;
            }
        }
        if slot.conn.finished() {
            return self.close(token);
        }
        let stuck = !slot.conn.unsent().is_empty();
        if stuck && !was_pending {
            slot.last_write = Instant::now();
        }
        let want = (if slot.conn.wants_read() { READ } else { 0 }) | (if stuck { WRITE } else { 0 });
        if want != slot.interest {
            if let Err(e) = self.epoll.modify(slot.stream.as_raw_fd(), token, want) {
                self.log.line(&slot.conn.closed_line(&format!("cannot watch the connection: {e}")));
                return self.close(token);
            }
            slot.interest = want;
        }
        if stuck && !slot.write_timer {
            slot.write_timer = true;
            self.timers.push(Reverse((slot.last_write + WRITE_TIMEOUT, Timer::Write(token))));
        }
    }

    /// Forgets a connection (closing its socket) and its parked wait.
    fn close(&mut self, token: u64) {
        if let Some(slot) = self.conns.remove(&token) {
            if let Some(id) = slot.wait {
                self.store.cancel(id);
            }
        }
    }

    /// Hands the store's answers to parked waits to their connections.
    fn deliver(&mut self) {
        loop {
            let ready = self.store.take_ready();
            if ready.is_empty() {
                return;
            }
            for (owner, response) in ready {
                if let Some(slot) = self.conns.get_mut(&owner) {
                    slot.wait = None;
                    slot.conn.respond(&response);
                    self.drive(owner);
                }
            }
        }
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(&Reverse((at, timer))) = self.timers.peek() {
            if at > now {
                return;
            }
            self.timers.pop();
            match timer {
                Timer::Accept => {
                    if let Err(e) = self.epoll.modify(self.listener.as_raw_fd(), LISTENER, READ) {
                        self.accept_failures.note(&self.log, now, &format!("cannot watch the listener again: {e}"));
                        self.timers.push(Reverse((now + ACCEPT_PAUSE, Timer::Accept)));
                    }
                }
                Timer::Auth(token) => {
                    let Some(slot) = self.conns.get(&token) else { continue };
                    if slot.conn.authenticating() {
                        let why = format!("no handshake within {:.1}s", self.auth_timeout.as_secs_f64());
                        self.refusals.refused(&self.log, slot.conn.peer(), &why);
                        self.close(token);
                    }
                }
                Timer::Write(token) => {
                    let Some(slot) = self.conns.get_mut(&token) else { continue };
                    slot.write_timer = false;
                    if slot.conn.unsent().is_empty() {
                        continue;
                    }
                    let due = slot.last_write + WRITE_TIMEOUT;
                    if due <= now {
                        let why = format!("it took none of its responses for {}s", WRITE_TIMEOUT.as_secs());
                        self.log.line(&slot.conn.closed_line(&why));
                        self.close(token);
                    } else {
                        slot.write_timer = true;
                        self.timers.push(Reverse((due, Timer::Write(token))));
                    }
                }
            }
        }
    }

    /// Stopping: parked waits are told, what can be sent is sent, everything is closed.
    fn finish(&mut self) {
        for owner in self.store.stop() {
            if let Some(slot) = self.conns.get_mut(&owner) {
                slot.wait = None;
                slot.conn.respond(&Response::Error("the store is shutting down".into()));
            }
        }
        for slot in self.conns.values_mut() {
            let _ = flush(&slot.stream, &mut slot.conn);
            let _ = slot.stream.shutdown(Shutdown::Both);
        }
        self.conns.clear();
        self.refusals.flush(&self.log);
    }
}
