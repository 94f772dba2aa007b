//! Binomial-tree reduce: the mirror of the binomial broadcast. In round k every rank whose
//! relative rank has bit k set sends its partial result to the rank 2^k below and drops out;
//! the root holds the reduction after ⌈log2 n⌉ rounds.

use crate::cpu::algorithms::{Ctx, Kernel, Scratch};
use crate::error::Result;

/// Reduces every rank's `buf` to `root`. `buf` is the input on every rank and is overwritten
/// with partial results on inner ranks of the tree (callers pass a copy where the user's
/// buffer must stay intact); at the root it ends with the reduction.
///
/// # Errors
/// Communication errors.
pub fn run(ctx: &Ctx, buf: &mut [u8], k: &Kernel, root: usize) -> Result<()> {
    let n = ctx.size();
    let vr = (ctx.rank() + n - root) % n;
    let mut tmp: Option<Scratch> = None;
    let mut mask = 1;
    while mask < n {
        if vr & mask == 0 {
            let child = vr | mask;
            if child < n {
                let t = tmp.get_or_insert_with(|| Scratch::new(buf.len()));
                ctx.recv((child + root) % n, t.bytes_mut())?;
                k.combine(buf, t.bytes())?;
            }
        } else {
            ctx.send(((vr & !mask) + root) % n, buf)?;
            break;
        }
        mask <<= 1;
    }
    Ok(())
}
