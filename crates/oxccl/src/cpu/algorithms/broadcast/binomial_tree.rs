//! Binomial-tree broadcast: in round k the ranks that already have the data (relative to the
//! root) send it 2^k ranks further, so all n ranks have it after ⌈log2 n⌉ rounds.

use crate::cpu::algorithms::Ctx;
use crate::error::Result;

/// Broadcasts `buf` from `root` in place.
///
/// # Errors
/// Communication errors.
pub fn run(ctx: &Ctx, buf: &mut [u8], root: usize) -> Result<()> {
    let n = ctx.size();
    let vr = (ctx.rank() + n - root) % n;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            ctx.recv((vr - mask + root) % n, buf)?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            ctx.send((vr + mask + root) % n, buf)?;
        }
        mask >>= 1;
    }
    Ok(())
}
