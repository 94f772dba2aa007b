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
//! a descriptor. Only then are requests read, in frames with a bounded header whose every
//! length is checked against its limit before use: keys up to 4 KiB
//! ([`MAX_KEY_LEN`]), values up to 64 MiB ([`MAX_VALUE_LEN`]); a frame's buffer grows as its
//! bytes arrive, so a length field alone allocates nothing. A malformed frame gets an error
//! response where one can still be sent, and closes that connection only.
//!
//! # Design
//! - **One thread, an event loop.** A job of thousands of ranks holds thousands of
//!   connections during init, so the server runs one thread (`oxccl-store`) that waits on
//!   epoll (level-triggered) for the listener, every connection and an eventfd that
//!   [`shutdown`](StoreServer::shutdown) writes. Sockets are non-blocking. The protocol is
//!   written without I/O: each connection is a state machine (`conn.rs`: handshake with
//!   [`auth::Challenge`](crate::bootstrap::auth::Challenge), frames in, responses out), the
//!   data and the parked waits are a plain struct (`map.rs`); `server.rs` moves bytes between
//!   them and the sockets and keeps the timers. The listen backlog is widened to the
//!   kernel's maximum (`net.core.somaxconn`) so that a thousand ranks connecting at once are
//!   queued rather than dropped.
//! - **Descriptors.** The server holds one descriptor per connected client, so
//!   [`bind`](StoreServer::bind) raises the process's soft `RLIMIT_NOFILE` to its hard limit
//!   (as Go's runtime does; logged at debug level). When accept still fails for want of
//!   descriptors (EMFILE, ENFILE) or memory, the server says so (at most one line per 10 s)
//!   and stops accepting for 100 ms instead of spinning; the connections wait in the queue.
//!   Ranks call [`StoreClient::close_idle`] after init so that the server does not keep a
//!   descriptor per idle rank.
//! - **Waiting happens in the server.** A `wait` whose keys are not all present is parked:
//!   it counts its missing keys and is indexed under each, so a set answers it the moment
//!   its last key appears (no polling latency, no request storm from a thousand waiting
//!   ranks), without scanning the other waits. Deadlines sit in a heap; a timed-out wait is
//!   answered with the keys still missing, which the client's error names. A connection's
//!   requests run one at a time, in order: none while its wait is parked.
//! - **A slow reader cannot block the loop.** Responses are queued per connection and sent
//!   as the socket accepts them (EPOLLOUT). Past 1 MiB of unsent output a connection's
//!   further requests are not carried out (nor more of its input read) until the client
//!   takes some, so its queue holds at most 1 MiB plus one response (a value of at most
//!   64 MiB); a connection whose output makes no progress for 60 s is closed. Input is read
//!   at most 1 MiB per turn per connection, so one busy client does not starve the others.
//! - **The client pools connections** behind one mutex: a request takes an idle connection
//!   or opens another, so a thread blocked in `wait` never holds up a `set` from another
//!   thread of the same process (which could otherwise deadlock a process whose threads
//!   rendezvous with each other). A connection whose request failed is closed, never reused.
//! - Counters written by [`add`](StoreClient::add) are stored as decimal text.
//! - [`StoreServer::shutdown`] (or drop) answers every parked wait with an error, closes the
//!   listener and every connection, and waits for the thread, so clients fail fast instead
//!   of hanging.

mod client;
mod conn;
mod map;
mod poll;
mod protocol;
mod refusals;
mod server;

pub use client::StoreClient;
pub use protocol::{MAX_KEY_LEN, MAX_VALUE_LEN, MAX_WAIT_KEYS};
pub use server::StoreServer;

/// The authentication context of store connections.
pub(crate) const AUTH_CONTEXT: &[u8] = b"oxccl-store";

#[cfg(test)]
mod tests;
