//! Bootstrap: who the ranks are and how they find each other.
//!
//! - [`auth`]: the job secret and the handshake every connection starts with.

pub mod auth;
