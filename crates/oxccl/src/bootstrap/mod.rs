//! Bootstrap: who the ranks are and how they find each other.
//!
//! - [`auth`]: the job secret and the handshake every connection starts with.
//! - [`env`](mod@env): rank and world from the launcher's environment variables (torchrun, MPI, Slurm).
//! - [`store`]: the authenticated TCP key-value store ranks rendezvous through.
//! - [`pmix`]: the same through the launcher's PMIx (Slurm, `mpirun`, PRRTE), where it runs one.

pub mod auth;
pub mod env;
pub mod pmix;
pub mod store;

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

    /// The value that rank `owner` published under `key`, waiting up to `timeout` for it.
    /// Exchanges that keep each rank's values with their rank (PMIx) need the owner; a store
    /// with one key space ignores it, which is the default.
    ///
    /// # Errors
    /// As [`Rendezvous::lookup`].
    fn lookup_from(&self, owner: usize, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let _ = owner;
        self.lookup(key, timeout)
    }

    /// The caller will not use the rendezvous for a while: it lets go of what it holds open
    /// (the store's client closes its idle connections, so a server of thousands of ranks
    /// does not keep a descriptor for each). Later calls reopen what they need.
    fn rest(&self) {}
}

/// A [`Rendezvous`] inside one process (for worlds of threads and for tests).
#[derive(Debug, Default)]
pub struct MemoryRendezvous {
    map: std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>,
    changed: std::sync::Condvar,
}

impl Rendezvous for MemoryRendezvous {
    fn publish(&self, key: &str, value: &[u8]) -> Result<()> {
        crate::sync::relock(&self.map).insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn lookup(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut map = crate::sync::relock(&self.map);
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(crate::error::Error::Store(format!("`{key}` was not published within {timeout:?}")));
            }
            map = self.changed.wait_timeout(map, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}
