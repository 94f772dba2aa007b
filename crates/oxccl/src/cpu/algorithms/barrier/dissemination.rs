//! Dissemination barrier (Hensgen, Finkel, Manber): in round k rank r signals r+2^k and waits
//! for r−2^k. After ⌈log2 n⌉ rounds every rank has heard, transitively, from every other,
//! for any n (no power-of-two restriction, no root).

use crate::cpu::algorithms::Ctx;
use crate::error::Result;

/// Waits until every rank has entered.
///
/// # Errors
/// Communication errors.
pub fn run(ctx: &Ctx) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank();
    let mut dist = 1;
    while dist < n {
        ctx.send_recv((r + dist) % n, &[], (r + n - dist) % n, &mut [])?;
        dist <<= 1;
    }
    Ok(())
}
