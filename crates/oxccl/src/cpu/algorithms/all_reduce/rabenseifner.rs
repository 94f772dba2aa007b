//! Rabenseifner's all-reduce: a recursive-halving reduce-scatter followed by a
//! recursive-doubling all-gather among the `p` participants of the non-power-of-two fold
//! (see [`halving_doubling`](crate::cpu::algorithms::halving_doubling)), over the `n`
//! near-equal element blocks of the buffer.
//!
//! Rounds: `2 log2 p` (+2 when `n` is not a power of two). In the halving rounds participant
//! `v` exchanges half of its current window with `v ^ m` for `m = p/2, ..., 1`, in the
//! doubling rounds it swaps windows with `v ^ m` for `m = 1, ..., p/2`. Each participant
//! sends about `2 (p − 1)/p` of the buffer: ring-like bandwidth with logarithmic latency, a
//! good choice for medium and large messages.
//!
//! Every reduced element is computed at one participant and copied everywhere else, so all
//! ranks end with bitwise-identical results.

use crate::cpu::algorithms::halving_doubling::{all_gather, fold, offsets, reduce_scatter, unfold, Group};
use crate::cpu::algorithms::{Ctx, Kernel};
use crate::error::Result;

/// All-reduce `buf` in place.
///
/// # Errors
/// Communication errors.
pub fn run(ctx: &Ctx, buf: &mut [u8], k: &Kernel) -> Result<()> {
    let g = Group::new(ctx.size());
    if g.world() <= 1 {
        return Ok(());
    }
    let offs = offsets(buf.len() / k.elem(), g.world(), k.elem());
    if let Some(id) = fold(ctx, &g, buf, k)? {
        reduce_scatter(ctx, &g, id, buf, &offs, k)?;
        all_gather(ctx, &g, id, buf, &offs)?;
    }
    unfold(ctx, &g, buf, 0..buf.len())
}
