//! The CPU backends, `cpu` and `local`: our own algorithms over our own transports.
//!
//! - [`setup`]: the `cpu` backend's process and world setup (store, host detection, links).
//! - [`local`]: the `local` backend (ranks as threads, in-memory transport).
//! - [`factory`]: how `init` finds both.
//! - [`transport`]: how bytes move (in-memory, shared memory, TCP).
//! - [`algorithms`]: what moves when (ring, trees, recursive doubling, ...), one file each.
//! - [`selector`]: which algorithm runs a given call.
//! - [`dispatch`]: from a type-erased operation to algorithm calls.
//! - [`engine`]: ordered execution, async work, poisoning, split.
//! - `executor`: one operation at a time, in order (blocking calls inline, async ones on a worker).
//! - `agree`: fault-tolerant agreement and the membership of a shrunk communicator.
//! - `grow`: newcomers joining a communicator's members through the store.
//! - `staged`: device buffers of large all_reduce and broadcast, pipelined through host memory.

pub(crate) mod addresses;
pub(crate) mod agree;
pub mod algorithms;
pub mod dispatch;
pub mod engine;
mod executor;
pub mod factory;
pub(crate) mod grow;
pub(crate) mod host_table;
pub mod local;
pub mod point_to_point;
pub mod selector;
pub mod setup;
pub mod transport;

/// The SplitMix64 increment (2^64 / golden ratio).
pub(crate) const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 output function: a bijective mix of 64 bits.
pub(crate) const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One SplitMix64 step from state `x` (deterministic pseudo-random values for tests).
#[cfg(test)]
pub(crate) const fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GOLDEN))
}
