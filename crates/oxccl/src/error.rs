//! The one error type of oxccl. Every variant says what went wrong and what to do about it.

use std::fmt;
use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::op_kind::OpKind;

/// Result alias used throughout oxccl.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in oxccl.
///
/// Errors are values, never panics: bad input, a peer that calls a different collective,
/// a peer that dies, a deadline that passes and an explicit [`abort`](crate::Communicator::abort)
/// all arrive here. After any error other than [`Error::InvalidArgument`] the communicator
/// that produced it is *poisoned*: further calls on it return [`Error::Aborted`], because
/// the ranks no longer agree on which messages belong to which collective.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something oxccl cannot use (a root out of range, a buffer of the
    /// wrong length, a count that does not divide by the world size, an unknown rank).
    /// Detected before any communication, so the communicator stays usable.
    InvalidArgument(String),
    /// This rank and `peer` are not running the same collective: different operations,
    /// dtypes, counts, roots or algorithms at the same sequence number. Every rank must
    /// issue the same collectives in the same order with matching arguments.
    Mismatch {
        /// The rank (in this communicator) whose message disagreed.
        peer: usize,
        /// What this rank is running.
        ours: Fingerprint,
        /// What the peer's message says it is running.
        theirs: Fingerprint,
    },
    /// A wait ran past its deadline. The peer named is the one this rank was waiting on:
    /// it is slow, stuck in a different collective, or gone.
    Timeout {
        /// The operation that was waiting.
        op: OpKind,
        /// Its sequence number on this communicator.
        seq: u64,
        /// The rank (in this communicator) waited on, when there was one.
        peer: Option<usize>,
        /// How long this rank waited.
        waited: Duration,
    },
    /// A peer disappeared (its process died, its communicator was dropped, or its
    /// connection closed) while this rank still needed it.
    PeerLost {
        /// The rank (in this communicator) that was lost.
        rank: usize,
        /// What was observed.
        detail: String,
    },
    /// The communicator was aborted: by [`Communicator::abort`](crate::Communicator::abort),
    /// by an earlier error on this rank, or by a failure reported by a peer. Create a new
    /// communicator to continue.
    Aborted {
        /// Why.
        reason: String,
    },
    /// The communicator was revoked ([`Communicator::revoke`](crate::Communicator::revoke)) by
    /// `rank`, on this rank or another: every pending and later call on it fails. Unlike an
    /// aborted one, a revoked communicator can still agree and shrink.
    Revoked {
        /// The rank that revoked it.
        rank: usize,
        /// Why.
        reason: String,
    },
    /// The requested backend cannot run here (library missing, no device, not built in).
    BackendUnavailable {
        /// The backend's name (`local`, `cpu`, `nccl`, `rccl`, `mpi`).
        backend: String,
        /// Why it is unavailable, including the paths tried where libraries are loaded.
        why: String,
    },
    /// The rendezvous store failed or refused a request.
    Store(String),
    /// An operating-system I/O error.
    Io {
        /// What oxccl was doing.
        context: String,
        /// The kind of I/O error.
        kind: std::io::ErrorKind,
        /// The operating system's message.
        message: String,
    },
    /// An error reported by an underlying library (NCCL, MPI, CUDA), with its own code and text.
    Backend {
        /// The library's error code.
        code: i64,
        /// The library's error string.
        message: String,
    },
    /// A configuration value (environment variable or builder setting) is not usable.
    Config(String),
    /// An invariant of oxccl itself was broken while an operation ran: a bug in oxccl.
    /// The communicator is poisoned; please report the message.
    Internal(String),
}

impl Error {
    /// What to tell a user of this error where the backend is already named: a
    /// [`Error::BackendUnavailable`]'s reason, or the whole message.
    pub(crate) fn reason(self) -> String {
        match self {
            Error::BackendUnavailable { why, .. } => why,
            other => other.to_string(),
        }
    }

    /// Builds an [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    /// Builds an [`Error::Io`] from an `std::io::Error` and what oxccl was doing.
    pub fn io(context: impl Into<String>, err: &std::io::Error) -> Self {
        Error::Io { context: context.into(), kind: err.kind(), message: err.to_string() }
    }

    /// Whether this error leaves the communicator usable (only argument errors do).
    pub fn is_recoverable(&self) -> bool {
        matches!(self, Error::InvalidArgument(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::Mismatch { peer, ours, theirs } => write!(
                f,
                "collective mismatch with rank {peer}: this rank runs {ours}, rank {peer} runs {theirs}; \
                 every rank must call the same collectives in the same order with the same arguments"
            ),
            Error::Timeout { op, seq, peer, waited } => {
                write!(f, "timeout in {op} (sequence number {seq}) after {:.3}s", waited.as_secs_f64())?;
                match peer {
                    Some(p) => write!(
                        f,
                        " waiting on rank {p}; is it alive, slow, or stuck in another collective? \
                                          (raise the timeout with Config::timeout or OXCCL_TIMEOUT)"
                    ),
                    None => write!(f, "; raise the timeout with Config::timeout or OXCCL_TIMEOUT"),
                }
            }
            Error::PeerLost { rank, detail } => write!(f, "lost rank {rank}: {detail}"),
            Error::Aborted { reason } => {
                write!(f, "communicator aborted: {reason}; create a new communicator to continue")
            }
            Error::Revoked { rank, reason } => write!(
                f,
                "communicator revoked by rank {rank}: {reason}; shrink it (or create a new communicator) to continue"
            ),
            Error::BackendUnavailable { backend, why } => write!(f, "backend `{backend}` is unavailable: {why}"),
            Error::Store(m) => write!(f, "store: {m}"),
            Error::Io { context, message, .. } => write!(f, "I/O error while {context}: {message}"),
            Error::Backend { code, message } => write!(f, "backend error {code}: {message}"),
            Error::Config(m) => write!(f, "configuration: {m}"),
            Error::Internal(m) => write!(f, "internal error in oxccl (please report it): {m}"),
        }
    }
}

impl std::error::Error for Error {}
