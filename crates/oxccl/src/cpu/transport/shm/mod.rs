//! The shared-memory transport: ranks on one host exchange frames through lock-free rings
//! in a mapped segment. (The collectives that run directly in shared memory are an
//! algorithm family: `cpu/algorithms/shared_memory.rs`, built on `segment`, `futex` and
//! `copy` from here.)
//!
//! - [`segment`]: /dev/shm files: create, open, unlink-after-attach, size checks.
//! - [`wait`]: the wait policy (spin, yield, sleep) and the oversubscription detection that
//!   chooses it.
//! - [`futex`]: waits on words in shared memory, in the phases of the policy.
//! - [`ring`]: the single-producer single-consumer byte ring.
//! - [`links`]: the [`Link`](super::routed::Link) between the ranks of a host; its receive
//!   side, the incoming rings read into the mailbox or a waiting caller's buffer, is
//!   `inbox`.
//! - [`single_copy`]: reads straight from another process's memory (cross-memory attach),
//!   for the collectives' large moves.
//! - [`copy`]: the collectives' copies (cache-bypassing for large results, and a way
//!   around a slow `memcpy` case).

pub mod copy;
pub mod futex;
mod inbox;
pub mod links;
pub mod ring;
pub mod segment;
pub mod single_copy;
pub mod wait;
