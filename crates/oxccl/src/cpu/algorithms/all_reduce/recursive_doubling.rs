//! Recursive-doubling all-reduce: after the non-power-of-two fold (see
//! [`halving_doubling`](crate::cpu::algorithms::halving_doubling)), the `p` participants run
//! `log2 p` rounds; in the round with distance `m` (`1, 2, ..., p/2`) participant `v` swaps
//! its whole buffer with `v ^ m` and both combine the two. Then the folded even ranks get the
//! result back.
//!
//! Cost: `log2 p` (+2 when `n` is not a power of two) rounds of one whole-buffer message
//! each: the fewest latency steps, but `log2 p` times the data of a ring, so it is the
//! choice for small messages.
//!
//! Both ranks of a pair compute the same combination: each round combines the lower id's
//! buffer with the higher id's, in that order, on both sides, so every rank ends with
//! bitwise-identical results even where the combine is not bitwise commutative
//! (NaN payloads, the sign of zero in min/max).

use crate::cpu::algorithms::halving_doubling::{fold, unfold, Group};
use crate::cpu::algorithms::{Ctx, Kernel, Scratch};
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
    if let Some(id) = fold(ctx, &g, buf, k)? {
        let mut tmp = Scratch::new(buf.len());
        let mut m = 1;
        while m < g.participants() {
            let peer = g.rank(id ^ m);
            let theirs = tmp.bytes_mut();
            ctx.send_recv(peer, buf, peer, theirs)?;
            if id & m == 0 {
                // Ours is the lower id: ours (op) theirs.
                k.combine(buf, theirs)?;
            } else {
                // Theirs is the lower id: theirs (op) ours, as the partner computes it.
                k.combine(theirs, buf)?;
                buf.copy_from_slice(theirs);
            }
            m *= 2;
        }
    }
    unfold(ctx, &g, buf, 0..buf.len())
}
