//! Recursive-halving reduce-scatter: the non-power-of-two fold, a recursive-halving
//! reduce-scatter among the `p` participants (see
//! [`halving_doubling`](crate::cpu::algorithms::halving_doubling)), then each participant
//! that represents a folded even rank sends it its reduced block.
//!
//! Rounds: `log2 p` (+2 when `n` is not a power of two). In the round with distance `m`
//! (`p/2, ..., 1`) participant `v` sends the half of its current window that `v ^ m` keeps and
//! reduces the half it keeps with the partner's copy. Each participant sends about
//! `(p − 1)/p` of the buffer in `log2 p` steps, against `n − 1` steps for the ring; the fold
//! adds one whole buffer for the folded pairs.

use crate::cpu::algorithms::halving_doubling::{equal_offsets, fold, reduce_scatter, unfold, Group};
use crate::cpu::algorithms::{Ctx, Kernel};
use crate::error::Result;

/// Reduce-scatter in place of `n` equal blocks: block `rank` of `buf` ends reduced; the other
/// blocks hold partial results.
///
/// # Errors
/// Communication errors.
pub fn run(ctx: &Ctx, buf: &mut [u8], k: &Kernel) -> Result<()> {
    let g = Group::new(ctx.size());
    if g.world() <= 1 {
        return Ok(());
    }
    let block = buf.len() / g.world();
    if let Some(id) = fold(ctx, &g, buf, k)? {
        reduce_scatter(ctx, &g, id, buf, &equal_offsets(g.world(), block), k)?;
    }
    match g.dropped_of_pair(ctx.rank()) {
        Some(even) => unfold(ctx, &g, buf, even * block..(even + 1) * block),
        None => Ok(()),
    }
}
