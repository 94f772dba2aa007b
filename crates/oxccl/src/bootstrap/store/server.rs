//! The store server: an accept thread, one thread per connection, one map behind a mutex.
//!
//! Diagnostics go to a [`Log`] (stderr unless a test captures them), each line prefixed
//! `oxccl store:`. Refused connections (a wrong secret, garbage, silence) are rate-limited
//! ([`Refusals`]): anyone who can reach the port can cause them, and each would otherwise be
//! a line in the job's output.

use crate::sync::relock as lock;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::protocol::{read_frame, FrameError, Request, Response};
use super::AUTH_CONTEXT;
use crate::bootstrap::auth::{self, Secret};
use crate::error::{Error, Result};

/// How long a new connection may take to authenticate before it is dropped.
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long writing a response may block on a client that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// After the first refused connection, how often at most a line counts the later ones.
const REFUSAL_REPORT_EVERY: Duration = Duration::from_secs(10);

/// Where a store server writes its diagnostics, one line at a time (without the newline).
/// Each server has its own; the default is stderr.
#[derive(Clone)]
pub(crate) struct Log(Arc<dyn Fn(&str) + Send + Sync>);

impl Log {
    /// Lines to the log (`tracing`, warn level: the store reports refused clients).
    pub(crate) fn stderr() -> Log {
        Log(Arc::new(|line| tracing::warn!("{line}")))
    }

    /// Lines to `sink` (tests capture them).
    #[cfg(test)]
    pub(crate) fn to(sink: impl Fn(&str) + Send + Sync + 'static) -> Log {
        Log(Arc::new(sink))
    }

    fn line(&self, line: &str) {
        (self.0)(line)
    }
}

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

/// Rate-limited reporting of refused connections: the first is said in full (peer and
/// reason); the later ones are counted, and the count is said (with the latest peer and
/// reason) with the first refusal at least `every` after the previous line, and when the
/// server stops.
struct Refusals {
    every: Duration,
    state: Mutex<RefusalState>,
}

#[derive(Default)]
struct RefusalState {
    /// When the last line about refusals was written (`None`: no refusal yet).
    last_line: Option<Instant>,
    /// Refusals since that line.
    unreported: u64,
    /// The latest of them: its peer and reason.
    latest: Option<(SocketAddr, String)>,
}

impl Refusals {
    fn new(every: Duration) -> Refusals {
        Refusals { every, state: Mutex::new(RefusalState::default()) }
    }

    /// Counts a refusal of `peer` for `reason`, and says so on `log` if one is due.
    fn refused(&self, log: &Log, peer: SocketAddr, reason: &dyn fmt::Display) {
        let now = Instant::now();
        let mut st = lock(&self.state);
        let Some(last) = st.last_line else {
            st.last_line = Some(now);
            log.line(&format!(
                "{} (further refusals are counted, reported at most every {})",
                refusal_line(peer, reason),
                secs(self.every)
            ));
            return;
        };
        st.unreported += 1;
        st.latest = Some((peer, reason.to_string()));
        if now.saturating_duration_since(last) >= self.every {
            Self::report(&mut st, log, now);
        }
    }

    /// Says how many refusals went unreported, if any (the server is stopping).
    fn flush(&self, log: &Log) {
        Self::report(&mut lock(&self.state), log, Instant::now());
    }

    fn report(st: &mut RefusalState, log: &Log, now: Instant) {
        let (Some(last), Some((peer, reason))) = (st.last_line, st.latest.take()) else { return };
        if st.unreported == 0 {
            return;
        }
        let n = st.unreported;
        log.line(&format!(
            "oxccl store: refused {n} more connection{} since the last report {} ago (the latest: {peer}: {reason})",
            if n == 1 { "" } else { "s" },
            secs(now.saturating_duration_since(last))
        ));
        st.unreported = 0;
        st.last_line = Some(now);
    }
}

/// `10s`, `1.5s`.
fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s:.1}s")
    }
}

/// A TCP key-value store for rendezvous, serving in background threads.
///
/// See the [module documentation](super) for the protocol and the threading model.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreServer").field("addr", &self.addr).field("serving", &self.accept.is_some()).finish()
    }
}

/// What the accept thread and the connection threads share.
struct Shared {
    secret: Secret,
    auth_timeout: Duration,
    log: Log,
    refusals: Refusals,
    data: Mutex<Data>,
    /// Signalled whenever a key is added or changed, and at shutdown.
    changed: Condvar,
    conns: Mutex<Conns>,
}

struct Data {
    map: HashMap<String, Vec<u8>>,
    stopping: bool,
}

