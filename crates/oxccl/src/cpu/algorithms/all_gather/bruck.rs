//! Bruck's all-gather (Bruck, Ho, Kipnis, Upfal, Weathersby, 1997): `⌈log2 n⌉` rounds for any
//! world size `n`.
//!
//! Rank `r` works in a rotated scratch buffer whose slot `j` holds the block of rank
//! `(r + j) mod n`; it starts with its own block in slot 0. In round `k` (distance `d = 2^k`)
//! it holds slots `0..d`; it sends the first `min(d, n − d)` of them to rank `r − d` and
//! receives as many from rank `r + d` (whose slots `0..` are this rank's slots `d..`), so it
//! then holds `min(2d, n)` slots. Finally the slots are copied back into rank order.
//!
//! Cost: `⌈log2 n⌉` rounds, `(n − 1)` blocks sent and received per rank (as the ring), plus
//! one local rotation. The choice for small blocks, where latency dominates.

use crate::cpu::algorithms::{split_pair, Ctx, Scratch};
use crate::error::{Error, Result};

/// All-gather in place of `n` equal blocks of `block` bytes: `buf` (`n * block` bytes) holds
/// this rank's block at block `rank` on entry and every rank's block on return.
///
/// # Errors
/// Communication errors; [`Error::InvalidArgument`] when `buf` is not `n * block` bytes.
pub fn run(ctx: &Ctx, buf: &mut [u8], block: usize) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank();
    if n.checked_mul(block) != Some(buf.len()) || r >= n {
        return Err(Error::invalid(format!("bruck all_gather: {} bytes are not {n} blocks of {block}", buf.len())));
    }
    if n == 1 {
        return Ok(());
    }
    // From here on every block index is < n and buf.len() == n * block, so the ranges below
    // are in bounds.
    let mut rot = Scratch::new(buf.len());
    rot.bytes_mut()[..block].copy_from_slice(&buf[r * block..(r + 1) * block]);
    let mut have = 1;
    while have < n {
        let cnt = have.min(n - have);
        let to = (r + n - have) % n;
        let from = (r + have) % n;
        let (out, inp) = split_pair(rot.bytes_mut(), 0..cnt * block, have * block..(have + cnt) * block)?;
        ctx.send_recv(to, out, from, inp)?;
        have += cnt;
    }
    for j in 1..n {
        let dst = (r + j) % n;
        buf[dst * block..(dst + 1) * block].copy_from_slice(&rot.bytes()[j * block..(j + 1) * block]);
    }
    Ok(())
}
