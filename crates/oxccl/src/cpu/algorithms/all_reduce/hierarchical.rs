//! Hierarchical all-reduce, for communicators spanning hosts with `m ≥ 2` ranks on each of
//! `h ≥ 2` hosts: a ring reduce-scatter inside each host (shared memory) leaves each rank a
//! `1/m` block reduced over its host; the ranks at the same position on every host
//! all-reduce that block between the hosts (a ring over TCP, `m` of them side by side);
//! a ring all-gather inside each host spreads the blocks back.
//!
//! Cost: `2(m−1)(α_s + S/m·β_s) + (m−1)/m·Sγ` inside the hosts, plus
//! `2(h−1)(α_t + S/(mh)·β_t) + (h−1)/(mh)·Sγ` between them. Each host sends
//! `2(h−1)/h·S` over its links in all, spread over `m` connections, where a flat ring
//! crossing the hosts sends `2(n−1)/n·S` through each one of its crossing links: the
//! traffic between hosts shrinks `m`-fold per connection.
//!
//! It opens with an empty message to both neighbours in the whole communicator's ring, and
//! one from each (one more latency step): a rank that runs another operation at this point
//! (a mismatch) nearly always waits first on a neighbour (rings, Bruck, recursive doubling,
//! a tree's odd ranks), so it meets this one's fingerprint, fails with `Mismatch` and tells
//! the others, instead of every rank waiting for its deadline on groups the other operation
//! never talks to.

use crate::cpu::algorithms::{all_gather, block_bytes, reduce_scatter, Ctx, Kernel};
use crate::error::{Error, Result};

/// All-reduce `buf` in place.
///
/// # Errors
/// [`Error::Internal`] when the communicator is not laid out for it (see
/// [`hosts::groups`](crate::cpu::algorithms::hosts::groups): the engine refuses such a
/// call before it starts); communication errors.
pub fn run(ctx: &Ctx, buf: &mut [u8], k: &Kernel) -> Result<()> {
    let g = ctx.hosts.ok_or_else(|| Error::Internal("hierarchical all_reduce without host groups".into()))?;
    let (r, n) = (ctx.rank(), ctx.size());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    ctx.send(next, &[])?;
    ctx.send(prev, &[])?;
    ctx.recv(prev, &mut [])?;
    ctx.recv(next, &mut [])?;
    let (m, e) = (g.local.len(), k.elem());
    let count = buf.len() / e;
    let blocks: Vec<_> = (0..m).map(|i| block_bytes(count, m, i, e)).collect();
    reduce_scatter::ring::run_blocks_in(ctx, &g.local, g.local_index, buf, &blocks, k)?;
    // This rank's block, all-reduced with the same block of the other hosts.
    let mine = blocks[g.local_index].clone();
    let h = g.cross.len();
    let sub: Vec<_> = (0..h).map(|i| block_bytes(mine.len() / e, h, i, e)).collect();
    let block = &mut buf[mine];
    reduce_scatter::ring::run_blocks_in(ctx, &g.cross, g.cross_index, block, &sub, k)?;
    all_gather::ring::run_blocks_in(ctx, &g.cross, g.cross_index, block, &sub)?;
    all_gather::ring::run_blocks_in(ctx, &g.local, g.local_index, buf, &blocks)
}