/// The live connections, so that shutdown can close them and wait for their threads.
struct Conns {
    stopping: bool,
    next_id: u64,
    live: HashMap<u64, (TcpStream, Option<JoinHandle<()>>)>,
}

impl StoreServer {
    /// Binds (e.g. `"0.0.0.0:29500"` or `"127.0.0.1:0"`) and serves in background threads.
    ///
    /// # Errors
    /// [`Error::Io`] when the address cannot be bound (in use, not local, malformed) or the
    /// accept thread cannot be started.
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
        let shared = Arc::new(Shared {
            secret,
            auth_timeout: opts.auth_timeout,
            refusals: Refusals::new(opts.report_every),
            log: opts.log,
            data: Mutex::new(Data { map: HashMap::new(), stopping: false }),
            changed: Condvar::new(),
            conns: Mutex::new(Conns { stopping: false, next_id: 0, live: HashMap::new() }),
        });
        let sh = Arc::clone(&shared);
        let accept = thread::Builder::new()
            .name("oxccl-store-accept".into())
            .spawn(move || accept_loop(&sh, &listener))
            .map_err(|e| Error::io("starting the store's accept thread", &e))?;
        Ok(StoreServer { addr: local, shared, accept: Some(accept) })
    }

    /// The address the server listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving (also on drop): closes the listener and every connection, wakes every
    /// waiting request, and waits for the server's threads. Connected clients then see
    /// errors.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(accept) = self.accept.take() else { return };
        lock(&self.shared.data).stopping = true;
        self.shared.changed.notify_all();
        let live = {
            let mut c = lock(&self.shared.conns);
            c.stopping = true;
            std::mem::take(&mut c.live)
        };
        for (stream, _) in live.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        // The accept thread blocks in accept(): a connection of our own wakes it, it sees
        // `stopping` and exits, closing the listener. If even that connection fails, it
        // stays parked until the next connection arrives, which it drops.
        if TcpStream::connect_timeout(&wake_address(self.addr), Duration::from_secs(2)).is_ok() {
            let _ = accept.join();
        }
        for (_, handle) in live.into_values() {
            if let Some(h) = handle {
                let _ = h.join();
            }
        }
        self.shared.refusals.flush(&self.shared.log);
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where to connect to reach a listener bound to `addr` from this host.
fn wake_address(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port()),
        _ => addr,
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) => {
                if lock(&shared.conns).stopping {
                    return;
                }
                // Out of descriptors and the like: say so, back off, keep serving.
                shared.log.line(&format!("oxccl store: accept failed: {e}"));
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let id = {
            let mut c = lock(&shared.conns);
            if c.stopping {
                return;
            }
            let Ok(clone) = stream.try_clone() else {
                shared.refused(peer, &"cannot track the connection");
                continue;
            };
            let id = c.next_id;
            c.next_id += 1;
            c.live.insert(id, (clone, None));
            id
        };
        let sh = Arc::clone(shared);
        let spawned = thread::Builder::new().name("oxccl-store-conn".into()).spawn(move || {
            serve(&sh, stream, peer);
            lock(&sh.conns).live.remove(&id);
        });
        let mut c = lock(&shared.conns);
        match spawned {
            // If the thread already finished, its entry is gone and the handle is dropped.
            Ok(h) => {
                if let Some(entry) = c.live.get_mut(&id) {
                    entry.1 = Some(h);
                }
            }
            Err(e) => {
                c.live.remove(&id);
                drop(c);
                shared.refused(peer, &format!("cannot start a thread for it: {e}"));
            }
        }
    }
}

/// The line logged when a connection is refused during authentication.
pub(crate) fn refusal_line(peer: SocketAddr, reason: &dyn fmt::Display) -> String {
    format!("oxccl store: refused {peer}: {reason}")
}

fn stopping(shared: &Shared) -> bool {
    lock(&shared.conns).stopping
}

impl Shared {
    /// Reports a refused connection (rate-limited, see [`Refusals`]).
    fn refused(&self, peer: SocketAddr, reason: &dyn fmt::Display) {
        self.refusals.refused(&self.log, peer, reason);
    }
}

