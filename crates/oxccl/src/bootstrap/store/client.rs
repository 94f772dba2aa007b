//! The store client: authenticated connections to a [`StoreServer`](super::StoreServer).

use crate::sync::relock as lock;
use std::fmt;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::protocol::{read_frame, Request, Response, MAX_WAIT_KEYS};
use super::AUTH_CONTEXT;
use crate::bootstrap::auth::{self, AuthError, Secret};
use crate::bootstrap::Rendezvous;
use crate::error::{Error, Result};

/// How long one connection attempt and its handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request other than a wait may go without progress before the connection is
/// declared lost.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Extra time, beyond a wait's own timeout, for the server's answer to arrive.
const WAIT_GRACE: Duration = Duration::from_secs(30);
/// First and longest pause between connection attempts.
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_millis(500);
/// Idle connections kept for reuse; more are closed when returned.
const MAX_IDLE: usize = 8;
/// How long a client that had a connection keeps trying to open another one whose attempts
/// time out (a store swamped by a thousand ranks reconnecting at once, on CPUs they share,
/// answers late, not never).
const RECONNECT_PATIENCE: Duration = Duration::from_secs(120);
/// How long it keeps trying while the store's port refuses connections (nothing listens:
/// the process that ran the store ended).
const REFUSED_PATIENCE: Duration = Duration::from_secs(2);
/// Longest pause between two reconnection attempts.
const RECONNECT_PAUSE_MAX: Duration = Duration::from_secs(2);

/// A client of a [`StoreServer`](super::StoreServer). `Send + Sync`: share it between threads.
///
/// Internally a mutex around a small pool of authenticated connections: a request takes an
/// idle connection (opening one if none is idle), so a thread blocked in
/// [`wait`](Self::wait) never holds up a `set` from another thread of the same process.
/// A connection whose request fails is closed, never reused.
pub struct StoreClient {
    /// What the caller asked for, for messages.
    target: String,
    /// The address that answered, for further connections.
    addr: SocketAddr,
    secret: Secret,
    idle: Mutex<Vec<Conn>>,
}

impl fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreClient").field("target", &self.target).field("addr", &self.addr).finish()
    }
}

struct Conn {
    stream: TcpStream,
    read_timeout: Option<Duration>,
}

/// Why one connection attempt failed.
enum Attempt {
    /// Worth trying again (reset, unreachable, timed out, name not resolvable yet).
    Retry(String),
    /// Nothing listens at the address (yet, or any more).
    Refused(String),
    /// Trying again cannot help (the secrets differ, not a store, a malformed address).
    Fatal(Error),
}

/// `pause` scaled by a random factor in [0.5, 1.5) (std's randomly keyed hasher).
fn jittered(pause: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let x = std::collections::hash_map::RandomState::new().build_hasher().finish() >> 54;
    pause.mul_f64(0.5 + x as f64 / 1024.0)
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Opens one authenticated connection to `addr`, giving up after `timeout`.
fn open(target: &str, addr: SocketAddr, secret: &Secret, timeout: Duration) -> Result<Conn, Attempt> {
    let timeout = timeout.clamp(Duration::from_millis(1), CONNECT_TIMEOUT);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| {
        if e.kind() == io::ErrorKind::ConnectionRefused {
            Attempt::Refused(format!("{addr}: {e}"))
        } else {
            Attempt::Retry(format!("{addr}: {e}"))
        }
    })?;
    let _ = stream.set_nodelay(true);
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| Attempt::Retry(format!("{addr}: {e}")))?;
    match auth::connect(&mut stream, secret, AUTH_CONTEXT) {
        Ok(()) => {}
        Err(AuthError::Io(e)) => return Err(Attempt::Retry(format!("{addr}: during authentication: {e}"))),
        Err(e @ (AuthError::RefusedByServer | AuthError::ServerUnproven | AuthError::ClientRefused)) => {
            return Err(Attempt::Fatal(Error::Store(format!("cannot join the store at {target} ({addr}): {e}"))))
        }
        Err(e @ AuthError::Protocol(_)) => {
            return Err(Attempt::Fatal(Error::Store(format!(
                "{target} ({addr}) is not an oxccl store ({e}); check MASTER_ADDR and MASTER_PORT"
            ))))
        }
    }
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(|e| Attempt::Retry(format!("{addr}: {e}")))?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(|e| Attempt::Retry(format!("{addr}: {e}")))?;
    Ok(Conn { stream, read_timeout: Some(IO_TIMEOUT) })
}

