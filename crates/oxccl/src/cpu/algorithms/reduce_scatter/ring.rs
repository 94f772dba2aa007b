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

/// [`run_blocks`] out of place: `input`'s blocks are this rank's contributions and `buf`
/// (as long) receives the results, with no copy of `input` into `buf` first: the first
/// step sends from `input`, and every block received is combined with `input`'s into
/// `buf`. On return block `rank` of `buf` holds the reduction, the others partial results,
/// except block `rank − 1`, which this rank never combines: it is left as it was.
///
/// # Errors
/// Communication errors; [`Error::InvalidArgument`](crate::Error::InvalidArgument) when
/// `input` and `buf` differ in length.
pub fn run_blocks_from(ctx: &Ctx, input: &[u8], buf: &mut [u8], blocks: &[Range<usize>], k: &Kernel) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank();
    if input.len() != buf.len() {
        return Err(crate::error::Error::invalid(format!(
            "an input of {} bytes for {} bytes of results",
            input.len(),
            buf.len()
        )));
    }
    if n == 1 {
        buf.copy_from_slice(input);
        return Ok(());
    }
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let max = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    let mut tmp = Scratch::new(ctx.scratch_len(prev, max));
    for s in 0..n - 1 {
        let send_i = (r + 2 * n - 1 - s) % n;
        let recv_i = (r + 2 * n - 2 - s) % n;
        let base = &input[blocks[recv_i].clone()];
        if s == 0 {
            let acc = &mut buf[blocks[recv_i].clone()];
            ctx.send_recv_reduce_from(next, &input[blocks[send_i].clone()], prev, base, acc, k, tmp.bytes_mut())?;
        } else {
            // The block sent was combined into `buf` at the step before.
            let (out, acc) = split_pair(buf, blocks[send_i].clone(), blocks[recv_i].clone())?;
            ctx.send_recv_reduce_from(next, out, prev, base, acc, k, tmp.bytes_mut())?;
        }
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
