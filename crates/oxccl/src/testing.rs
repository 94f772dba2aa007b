//! Internals that tests outside this crate need, behind the cargo feature `testing`; not
//! part of oxccl's stable API.

use std::sync::Arc;

use crate::backend::Backend;
use crate::config::Config;
use crate::error::Result;

/// The context string of the TCP transport's secret handshake (for tests that speak the
/// handshake themselves, e.g. an impostor that must be refused).
pub const TCP_AUTH_CONTEXT: &[u8] = crate::cpu::transport::tcp::AUTH_CONTEXT;

/// The `n` ranks of a new `local` world as bare backends, named `name` (for tests that wrap
/// a real backend, e.g. to inject faults).
///
/// # Errors
/// [`Error::Config`](crate::Error::Config) for unusable settings;
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `n` is 0.
pub fn local_backends(cfg: &Config, n: usize, name: &'static str) -> Result<Vec<Arc<dyn Backend>>> {
    let world = crate::cpu::local::named_world(&cfg.resolve()?, n, name)?;
    Ok(world.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect())
}
