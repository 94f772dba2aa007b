//! How a connection is opened and vetted: finding a peer's published address ([`lookup`]),
//! dialing it ([`dial`], the client side), and the handshake both sides run, the job-secret
//! proof of [`auth`] then the identity exchange ([`Ident`], [`Verdict`]; the server side
//! runs without blocking on the progress thread, `accepting`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::options::LANES_ENV;
use super::remaining;
use crate::bootstrap::auth::{self, AuthError, Secret, SECRET_ENV};
use crate::bootstrap::Rendezvous;
use crate::error::{Error, Result};

/// The handshake context of transport connections (the store uses another).
pub const AUTH_CONTEXT: &[u8] = b"oxccl-tcp";
const ID_MAGIC: [u8; 8] = *b"OXTCPID2";
pub(super) const HELLO_LEN: usize = 8 + 8 + 8 + 8 + 8 + 8 + 8;
pub(super) const REPLY_LEN: usize = 8 + 8 + 1;

/// The key under which rank `rank` publishes its listening address.
pub fn address_key(prefix: &str, rank: usize) -> String {
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
pub(super) struct Ident {
    pub(super) me: usize,
    world: usize,
    /// Connections per peer (`OXCCL_SOCKETS_PER_PEER`): both ranks must agree.
    pub(super) lanes: usize,
    /// A hash of the rendezvous prefix: connections from another setup are refused.
    tag: [u8; 8],
}

impl Ident {
    pub(super) fn new(me: usize, world: usize, lanes: usize, prefix: &str) -> Ident {
        let mut h = Sha256::new();
        h.update(b"oxccl-tcp-prefix\0");
        h.update(prefix.as_bytes());
        let digest = h.finalize();
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&digest[..8]);
        Ident { me, world, lanes, tag }
    }

    /// The client's identity message for connection `lane` to `dst`.
    pub(super) fn hello(&self, dst: usize, lane: usize) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(&ID_MAGIC);
        b[8..16].copy_from_slice(&(self.me as u64).to_le_bytes());
        b[16..24].copy_from_slice(&(dst as u64).to_le_bytes());
        b[24..32].copy_from_slice(&(self.world as u64).to_le_bytes());
        b[32..40].copy_from_slice(&self.tag);
        b[40..48].copy_from_slice(&(self.lanes as u64).to_le_bytes());
        b[48..56].copy_from_slice(&(lane as u64).to_le_bytes());
        b
    }
}

/// Why the server refused a client's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Verdict {
    Accepted = 0,
    NotMe = 1,
    OtherWorld = 2,
    OtherSetup = 3,
    Unexpected = 4,
    OtherLanes = 5,
    /// Both ranks dialed each other at once, and the server's own dial wins (it is the
    /// lower rank): the client takes the server's connection instead.
    Crossed = 6,
    /// The server already holds (or is accepting) a connection from the client.
    Duplicate = 7,
    /// The server has lost the client (their connection ended, or the server shut down): a
    /// lost peer is not connected again, so the client loses the server too.
    Lost = 8,
}

impl Verdict {
    fn from_byte(b: u8) -> Option<Verdict> {
        [
            Verdict::Accepted,
            Verdict::NotMe,
            Verdict::OtherWorld,
            Verdict::OtherSetup,
            Verdict::Unexpected,
            Verdict::OtherLanes,
            Verdict::Crossed,
            Verdict::Duplicate,
            Verdict::Lost,
        ]
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
            Verdict::OtherLanes => format!(
                "the two ranks disagree on the number of connections per peer; set {LANES_ENV} alike on every rank"
            ),
            Verdict::Crossed => format!("rank {server} is dialing rank {client} at the same moment, and keeps its own"),
            Verdict::Duplicate => format!("rank {server} already has a connection from rank {client}"),
            Verdict::Lost => format!(
                "rank {server} has lost rank {client} (their connection ended, or rank {server} shut its connections \
                 down), and lost peers are not connected again"
            ),
        }
    }
}

