//! Hierarchical all-reduce, for communicators spanning hosts with `m ≥ 2` ranks on each of
//! `h ≥ 2` hosts: a ring reduce-scatter inside each host (shared memory) leaves each rank a
//! `1/m` block reduced over its host; the ranks at the same position on every host
//! all-reduce that block between the hosts (a ring over TCP, `m` of them side by side);
//! a ring all-gather inside each host spreads the blocks back.
//!
//! Inside a host whose ranks set up shared-memory collectives of their own (the engine does
//! where shared memory is allowed), the two host phases run on them instead of rings over
//! the shared-memory transport: each is one pass through the host's slots
//! (`ShmCollectives::reduce_scatter_blocks` and `all_gather_blocks`, in
//! `shared_memory/blocks.rs`), with
//! one synchronization per chunk and no frames. Both cut the same blocks, so a host that
//! could not set them up (no room in /dev/shm) runs the rings with the same result.
//!
//! Cost: `2(m−1)(α_s + S/m·β_s) + (m−1)/m·Sγ` inside the hosts (rings), plus
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

use crate::cpu::algorithms::hosts::HostGroups;
use crate::cpu::algorithms::{all_gather, block_bytes, reduce_scatter, Ctx, Kernel};
use crate::error::{Error, Result};
use crate::reduce_op::ReduceOp;

/// All-reduce `buf` in place.
///
/// # Errors
/// [`Error::Internal`] when the communicator is not laid out for it (see
/// [`hosts::groups`](crate::cpu::algorithms::hosts::groups): the engine refuses such a
/// call before it starts); communication errors.
pub fn run(ctx: &Ctx, buf: &mut [u8], k: &Kernel) -> Result<()> {
    run_from(ctx, None, buf, k)
}

/// All-reduce into `buf`, from `input` when given (as long as `buf`: out of place), else
/// from `buf`. Where the host's shared-memory collectives run the first phase, it reads
/// `input` directly; otherwise `input` is copied into `buf` first.
///
/// # Errors
/// As [`run`]; [`Error::Internal`] when `input` is not as long as `buf`.
pub fn run_from(ctx: &Ctx, input: Option<&[u8]>, buf: &mut [u8], k: &Kernel) -> Result<()> {
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
    let on_host: Vec<usize> = g.local.iter().map(|&r| ctx.ranks[r]).collect();
    match ctx.host_native {
        Some(shm) => {
            // Avg divides once, at the end of the whole all_reduce; its phases add up.
            let op = if k.op == ReduceOp::Avg { ReduceOp::Sum } else { k.op };
            let host = host_ctx(ctx, g, &on_host);
            shm.reduce_scatter_blocks(&host, input, buf, &blocks, k.dtype, op).map_err(|e| lift(e, g))?
        }
        None => {
            if let Some(input) = input {
                if input.len() != buf.len() {
                    return Err(Error::Internal(format!("an input of {} bytes for {}", input.len(), buf.len())));
                }
                buf.copy_from_slice(input);
            }
            reduce_scatter::ring::run_blocks_in(ctx, &g.local, g.local_index, buf, &blocks, k)?
        }
    }
    // This rank's block, all-reduced with the same block of the other hosts.
    let mine = blocks[g.local_index].clone();
    let h = g.cross.len();
    let sub: Vec<_> = (0..h).map(|i| block_bytes(mine.len() / e, h, i, e)).collect();
    let block = &mut buf[mine];
    reduce_scatter::ring::run_blocks_in(ctx, &g.cross, g.cross_index, block, &sub, k)?;
    all_gather::ring::run_blocks_in(ctx, &g.cross, g.cross_index, block, &sub)?;
    match ctx.host_native {
        Some(shm) => shm.all_gather_blocks(&host_ctx(ctx, g, &on_host), buf, &blocks).map_err(|e| lift(e, g)),
        None => all_gather::ring::run_blocks_in(ctx, &g.local, g.local_index, buf, &blocks),
    }
}

/// The context of the phases inside this rank's host, run by its shared-memory
/// collectives: the host's ranks alone (`on_host`: their transport ranks, in the order of
/// `g.local`), the operation's fingerprint and deadline. Its waits are not charged to peers
/// for the profiler (it numbers the ranks of the host, not of the communicator).
fn host_ctx<'a>(ctx: &Ctx<'a>, g: &HostGroups, on_host: &'a [usize]) -> Ctx<'a> {
    Ctx {
        transport: ctx.transport,
        comm_id: ctx.comm_id,
        ranks: on_host,
        rank: g.local_index,
        fp: ctx.fp,
        clock: ctx.clock.fork(),
        tally: None,
        waits: None,
        hosts: None,
        host_native: None,
    }
}

/// An error of a host context, with the peer it names renumbered from the host's ranks to
/// the communicator's.
fn lift(e: Error, g: &HostGroups) -> Error {
    let up = |p: usize| g.local.get(p).copied().unwrap_or(p);
    match e {
        Error::Mismatch { peer, ours, theirs } => Error::Mismatch { peer: up(peer), ours, theirs },
        Error::Timeout { op, seq, peer, waited } => Error::Timeout { op, seq, peer: peer.map(up), waited },
        Error::PeerLost { rank, detail } => Error::PeerLost { rank: up(rank), detail },
        e => e,
    }
}