impl Conn {
    /// Sends one request frame and reads the answer. Any error leaves the connection unusable.
    fn round_trip(&mut self, frame: &[u8], read_timeout: Option<Duration>) -> std::result::Result<Response, String> {
        if self.read_timeout != read_timeout {
            self.stream.set_read_timeout(read_timeout).map_err(|e| e.to_string())?;
            self.read_timeout = read_timeout;
        }
        self.stream.write_all(frame).map_err(|e| format!("sending: {e}"))?;
        match read_frame(&mut self.stream) {
            Ok(Some(body)) => Response::decode(&body).map_err(|e| format!("malformed response: {e}")),
            Ok(None) => Err("the store closed the connection".into()),
            Err(e) => Err(format!("receiving: {e}")),
        }
    }
}

impl StoreClient {
    /// Connects and authenticates, retrying refused connections until `timeout` (the server
    /// may start later). `addr` is `host:port`; the host may be a name.
    ///
    /// # Errors
    /// [`Error::Store`] when no store answered in time (the message names the address and
    /// the last failure), when the store refuses this process's secret or cannot prove it
    /// knows the job's (the message says the secrets differ and how to fix it), when
    /// something other than an oxccl store answers, or when `addr` is not `host:port`.
    pub fn connect(addr: &str, secret: &Secret, timeout: Duration) -> Result<StoreClient> {
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        let mut pause = RETRY_FIRST;
        let mut last = String::from("no attempt finished");
        loop {
            let remaining = deadline.map_or(CONNECT_TIMEOUT, |d| d.saturating_duration_since(Instant::now()));
            match addr.to_socket_addrs() {
                Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                    return Err(Error::Store(format!(
                        "`{addr}` is not a store address: {e}; expected host:port, e.g. 10.0.0.1:29500"
                    )))
                }
                Err(e) => last = format!("cannot resolve {addr}: {e}"),
                Ok(candidates) => {
                    for sa in candidates {
                        match open(addr, sa, secret, remaining) {
                            Ok(conn) => {
                                return Ok(StoreClient {
                                    target: addr.to_string(),
                                    addr: sa,
                                    secret: secret.clone(),
                                    idle: Mutex::new(vec![conn]),
                                })
                            }
                            Err(Attempt::Fatal(e)) => return Err(e),
                            Err(Attempt::Retry(m) | Attempt::Refused(m)) => last = m,
                        }
                    }
                }
            }
            let remaining = deadline.map_or(RETRY_MAX, |d| d.saturating_duration_since(Instant::now()));
            if remaining.is_zero() {
                return Err(Error::Store(format!(
                    "no store answered at {addr} within {} (last attempt: {last}); is the process that runs the \
                     store (rank 0) up, and do MASTER_ADDR and MASTER_PORT point at it?",
                    secs(timeout)
                )));
            }
            std::thread::sleep(pause.min(remaining));
            pause = (pause * 2).min(RETRY_MAX);
        }
    }

    /// Closes the pooled connections that no request is using now. A rank calls it once its
    /// init is done, so that the server does not keep one descriptor per idle rank; a later
    /// request opens (and authenticates) a new connection on demand, and requests in flight
    /// on other threads are not disturbed.
    pub fn close_idle(&self) {
        let idle = std::mem::take(&mut *lock(&self.idle));
        drop(idle); // closed outside the lock
    }

    /// How many connections are pooled (tests).
    #[cfg(test)]
    pub(crate) fn pooled(&self) -> usize {
        lock(&self.idle).len()
    }

    /// Takes an idle connection or opens a new one: attempts that time out are tried again
    /// for [`RECONNECT_PATIENCE`], refused ones for [`REFUSED_PATIENCE`], with growing,
    /// jittered pauses (a thousand ranks that found the store busy do not come back at once).
    fn take(&self) -> Result<Conn> {
        if let Some(c) = lock(&self.idle).pop() {
            return Ok(c);
        }
        let start = Instant::now();
        let mut refused_since: Option<Instant> = None;
        let mut pause = RETRY_FIRST;
        loop {
            let m = match open(&self.target, self.addr, &self.secret, CONNECT_TIMEOUT) {
                Ok(c) => return Ok(c),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Refused(m)) => {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= REFUSED_PATIENCE {
                        return Err(self.unreachable(&m, start));
                    }
                    m
                }
                Err(Attempt::Retry(m)) => {
                    refused_since = None;
                    m
                }
            };
            if start.elapsed() >= RECONNECT_PATIENCE {
                return Err(self.unreachable(&m, start));
            }
            tracing::debug!("store at {}: reconnecting after {}: {m}", self.target, secs(start.elapsed()));
            std::thread::sleep(jittered(pause));
            pause = (pause * 2).min(RECONNECT_PAUSE_MAX);
        }
    }

    fn unreachable(&self, last: &str, start: Instant) -> Error {
        Error::Store(format!(
            "cannot open another connection to the store at {} (tried for {}; last attempt: {last}); has the \
             process that runs the store (rank 0) exited?",
            self.target,
            secs(start.elapsed())
        ))
    }

    fn give_back(&self, conn: Conn) {
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    /// One request, one response. Server-side refusals become [`Error::Store`].
    fn call(&self, op: &str, req: &Request, read_timeout: Option<Duration>) -> Result<Response> {
        let frame = req.encode().map_err(|e| Error::invalid(format!("store {op}: {e}")))?;
        let mut conn = self.take()?;
        match conn.round_trip(&frame, read_timeout) {
            Ok(Response::Error(m)) => {
                self.give_back(conn);
                Err(Error::Store(format!("{op} refused by the store at {}: {m}", self.target)))
            }
            Ok(r) => {
                self.give_back(conn);
                Ok(r)
            }
            Err(m) => Err(Error::Store(format!(
                "lost the connection to the store at {} during {op}: {m}; has the process that runs the store \
                 (rank 0) exited?",
                self.target
            ))),
        }
    }

    fn unexpected(&self, op: &str, r: &Response) -> Error {
        Error::Store(format!("the store at {} answered {op} with an unexpected {r:?}", self.target))
    }

    /// Stores `value` under `key`, replacing any previous value, and wakes waiters on it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a key over 4 KiB or a value over 64 MiB;
    /// [`Error::Store`] when the store cannot be reached.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        match self.call("set", &Request::Set { key: key.into(), value: value.to_vec() }, Some(IO_TIMEOUT))? {
            Response::Done => Ok(()),
            r => Err(self.unexpected("set", &r)),
        }
    }

    /// The value under `key`, or `None` when there is none.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a key over 4 KiB; [`Error::Store`] when the store
    /// cannot be reached.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        match self.call("get", &Request::Get { key: key.into() }, Some(IO_TIMEOUT))? {
            Response::Value(v) => Ok(v),
            r => Err(self.unexpected("get", &r)),
        }
    }

    /// Waits until every key exists. The server answers as soon as the last one is set, and
    /// other threads using this client are not held up meanwhile.
    ///
    /// # Errors
    /// [`Error::Store`] naming the missing keys after `timeout`, or when the store cannot be
    /// reached; [`Error::InvalidArgument`] for a key over 4 KiB.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        for chunk in keys.chunks(MAX_WAIT_KEYS) {
            let remaining = deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()));
            // Rounded up, so that a wait never gives up before its timeout.
            let timeout_ms = u64::try_from(remaining.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
            let req = Request::Wait { keys: chunk.iter().map(|k| k.to_string()).collect(), timeout_ms };
            match self.call("wait", &req, remaining.checked_add(WAIT_GRACE))? {
                Response::Done => {}
                Response::Missing(missing) => {
                    let shown: Vec<String> = missing.iter().take(8).map(|k| format!("`{k}`")).collect();
                    let more = if missing.len() > shown.len() {
                        format!(" and {} more", missing.len() - shown.len())
                    } else {
                        String::new()
                    };
                    return Err(Error::Store(format!(
                        "timed out after {} waiting for key(s) {}{more} at the store at {}; the ranks that publish \
                         them may not have started, may have failed, or may use another store (MASTER_ADDR, \
                         MASTER_PORT)",
                        secs(start.elapsed()),
                        shown.join(", "),
                        self.target
                    )));
                }
                r => return Err(self.unexpected("wait", &r)),
            }
        }
        Ok(())
    }

    /// The value under `key`, waiting up to `timeout` for it to be set.
    ///
    /// # Errors
    /// As for [`wait`](Self::wait): [`Error::Store`] naming the key when it does not appear
    /// in time or the store cannot be reached.
    pub fn get_wait(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let remaining = deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()));
            self.wait(&[key], remaining)?;
            if let Some(v) = self.get(key)? {
                return Ok(v);
            }
            // Deleted between the wait and the get: wait again for what time is left.
        }
    }

    /// Atomically adds `delta` to the integer under `key` (missing = 0) and returns the new
    /// value. The value is stored as decimal text, so [`get`](Self::get) returns e.g. `b"3"`.
    ///
    /// # Errors
    /// [`Error::Store`] when the key holds something other than a decimal integer, when the
    /// sum overflows `i64`, or when the store cannot be reached; [`Error::InvalidArgument`]
    /// for a key over 4 KiB.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        match self.call("add", &Request::Add { key: key.into(), delta }, Some(IO_TIMEOUT))? {
            Response::Int(n) => Ok(n),
            r => Err(self.unexpected("add", &r)),
        }
    }

    /// Atomically sets `key` to `new` if its current value equals `expected` (`None`: the key
    /// is absent); returns the value after the operation: `new` when it was set, otherwise
    /// the current value (empty when the key is absent).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a key over 4 KiB or a value over 64 MiB;
    /// [`Error::Store`] when the store cannot be reached.
    pub fn compare_set(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<Vec<u8>> {
        let req = Request::CompareSet { key: key.into(), expected: expected.map(<[u8]>::to_vec), new: new.to_vec() };
        match self.call("compare_set", &req, Some(IO_TIMEOUT))? {
            Response::Bytes(v) => Ok(v),
            r => Err(self.unexpected("compare_set", &r)),
        }
    }

    /// Removes `key`; returns whether it existed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a key over 4 KiB; [`Error::Store`] when the store
    /// cannot be reached.
    pub fn delete(&self, key: &str) -> Result<bool> {
        match self.call("delete", &Request::Delete { key: key.into() }, Some(IO_TIMEOUT))? {
            Response::Bool(b) => Ok(b),
            r => Err(self.unexpected("delete", &r)),
        }
    }
}

impl Rendezvous for StoreClient {
    /// [`StoreClient::set`].
    fn publish(&self, key: &str, value: &[u8]) -> Result<()> {
        self.set(key, value)
    }

    /// [`StoreClient::get_wait`].
    fn lookup(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.get_wait(key, timeout)
    }

    /// [`StoreClient::close_idle`].
    fn rest(&self) {
        self.close_idle();
    }
}
