//! Bootstrap: who the ranks are and how they find each other.
//!
//! - [`auth`]: the job secret and the handshake every connection starts with.

pub mod auth;

use std::time::Duration;

use crate::error::Result;

/// A place where ranks publish and look up small values during setup (addresses,
/// segment names). The TCP store implements it; tests may use an in-memory map.
pub trait Rendezvous: Send + Sync {
    /// Publishes `value` under `key` (overwriting).
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store) when the store cannot be reached.
    fn publish(&self, key: &str, value: &[u8]) -> Result<()>;

    /// The value under `key`, waiting up to `timeout` for it to be published.
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store) when it does not appear in time or the store fails.
    fn lookup(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
}
