//! The shared-memory transport: ranks on one host exchange frames through lock-free rings
//! in a mapped segment, and the hot collectives run directly in shared memory.
//!
//! - [`segment`]: /dev/shm files: create, open, unlink-after-attach, size checks.
//! - [`futex`]: spin-then-sleep waits on words in shared memory.
//! - [`ring`]: the single-producer single-consumer byte ring.
//! - [`links`]: the [`Link`](super::routed::Link) between the ranks of a host.
//! - [`collectives`]: all_reduce, broadcast, all_gather and barrier run in the segment.
//! - [`stream`]: cache-bypassing copies for large results.

pub mod collectives;
pub mod futex;
pub mod links;
pub mod ring;
pub mod segment;
pub mod stream;
