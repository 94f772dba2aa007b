//! Binomial-tree all-reduce: a binomial-tree reduce to rank 0 followed by a binomial-tree
//! broadcast from rank 0.
//!
//! Rounds: `2 ⌈log2 n⌉`, each moving the whole buffer; rank 0 receives up to `⌈log2 n⌉`
//! buffers and sends as many. Fewer messages than a ring for small buffers on any world
//! size, but the root's links carry `log2 n` times the data, so it does not scale with size.
//! The result is computed once, at rank 0, and copied to everyone: bitwise identical on all
//! ranks.

use crate::cpu::algorithms::{broadcast, reduce, Ctx, Kernel};
use crate::error::Result;

/// All-reduce `buf` in place. (The reduce leaves partial results in `buf` on inner ranks of
/// the tree; the broadcast then overwrites them with the result.)
///
/// # Errors
/// Communication errors.
pub fn run(ctx: &Ctx, buf: &mut [u8], k: &Kernel) -> Result<()> {
    if ctx.size() <= 1 {
        return Ok(());
    }
    reduce::binomial_tree::run(ctx, buf, k, 0)?;
    broadcast::binomial_tree::run(ctx, buf, 0)
}
