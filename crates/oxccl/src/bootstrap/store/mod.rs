//! A TCP key-value store for rendezvous, like torch's `TCPStore`.
//!
//! Rank 0 (or the launcher) runs a [`StoreServer`]; every rank connects a [`StoreClient`]
//! and publishes and looks up small values (addresses, segment names, unique ids) while a
//! communicator is set up. The client implements [`Rendezvous`](crate::bootstrap::Rendezvous)
//! (`publish` = [`set`](StoreClient::set), `lookup` = [`get_wait`](StoreClient::get_wait)).
//!
//! ```
//! use std::time::Duration;
//! use oxccl::bootstrap::auth::Secret;
//! use oxccl::bootstrap::store::{StoreClient, StoreServer};
//!
//! let secret = Secret::generate()?;
//! let server = StoreServer::bind("127.0.0.1:0", secret.clone())?;
//! let client = StoreClient::connect(&server.local_addr().to_string(), &secret, Duration::from_secs(5))?;
//! client.set("rank0/addr", b"10.0.0.1:4000")?;
//! assert_eq!(client.get_wait("rank0/addr", Duration::from_secs(1))?, b"10.0.0.1:4000");
//! assert_eq!(client.add("arrived", 1)?, 1);
//! # Ok::<(), oxccl::Error>(())
//! ```
//!
//! # Security
//! Every connection starts with the job secret's challenge-response
//! ([`auth`](crate::bootstrap::auth), context `oxccl-store`): the server refuses a client
//! that does not know the secret, and the client refuses a server that cannot prove it
//! knows it. The server logs the first refusal to stderr (`oxccl store: refused <addr>:
//! <reason>`); since anyone who reaches the port can cause refusals, later ones are only
//! counted: one line at most every 10 s (`refused N more connections since ...`, with the
//! latest address and reason), and the count left unreported when the server stops. A connection
//! that does not finish the handshake within 10 s is dropped, so a silent client cannot hold
//! a thread. Only then are requests read, in frames with a bounded header whose every
//! length is checked against its limit before use: keys up to 4 KiB
//! ([`MAX_KEY_LEN`]), values up to 64 MiB ([`MAX_VALUE_LEN`]). A malformed frame gets an
//! error response where one can still be sent, and closes that connection only.
//!
//! # Design
//! - **One thread per connection.** Worlds are small (one connection per rank, a few more
//!   while threads of a rank overlap), a blocked thread costs little, and blocking code is
//!   simple to get right. An accept thread hands each connection its own thread.
//! - **Waiting happens in the server,** on one condition variable signalled whenever a key
//!   is set or changed: a `wait` is answered the moment its last key appears (no polling
//!   latency, no request storm from a thousand waiting ranks), and since it only blocks that
//!   connection's thread, other clients are served meanwhile. A timed-out wait is answered
//!   with the keys still missing, which the client's error names.
//! - **The client pools connections** behind one mutex: a request takes an idle connection
//!   or opens another, so a thread blocked in `wait` never holds up a `set` from another
//!   thread of the same process (which could otherwise deadlock a process whose threads
//!   rendezvous with each other). A connection whose request failed is closed, never reused.
//! - Counters written by [`add`](StoreClient::add) are stored as decimal text.
//! - [`StoreServer::shutdown`] (or drop) closes the listener and every connection and wakes
//!   every wait with an error, so clients fail fast instead of hanging.

mod client;
mod protocol;
mod server;

pub use client::StoreClient;
pub use protocol::{MAX_KEY_LEN, MAX_VALUE_LEN, MAX_WAIT_KEYS};
pub use server::StoreServer;

/// The authentication context of store connections.
pub(crate) const AUTH_CONTEXT: &[u8] = b"oxccl-store";

#[cfg(test)]
mod tests;
