//! The TCP transport: one connection per pair of ranks, for ranks on different hosts.
//!
//! [`TcpLinks::establish`] sets a rank's connections up:
//!
//! 1. it listens on an address of the chosen interface ([`select_address`]: `bind_addr`,
//!    else `OXCCL_SOCKET_IFNAME`, else the first up non-loopback IPv4 interface, else
//!    127.0.0.1) and publishes `host:port` under `{prefix}/tcp/{rank}`;
//! 2. **the lower rank of each pair connects to the higher one**: a rank dials every peer
//!    above it and accepts a connection from every peer below it (accepting runs on its own
//!    thread while the rank dials, and every accepted connection is handled on a thread of
//!    its own, so a silent or hostile client cannot hold the others up);
//! 3. every connection starts with the mutual job-secret handshake of
//!    [`auth`] (context `oxccl-tcp`), then an identity exchange:
//!
//!    ```text
//!    client -> server  "OXTCPID1" src u64  dst u64  world u64  prefix-tag[8]
//!    server -> client  "OXTCPID1" rank u64 verdict u8 (0: accepted)
//!    ```
//!
//!    The server accepts only a client that names it as its destination, agrees on the
//!    world size and the rendezvous prefix (an 8-byte hash of it), and is one of the lower
//!    peers it still expects; the client accepts only the rank it dialed. So a connection
//!    cannot claim to be another rank's by mistake, nor join from another setup.
//! 4. every connection gets `TCP_NODELAY`, keepalive probes and a bound on unacknowledged
//!    data (see `set_liveness`: a host that vanishes, or a cut link, ends the connection
//!    within about half a minute even while nothing is being sent), and a reader thread
//!    that decodes frames ([`frame`]) and delivers them into the rank's [`Mailbox`]: data with `deliver`,
//!    failure notices with `fail`, release notices with `close`. When the connection ends
//!    (EOF, a read error, a malformed frame) the reader calls `lose` and ends; a malformed
//!    frame also closes the connection. Every field is checked before use, and a length
//!    field alone never makes a reader allocate more than 64 MiB (the payload buffer grows
//!    as bytes actually arrive, up to `max_frame`).
//!
//! Sends ([`Link::send_frame`]) are serialized per connection by a mutex and written with
//! plain `send`s (`MSG_NOSIGNAL`; vectored writes would use `writev`, which raises `SIGPIPE`
//! on a closed connection and kills a process that has not ignored it). Small frames are
//! coalesced into one write. The deadline becomes the socket's write timeout.
//!
//! Connections are not re-established: a lost connection loses the peer for every
//! communicator that uses it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::frame::{self, FrameKind, HEADER_LEN, MAX_NOTICE_LEN};
use super::mailbox::Mailbox;
use super::routed::Link;
use super::{Header, TransportError};
use crate::bootstrap::auth::{self, AuthError, Secret, SECRET_ENV};
use crate::bootstrap::Rendezvous;
use crate::error::{Error, Result};

/// The environment variable that chooses the interface (like `NCCL_SOCKET_IFNAME`).
pub const IFNAME_ENV: &str = "OXCCL_SOCKET_IFNAME";
/// The environment variable that bounds the payload of one frame, in bytes (`K`, `M`, `G`
/// suffixes are powers of 1024).
pub const MAX_FRAME_ENV: &str = "OXCCL_MAX_FRAME";
/// The handshake context of transport connections (the store uses another).
pub const AUTH_CONTEXT: &[u8] = b"oxccl-tcp";
/// The default bound on one frame's payload. Large because the algorithms send a whole
/// buffer (or a whole block of it) as one frame; readers allocate as bytes arrive.
#[cfg(target_pointer_width = "64")]
pub const DEFAULT_MAX_FRAME: usize = 1 << 34;
/// The default bound on one frame's payload.
#[cfg(not(target_pointer_width = "64"))]
pub const DEFAULT_MAX_FRAME: usize = 1 << 30;
/// The default time [`TcpLinks::establish`] waits for all of its peers.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest wait for a client's handshake messages once its connection is accepted.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const ID_MAGIC: [u8; 8] = *b"OXTCPID1";
const HELLO_LEN: usize = 8 + 8 + 8 + 8 + 8;
const REPLY_LEN: usize = 8 + 8 + 1;
/// Frames with payloads up to this size are copied behind their header and sent with one write.
const COALESCE: usize = 32 * 1024;
/// Most a reader allocates for a payload before its bytes arrive.
const PREALLOC: usize = 64 << 20;
const READ_BUFFER: usize = 64 * 1024;
/// How far past its deadline a blocked write may run before the socket's timeout is re-armed.
const TIMEOUT_SLACK: Duration = Duration::from_millis(50);
const ACCEPT_POLL: Duration = Duration::from_millis(2);
/// Idle time before the first keepalive probe, seconds.
const KEEPALIVE_IDLE_S: libc::c_int = 10;
/// Time between keepalive probes, seconds.
const KEEPALIVE_INTERVAL_S: libc::c_int = 5;
/// Unanswered probes before the connection is declared dead.
const KEEPALIVE_PROBES: libc::c_int = 3;
/// Longest time sent data may stay unacknowledged before the connection is declared dead.
const USER_TIMEOUT_MS: libc::c_int = 30_000;

/// Makes a dead peer end the connection even when nothing is being sent: keepalive probes
/// after 10 s of silence (dead after 3 unanswered probes 5 s apart) and `TCP_USER_TIMEOUT`
/// (data unacknowledged for 30 s). The reader thread then sees the error and the peer is
/// lost for every communicator (`PeerLost`), instead of each wait running to its deadline.
///
/// # Errors
/// When the socket refuses an option.
fn set_liveness(s: &TcpStream) -> io::Result<()> {
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
const MAX_REJECTIONS_KEPT: usize = 8;

/// How [`TcpLinks::establish`] listens, connects and frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpOptions {
    /// Which interface to listen on (`OXCCL_SOCKET_IFNAME`): a comma-separated list of name
    /// prefixes (`eth,ib`; a name that matches exactly is preferred, so `eth0` picks `eth0`
    /// over `eth0.100`); `=name` matches `name` only; a leading `^` excludes the listed
    /// prefixes instead (`^docker,lo`). `None`: the first up non-loopback IPv4 interface.
    pub ifname: Option<String>,
    /// An explicit address to listen on (e.g. 127.0.0.1), overriding `ifname`.
    pub bind_addr: Option<IpAddr>,
    /// How long establishing all connections may take (address lookups, connects with
    /// retries, accepts, handshakes).
    pub connect_timeout: Duration,
    /// The largest frame payload sent or accepted, in bytes (`OXCCL_MAX_FRAME`); every rank
    /// should use the same value. At least [`MAX_NOTICE_LEN`].
    pub max_frame: usize,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            ifname: None,
            bind_addr: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

impl TcpOptions {
    /// The defaults, with `OXCCL_SOCKET_IFNAME` and `OXCCL_MAX_FRAME` from the environment.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable whose value cannot be used.
    pub fn from_env() -> Result<TcpOptions> {
        TcpOptions::from_env_with(|k| std::env::var(k).ok())
    }

    /// Like [`TcpOptions::from_env`], reading variables through `env`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable whose value cannot be used.
    pub fn from_env_with(env: impl Fn(&str) -> Option<String>) -> Result<TcpOptions> {
        let mut o = TcpOptions { ifname: env(IFNAME_ENV).filter(|v| !v.trim().is_empty()), ..TcpOptions::default() };
        if let Some(v) = env(MAX_FRAME_ENV) {
            o.max_frame = parse_size(&v).map_err(|e| Error::Config(format!("{MAX_FRAME_ENV}={v:?}: {e}")))?;
        }
        o.check()?;
        Ok(o)
    }

    fn check(&self) -> Result<()> {
        if self.max_frame < MAX_NOTICE_LEN {
            return Err(Error::Config(format!(
                "{MAX_FRAME_ENV} is {} bytes; it must be at least {MAX_NOTICE_LEN} (failure notices need that much)",
                self.max_frame
            )));
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::Config("the TCP connect timeout must be greater than zero".into()));
        }
        Ok(())
    }
}

