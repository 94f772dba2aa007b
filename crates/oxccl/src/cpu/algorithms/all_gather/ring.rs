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
    let all: Vec<usize> = (0..ctx.size()).collect();
    run_blocks_in(ctx, &all, ctx.rank(), buf, blocks)
}

/// [`run_blocks`] among the communicator ranks `members` (in ring order; this rank is
/// `members[me]`), one block per member.
///
/// # Errors
/// Communication errors.
pub fn run_blocks_in(ctx: &Ctx, members: &[usize], me: usize, buf: &mut [u8], blocks: &[Range<usize>]) -> Result<()> {
    let n = members.len();
    let r = me;
    let next = members[(r + 1) % n];
    let prev = members[(r + n - 1) % n];
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
