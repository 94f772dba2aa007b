//! The job's secret and its rendezvous store: node 0's launcher hosts the store the ranks
//! meet at (`MASTER_ADDR:MASTER_PORT`), authenticated with the job secret.

use oxccl::bootstrap::auth::{Secret, SECRET_ENV};
use oxccl::bootstrap::store::StoreServer;

/// The job secret: the one given (`--secret` or `OXCCL_SECRET`), else a fresh random one for
/// a single-node job.
///
/// # Errors
/// When a multi-node job has no secret (the nodes cannot agree on a generated one), or the
/// given one is empty, or the system's random source fails.
pub fn secret(given: Option<&str>, nnodes: usize) -> Result<Secret, String> {
    match given {
        Some(text) => Secret::from_text(text).map_err(|e| format!("{e} (from --secret or {SECRET_ENV})")),
        None if nnodes > 1 => Err(format!(
            "a job on {nnodes} nodes needs one secret shared by every node, so that only its ranks can \
             join its store: generate one (for example `export {SECRET_ENV}=$(openssl rand -hex 32)`) and \
             start `oxccl run` on every node with the same {SECRET_ENV} (or --secret)"
        )),
        None => Secret::generate().map_err(|e| format!("could not generate the job secret: {e}")),
    }
}

/// The store hosted by this launcher, serving until dropped.
pub struct HostedStore {
    /// The store, serving in its own threads.
    server: StoreServer,
}

impl HostedStore {
    /// Binds the store to `host:port` (port 0: any free port) on this machine.
    ///
    /// # Errors
    /// When the address cannot be bound, with what to change.
    pub fn bind(host: &str, port: u16, secret: &Secret) -> Result<HostedStore, String> {
        let addr = join_host_port(host, port);
        let server = StoreServer::bind(&addr, secret.clone()).map_err(|e| {
            format!(
                "could not host the rendezvous store at {addr}: {e}. On node 0, --master-addr must be an \
                 address of this machine that the other nodes can reach, and --master-port a free port \
                 (leave it out on a single node to pick one)"
            )
        })?;
        Ok(HostedStore { server })
    }

    /// The port the store listens on (the real one when bound to port 0).
    pub fn port(&self) -> u16 {
        self.server.local_addr().port()
    }

    /// A client of this store (to read what the ranks report), or `None` when it cannot
    /// connect.
    pub fn client(&self, secret: &Secret) -> Option<oxccl::bootstrap::store::StoreClient> {
        let addr = join_host_port("127.0.0.1", self.port());
        oxccl::bootstrap::store::StoreClient::connect(&addr, secret, std::time::Duration::from_secs(2)).ok()
    }

    /// Stops serving: connected ranks see errors from then on.
    pub fn shutdown(self) {
        self.server.shutdown();
    }
}

/// `host:port`, with an IPv6 host in brackets.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_node_jobs_need_a_shared_secret() {
        let e = secret(None, 2).unwrap_err();
        assert!(e.contains(SECRET_ENV) && e.contains("every node"), "{e}");
        assert_eq!(secret(Some("abc"), 2).unwrap(), Secret::from_text("abc").unwrap());
        assert!(secret(Some(""), 1).is_err());
        assert_eq!(secret(None, 1).unwrap().text().len(), 64);
    }

    #[test]
    fn hosts_a_store_on_a_free_port() {
        let s = secret(None, 1).unwrap();
        let store = HostedStore::bind("127.0.0.1", 0, &s).unwrap();
        assert_ne!(store.port(), 0);
        let taken = HostedStore::bind("127.0.0.1", store.port(), &s).err().unwrap();
        assert!(taken.contains("--master-port"), "{taken}");
        store.shutdown();
        assert_eq!(join_host_port("::1", 5), "[::1]:5");
    }
}
