//! The shared-memory transport: ranks on one host exchange frames through lock-free rings
//! in a mapped segment, and the hot collectives run directly in shared memory.
//!
//! - [`segment`]: /dev/shm files: create, open, unlink-after-attach, size checks.
//! - [`futex`]: spin-then-sleep waits on words in shared memory.
//! - [`ring`]: the single-producer single-consumer byte ring.
//! - [`links`]: the [`Link`](super::routed::Link) between the ranks of a host.
//! - [`collectives`]: all_reduce, broadcast, all_gather and barrier run in the segment.
//! - [`copy`]: the collectives' copies (cache-bypassing for large results, and a way
//!   around a slow `memcpy` case).

pub mod collectives;
pub mod copy;
pub mod futex;
pub mod links;
pub mod ring;
pub mod segment;