/// Parses `1048576`, `64K`, `16M`, `4G`, `1GiB`... (powers of 1024) into bytes.
fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| "expected a number of bytes, like 1048576, 64M or 4G".to_string())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("unknown unit {other:?} (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| "too large for this machine".to_string())
}

/// An IPv4 interface address, as the selector sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Iface {
    name: String,
    ip: Ipv4Addr,
    up: bool,
}

fn interfaces() -> io::Result<Vec<Iface>> {
    Ok(if_addrs::get_if_addrs()?
        .into_iter()
        .filter_map(|i| {
            let up = i.is_oper_up();
            match i.addr {
                if_addrs::IfAddr::V4(a) => Some(Iface { name: i.name, ip: a.ip, up }),
                if_addrs::IfAddr::V6(_) => None,
            }
        })
        .collect())
}

/// The address a rank listens on and publishes: `opts.bind_addr` when set, else the IPv4
/// address of the interface `opts.ifname` names, else the first up non-loopback IPv4
/// interface, else 127.0.0.1.
///
/// # Errors
/// [`Error::Config`] when `bind_addr` is unspecified (0.0.0.0 cannot be published) or
/// `ifname` matches no interface (the message lists the interfaces found);
/// [`Error::Io`] when the interfaces cannot be listed for `ifname`.
pub fn select_address(opts: &TcpOptions) -> Result<IpAddr> {
    if let Some(ip) = opts.bind_addr {
        if ip.is_unspecified() {
            return Err(Error::Config(format!(
                "the TCP bind address {ip} cannot be published to peers; give an interface's address or set {IFNAME_ENV}"
            )));
        }
        return Ok(ip);
    }
    match opts.ifname.as_deref() {
        Some(spec) => {
            let found =
                interfaces().map_err(|e| Error::io(format!("listing network interfaces for {IFNAME_ENV}"), &e))?;
            pick(Some(spec), &found).map(IpAddr::V4)
        }
        None => Ok(IpAddr::V4(interfaces().ok().and_then(|f| pick(None, &f).ok()).unwrap_or(Ipv4Addr::LOCALHOST))),
    }
}

/// `OXCCL_SOCKET_IFNAME`, parsed.
struct IfSpec {
    exclude: bool,
    /// (name or prefix, exact only)
    items: Vec<(String, bool)>,
}

impl IfSpec {
    fn parse(spec: &str) -> Result<IfSpec> {
        let spec = spec.trim();
        let (exclude, list) = match spec.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let items: Vec<(String, bool)> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s.strip_prefix('=') {
                Some(exact) => (exact.to_string(), true),
                None => (s.to_string(), false),
            })
            .collect();
        if items.is_empty() {
            return Err(Error::Config(format!("{IFNAME_ENV}={spec:?} names no interface")));
        }
        Ok(IfSpec { exclude, items })
    }

    fn matches(&self, name: &str) -> bool {
        self.items.iter().any(|(p, exact)| if *exact { name == p } else { name.starts_with(p.as_str()) })
    }

    fn names_exactly(&self, name: &str) -> bool {
        self.items.iter().any(|(p, _)| name == p)
    }
}

fn describe(found: &[Iface]) -> String {
    if found.is_empty() {
        return "none".into();
    }
    found
        .iter()
        .map(|i| format!("{} {}{}", i.name, i.ip, if i.up { "" } else { " (down)" }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Picks an address among `found` as [`select_address`] describes.
fn pick(spec: Option<&str>, found: &[Iface]) -> Result<Ipv4Addr> {
    let virtual_name = |n: &str| ["docker", "veth", "virbr", "br-"].iter().any(|p| n.starts_with(p));
    let Some(spec) = spec else {
        return Ok(found
            .iter()
            .enumerate()
            .filter(|(_, i)| i.up && !i.ip.is_loopback() && !i.ip.is_link_local() && !i.ip.is_unspecified())
            .min_by_key(|&(k, i)| (virtual_name(&i.name), k))
            .map_or(Ipv4Addr::LOCALHOST, |(_, i)| i.ip));
    };
    let parsed = IfSpec::parse(spec)?;
    let best = if parsed.exclude {
        found
            .iter()
            .enumerate()
            .filter(|(_, i)| !parsed.matches(&i.name) && !i.ip.is_unspecified())
            .min_by_key(|&(k, i)| (i.ip.is_loopback(), !i.up, k))
    } else {
        found
            .iter()
            .enumerate()
            .filter(|(_, i)| parsed.matches(&i.name) && !i.ip.is_unspecified())
            .min_by_key(|&(k, i)| (!parsed.names_exactly(&i.name), !i.up, k))
    };
    best.map(|(_, i)| i.ip).ok_or_else(|| {
        Error::Config(format!(
            "{IFNAME_ENV}={spec:?} matches no interface with an IPv4 address; interfaces found: {}",
            describe(found)
        ))
    })
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

fn address_key(prefix: &str, rank: usize) -> String {
    format!("{prefix}/tcp/{rank}")
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// Who this endpoint is, as the identity exchange states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ident {
    me: usize,
    world: usize,
    /// A hash of the rendezvous prefix: connections from another setup are refused.
    tag: [u8; 8],
}

impl Ident {
    fn new(me: usize, world: usize, prefix: &str) -> Ident {
        let mut h = Sha256::new();
        h.update(b"oxccl-tcp-prefix\0");
        h.update(prefix.as_bytes());
        let digest = h.finalize();
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&digest[..8]);
        Ident { me, world, tag }
    }

    fn hello(&self, dst: usize) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(&ID_MAGIC);
        b[8..16].copy_from_slice(&(self.me as u64).to_le_bytes());
        b[16..24].copy_from_slice(&(dst as u64).to_le_bytes());
        b[24..32].copy_from_slice(&(self.world as u64).to_le_bytes());
        b[32..40].copy_from_slice(&self.tag);
        b
    }
}

/// Why the server refused a client's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Verdict {
    Accepted = 0,
    NotMe = 1,
    OtherWorld = 2,
    OtherSetup = 3,
    Unexpected = 4,
}

impl Verdict {
    fn from_byte(b: u8) -> Option<Verdict> {
        [Verdict::Accepted, Verdict::NotMe, Verdict::OtherWorld, Verdict::OtherSetup, Verdict::Unexpected]
            .get(usize::from(b))
            .copied()
    }

    fn text(self, server: usize, client: usize) -> String {
        match self {
            Verdict::Accepted => "accepted".into(),
            Verdict::NotMe => format!("rank {server} is not the rank the client dialed (a stale address?)"),
            Verdict::OtherWorld => "the two ranks disagree on the world size".into(),
            Verdict::OtherSetup => {
                "the two ranks belong to different setups (another job, or another rendezvous prefix)".into()
            }
            Verdict::Unexpected => format!(
                "rank {server} does not expect a connection from rank {client} (do the ranks agree on their peers?)"
            ),
        }
    }
}

/// Server side of the identity exchange: the client's rank, or why it was refused.
fn check_hello(hello: &[u8; HELLO_LEN], me: &Ident, expected: &HashSet<usize>) -> (Verdict, u64) {
    let src = u64_at(hello, 8);
    let verdict = if hello[..8] != ID_MAGIC {
        Verdict::OtherSetup
    } else if u64_at(hello, 24) != me.world as u64 {
        Verdict::OtherWorld
    } else if u64_at(hello, 16) != me.me as u64 {
        Verdict::NotMe
    } else if hello[32..40] != me.tag {
        Verdict::OtherSetup
    } else if !usize::try_from(src).is_ok_and(|s| expected.contains(&s)) {
        Verdict::Unexpected
    } else {
        Verdict::Accepted
    };
    (verdict, src)
}

/// Runs the server side of a connection's handshake; the client's rank.
fn serve(
    s: &mut TcpStream,
    secret: &Secret,
    me: &Ident,
    expected: &HashSet<usize>,
) -> std::result::Result<usize, String> {
    auth::accept(s, secret, AUTH_CONTEXT).map_err(|e| e.to_string())?;
    let mut hello = [0u8; HELLO_LEN];
    s.read_exact(&mut hello).map_err(|e| format!("the identity exchange failed: {e}"))?;
    let (verdict, src) = check_hello(&hello, me, expected);
    let mut reply = [0u8; REPLY_LEN];
    reply[..8].copy_from_slice(&ID_MAGIC);
    reply[8..16].copy_from_slice(&(me.me as u64).to_le_bytes());
    reply[16] = verdict as u8;
    s.write_all(&reply).map_err(|e| format!("the identity exchange failed: {e}"))?;
    match (verdict, usize::try_from(src)) {
        (Verdict::Accepted, Ok(src)) => Ok(src),
        _ => Err(format!("a peer claiming to be rank {src} was refused: {}", verdict.text(me.me, src as usize))),
    }
}

fn auth_failure(context: String, e: AuthError) -> Error {
    match e {
        AuthError::Io(io) => Error::io(context, &io),
        other => Error::Io {
            context,
            kind: io::ErrorKind::PermissionDenied,
            message: format!("{other}; every rank of a job must use the same {SECRET_ENV}"),
        },
    }
}

/// Connects to `peer` (the higher rank of the pair) and runs the client side of the handshake.
fn dial(peer: usize, addr: SocketAddr, secret: &Secret, me: &Ident, deadline: Instant) -> Result<TcpStream> {
    let context = || format!("connecting rank {} to rank {peer} at {addr}", me.me);
    let mut backoff = Duration::from_millis(10);
    let mut last: Option<io::Error> = None;
    let mut s = loop {
        let left = remaining(deadline);
        if left.is_zero() {
            return Err(Error::Io {
                context: context(),
                kind: io::ErrorKind::TimedOut,
                message: format!(
                    "no connection within the connect timeout (last error: {})",
                    last.map_or_else(|| "none".to_string(), |e| e.to_string())
                ),
            });
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => break s,
            Err(e) if matches!(e.kind(), io::ErrorKind::InvalidInput | io::ErrorKind::PermissionDenied) => {
                return Err(Error::io(context(), &e));
            }
            Err(e) => {
                last = Some(e);
                std::thread::sleep(backoff.min(remaining(deadline)));
                backoff = (backoff * 2).min(Duration::from_millis(250));
            }
        }
    };
    let io_err = |e: io::Error| Error::io(context(), &e);
    let left = remaining(deadline).max(Duration::from_millis(1));
    s.set_nodelay(true).map_err(io_err)?;
    s.set_read_timeout(Some(left)).map_err(io_err)?;
    s.set_write_timeout(Some(left)).map_err(io_err)?;
    auth::connect(&mut s, secret, AUTH_CONTEXT)
        .map_err(|e| auth_failure(format!("authenticating rank {} to rank {peer} at {addr}", me.me), e))?;
    s.write_all(&me.hello(peer)).map_err(io_err)?;
    let mut reply = [0u8; REPLY_LEN];
    s.read_exact(&mut reply).map_err(io_err)?;
    let refused = |message: String| Error::Io { context: context(), kind: io::ErrorKind::InvalidData, message };
    if reply[..8] != ID_MAGIC {
        return Err(refused("the peer does not speak the oxccl TCP protocol".into()));
    }
    let theirs = u64_at(&reply, 8);
    match Verdict::from_byte(reply[16]) {
        Some(Verdict::Accepted) if theirs == peer as u64 => Ok(s),
        Some(Verdict::Accepted) => {
            Err(refused(format!("the address published for rank {peer} belongs to rank {theirs}")))
        }
        Some(v) => Err(refused(format!("rank {peer} refused the connection: {}", v.text(peer, me.me)))),
        None => Err(refused(format!("rank {peer} answered with an unknown verdict {}", reply[16]))),
    }
}

/// Looks `peer`'s published address up.
fn lookup(rdv: &dyn Rendezvous, prefix: &str, peer: usize, deadline: Instant) -> Result<SocketAddr> {
    let key = address_key(prefix, peer);
    let raw = rdv.lookup(&key, remaining(deadline))?;
    std::str::from_utf8(&raw).ok().and_then(|t| t.trim().parse().ok()).ok_or_else(|| {
        Error::Store(format!(
            "the address of rank {peer} under `{key}` is not host:port: {:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(80)])
        ))
    })
}

/// A connection being accepted (its handshake runs on `thread`).
struct Handshake {
    id: u64,
    sock: TcpStream,
    thread: JoinHandle<()>,
}

/// What a handshake thread reports.
struct Arrival {
    id: u64,
    from: SocketAddr,
    result: std::result::Result<(usize, TcpStream), String>,
}

/// Accepts the lower peers' connections on a thread while the rank dials the higher ones.
/// Dropping it stops accepting and closes every connection it did not hand out.
struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Handshake>>>,
    rx: mpsc::Receiver<Arrival>,
    claimed: HashSet<u64>,
}

