//! Shared machinery of the power-of-two algorithms (recursive doubling, recursive halving,
//! Rabenseifner), with the usual fix-up for world sizes that are not a power of two.
//!
//! With `n` ranks let `p` be the largest power of two `<= n` and `r = n - p`.
//!
//! * **Fold** (pre-step, one round): the first `2r` ranks pair up. Even rank `2i` sends its
//!   whole buffer to odd rank `2i + 1`, which combines it into its own, and then sits out.
//!   The `p` remaining *participants* get new ids: odd rank `2i + 1` becomes `i` (for
//!   `i < r`), rank `q >= 2r` becomes `q - r`. See [`Group`].
//! * **Recursive halving reduce-scatter** ([`reduce_scatter`], `log2 p` rounds): the buffer is
//!   cut into the original `n` element blocks; participant `v` owns the contiguous block
//!   range `[start(v), start(v + 1))` with `start(v) = 2v` for `v < r` and `v + r` otherwise,
//!   i.e. the blocks of the original ranks it represents. In the round with distance `m`
//!   (`p/2, p/4, ..., 1`) participant `v` exchanges with `v ^ m`: both hold the same window of
//!   `2m` participants' blocks; each sends the half its partner keeps and reduces the half it
//!   keeps. Afterwards `v` holds its own blocks fully reduced. Each participant sends and
//!   receives `(p - 1)/p` of the buffer.
//! * **Recursive doubling all-gather** ([`all_gather`], `log2 p` rounds): the reverse; in the
//!   round with distance `m` (`1, 2, ..., p/2`) `v` and `v ^ m` swap the windows of `m`
//!   participants they hold, doubling them, until everyone has the whole buffer.
//! * **Unfold** ([`unfold`], post-step, one round): each odd rank `2i + 1 < 2r` sends the
//!   result (or the part of it its partner needs) back to even rank `2i`, as a copy, so both
//!   hold bitwise the same values.
//!
//! Every reduced value is computed at exactly one place and only copied from there, so all
//! ranks end with bitwise-identical results whatever the element type.

use std::ops::Range;

use crate::cpu::algorithms::{block_bytes, split_pair, Ctx, Kernel, Scratch};
use crate::error::{Error, Result};

/// The power-of-two group of participants that a world of `n` ranks folds into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    n: usize,
    p: usize,
    rem: usize,
}

impl Group {
    /// The group of a world of `n` ranks.
    pub fn new(n: usize) -> Group {
        let p = n.checked_ilog2().map_or(0, |e| 1usize << e);
        Group { n, p, rem: n - p }
    }

    /// The number of ranks in the world.
    pub fn world(&self) -> usize {
        self.n
    }

    /// The number of participants: the largest power of two `<= n`.
    pub fn participants(&self) -> usize {
        self.p
    }

    /// The participant id of `rank`, or `None` when it sits out (an even rank `< 2r`).
    pub fn id(&self, rank: usize) -> Option<usize> {
        if rank < 2 * self.rem {
            (rank % 2 == 1).then_some(rank / 2)
        } else {
            Some(rank - self.rem)
        }
    }

    /// The original rank of participant `id`.
    pub fn rank(&self, id: usize) -> usize {
        if id < self.rem {
            2 * id + 1
        } else {
            id + self.rem
        }
    }

    /// The first original block owned by participant `id` (`start(p) = n`).
    pub fn start(&self, id: usize) -> usize {
        if id < self.rem {
            2 * id
        } else {
            id + self.rem
        }
    }

    /// The original blocks owned by participant `id`.
    #[cfg(test)]
    pub fn blocks(&self, id: usize) -> Range<usize> {
        self.start(id)..self.start(id + 1)
    }

    /// For a rank of a folded pair, the pair's even (sitting-out) rank; `None` for ranks
    /// `>= 2r`, which were not folded.
    pub fn dropped_of_pair(&self, rank: usize) -> Option<usize> {
        (rank < 2 * self.rem).then_some(rank & !1)
    }
}

/// The `n + 1` byte offsets of the `n` near-equal element blocks ([`block_bytes`]) of `count`
/// elements of `elem` bytes: block `i` is `offsets[i]..offsets[i + 1]`.
pub fn offsets(count: usize, n: usize, elem: usize) -> Vec<usize> {
    let mut out: Vec<usize> = (0..n).map(|i| block_bytes(count, n, i, elem).start).collect();
    out.push(count * elem);
    out
}

/// The `n + 1` byte offsets of `n` equal blocks of `block` bytes.
pub fn equal_offsets(n: usize, block: usize) -> Vec<usize> {
    (0..=n).map(|i| i * block).collect()
}

/// The byte range of participants `lo..hi`'s blocks, given the blocks' `offsets`.
fn region(g: &Group, offsets: &[usize], lo: usize, hi: usize) -> Result<Range<usize>> {
    let at = |id: usize| {
        offsets.get(g.start(id)).copied().ok_or_else(|| Error::invalid(format!("participant {id} has no block offset")))
    };
    let (a, b) = (at(lo)?, at(hi)?);
    if a <= b {
        Ok(a..b)
    } else {
        Err(Error::invalid(format!("block offsets out of order: {a} > {b}")))
    }
}

