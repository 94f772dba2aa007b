//! Ring reduce-scatter: n−1 steps; in step s rank r sends its partial block r−1−s to r+1 and
//! receives the partial block r−2−s from r−1, reducing it into its own copy. After the last
//! step rank r holds block r fully reduced. Bandwidth-optimal for large messages.

use std::ops::Range;

use crate::cpu::algorithms::{split_pair, Ctx, Kernel, Scratch};
use crate::error::Result;

/// Reduce-scatter in place over byte `blocks` of `buf` (in rank order); on return block
/// `rank` of `buf` holds the reduction, the other blocks hold partial results.
///
/// # Errors
/// Communication errors.
pub fn run_blocks(ctx: &Ctx, buf: &mut [u8], blocks: &[Range<usize>], k: &Kernel) -> Result<()> {
    let all: Vec<usize> = (0..ctx.size()).collect();
    run_blocks_in(ctx, &all, ctx.rank(), buf, blocks, k)
}

/// [`run_blocks`] among the communicator ranks `members` (in ring order; this rank is
/// `members[me]`), one block per member: block `me` ends reduced over the members.
///
/// # Errors
/// Communication errors.
pub fn run_blocks_in(
    ctx: &Ctx,
    members: &[usize],
    me: usize,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    k: &Kernel,
) -> Result<()> {
    let n = members.len();
    let r = me;
    if n == 1 {
        return Ok(());
    }
    let next = members[(r + 1) % n];
    let prev = members[(r + n - 1) % n];
    let max = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    let mut tmp = Scratch::new(ctx.scratch_len(prev, max));
    for s in 0..n - 1 {
        let send_i = (r + 2 * n - 1 - s) % n;
        let recv_i = (r + 2 * n - 2 - s) % n;
        let (out, acc) = split_pair(buf, blocks[send_i].clone(), blocks[recv_i].clone())?;
        ctx.send_recv_reduce(next, out, prev, acc, k, tmp.bytes_mut())?;
    }
    Ok(())
}

/// Reduce-scatter in place of `n` equal blocks: block `rank` of `buf` ends reduced.
///
/// # Errors
/// Communication errors.
pub fn run(ctx: &Ctx, buf: &mut [u8], k: &Kernel) -> Result<()> {
    let n = ctx.size();
    let block = buf.len() / n;
    let blocks: Vec<_> = (0..n).map(|i| i * block..(i + 1) * block).collect();
    run_blocks(ctx, buf, &blocks, k)
}
