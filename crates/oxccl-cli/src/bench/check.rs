//! Correctness check (`-c 1`): deterministic inputs and the results every rank expects.
//!
//! Every input element is a small whole number computed from (rank, index), chosen per
//! reduce op so that the exact result is representable in every dtype (bf16 included) and
//! does not depend on the order in which ranks are combined:
//! - `sum`: values 0‥6 (partial sums stay exact in the f32 accumulator of f16/bf16);
//! - `prod`: mostly 1 with a few 2s (products are powers of two);
//! - `min`/`max`: values 0‥16;
//! - `avg`: `base(i) ± 1` with the ±1 cancelling over the ranks, so the mean is a whole number;
//! - operations that only move data: values 1‥101 that differ between ranks, so a block
//!   delivered to the wrong place is caught.
//!
//! The expected value is computed sequentially ([`BenchElem::reduce`]): in `f64` for floats
//! (exact for these inputs), with two's-complement wrapping for integers (as oxccl defines
//! integer reductions).

use oxccl::{Communicator, ReduceOp};

use super::elem::BenchElem;
use super::ops::{BenchOp, Buffers, OpArgs, Place};

/// Which family of inputs an operation uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Data movement only: values that identify their source rank and index.
    Plain,
    /// A reduction with this op.
    Reduce(ReduceOp),
}

impl Pattern {
    /// The pattern `op` uses with reduce op `redop`.
    pub fn for_op(op: BenchOp, redop: ReduceOp) -> Pattern {
        if op.is_reduction() {
            Pattern::Reduce(redop)
        } else {
            Pattern::Plain
        }
    }
}

/// Input element `i` of rank `rank` in a world of `n` ranks: always a small whole number.
pub fn value(p: Pattern, rank: usize, i: usize, n: usize) -> i64 {
    let (r, i) = (rank as u64, i as u64);
    let v = match p {
        Pattern::Plain => ((r % 101) * 37 + (i % 101) * 7 + 1) % 101 + 1,
        Pattern::Reduce(ReduceOp::Sum) => ((r % 7) * 3 + i % 7) % 7,
        Pattern::Reduce(ReduceOp::Prod) => {
            if (r + i).is_multiple_of(8) {
                2
            } else {
                1
            }
        }
        Pattern::Reduce(ReduceOp::Min | ReduceOp::Max) => ((r % 17) * 5 + (i % 17) * 3) % 17,
        Pattern::Reduce(ReduceOp::Avg) => {
            // Pairs of ranks (2k, 2k+1) get +1 and -1; a last unpaired rank gets 0, so the
            // offsets sum to zero and the mean is exactly base(i).
            let base = 1 + i % 3;
            if r % 2 == 1 {
                base - 1
            } else if r + 1 < n as u64 {
                base + 1
            } else {
                base
            }
        }
    };
    v as i64
}

/// Fills `buf` with this rank's inputs: element k becomes `value(p, rank, k, n)`.
pub fn fill<T: BenchElem>(buf: &mut [T], p: Pattern, rank: usize, n: usize) {
    for (k, x) in buf.iter_mut().enumerate() {
        *x = T::from_i64(value(p, rank, k, n));
    }
}

/// Allocates this rank's buffers for `count` elements of `op` and fills them with the
/// check's inputs ([`value`]); the output starts zeroed (out of place).
pub fn prepare<T: BenchElem>(comm: &Communicator, op: BenchOp, count: usize, a: &OpArgs) -> Buffers<T> {
    let (in_len, out_len) = op.buffer_lens(count, comm.world_size(), a.place);
    // In place, every operation works on `output` alone: no input buffer to allocate.
    let in_len = if a.place == Place::InPlace { 0 } else { in_len };
    let mut b = Buffers { input: vec![T::default(); in_len], output: vec![T::default(); out_len] };
    refill(comm, op, count, a, &mut b);
    b
}