fn get(buf: &[u8], r: Range<usize>) -> Result<&[u8]> {
    let len = buf.len();
    buf.get(r.clone()).ok_or_else(|| Error::invalid(format!("bytes {r:?} out of range of {len}")))
}

fn get_mut(buf: &mut [u8], r: Range<usize>) -> Result<&mut [u8]> {
    let len = buf.len();
    buf.get_mut(r.clone()).ok_or_else(|| Error::invalid(format!("bytes {r:?} out of range of {len}")))
}

/// Fold (pre-step): even ranks `< 2r` send their whole `buf` to the next (odd) rank, which
/// combines it into its own. Returns this rank's participant id, or `None` when this rank
/// now sits out until [`unfold`].
///
/// # Errors
/// Communication errors.
pub fn fold(ctx: &Ctx, g: &Group, buf: &mut [u8], k: &Kernel) -> Result<Option<usize>> {
    let rank = ctx.rank();
    match (g.dropped_of_pair(rank), g.id(rank)) {
        (Some(_), None) => {
            ctx.send(rank + 1, buf)?;
            Ok(None)
        }
        (Some(even), Some(id)) => {
            let mut tmp = Scratch::new(buf.len());
            ctx.recv(even, tmp.bytes_mut())?;
            k.combine(buf, tmp.bytes())?;
            Ok(Some(id))
        }
        (None, id) => Ok(id),
    }
}

/// Unfold (post-step): each odd rank `< 2r` sends `buf[bytes]` to its even partner, which
/// receives it into the same range of its `buf`. Both ranks of a pair pass the same `bytes`;
/// other ranks do nothing.
///
/// # Errors
/// Communication errors; [`Error::InvalidArgument`] when `bytes` leaves `buf`.
pub fn unfold(ctx: &Ctx, g: &Group, buf: &mut [u8], bytes: Range<usize>) -> Result<()> {
    let rank = ctx.rank();
    match g.dropped_of_pair(rank) {
        Some(even) if even == rank => ctx.recv(rank + 1, get_mut(buf, bytes)?),
        Some(even) => ctx.send(even, get(buf, bytes)?),
        None => Ok(()),
    }
}

/// Recursive-halving reduce-scatter among the participants: `buf` holds the `n` original
/// blocks at `offsets` (`n + 1` ascending byte offsets); on return participant `id` holds the
/// reduction of its blocks ([`Group::blocks`]); other bytes hold partial results.
///
/// # Errors
/// Communication errors; [`Error::InvalidArgument`] for offsets that do not fit `buf`.
pub fn reduce_scatter(ctx: &Ctx, g: &Group, id: usize, buf: &mut [u8], offsets: &[usize], k: &Kernel) -> Result<()> {
    let mut tmp: Option<Scratch> = None;
    let mut m = g.participants() / 2;
    while m > 0 {
        let base = id & !(2 * m - 1);
        let lower = region(g, offsets, base, base + m)?;
        let upper = region(g, offsets, base + m, base + 2 * m)?;
        let (keep, give) = if id & m == 0 { (lower, upper) } else { (upper, lower) };
        // Windows nest, so the first round keeps the most bytes.
        let t = tmp.get_or_insert_with(|| Scratch::new(keep.len()));
        let incoming = get_mut(t.bytes_mut(), 0..keep.len())?;
        ctx.send_recv(g.rank(id ^ m), get(buf, give)?, g.rank(id ^ m), incoming)?;
        k.combine(get_mut(buf, keep)?, incoming)?;
        m /= 2;
    }
    Ok(())
}

/// Recursive-doubling all-gather among the participants: on entry participant `id` holds
/// its blocks ([`Group::blocks`]) of `buf` (at `offsets`, as in [`reduce_scatter`]); on
/// return every participant holds every block.
///
/// # Errors
/// Communication errors; [`Error::InvalidArgument`] for offsets that do not fit `buf`.
pub fn all_gather(ctx: &Ctx, g: &Group, id: usize, buf: &mut [u8], offsets: &[usize]) -> Result<()> {
    let mut m = 1;
    while m < g.participants() {
        let mine = id & !(m - 1);
        let theirs = mine ^ m;
        let send = region(g, offsets, mine, mine + m)?;
        let recv = region(g, offsets, theirs, theirs + m)?;
        let (out, inp) = split_pair(buf, send, recv)?;
        ctx.send_recv(g.rank(id ^ m), out, g.rank(id ^ m), inp)?;
        m *= 2;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_blocks_partition_the_world() {
        for n in 1..=20 {
            let g = Group::new(n);
            let p = g.participants();
            assert!(p.is_power_of_two() && p <= n && n < 2 * p);
            let mut ids: Vec<_> = (0..n).filter_map(|r| g.id(r)).collect();
            ids.sort_unstable();
            assert_eq!(ids, (0..p).collect::<Vec<_>>());
            for v in 0..p {
                assert_eq!(g.id(g.rank(v)), Some(v));
                assert!(g.blocks(v).contains(&g.rank(v)));
            }
            assert_eq!(g.start(0), 0);
            assert_eq!(g.start(p), n);
            for r in 0..n {
                let owner = (0..p).filter(|&v| g.blocks(v).contains(&r)).count();
                assert_eq!(owner, 1, "block {r} of {n}");
            }
        }
        let g = Group::new(0);
        assert_eq!(g.participants(), 0);
    }
}