/// Server side of the identity exchange, before the connection table has its say: the
/// client's rank and the connection's lane, and whether the identity checks out (`expected`:
/// which ranks may connect, by rank).
pub(super) fn check_hello(hello: &[u8; HELLO_LEN], me: &Ident, expected: &[bool]) -> (Verdict, u64, u64) {
    let src = u64_at(hello, 8);
    let lane = u64_at(hello, 48);
    let verdict = if hello[..8] != ID_MAGIC {
        Verdict::OtherSetup
    } else if u64_at(hello, 24) != me.world as u64 {
        Verdict::OtherWorld
    } else if u64_at(hello, 16) != me.me as u64 {
        Verdict::NotMe
    } else if hello[32..40] != me.tag {
        Verdict::OtherSetup
    } else if u64_at(hello, 40) != me.lanes as u64 || lane >= me.lanes as u64 {
        Verdict::OtherLanes
    } else if !usize::try_from(src).is_ok_and(|s| expected.get(s).copied().unwrap_or(false)) {
        Verdict::Unexpected
    } else {
        Verdict::Accepted
    };
    (verdict, src, lane)
}

/// The server's answer to an identity message: its rank and the verdict.
pub(super) fn reply(me: &Ident, verdict: Verdict) -> [u8; REPLY_LEN] {
    let mut reply = [0u8; REPLY_LEN];
    reply[..8].copy_from_slice(&ID_MAGIC);
    reply[8..16].copy_from_slice(&(me.me as u64).to_le_bytes());
    reply[16] = verdict as u8;
    reply
}