impl Acceptor {
    fn start(
        listener: TcpListener,
        secret: &Secret,
        me: Ident,
        expected: HashSet<usize>,
        deadline: Instant,
    ) -> Result<Acceptor> {
        listener.set_nonblocking(true).map_err(|e| Error::io("preparing the TCP transport's listening socket", &e))?;
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let secret = Arc::new(secret.clone());
        let expected = Arc::new(expected);
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-tcp{}-acc", me.me))
            .spawn(move || accept_loop(&listener, &secret, me, &expected, deadline, &tx, &flag))
            .map_err(|e| Error::io("starting the TCP transport's accept thread", &e))?;
        Ok(Acceptor { stop, thread: Some(thread), rx, claimed: HashSet::new() })
    }

    /// Waits until every rank in `expected` has connected.
    fn collect(
        &mut self,
        me: usize,
        expected: &HashSet<usize>,
        addr: SocketAddr,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Vec<(usize, TcpStream)>> {
        let mut got: HashMap<usize, TcpStream> = HashMap::new();
        let mut refused: Vec<String> = Vec::new();
        let mut refused_count = 0usize;
        while got.len() < expected.len() {
            let left = remaining(deadline);
            let arrival = if left.is_zero() {
                None
            } else {
                match self.rx.recv_timeout(left) {
                    Ok(a) => Some(a),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(Error::Internal("the TCP accept thread ended early".into()));
                    }
                }
            };
            let Some(Arrival { id, from, result }) = arrival else {
                let mut missing: Vec<usize> = expected.iter().copied().filter(|p| !got.contains_key(p)).collect();
                missing.sort_unstable();
                let mut message = format!("rank(s) {missing:?} did not connect within {timeout:?}");
                if refused_count > 0 {
                    message.push_str(&format!(
                        "; {refused_count} connection(s) were refused: {}{}",
                        refused.join("; "),
                        if refused_count > refused.len() { "; ..." } else { "" }
                    ));
                }
                return Err(Error::Io {
                    context: format!("waiting for TCP connections to rank {me} (listening on {addr})"),
                    kind: io::ErrorKind::TimedOut,
                    message,
                });
            };
            let problem = match result {
                Ok((peer, stream)) if !got.contains_key(&peer) => {
                    self.claimed.insert(id);
                    got.insert(peer, stream);
                    None
                }
                Ok((peer, _)) => Some(format!("a second connection claiming to be rank {peer}")),
                Err(why) => Some(why),
            };
            if let Some(p) = problem {
                refused_count += 1;
                if refused.len() < MAX_REJECTIONS_KEPT {
                    refused.push(format!("from {from}: {p}"));
                }
            }
        }
        Ok(got.into_iter().collect())
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let pending = self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default();
        // Connections still in their handshake were not handed out: close them, which also
        // ends their threads promptly.
        for h in pending.iter().filter(|h| !self.claimed.contains(&h.id)) {
            let _ = h.sock.shutdown(Shutdown::Both);
        }
        for h in pending {
            let _ = h.thread.join();
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    secret: &Arc<Secret>,
    me: Ident,
    expected: &Arc<HashSet<usize>>,
    deadline: Instant,
    tx: &mpsc::Sender<Arrival>,
    stop: &AtomicBool,
) -> Vec<Handshake> {
    let mut pending: Vec<Handshake> = Vec::new();
    let mut next_id = 0u64;
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((sock, from)) => {
                next_id += 1;
                let id = next_id;
                match start_handshake(id, sock, from, secret, me, expected, deadline, tx) {
                    Ok(h) => pending.push(h),
                    Err(why) => {
                        let _ = tx.send(Arrival { id, from, result: Err(why) });
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // WouldBlock: nothing to accept yet; anything else (out of descriptors, a
            // connection reset before it was accepted) is worth another try.
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
        pending.retain(|h| !h.thread.is_finished());
    }
    pending
}

#[allow(clippy::too_many_arguments)]
fn start_handshake(
    id: u64,
    mut sock: TcpStream,
    from: SocketAddr,
    secret: &Arc<Secret>,
    me: Ident,
    expected: &Arc<HashSet<usize>>,
    deadline: Instant,
    tx: &mpsc::Sender<Arrival>,
) -> std::result::Result<Handshake, String> {
    let limit = remaining(deadline).min(HANDSHAKE_TIMEOUT).max(Duration::from_millis(1));
    let prepared = sock
        .set_nonblocking(false)
        .and_then(|()| sock.set_read_timeout(Some(limit)))
        .and_then(|()| sock.set_write_timeout(Some(limit)))
        .and_then(|()| sock.set_nodelay(true))
        .and_then(|()| sock.try_clone());
    let clone = prepared.map_err(|e| format!("could not prepare the connection: {e}"))?;
    let (secret, expected, tx) = (Arc::clone(secret), Arc::clone(expected), tx.clone());
    let thread = std::thread::Builder::new()
        .name(format!("oxccl-tcp{}-hs", me.me))
        .spawn(move || {
            let result = serve(&mut sock, &secret, &me, &expected).map(|peer| (peer, sock));
            let _ = tx.send(Arrival { id, from, result });
        })
        .map_err(|e| format!("could not start a handshake thread: {e}"))?;
    Ok(Handshake { id, sock: clone, thread })
}

/// One established connection.
struct Conn {
    peer: usize,
    sock: TcpStream,
    writer: Mutex<WriteState>,
    /// Set once the connection is unusable, with what was observed.
    gone: OnceLock<String>,
}

/// The sending side of a connection, behind its mutex.
#[derive(Default)]
struct WriteState {
    /// The socket's current write timeout.
    timeout: Option<Duration>,
    /// Header and payload of a small frame, written together.
    scratch: Vec<u8>,
    /// A frame was begun and not finished: the stream is out of step.
    mid_frame: bool,
}

enum WriteFail {
    Timeout,
    Io(io::Error),
}

impl WriteState {
    /// Writes `buf`, setting the socket's write timeout from `deadline` when needed.
    fn write_all(
        &mut self,
        mut sock: &TcpStream,
        mut buf: &[u8],
        deadline: Instant,
    ) -> std::result::Result<(), WriteFail> {
        while !buf.is_empty() {
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
            match sock.write(buf) {
                Ok(0) => return Err(WriteFail::Io(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    self.mid_frame = true;
                    buf = buf.get(n..).unwrap_or_default();
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

    fn write_frame(
        &mut self,
        sock: &TcpStream,
        head: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> std::result::Result<(), WriteFail> {
        if payload.len() <= COALESCE {
            let mut buf = std::mem::take(&mut self.scratch);
            buf.clear();
            buf.extend_from_slice(head);
            buf.extend_from_slice(payload);
            let r = self.write_all(sock, &buf, deadline);
            self.scratch = buf;
            r?;
        } else {
            self.write_all(sock, head, deadline)?;
            self.write_all(sock, payload, deadline)?;
        }
        self.mid_frame = false;
        Ok(())
    }
}

/// How a reader's stream ended.
#[derive(Debug)]
enum End {
    /// EOF at a frame boundary.
    Closed,
    /// EOF inside a frame.
    Truncated,
    /// A read failed.
    Failed(io::Error),
    /// The peer sent something that is not a valid frame (the text says what).
    Malformed(String),
}

/// Fills `head`; `Ok(false)` at EOF before its first byte.
fn read_header(r: &mut impl Read, head: &mut [u8; HEADER_LEN]) -> io::Result<bool> {
    let mut n = 0;
    while n < HEADER_LEN {
        match r.read(&mut head[n..]) {
            Ok(0) if n == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads a payload of `len` bytes (already checked against the limit), allocating as the
/// bytes arrive: a length field alone costs at most [`PREALLOC`] bytes.
fn read_payload(r: &mut impl Read, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len.min(PREALLOC)];
    let mut filled = 0;
    loop {
        r.read_exact(&mut buf[filled..])?;
        filled = buf.len();
        if filled >= len {
            return Ok(buf);
        }
        buf.resize(len.min(filled.saturating_mul(2)), 0);
    }
}

/// Decodes frames from `r` into `mailbox` (as coming from `src`) until the stream ends.
fn pump(r: &mut impl Read, src: usize, mailbox: &Mailbox, max_frame: usize) -> End {
    let mut head = [0u8; HEADER_LEN];
    loop {
        match read_header(r, &mut head) {
            Ok(true) => {}
            Ok(false) => return End::Closed,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return End::Truncated,
            Err(e) => return End::Failed(e),
        }
        let f = match frame::decode_header(&head, max_frame) {
            Ok(f) => f,
            Err(e) => return End::Malformed(format!("a malformed frame ({})", e.0)),
        };
        match f.kind {
            FrameKind::Release if f.payload_len != 0 => {
                return End::Malformed(format!("a release notice with a {}-byte payload", f.payload_len));
            }
            FrameKind::Failure if f.payload_len > MAX_NOTICE_LEN => {
                return End::Malformed(format!(
                    "a failure notice of {} bytes (at most {MAX_NOTICE_LEN})",
                    f.payload_len
                ));
            }
            _ => {}
        }
        let payload = match read_payload(r, f.payload_len) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return End::Truncated,
            Err(e) => return End::Failed(e),
        };
        if let Err(e) = mailbox.accept(src, f, payload) {
            return End::Malformed(format!("a failure notice that cannot be decoded ({})", e.0));
        }
    }
}

fn spawn_reader(
    me: usize,
    conn: Arc<Conn>,
    mailbox: Arc<Mailbox>,
    max_frame: usize,
    closing: Arc<AtomicBool>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("oxccl-tcp{me}<{}", conn.peer)).spawn(move || {
        let peer = conn.peer;
        let end = pump(&mut BufReader::with_capacity(READ_BUFFER, &conn.sock), peer, &mailbox, max_frame);
        if matches!(end, End::Malformed(_)) {
            let _ = conn.sock.shutdown(Shutdown::Both);
        }
        let detail = if closing.load(Ordering::Acquire) {
            format!("rank {me} shut its TCP connections down")
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
        let detail = conn.gone.get_or_init(|| detail);
        mailbox.lose(peer, detail);
    })
}

/// A rank's TCP connections to its peers: a [`Link`] for [`RoutedTransport`](super::routed::RoutedTransport).
/// What arrives is delivered into the mailbox given to [`TcpLinks::establish`].
///
/// Dropping it shuts every connection down (peers see it close and lose this rank) and joins
/// the reader threads.
pub struct TcpLinks {
    rank: usize,
    addr: SocketAddr,
    max_frame: usize,
    mailbox: Arc<Mailbox>,
    /// Indexed by peer rank.
    conns: Vec<Option<Arc<Conn>>>,
    closing: Arc<AtomicBool>,
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

        let me = Ident::new(rank, world, prefix);
        let lower: HashSet<usize> = peers.iter().copied().filter(|&p| p < rank).collect();
        let mut higher: Vec<usize> = peers.iter().copied().filter(|&p| p > rank).collect();
        higher.sort_unstable();
        let mut acceptor =
            if lower.is_empty() { None } else { Some(Acceptor::start(listener, secret, me, lower.clone(), deadline)?) };

        let mut streams = Vec::with_capacity(peers.len());
        for p in higher {
            let at = lookup(rdv, prefix, p, deadline)?;
            streams.push((p, dial(p, at, secret, &me, deadline)?));
        }
        if let Some(acc) = acceptor.as_mut() {
            streams.extend(acc.collect(rank, &lower, addr, deadline, opts.connect_timeout)?);
        }
        drop(acceptor);

        let mut links = TcpLinks {
            rank,
            addr,
            max_frame: opts.max_frame,
            mailbox,
            conns: vec![None; world],
            closing: Arc::new(AtomicBool::new(false)),
            readers: Vec::with_capacity(streams.len()),
        };
        for (p, s) in streams {
            let ready = s
                .set_nodelay(true)
                .and_then(|()| set_liveness(&s))
                .and_then(|()| s.set_read_timeout(None))
                .and_then(|()| s.set_write_timeout(None));
            ready.map_err(|e| Error::io(format!("preparing the TCP connection to rank {p}"), &e))?;
            let conn = Arc::new(Conn { peer: p, sock: s, writer: Mutex::default(), gone: OnceLock::new() });
            links.conns[p] = Some(Arc::clone(&conn));
            let reader =
                spawn_reader(rank, conn, Arc::clone(&links.mailbox), links.max_frame, Arc::clone(&links.closing))
                    .map_err(|e| Error::io("starting a TCP reader thread", &e))?;
            links.readers.push(reader);
        }
        Ok(links)
    }

    /// The address this rank listened on and published.
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
            let _ = conn.sock.shutdown(Shutdown::Both);
        }
    }

    /// Marks `conn` unusable, closes it, and loses its peer.
    fn break_conn(&self, conn: &Conn, detail: String) -> String {
        let detail = conn.gone.get_or_init(|| detail).clone();
        let _ = conn.sock.shutdown(Shutdown::Both);
        self.mailbox.lose(conn.peer, &detail);
        detail
    }
}

impl Link for TcpLinks {
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
        let conn = self.conns.get(peer).and_then(Option::as_ref).ok_or_else(|| {
            TransportError::Other(Error::invalid(format!("rank {} has no TCP connection to rank {peer}", self.rank)))
        })?;
        if payload.len() > self.max_frame {
            return Err(TransportError::Other(Error::Config(format!(
                "a message of {} bytes to rank {peer} exceeds the frame limit of {} bytes; raise {MAX_FRAME_ENV} on every rank",
                payload.len(),
                self.max_frame
            ))));
        }
        let head = frame::encode_header(kind, header, payload.len());
        // A sender that panicked mid-frame leaves `mid_frame` set, which is checked below.
        let mut w = crate::sync::relock(&conn.writer);
        if let Some(detail) = conn.gone.get() {
            return Err(TransportError::PeerLost { peer, detail: detail.clone() });
        }
        if w.mid_frame {
            let detail =
                self.break_conn(conn, format!("an earlier send to rank {peer} stopped in the middle of a frame"));
            return Err(TransportError::PeerLost { peer, detail });
        }
        match w.write_frame(&conn.sock, &head, payload, deadline) {
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
}

impl Drop for TcpLinks {
    fn drop(&mut self) {
        self.shutdown();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Condvar;
    use std::thread;

    use proptest::prelude::*;

    use super::*;
    use crate::communicator::Communicator;
    use crate::config::Config;
    use crate::cpu::engine::{CpuBackend, WORLD_COMM_ID};
    use crate::cpu::transport::routed::RoutedTransport;
    use crate::cpu::transport::Stage;
    use crate::cpu::transport::{Channel, Transport};
    use crate::fingerprint::{Fingerprint, OpKind};
    use crate::{Algorithm, DType, ReduceOp};

    /// An in-memory rendezvous shared by the threads of a test.
    #[derive(Default)]
    struct MemRdv {
        map: Mutex<HashMap<String, Vec<u8>>>,
        cv: Condvar,
    }

    impl Rendezvous for MemRdv {
        fn publish(&self, key: &str, value: &[u8]) -> Result<()> {
            self.map.lock().unwrap().insert(key.to_string(), value.to_vec());
            self.cv.notify_all();
            Ok(())
        }

        fn lookup(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
            let deadline = Instant::now() + timeout;
            let mut map = self.map.lock().unwrap();
            loop {
                if let Some(v) = map.get(key) {
                    return Ok(v.clone());
                }
                let left = remaining(deadline);
                if left.is_zero() {
                    return Err(Error::Store(format!("`{key}` was not published in time")));
                }
                map = self.cv.wait_timeout(map, left).unwrap().0;
            }
        }
    }

    const PREFIX: &str = "job-1";

    fn opts() -> TcpOptions {
        TcpOptions {
            ifname: None,
            bind_addr: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            connect_timeout: Duration::from_secs(10),
            max_frame: 1 << 26,
        }
    }

    fn secret() -> Secret {
        Secret::from_text("tcp-test-secret").unwrap()
    }

    fn all_but(r: usize, n: usize) -> Vec<usize> {
        (0..n).filter(|&p| p != r).collect()
    }

    fn establish(
        r: usize,
        n: usize,
        rdv: &MemRdv,
        secret: &Secret,
        opts: &TcpOptions,
    ) -> Result<(Arc<Mailbox>, TcpLinks)> {
        let mb = Arc::new(Mailbox::new());
        TcpLinks::establish(r, n, &all_but(r, n), rdv, PREFIX, secret, opts, Arc::clone(&mb)).map(|l| (mb, l))
    }

    /// Establishes every rank of a world on its own thread.
    fn links_world(
        n: usize,
        secret_of: impl Fn(usize) -> Secret + Sync,
        opts: &TcpOptions,
    ) -> Vec<Result<(Arc<Mailbox>, TcpLinks)>> {
        let rdv = MemRdv::default();
        thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let (rdv, secret_of) = (&rdv, &secret_of);
                    s.spawn(move || establish(r, n, rdv, &secret_of(r), opts))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn transport(r: usize, n: usize, mb: Arc<Mailbox>, links: &Arc<TcpLinks>) -> RoutedTransport {
        let routes = (0..n).map(|p| if p == r { None } else { Some(Arc::clone(links) as Arc<dyn Link>) }).collect();
        RoutedTransport::new(r, mb, routes).unwrap()
    }

    fn communicator(r: usize, n: usize, mb: Arc<Mailbox>, links: &Arc<TcpLinks>) -> Communicator {
        let cfg = Config::new().timeout(Duration::from_secs(20)).resolve_with(|_| None).unwrap();
        let ranks: Arc<[usize]> = (0..n).collect();
        let t = Arc::new(transport(r, n, mb, links));
        Communicator::from_backend(Arc::new(CpuBackend::new("tcp-test", t, WORLD_COMM_ID, ranks, r, cfg).unwrap()))
    }

    fn tcp_world(n: usize) -> Vec<(Communicator, Arc<TcpLinks>)> {
        links_world(n, |_| secret(), &opts())
            .into_iter()
            .enumerate()
            .map(|(r, res)| {
                let (mb, links) = res.unwrap();
                let links = Arc::new(links);
                (communicator(r, n, mb, &links), links)
            })
            .collect()
    }

    fn on_threads<R: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
        let f = &f;
        thread::scope(|s| {
            let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || f(c))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn input(r: usize, count: usize) -> Vec<i64> {
        (0..count).map(|i| (r * 1000 + i) as i64 - 500).collect()
    }

    #[test]
    fn collectives_over_tcp_match_sequential_references() {
        for n in 2..=5 {
            let world = tcp_world(n);
            let comms: Vec<Communicator> = world.iter().map(|(c, _)| c.clone()).collect();
            let count = 1031;
            for algo in [Algorithm::Ring, Algorithm::RecursiveDoubling] {
                let sum: Vec<i64> = (0..count).map(|i| (0..n).map(|r| input(r, count)[i]).sum()).collect();
                let max: Vec<f64> =
                    (0..count).map(|i| (0..n).map(|r| input(r, count)[i] as f64).fold(f64::MIN, f64::max)).collect();
                let got = on_threads(&comms, |c| {
                    let c = c.with_algorithm(algo);
                    let mut x = input(c.rank(), count);
                    c.all_reduce(&mut x, ReduceOp::Sum)?;
                    let mut y: Vec<f64> = input(c.rank(), count).iter().map(|&v| v as f64).collect();
                    c.all_reduce(&mut y, ReduceOp::Max)?;
                    Ok::<_, Error>((x, y))
                });
                for (r, g) in got.into_iter().enumerate() {
                    let (x, y) = g.unwrap_or_else(|e| panic!("n={n} {algo:?} rank {r}: {e}"));
                    assert_eq!(x, sum, "n={n} {algo:?} rank {r}");
                    assert_eq!(y, max, "n={n} {algo:?} rank {r}");
                }
            }
            // A large ring all_reduce: frames far above the coalescing size.
            let big = 1 << 18;
            let got = on_threads(&comms, |c| {
                let mut x: Vec<f32> = (0..big).map(|i| ((i % 97) + c.rank()) as f32).collect();
                c.with_algorithm(Algorithm::Ring).all_reduce(&mut x, ReduceOp::Sum).map(|()| x)
            });
            let want: Vec<f32> = (0..big).map(|i| (0..n).map(|r| ((i % 97) + r) as f32).sum()).collect();
            for g in got {
                assert!(g.unwrap() == want, "n={n}: large all_reduce differs");
            }
            let got = on_threads(&comms, |c| {
                let mine = vec![c.rank() as i32 * 10 + 1; 7];
                let mut all = vec![0i32; 7 * n];
                c.all_gather(&mine, &mut all).map(|()| all)
            });
            let want: Vec<i32> = (0..n).flat_map(|r| vec![r as i32 * 10 + 1; 7]).collect();
            for g in got {
                assert_eq!(g.unwrap(), want);
            }
            let root = n - 1;
            let got = on_threads(&comms, |c| {
                let mut b = if c.rank() == root { input(root, 300) } else { vec![0; 300] };
                c.broadcast(&mut b, root).map(|()| b)
            });
            for g in got {
                assert_eq!(g.unwrap(), input(root, 300));
            }
            let got = on_threads(&comms, |c| {
                let (r, n) = (c.rank(), c.world_size());
                let msg: Vec<u32> = (0..r as u32 + 3).collect();
                c.send(&msg, (r + 1) % n, 5)?;
                let mut buf = vec![0u32; 16];
                let len = c.recv(&mut buf, (r + n - 1) % n, 5)?;
                buf.truncate(len);
                c.barrier()?;
                Ok::<_, Error>(buf)
            });
            for (r, g) in got.into_iter().enumerate() {
                let from = (r + n - 1) % n;
                assert_eq!(g.unwrap(), (0..from as u32 + 3).collect::<Vec<_>>(), "n={n} rank {r}");
            }
            for (r, (_, links)) in world.iter().enumerate() {
                assert_eq!(links.peers(), all_but(r, n));
                assert!(links.local_addr().ip().is_loopback());
            }
        }
    }

    fn names_rank_1(e: &Error) -> bool {
        match e {
            Error::PeerLost { rank, .. } => *rank == 1,
            Error::Aborted { reason } => reason.contains("rank 1"),
            _ => false,
        }
    }

    #[test]
    fn a_vanished_peer_fails_the_others_fast() {
        // Abrupt: the connections close as when the process dies. Graceful: the communicator
        // is dropped first (release notices), then the links.
        for abrupt in [true, false] {
            let mut world = tcp_world(3);
            let (c1, l1) = world.remove(1);
            let comms: Vec<Communicator> = world.iter().map(|(c, _)| c.clone()).collect();
            let started = Instant::now();
            let got = thread::scope(|s| {
                s.spawn(move || {
                    thread::sleep(Duration::from_millis(200));
                    if abrupt {
                        l1.shutdown();
                    }
                    drop(c1);
                    drop(l1);
                });
                on_threads(&comms, |c| {
                    let mut x = vec![1i64; 4096];
                    let r = c.with_algorithm(Algorithm::Ring).all_reduce(&mut x, ReduceOp::Sum);
                    (r, started.elapsed())
                })
            });
            for (r, took) in got {
                let e = r.expect_err("the collective cannot succeed without rank 1");
                assert!(names_rank_1(&e), "abrupt={abrupt}: {e:?}");
                assert!(took < Duration::from_secs(5), "abrupt={abrupt}: took {took:?}");
            }
        }
    }

    fn short_opts() -> TcpOptions {
        TcpOptions { connect_timeout: Duration::from_secs(2), ..opts() }
    }

    #[test]
    fn a_client_with_the_wrong_secret_cannot_join() {
        let bad = Secret::from_text("not the job's secret").unwrap();
        // Rank 0 (good) dials rank 1 (wrong secret).
        let got = links_world(2, |r| if r == 1 { bad.clone() } else { secret() }, &short_opts());
        let e0 = got[0].as_ref().unwrap_err().to_string();
        let e1 = got[1].as_ref().unwrap_err().to_string();
        assert!(e0.contains(SECRET_ENV) && e0.contains("rank 1"), "{e0}");
        assert!(e1.contains("failed to prove"), "{e1}");
        // Rank 0 (wrong secret) dials rank 1 (good): the good side names the problem.
        let got = links_world(2, |r| if r == 0 { bad.clone() } else { secret() }, &short_opts());
        let e0 = got[0].as_ref().unwrap_err().to_string();
        let e1 = got[1].as_ref().unwrap_err().to_string();
        assert!(e0.contains(SECRET_ENV), "{e0}");
        assert!(e1.contains("failed to prove it knows the job secret") && e1.contains("[0]"), "{e1}");
    }

    fn read_until_closed(s: &mut TcpStream) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted) => {
                    return
                }
                Err(e) => panic!("the connection was not closed: {e}"),
            }
        }
    }

    #[test]
    fn garbage_clients_are_refused_without_disturbing_the_world() {
        let rdv = &MemRdv::default();
        let n = 3;
        let (world, mut silent) = thread::scope(|s| {
            let top = s.spawn(|| establish(2, n, rdv, &secret(), &opts()));
            let addr: SocketAddr =
                String::from_utf8(rdv.lookup("job-1/tcp/2", Duration::from_secs(5)).unwrap()).unwrap().parse().unwrap();
            // Plain garbage.
            let mut g = TcpStream::connect(addr).unwrap();
            g.write_all(&[0xAB; 100]).unwrap();
            read_until_closed(&mut g);
            // A frame header with an absurd length instead of a handshake.
            let mut g = TcpStream::connect(addr).unwrap();
            let mut head = frame::encode_header(FrameKind::Data, &header(3), 0);
            head[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
            g.write_all(&head).unwrap();
            g.write_all(&[0; 16]).unwrap();
            read_until_closed(&mut g);
            // A truncated handshake.
            let mut g = TcpStream::connect(addr).unwrap();
            let mut challenge = [0u8; 40];
            g.read_exact(&mut challenge).unwrap();
            g.write_all(&challenge[..10]).unwrap();
            g.shutdown(Shutdown::Write).unwrap();
            read_until_closed(&mut g);
            // Authenticated, but claiming impossible identities.
            for (src, world, prefix) in [(7, n, PREFIX), (2, n, PREFIX), (0, n + 1, PREFIX), (0, n, "other-job")] {
                let mut g = TcpStream::connect(addr).unwrap();
                auth::connect(&mut g, &secret(), AUTH_CONTEXT).unwrap();
                g.write_all(&Ident::new(src, world, prefix).hello(2)).unwrap();
                let mut reply = [0u8; REPLY_LEN];
                g.read_exact(&mut reply).unwrap();
                assert_ne!(reply[16], Verdict::Accepted as u8, "src {src} world {world} prefix {prefix}");
                read_until_closed(&mut g);
            }
            // A client that says nothing must not hold the others up.
            let silent = TcpStream::connect(addr).unwrap();
            let lower: Vec<_> = (0..2).map(|r| s.spawn(move || establish(r, n, rdv, &secret(), &opts()))).collect();
            let mut world: Vec<_> = lower.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
            world.push(top.join().unwrap().unwrap());
            (world, silent)
        });
        read_until_closed(&mut silent);
        let comms: Vec<Communicator> =
            world.into_iter().enumerate().map(|(r, (mb, links))| communicator(r, n, mb, &Arc::new(links))).collect();
        let got = on_threads(&comms, |c| {
            let mut x = input(c.rank(), 100);
            c.all_reduce(&mut x, ReduceOp::Sum).map(|()| x)
        });
        let want: Vec<i64> = (0..100).map(|i| (0..n).map(|r| input(r, 100)[i]).sum()).collect();
        for g in got {
            assert_eq!(g.unwrap(), want);
        }
    }

    fn header(comm_id: u64) -> Header {
        Header {
            comm_id,
            channel: Channel::PointToPoint(3),
            fingerprint: Fingerprint {
                seq: 0,
                op: OpKind::Send,
                dtype: DType::U8,
                count: 5,
                root: None,
                reduce: None,
                algorithm: Algorithm::Linear,
            },
        }
    }

    fn lost_detail(mb: &Mailbox, peer: usize) -> String {
        match mb.recv(
            peer,
            99,
            Channel::Collective,
            Some(Stage::Collective(0)),
            &mut [],
            Instant::now() + Duration::from_secs(5),
        ) {
            Err(TransportError::PeerLost { peer: p, detail }) if p == peer => detail,
            other => panic!("expected rank {peer} to be lost, got {other:?}"),
        }
    }

    /// A world of `n` in which rank 0 is played by hand: its authenticated connections to
    /// ranks 1.., and the real ranks' mailboxes and links.
    fn with_fake_rank0(n: usize) -> (Vec<TcpStream>, Vec<(Arc<Mailbox>, TcpLinks)>) {
        let rdv = &MemRdv::default();
        thread::scope(|s| {
            let real: Vec<_> = (1..n).map(|r| s.spawn(move || establish(r, n, rdv, &secret(), &opts()))).collect();
            let me = Ident::new(0, n, PREFIX);
            let deadline = Instant::now() + Duration::from_secs(10);
            let fake =
                (1..n).map(|p| dial(p, lookup(rdv, PREFIX, p, deadline).unwrap(), &secret(), &me, deadline).unwrap());
            let fake = fake.collect();
            (fake, real.into_iter().map(|h| h.join().unwrap().unwrap()).collect())
        })
    }

    #[test]
    fn bad_frames_from_an_authenticated_peer_lose_only_that_peer() {
        let n = 3;
        let (fake, real) = with_fake_rank0(n);
        let (mut fake, mut real) = (fake.into_iter(), real.into_iter());
        let (mut to1, mut to2) = (fake.next().unwrap(), fake.next().unwrap());
        let ((mb1, l1), (mb2, l2)) = (real.next().unwrap(), real.next().unwrap());
        // A good frame first, then one with an absurd length.
        to1.write_all(&frame::encode_header(FrameKind::Data, &header(9), 5)).unwrap();
        to1.write_all(b"hello").unwrap();
        let mut buf = [0u8; 8];
        let got =
            mb1.recv(0, 9, Channel::PointToPoint(3), None, &mut buf, Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(&buf[..got.len], b"hello");
        let mut head = frame::encode_header(FrameKind::Data, &header(9), 0);
        head[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
        to1.write_all(&head).unwrap();
        let d = lost_detail(&mb1, 0);
        assert!(d.contains("limit") && d.contains("closed"), "{d}");
        read_until_closed(&mut to1);
        // A truncated frame.
        to2.write_all(&frame::encode_header(FrameKind::Data, &header(9), 1000)).unwrap();
        to2.write_all(&[1; 10]).unwrap();
        to2.shutdown(Shutdown::Write).unwrap();
        let d = lost_detail(&mb2, 0);
        assert!(d.contains("middle of a frame"), "{d}");
        // Ranks 1 and 2 still talk, both ways.
        let (l1, l2) = (Arc::new(l1), Arc::new(l2));
        let (t1, t2) = (transport(1, n, mb1, &l1), transport(2, n, mb2, &l2));
        let deadline = Instant::now() + Duration::from_secs(5);
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        t1.send(2, &header(5), &big, deadline).unwrap();
        t2.send(1, &header(5), b"back", deadline).unwrap();
        let mut buf = vec![0u8; big.len()];
        let got = t2.recv(1, 5, Channel::PointToPoint(3), None, &mut buf, deadline).unwrap();
        assert_eq!(got.len, big.len());
        assert!(buf == big);
        let got = t1.recv(2, 5, Channel::PointToPoint(3), None, &mut buf, deadline).unwrap();
        assert_eq!(&buf[..got.len], b"back");
        // Sends to the lost fake peer fail; a frame above the limit is refused before sending.
        assert!(matches!(t1.send(0, &header(5), b"x", deadline), Err(TransportError::PeerLost { peer: 0, .. })));
        let huge = vec![0u8; (1 << 26) + 1];
        assert!(matches!(
            l1.send_frame(2, FrameKind::Data, &header(5), &huge, deadline),
            Err(TransportError::Other(Error::Config(_)))
        ));
        drop(to2);
    }

    #[test]
    fn sends_to_a_peer_that_does_not_read_time_out() {
        let (fake, real) = with_fake_rank0(2);
        let mut to1 = fake.into_iter().next().unwrap();
        let (_mb, l1) = real.into_iter().next().unwrap();
        // A deadline that has passed: nothing is written, the connection stays usable.
        let past = Instant::now();
        assert_eq!(
            l1.send_frame(0, FrameKind::Data, &header(2), b"late", past),
            Err(TransportError::Timeout { peer: 0 })
        );
        l1.send_frame(0, FrameKind::Data, &header(2), b"ok", Instant::now() + Duration::from_secs(5)).unwrap();
        let mut head = [0u8; HEADER_LEN + 2];
        to1.read_exact(&mut head).unwrap();
        let f = frame::decode_header(&head, 16).unwrap();
        assert_eq!((f.header, f.payload_len, &head[HEADER_LEN..]), (header(2), 2, &b"ok"[..]));
        // More than the socket buffers hold, to a peer that does not read: the deadline holds,
        // and the half-written frame closes the connection.
        let big = vec![7u8; 48 << 20];
        let started = Instant::now();
        let r = l1.send_frame(0, FrameKind::Data, &header(2), &big, started + Duration::from_millis(300));
        assert_eq!(r, Err(TransportError::Timeout { peer: 0 }));
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        let r = l1.send_frame(0, FrameKind::Data, &header(2), b"x", Instant::now() + Duration::from_secs(5));
        assert!(
            matches!(&r, Err(TransportError::PeerLost { peer: 0, detail }) if detail.contains("timed out")),
            "{r:?}"
        );
    }

    #[test]
    fn connections_probe_for_dead_peers() {
        use std::os::fd::AsRawFd;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        set_liveness(&c).unwrap();
        let get = |level, name| {
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt into a live c_int with its size.
            let r =
                unsafe { libc::getsockopt(c.as_raw_fd(), level, name, (&mut v as *mut libc::c_int).cast(), &mut len) };
            assert_eq!(r, 0);
            v
        };
        assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), KEEPALIVE_IDLE_S);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), KEEPALIVE_INTERVAL_S);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT), KEEPALIVE_PROBES);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), USER_TIMEOUT_MS);
    }

    #[test]
    fn failure_and_release_notices_reach_the_mailbox() {
        let mut stream = Vec::new();
        for (kind, payload) in [
            (FrameKind::Data, b"abc".to_vec()),
            (FrameKind::Failure, frame::encode_error(&Error::Aborted { reason: "boom".into() })),
        ] {
            let mut h = header(4);
            if kind == FrameKind::Failure {
                // Failed at collective 5: the stage travels in the sequence number.
                h.comm_id = 6;
                h.fingerprint.seq = 5;
            }
            stream.extend_from_slice(&frame::encode_header(kind, &h, payload.len()));
            stream.extend_from_slice(&payload);
        }
        stream.extend_from_slice(&frame::encode_header(FrameKind::Release, &header(4), 0));
        let mb = Mailbox::new();
        assert!(matches!(pump(&mut stream.as_slice(), 2, &mb, 1 << 20), End::Closed));
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut buf = [0u8; 3];
        assert_eq!(mb.recv(2, 4, Channel::PointToPoint(3), None, &mut buf, deadline).unwrap().len, 3);
        assert!(matches!(
            mb.probe(2, 4, Channel::Collective, Some(Stage::Collective(0))),
            Err(TransportError::PeerLost { peer: 2, .. })
        ));
        match mb.probe(2, 6, Channel::Collective, Some(Stage::Collective(0))) {
            Err(TransportError::PeerFailed { peer: 2, error: Error::Aborted { reason } }) => assert_eq!(reason, "boom"),
            other => panic!("{other:?}"),
        }
        // Waits on another peer end from stage 5 on, not before.
        assert!(matches!(mb.probe(1, 6, Channel::Collective, Some(Stage::Collective(4))), Ok(None)));
        assert!(matches!(
            mb.probe(1, 6, Channel::Collective, Some(Stage::Collective(5))),
            Err(TransportError::PeerFailed { peer: 2, .. })
        ));
    }

    #[test]
    fn malformed_streams_end_the_reader_cleanly() {
        let mb = Mailbox::new();
        let good = frame::encode_header(FrameKind::Data, &header(1), 4);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "closed"),
            (good[..30].to_vec(), "truncated"),
            ([&good[..], b"ab"].concat(), "truncated"),
            (vec![0xFF; 100], "magic"),
            (frame::encode_header(FrameKind::Release, &header(1), 3).to_vec(), "release"),
            (frame::encode_header(FrameKind::Failure, &header(1), MAX_NOTICE_LEN + 1).to_vec(), "failure notice of"),
            ([&frame::encode_header(FrameKind::Failure, &header(1), 1)[..], &[42]].concat(), "cannot be decoded"),
            (frame::encode_header(FrameKind::Data, &header(1), (1 << 20) + 1).to_vec(), "limit"),
        ];
        for (bytes, want) in cases {
            let end = pump(&mut bytes.as_slice(), 0, &mb, 1 << 20);
            let text = format!("{end:?}").to_lowercase();
            assert!(text.contains(want), "{want}: {text}");
        }
        // A huge length within the limit, with the bytes missing: no huge allocation up front.
        let head = frame::encode_header(FrameKind::Data, &header(1), 1 << 40);
        assert!(matches!(pump(&mut &head[..], 0, &mb, usize::MAX), End::Truncated));
    }

    #[test]
    fn payloads_above_the_first_allocation_are_read_whole() {
        let len = PREALLOC + PREALLOC / 2 + 3;
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        assert!(read_payload(&mut data.as_slice(), len).unwrap() == data);
        assert_eq!(read_payload(&mut &data[..len - 1], len).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn readers_take_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400), max in 0usize..512) {
            let mb = Mailbox::new();
            let end = pump(&mut bytes.as_slice(), 1, &mb, max);
            prop_assert!(!matches!(end, End::Failed(_)));
        }

        #[test]
        fn readers_deliver_valid_frames_in_order(
            frames in prop::collection::vec((frame::fuzz::header(), prop::collection::vec(any::<u8>(), 0..64)), 0..8),
            junk in prop::collection::vec(any::<u8>(), 0..80),
        ) {
            let mut bytes = Vec::new();
            for (h, p) in &frames {
                let mut h = *h;
                h.comm_id = 1;
                bytes.extend_from_slice(&frame::encode_header(FrameKind::Data, &h, p.len()));
                bytes.extend_from_slice(p);
            }
            bytes.extend_from_slice(&junk);
            let mb = Mailbox::new();
            let end = pump(&mut bytes.as_slice(), 0, &mb, 64);
            prop_assert!(!matches!(end, End::Failed(_)));
            let deadline = Instant::now();
            for (h, p) in &frames {
                let mut buf = [0u8; 64];
                let got = mb.recv(0, 1, h.channel, Some(Stage::Collective(0)), &mut buf, deadline);
                let got = got.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                prop_assert_eq!(got.header.fingerprint, h.fingerprint);
                prop_assert_eq!(&buf[..got.len], &p[..]);
            }
        }
    }

