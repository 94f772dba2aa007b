//! Ring all-reduce: a ring reduce-scatter followed by a ring all-gather over n near-equal
//! blocks. Each rank sends and receives 2(n−1)/n of the buffer: the bandwidth-optimal choice
//! for large messages, at the price of 2(n−1) latency steps.

use crate::cpu::algorithms::{all_gather, block_bytes, reduce_scatter, Ctx, Kernel};
use crate::error::Result;

/// All-reduce `buf` in place.
///
/// # Errors
/// Communication errors.
pub fn run(ctx: &Ctx, buf: &mut [u8], k: &Kernel) -> Result<()> {
    let n = ctx.size();
    if n == 1 {
        return Ok(());
    }
    let count = buf.len() / k.elem();
    let blocks: Vec<_> = (0..n).map(|i| block_bytes(count, n, i, k.elem())).collect();
    reduce_scatter::ring::run_blocks(ctx, buf, &blocks, k)?;
    all_gather::ring::run_blocks(ctx, buf, &blocks)
}

/// All-reduce `input` into `buf` (as long), out of place: the reduce-scatter reads `input`
/// where the in-place form would read a copy of it, so the copy is saved.
///
/// # Errors
/// Communication errors; [`Error::InvalidArgument`](crate::Error::InvalidArgument) when
/// `input` and `buf` differ in length.
pub fn run_from(ctx: &Ctx, input: &[u8], buf: &mut [u8], k: &Kernel) -> Result<()> {
    let n = ctx.size();
    let count = buf.len() / k.elem();
    let blocks: Vec<_> = (0..n).map(|i| block_bytes(count, n, i, k.elem())).collect();
    reduce_scatter::ring::run_blocks_from(ctx, input, buf, &blocks, k)?;
    if n == 1 {
        return Ok(());
    }
    all_gather::ring::run_blocks(ctx, buf, &blocks)
}
