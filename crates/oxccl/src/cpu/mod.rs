//! The CPU backends: our own algorithms over our own transports.
//!
//! - [`transport`]: how bytes move (in-memory today; shared memory and TCP plug in here).
//! - [`algorithms`]: what moves when (ring, trees, recursive doubling, ...), one file each.
//! - [`reduce`]: the element-wise reduction kernels.
//! - [`selector`]: which algorithm runs a given call.
//! - [`dispatch`]: from a type-erased operation to algorithm calls.
//! - [`engine`]: ordered execution, async work, poisoning, split.

pub mod algorithms;
pub mod dispatch;
pub mod engine;
pub mod point_to_point;
pub mod reduce;
pub mod selector;
pub mod transport;
