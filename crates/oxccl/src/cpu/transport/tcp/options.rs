//! The TCP transport's options: [`TcpOptions`], its defaults, and how they are read from
//! the environment (`OXCCL_SOCKET_IFNAME`, `OXCCL_MAX_FRAME`).

use std::net::IpAddr;
use std::time::Duration;

use crate::cpu::transport::frame::MAX_NOTICE_LEN;
use crate::error::{Error, Result};

/// The environment variable that chooses the interface (like `NCCL_SOCKET_IFNAME`).
pub const IFNAME_ENV: &str = "OXCCL_SOCKET_IFNAME";
/// The environment variable that bounds the payload of one frame, in bytes (`K`, `M`, `G`
/// suffixes are powers of 1024).
pub const MAX_FRAME_ENV: &str = "OXCCL_MAX_FRAME";
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

    pub(super) fn check(&self) -> Result<()> {
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
pub(super) fn parse_size(s: &str) -> std::result::Result<usize, String> {
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