/// Refills buffers made by [`prepare`] with the inputs, so the next run's result can be checked.
pub fn refill<T: BenchElem>(comm: &Communicator, op: BenchOp, count: usize, a: &OpArgs, b: &mut Buffers<T>) {
    let (rank, n) = (comm.rank(), comm.world_size());
    let p = Pattern::for_op(op, a.redop);
    match a.place {
        Place::OutOfPlace => {
            fill(&mut b.input, p, rank, n);
            b.output.fill(T::default());
        }
        Place::InPlace if op == BenchOp::AllGather => {
            // This rank's input is its own block of the one buffer.
            let block = count / n.max(1);
            b.output.fill(T::default());
            if let Some(mine) = b.output.get_mut(rank * block..(rank + 1) * block) {
                fill(mine, p, rank, n);
            }
        }
        Place::InPlace => fill(&mut b.output, p, rank, n),
    }
}

/// Everything the expected result depends on besides the buffers.
#[derive(Debug, Clone, Copy)]
pub struct CheckCtx {
    /// The operation.
    pub op: BenchOp,
    /// Its reduce op (ignored by data-movement operations).
    pub redop: ReduceOp,
    /// Its root (ignored by unrooted operations).
    pub root: usize,
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub n: usize,
    /// The total element count of the operation (see [`BenchOp::count_for`]).
    pub count: usize,
}