    fn iface(name: &str, ip: [u8; 4], up: bool) -> Iface {
        Iface { name: name.into(), ip: Ipv4Addr::from(ip), up }
    }

    #[test]
    fn interfaces_are_chosen_like_nccl_socket_ifname() {
        let found = vec![
            iface("lo", [127, 0, 0, 1], true),
            iface("docker0", [172, 17, 0, 1], true),
            iface("eth0.100", [10, 1, 0, 2], true),
            iface("eth0", [10, 0, 0, 2], true),
            iface("eth1", [10, 0, 1, 2], false),
            iface("ib0", [10, 9, 0, 2], true),
        ];
        let ip = |spec: Option<&str>| pick(spec, &found).map(|a| a.to_string());
        assert_eq!(ip(Some("eth0")).unwrap(), "10.0.0.2");
        assert_eq!(ip(Some("eth")).unwrap(), "10.1.0.2");
        assert_eq!(ip(Some("=eth1")).unwrap(), "10.0.1.2");
        assert_eq!(ip(Some(" ib , eth ")).unwrap(), "10.1.0.2");
        assert_eq!(ip(Some("^docker,eth,lo")).unwrap(), "10.9.0.2");
        assert_eq!(ip(Some("^eth,ib,docker")).unwrap(), "127.0.0.1");
        assert_eq!(ip(None).unwrap(), "10.1.0.2");
        assert_eq!(pick(None, &found[..2]).unwrap().to_string(), "172.17.0.1");
        assert_eq!(pick(None, &found[..1]).unwrap(), Ipv4Addr::LOCALHOST);
        assert_eq!(pick(None, &[]).unwrap(), Ipv4Addr::LOCALHOST);
        let e = ip(Some("wlan0")).unwrap_err().to_string();
        assert!(e.contains(IFNAME_ENV) && e.contains("eth1 10.0.1.2 (down)") && e.contains("lo 127.0.0.1"), "{e}");
        assert!(ip(Some("^")).is_err());
        assert!(ip(Some(" , ")).is_err());
        // The real interfaces of this machine: every Linux host has `lo`.
        let real = TcpOptions { ifname: Some("=lo".into()), ..TcpOptions::default() };
        assert_eq!(select_address(&real).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        let e = select_address(&TcpOptions { ifname: Some("no-such-if".into()), ..TcpOptions::default() }).unwrap_err();
        assert!(matches!(&e, Error::Config(m) if m.contains("lo 127.0.0.1")), "{e}");
        let any = TcpOptions { bind_addr: Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), ..TcpOptions::default() };
        assert!(matches!(select_address(&any), Err(Error::Config(_))));
    }