/// One connection: authenticate, then answer requests until the client leaves.
fn serve(shared: &Shared, mut stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    // A client that connects and stays silent is dropped after the timeout.
    if let Err(e) = stream
        .set_read_timeout(Some(shared.auth_timeout))
        .and_then(|()| stream.set_write_timeout(Some(shared.auth_timeout)))
    {
        shared.refused(peer, &e);
        return;
    }
    if let Err(e) = auth::accept(&mut stream, &shared.secret, AUTH_CONTEXT) {
        if !stopping(shared) {
            match e {
                auth::AuthError::Io(io) if matches!(io.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    let why = format!("no handshake within {:.1}s", shared.auth_timeout.as_secs_f64());
                    shared.refused(peer, &why);
                }
                e => shared.refused(peer, &e),
            }
        }
        return;
    }
    // An authenticated client may stay idle as long as it likes (clients pool connections).
    if stream.set_read_timeout(None).and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT))).is_err() {
        return;
    }
    loop {
        let body = match read_frame(&mut stream) {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(FrameError::Io(e)) => {
                let normal = matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe
                );
                if !normal && !stopping(shared) {
                    shared.log.line(&format!("oxccl store: closed {peer}: {e}"));
                }
                return;
            }
            Err(e @ FrameError::Truncated { .. }) => {
                if !stopping(shared) {
                    shared.log.line(&format!("oxccl store: closed {peer}: {e}"));
                }
                return;
            }
            Err(e @ FrameError::TooLarge(_)) => {
                shared.log.line(&format!("oxccl store: closed {peer}: {e}"));
                let _ = send(&mut stream, &Response::Error(format!("malformed frame: {e}")));
                return;
            }
        };
        let response = match Request::decode(&body) {
            Ok(req) => handle(shared, req),
            Err(e) => {
                shared.log.line(&format!("oxccl store: closed {peer}: malformed request: {e}"));
                let _ = send(&mut stream, &Response::Error(format!("malformed request: {e}")));
                return;
            }
        };
        if send(&mut stream, &response).is_err() {
            return;
        }
    }
}

fn send(stream: &mut TcpStream, response: &Response) -> io::Result<()> {
    let frame = match response.encode() {
        Ok(f) => f,
        // Cannot happen for values the store accepted; answer with an error rather than nothing.
        Err(e) => Response::Error(format!("cannot encode the response: {e}")).encode().map_err(io::Error::other)?,
    };
    stream.write_all(&frame)
}

/// Carries out one request against the shared map.
fn handle(shared: &Shared, req: Request) -> Response {
    let mut data = lock(&shared.data);
    match req {
        Request::Set { key, value } => {
            data.map.insert(key, value);
            shared.changed.notify_all();
            Response::Done
        }
        Request::Get { key } => Response::Value(data.map.get(&key).cloned()),
        Request::Add { key, delta } => {
            let current = match data.map.get(&key) {
                None => 0,
                Some(v) => match std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()) {
                    Some(n) => n,
                    None => {
                        return Response::Error(format!(
                            "add on key `{key}`: its value is not a decimal integer (it was set with set or \
                             compare_set); use a separate key for counters"
                        ))
                    }
                },
            };
            let Some(new) = current.checked_add(delta) else {
                return Response::Error(format!("add on key `{key}`: {current} + {delta} overflows a 64-bit integer"));
            };
            data.map.insert(key, new.to_string().into_bytes());
            shared.changed.notify_all();
            Response::Int(new)
        }
        Request::CompareSet { key, expected, new } => {
            let matches = match (&expected, data.map.get(&key)) {
                (None, None) => true,
                (Some(e), Some(cur)) => e == cur,
                _ => false,
            };
            if matches {
                data.map.insert(key, new.clone());
                shared.changed.notify_all();
                Response::Bytes(new)
            } else {
                Response::Bytes(data.map.get(&key).cloned().unwrap_or_default())
            }
        }
        Request::Delete { key } => Response::Bool(data.map.remove(&key).is_some()),
        Request::Wait { keys, timeout_ms } => {
            // None: a deadline too far away to represent; wait without one.
            let deadline = Instant::now().checked_add(Duration::from_millis(timeout_ms));
            loop {
                if data.stopping {
                    return Response::Error("the store is shutting down".into());
                }
                if keys.iter().all(|k| data.map.contains_key(k)) {
                    return Response::Done;
                }
                data = match deadline {
                    None => shared.changed.wait(data).unwrap_or_else(|p| p.into_inner()),
                    Some(d) => {
                        let now = Instant::now();
                        if now >= d {
                            // The missing keys are listed once, when the wait gives up.
                            let missing = keys.iter().filter(|k| !data.map.contains_key(*k)).cloned().collect();
                            return Response::Missing(missing);
                        }
                        shared.changed.wait_timeout(data, d - now).unwrap_or_else(|p| p.into_inner()).0
                    }
                };
            }
        }
    }
}
