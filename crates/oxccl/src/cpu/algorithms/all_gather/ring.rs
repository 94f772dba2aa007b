//! Ring all-gather: n−1 steps; in step s rank r passes block r−s to r+1 and receives block
//! r−s−1 from r−1. Bandwidth-optimal: every rank sends and receives (n−1)/n of the result.
//! Blocks may differ in size, which makes this the all_gather_v algorithm too.

use std::ops::Range;

use crate::cpu::algorithms::{split_pair, Ctx};
use crate::error::Result;

/// All-gather in place: `buf` holds every block at `blocks[i]` (byte ranges, in rank order);
/// this rank's block is filled on entry, all blocks are on return.
///
/// # Errors
/// Communication errors.
pub fn run_blocks(ctx: &Ctx, buf: &mut [u8], blocks: &[Range<usize>]) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank();
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    for s in 0..n.saturating_sub(1) {
        let send_i = (r + n - s) % n;
        let recv_i = (r + 2 * n - s - 1) % n;
        let (out, inp) = split_pair(buf, blocks[send_i].clone(), blocks[recv_i].clone())?;
        ctx.send_recv(next, out, prev, inp)?;
    }
    Ok(())
}

/// All-gather in place of `n` equal blocks of `block` bytes.
///
/// # Errors
/// Communication errors.
pub fn run(ctx: &Ctx, buf: &mut [u8], block: usize) -> Result<()> {
    let blocks: Vec<_> = (0..ctx.size()).map(|i| i * block..(i + 1) * block).collect();
    run_blocks(ctx, buf, &blocks)
}