    #[test]
    fn options_come_from_the_environment() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let o = TcpOptions::from_env_with(env(&[(IFNAME_ENV, "eth0"), (MAX_FRAME_ENV, "64M")])).unwrap();
        assert_eq!((o.ifname.as_deref(), o.max_frame), (Some("eth0"), 64 << 20));
        assert_eq!(TcpOptions::from_env_with(env(&[])).unwrap(), TcpOptions::default());
        for bad in ["", "12X", "1K", "99999999999999T"] {
            let vars: &'static [(&str, &str)] = Box::leak(Box::new([(MAX_FRAME_ENV, bad)]));
            let e = TcpOptions::from_env_with(env(vars)).unwrap_err();
            assert!(matches!(&e, Error::Config(m) if m.contains(MAX_FRAME_ENV)), "{bad}: {e}");
        }
        assert_eq!(parse_size(" 2 GiB ").unwrap(), 2 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
    }

    #[test]
    fn establish_checks_its_arguments() {
        let rdv = MemRdv::default();
        let mb = Arc::new(Mailbox::new());
        let o = opts();
        for (rank, world, peers) in [(3, 3, vec![0]), (0, 3, vec![3]), (0, 3, vec![0]), (0, 3, vec![1, 1])] {
            let e = TcpLinks::establish(rank, world, &peers, &rdv, PREFIX, &secret(), &o, Arc::clone(&mb)).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        }
        // A world of one: nothing to connect.
        let l = TcpLinks::establish(0, 1, &[], &rdv, PREFIX, &secret(), &o, mb).unwrap();
        assert!(l.peers().is_empty());
        assert!(format!("{l:?}").contains("TcpLinks"));
    }
}
