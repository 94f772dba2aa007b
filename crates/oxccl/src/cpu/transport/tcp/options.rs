//! The TCP transport's options: [`TcpOptions`] and its defaults. The `cpu` backend fills
//! them from its resolved settings (`OXCCL_SOCKET_IFNAME`, `OXCCL_MAX_FRAME`: see
//! [`config::registry`](crate::config::registry)); nothing here reads the environment.

use std::net::IpAddr;
use std::time::Duration;

use crate::config::registry;
use crate::cpu::transport::frame::MAX_NOTICE_LEN;
use crate::error::{Error, Result};

/// The setting that chooses the interface (like `NCCL_SOCKET_IFNAME`), for messages.
pub const IFNAME_ENV: &str = registry::SOCKET_IFNAME.name;
/// The setting that bounds the payload of one frame, for messages.
pub const MAX_FRAME_ENV: &str = registry::MAX_FRAME.name;
/// The default bound on one frame's payload. Large because the algorithms send a whole
/// buffer (or a whole block of it) as one frame; readers allocate as bytes arrive.
#[cfg(target_pointer_width = "64")]
pub const DEFAULT_MAX_FRAME: usize = 1 << 34;
/// The default bound on one frame's payload.
#[cfg(not(target_pointer_width = "64"))]
pub const DEFAULT_MAX_FRAME: usize = 1 << 30;
/// The default time [`TcpLinks::establish`](super::TcpLinks::establish) waits for all of
/// its peers.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest a receiver reads its peer's socket itself ([`TcpOptions::poll_for`]) where
/// the machine's waits spin: about a round trip of a fast link. Longer polls cost more than
/// they save, since a spinning receiver holds the core the kernel's network work needs; after
/// the poll the progress thread delivers (sleeping on the socket itself was slower).
/// Measurements: `docs/performance.md`, "The TCP transport".
pub const MAX_POLL: Duration = Duration::from_micros(50);

/// How [`TcpLinks::establish`](super::TcpLinks::establish) listens, connects and frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpOptions {
    /// Which interface to listen on (`OXCCL_SOCKET_IFNAME`): a comma-separated list of name
    /// prefixes (`eth,ib`; a name that matches exactly is preferred, so `eth0` picks `eth0`
    /// over `eth0.100`); `=name` matches `name` only; a leading `^` excludes the listed
    /// prefixes instead (`^docker,lo`). `None`: the first up non-loopback IPv4 interface.
    pub ifname: Option<String>,
    /// An explicit address to listen on (e.g. 127.0.0.1), overriding `ifname`.
    pub bind_addr: Option<IpAddr>,
    /// The interface to prefer when neither `ifname` nor `bind_addr` is set, if it is up
    /// with an IPv4 address: the NIC nearest this rank's GPU (the backend's setup decides).
    pub prefer: Option<String>,
    /// How long establishing all connections may take (address lookups, connects with
    /// retries, accepts, handshakes).
    pub connect_timeout: Duration,
    /// The largest frame payload sent or accepted, in bytes (`OXCCL_MAX_FRAME`); every rank
    /// should use the same value. At least [`MAX_NOTICE_LEN`].
    pub max_frame: usize,
    /// How long a receiver reads its peer's socket itself, without waiting, before it sleeps
    /// until the progress thread delivers (zero: the progress thread delivers every
    /// frame). The `cpu` backend sets it to the spin of the machine's wait policy, at most
    /// [`MAX_POLL`]: a polling receiver saves the reader's wake-up and the copy through the
    /// mailbox, but holds a core that a crowded machine, and the kernel's network work, need.
    pub poll_for: Duration,
    /// How long a receiver goes on reading its peer's socket itself after `poll_for`,
    /// yielding its CPU between reads, before it sleeps (zero: it does not yield). The
    /// `cpu` backend sets it to the yield phase of the machine's wait policy, which is
    /// nonzero where the ranks outnumber the CPUs: there a sleeping receiver pays two
    /// wake-ups per frame (the progress thread, then itself), and a CPU that went idle
    /// meanwhile must be woken too (a VM exit on a virtual machine), while a yield hands the
    /// CPU straight to a rank that has work (`docs/performance.md`).
    pub yield_for: Duration,
    /// Connections per peer (`OXCCL_SOCKETS_PER_PEER`, 1 to [`MAX_LANES`]); every rank must
    /// use the same number (the handshake refuses a peer that does not). Frames of
    /// [`STRIPE_FROM`](super::stripes::STRIPE_FROM) bytes and more are striped across them.
    pub lanes: usize,
}

/// The most connections per peer.
pub const MAX_LANES: usize = 8;
/// The default connections per peer: two streams carried large frames faster than one,
/// and four no faster than two (`docs/performance.md`).
pub const DEFAULT_LANES: usize = 2;
/// The setting that chooses the connections per peer, for messages.
pub const LANES_ENV: &str = registry::SOCKETS_PER_PEER.name;

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            ifname: None,
            bind_addr: None,
            prefer: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_frame: DEFAULT_MAX_FRAME,
            poll_for: Duration::ZERO,
            yield_for: Duration::ZERO,
            lanes: DEFAULT_LANES,
        }
    }
}

impl TcpOptions {
    /// Checks the options before any connection is made.
    ///
    /// # Errors
    /// [`Error::Config`] for a frame bound below what failure notices need, connections per
    /// peer out of range, or a zero connect timeout.
    pub(super) fn check(&self) -> Result<()> {
        if self.max_frame < MAX_NOTICE_LEN {
            return Err(Error::Config(format!(
                "{MAX_FRAME_ENV} is {} bytes; it must be at least {MAX_NOTICE_LEN} (failure notices need that much)",
                self.max_frame
            )));
        }
        if !(1..=MAX_LANES).contains(&self.lanes) {
            return Err(Error::Config(format!("{LANES_ENV} is {}; it must be 1 to {MAX_LANES}", self.lanes)));
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::Config("the TCP connect timeout must be greater than zero".into()));
        }
        Ok(())
    }
}
