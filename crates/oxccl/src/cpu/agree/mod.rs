//! Fault-tolerant agreement among the survivors of a communicator (ULFM's
//! `MPIX_Comm_agree`): the AND of their flags and the set of ranks found dead, the same on
//! every survivor even when ranks die during the call; and the membership of a shrunk
//! communicator, built on it.
//!
//! - `protocol.rs`: the protocol as a state machine without I/O (coordinator with failover,
//!   proposals adopted across rounds so that decisions are uniform), and its cost.
//! - `wire.rs`: its messages as bytes, checked when read.
//! - `service.rs`: the protocol over a transport, one thread per communicator that also
//!   answers for agreements this rank already left.
//! - `shrink.rs`: agreeing until every survivor's dead ranks are in the decision.
//! - `tests.rs`: the protocol in a simulator that reorders messages and kills ranks.

pub(crate) mod protocol;
pub(crate) mod service;
pub(crate) mod shrink;
pub(crate) mod wire;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod world_tests;