/// Why a refused identity was refused, for the server's records.
pub(super) fn refusal(me: &Ident, verdict: Verdict, src: u64) -> String {
    format!("a peer claiming to be rank {src} was refused: {}", verdict.text(me.me, src as usize))
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

/// How long a peer whose port refuses connections is tried again before it counts as gone:
/// its address was published only once it listened, so a refusal means its listener closed
/// (its process ended, or it shut its connections down).
pub(super) const REFUSED_PATIENCE: Duration = Duration::from_millis(100);

/// Why a dial did not give a connection.
#[derive(Debug)]
pub(super) enum DialError {
    /// The peer keeps a connection of its own instead (`Crossed`, `Duplicate`).
    Yielded,
    /// For good: the peer is gone, refused this rank, or cannot be authenticated.
    Failed(Error),
    /// The deadline passed first; the instant since which the peer's port refused every
    /// attempt, when it did (the next dial goes on counting from it, see [`dial`]).
    TimedOut { refused_since: Option<Instant> },
    /// The peer's address could not be looked up (the store failed, or the peer never
    /// published it).
    NoAddress(Error),
}

/// Opens connection `lane` to `peer` and runs the client side of the handshake.
///
/// # Errors
/// [`DialError`]: `Yielded` when the peer's own connection is kept, `Failed` when its port
/// refuses connections for [`REFUSED_PATIENCE`], authentication fails (`PermissionDenied`,
/// naming `OXCCL_SECRET`) or it refuses this rank's identity (`InvalidData`), `TimedOut` at
/// `deadline`.
///
/// `refused_since` carries refusals over from earlier dials that ended at their deadline
/// (`TimedOut { refused_since }`): callers that wait in short slices dial many times, and
/// each alone would be shorter than the patience, so a dead peer would be dialed forever.
pub(super) fn dial(
    peer: usize,
    lane: usize,
    addr: SocketAddr,
    secret: &Secret,
    me: &Ident,
    deadline: Instant,
    mut refused_since: Option<Instant>,
) -> std::result::Result<TcpStream, DialError> {
    let context = || format!("connecting rank {} to rank {peer} at {addr} (connection {lane})", me.me);
    let mut backoff = Duration::from_millis(10);
    let mut last: Option<io::Error> = None;
    let mut s = loop {
        let left = remaining(deadline);
        if left.is_zero() {
            tracing::debug!(
                "{}: no connection before the deadline (last error: {})",
                context(),
                last.map_or_else(|| "none".to_string(), |e| e.to_string())
            );
            return Err(DialError::TimedOut { refused_since });
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => break s,
            Err(e) if matches!(e.kind(), io::ErrorKind::InvalidInput | io::ErrorKind::PermissionDenied) => {
                return Err(DialError::Failed(Error::io(context(), &e)));
            }
            Err(e) => {
                if e.kind() != io::ErrorKind::ConnectionRefused {
                    refused_since = None;
                } else {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= REFUSED_PATIENCE {
                        return Err(DialError::Failed(Error::Io {
                            context: context(),
                            kind: io::ErrorKind::ConnectionRefused,
                            message: format!(
                                "nothing listens at rank {peer}'s published address any more: its process ended, \
                                 or it shut its connections down"
                            ),
                        }));
                    }
                }
                last = Some(e);
                std::thread::sleep(backoff.min(remaining(deadline)));
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
        }
    };
    let failed = |e: io::Error| {
        if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
            DialError::TimedOut { refused_since: None }
        } else {
            DialError::Failed(Error::io(context(), &e))
        }
    };
    let left = remaining(deadline).max(Duration::from_millis(1));
    s.set_nodelay(true).map_err(failed)?;
    s.set_read_timeout(Some(left)).map_err(failed)?;
    s.set_write_timeout(Some(left)).map_err(failed)?;
    auth::connect(&mut s, secret, AUTH_CONTEXT).map_err(|e| match e {
        AuthError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => DialError::Failed(Error::Io {
            context: context(),
            kind: io::ErrorKind::PermissionDenied,
            message: format!(
                "rank {peer} closed the connection during authentication: its process ended, or it refused \
                 this rank's secret (every rank of a job must use the same {SECRET_ENV})"
            ),
        }),
        AuthError::Io(e) => failed(e),
        e => DialError::Failed(auth_failure(format!("authenticating rank {} to rank {peer} at {addr}", me.me), e)),
    })?;
    s.write_all(&me.hello(peer, lane)).map_err(failed)?;
    let mut reply = [0u8; REPLY_LEN];
    s.read_exact(&mut reply).map_err(failed)?;
    let refused = |message: String| {
        DialError::Failed(Error::Io { context: context(), kind: io::ErrorKind::InvalidData, message })
    };
    if reply[..8] != ID_MAGIC {
        return Err(refused("the peer does not speak the oxccl TCP protocol".into()));
    }
    let theirs = u64_at(&reply, 8);
    match Verdict::from_byte(reply[16]) {
        Some(Verdict::Accepted) if theirs == peer as u64 => Ok(s),
        Some(Verdict::Accepted) => {
            Err(refused(format!("the address published for rank {peer} belongs to rank {theirs}")))
        }
        Some(Verdict::Crossed | Verdict::Duplicate) => Err(DialError::Yielded),
        // Reported as the connection ending: the caller loses the peer.
        Some(Verdict::Lost) => Err(DialError::Failed(Error::Io {
            context: context(),
            kind: io::ErrorKind::ConnectionAborted,
            message: Verdict::Lost.text(peer, me.me),
        })),
        Some(v) => Err(refused(format!("rank {peer} refused the connection: {}", v.text(peer, me.me)))),
        None => Err(refused(format!("rank {peer} answered with an unknown verdict {}", reply[16]))),
    }
}

/// Looks `peer`'s published address up.
pub(super) fn lookup(rdv: &dyn Rendezvous, prefix: &str, peer: usize, deadline: Instant) -> Result<SocketAddr> {
    let key = address_key(prefix, peer);
    let raw = rdv.lookup_from(peer, &key, remaining(deadline))?;
    std::str::from_utf8(&raw).ok().and_then(|t| t.trim().parse().ok()).ok_or_else(|| {
        Error::Store(format!(
            "the address of rank {peer} under `{key}` is not host:port: {:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(80)])
        ))
    })
}