/// The number of result elements on this rank that differ from the expected values, after
/// one run of `ctx.op` on buffers filled by [`prepare`].
pub fn count_wrong<T: BenchElem>(ctx: &CheckCtx, bufs: &Buffers<T>, place: Place) -> u64 {
    let CheckCtx { op, redop, root, rank, n, count } = *ctx;
    let p = Pattern::for_op(op, redop);
    let block = count / n.max(1);
    let red = |i: usize| T::reduce((0..n).map(|r| value(p, r, i, n)), redop, n);
    let plain = |r: usize, i: usize| T::from_i64(value(p, r, i, n));
    let out = &bufs.output;
    let wrong = |len: usize, offset: usize, want: &dyn Fn(usize) -> T| -> u64 {
        match out.get(offset..offset + len) {
            Some(got) => got.iter().enumerate().filter(|&(i, x)| *x != want(i)).count() as u64,
            // The buffer is shorter than the result: every element is missing.
            None => len as u64,
        }
    };
    match op {
        BenchOp::AllReduce => wrong(count, 0, &red),
        BenchOp::Reduce if rank == root => wrong(count, 0, &red),
        BenchOp::Broadcast => wrong(count, 0, &|i| plain(root, i)),
        BenchOp::AllGather => wrong(count, 0, &|i| plain(i / block, i % block)),
        BenchOp::Gather if rank == root => wrong(count, 0, &|i| plain(i / block, i % block)),
        BenchOp::ReduceScatter => {
            let offset = if place == Place::InPlace { rank * block } else { 0 };
            wrong(block, offset, &|k| red(rank * block + k))
        }
        BenchOp::AllToAll => wrong(count, 0, &|i| plain(i / block, rank * block + i % block)),
        BenchOp::Scatter => wrong(block, 0, &|k| plain(root, rank * block + k)),
        BenchOp::SendRecv => wrong(count, 0, &|i| plain((rank + n - 1) % n, i)),
        BenchOp::Reduce | BenchOp::Gather | BenchOp::Barrier => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_small_whole_numbers() {
        for p in [Pattern::Plain, Pattern::Reduce(ReduceOp::Sum), Pattern::Reduce(ReduceOp::Avg)] {
            for r in 0..9 {
                for i in [0, 1, 7, 1000, usize::MAX] {
                    let v = value(p, r, i, 9);
                    assert!((0..=102).contains(&v), "{p:?} {r} {i}: {v}");
                }
            }
        }
        assert!((0..40).all(|i| value(Pattern::Plain, 0, i, 2) != value(Pattern::Plain, 1, i, 2)));
    }

    #[test]
    fn avg_inputs_have_whole_means() {
        for n in 1..9 {
            for i in 0..6 {
                let sum: i64 = (0..n).map(|r| value(Pattern::Reduce(ReduceOp::Avg), r, i, n)).sum();
                assert_eq!(sum, n as i64 * (1 + (i as i64 % 3)), "n={n} i={i}");
            }
        }
    }

    fn ctx(op: BenchOp, rank: usize, n: usize, count: usize) -> CheckCtx {
        CheckCtx { op, redop: ReduceOp::Sum, root: 1, rank, n, count }
    }

    #[test]
    fn counts_wrong_elements_of_an_all_reduce() {
        let c = ctx(BenchOp::AllReduce, 0, 3, 5);
        let p = Pattern::Reduce(ReduceOp::Sum);
        let good: Vec<f32> = (0..5).map(|i| (0..3).map(|r| value(p, r, i, 3) as f32).sum()).collect();
        let mut b = Buffers { input: vec![], output: good };
        assert_eq!(count_wrong(&c, &b, Place::OutOfPlace), 0);
        b.output[2] += 1.0;
        b.output[4] = f32::NAN;
        assert_eq!(count_wrong(&c, &b, Place::OutOfPlace), 2);
        b.output.truncate(3);
        assert_eq!(count_wrong(&c, &b, Place::OutOfPlace), 5, "a short buffer counts as all wrong");
    }

    #[test]
    fn data_movement_expectations() {
        let n = 3;
        let plain = |r, i| value(Pattern::Plain, r, i, n) as i32;
        // all_gather on rank 2: block j holds rank j's input.
        let b = Buffers { input: vec![], output: (0..6).map(|i| plain(i / 2, i % 2)).collect::<Vec<i32>>() };
        assert_eq!(count_wrong(&ctx(BenchOp::AllGather, 2, n, 6), &b, Place::OutOfPlace), 0);
        // all_to_all on rank 1: block j holds block 1 of rank j's input.
        let b = Buffers { input: vec![], output: (0..6).map(|i| plain(i / 2, 2 + i % 2)).collect::<Vec<i32>>() };
        assert_eq!(count_wrong(&ctx(BenchOp::AllToAll, 1, n, 6), &b, Place::OutOfPlace), 0);
        // send_recv on rank 0 receives from rank 2.
        let b = Buffers { input: vec![], output: (0..4).map(|i| plain(2, i)).collect::<Vec<i32>>() };
        assert_eq!(count_wrong(&ctx(BenchOp::SendRecv, 0, n, 4), &b, Place::OutOfPlace), 0);
        // gather off the root checks nothing; scatter gets its block of the root's input.
        assert_eq!(count_wrong(&ctx(BenchOp::Gather, 0, n, 6), &Buffers::<i32>::default(), Place::OutOfPlace), 0);
        let b = Buffers { input: vec![], output: (0..2).map(|k| plain(1, 4 + k)).collect::<Vec<i32>>() };
        assert_eq!(count_wrong(&ctx(BenchOp::Scatter, 2, n, 6), &b, Place::OutOfPlace), 0);
    }

    #[test]
    fn in_place_reduce_scatter_reads_this_ranks_block() {
        let n = 2;
        let p = Pattern::Reduce(ReduceOp::Sum);
        let red = |i| (0..n).map(|r| value(p, r, i, n) as f64).sum::<f64>();
        let mut out = vec![-1.0f64; 8];
        for k in 0..4 {
            out[4 + k] = red(4 + k);
        }
        let b = Buffers { input: vec![], output: out };
        assert_eq!(count_wrong(&ctx(BenchOp::ReduceScatter, 1, n, 8), &b, Place::InPlace), 0);
        assert_eq!(count_wrong(&ctx(BenchOp::ReduceScatter, 0, n, 8), &b, Place::InPlace), 4);
    }
}
