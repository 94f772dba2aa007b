//! The list of collective (non-error) cases, in the order every rank runs them.
//!
//! The list is a pure function of the world size and the options, so every rank builds the
//! same one. Families, in order: `all_reduce`, `reduce`, `reduce_scatter`, `broadcast`,
//! `all_gather`, `all_gather_v`, `all_to_all`, `all_to_all_v`, `gather`, `scatter`,
//! `barrier`, `bitwise` (float all_reduce results identical on every rank), `large`
//! (sizes where `Auto` switches algorithm), `p2p`, `groups`, `async`.
//!
//! Element counts: every case covers 0, 1, a count below the world size (`n − 1`) and
//! primes; the full list is `0, 1, 2, n−1, n, n+1, 7, 13, 131, 4099` (around the world size
//! the blocks of the ring and halving algorithms are empty or uneven). The heavy cross
//! products (the reductions with `Prod`, `Min`, `Max`, `Avg`) use 1031 instead of 4099; `Sum`
//! gets the full list. Quick mode uses `0, 1, n−1, 13` and the dtypes `u8 i64 bf16 f32`.

pub(crate) mod async_ops;
pub(crate) mod collective;
pub(crate) mod groups;
pub(crate) mod p2p;
mod support;

use oxccl::{with_dtype, Algorithm, Communicator, DType, OpKind, ReduceOp};

use crate::check::{Cx, Verdict};
use crate::options::SuiteOptions;

use support::{algos, case, case_min, counts, dtypes, Case, Form};

/// An element count above the size where `Auto` picks bandwidth algorithms (512 KiB of f32).
pub(crate) const LARGE: usize = 140_009;

/// The collective cases for a world of `n` ranks.
pub(crate) fn build(n: usize, opts: &SuiteOptions) -> Vec<Case> {
    let mut v = Vec::new();
    reductions(&mut v, n, opts);
    movement(&mut v, n, opts);
    extras(&mut v, n, opts);
    v
}

fn reductions(v: &mut Vec<Case>, n: usize, opts: &SuiteOptions) {
    type Run = fn(&Communicator, &Cx, DType, ReduceOp, Algorithm, Form, &[usize]) -> Verdict;
    let families: [(&str, OpKind, Run); 3] = [
        (
            "all_reduce",
            OpKind::AllReduce,
            |c, cx, d, op, a, f, counts| with_dtype!(d, T => collective::all_reduce::<T>(c, cx, op, a, f, counts)),
        ),
        (
            "reduce",
            OpKind::Reduce,
            |c, cx, d, op, a, f, counts| with_dtype!(d, T => collective::reduce::<T>(c, cx, op, a, f, counts)),
        ),
        (
            "reduce_scatter",
            OpKind::ReduceScatter,
            |c, cx, d, op, a, f, counts| with_dtype!(d, T => collective::reduce_scatter::<T>(c, cx, op, a, f, counts)),
        ),
    ];
    for (family, kind, run) in families {
        for d in dtypes(opts) {
            for op in ReduceOp::ALL {
                let counts = counts(n, opts, op != ReduceOp::Sum);
                for a in algos(kind) {
                    for f in Form::BOTH {
                        let counts = counts.clone();
                        let name = format!("{family}/{d}/{op}/{a}/{}", f.name());
                        v.push(case(name, move |c, cx| run(c, cx, d, op, a, f, &counts)));
                    }
                }
            }
        }
    }
}

fn movement(v: &mut Vec<Case>, n: usize, opts: &SuiteOptions) {
    type RunForm = fn(&Communicator, &Cx, DType, Algorithm, Form, &[usize]) -> Verdict;
    let with_forms: [(&str, OpKind, RunForm); 3] = [
        (
            "broadcast",
            OpKind::Broadcast,
            |c, cx, d, a, f, counts| with_dtype!(d, T => collective::broadcast::<T>(c, cx, a, f, counts)),
        ),
        (
            "all_gather",
            OpKind::AllGather,
            |c, cx, d, a, f, counts| with_dtype!(d, T => collective::all_gather::<T>(c, cx, a, f, counts)),
        ),
        (
            "all_to_all",
            OpKind::AllToAll,
            |c, cx, d, a, f, counts| with_dtype!(d, T => collective::all_to_all::<T>(c, cx, a, f, counts)),
        ),
    ];
    for (family, kind, run) in with_forms {
        for d in dtypes(opts) {
            for a in algos(kind) {
                for f in Form::BOTH {
                    let counts = counts(n, opts, false);
                    let name = format!("{family}/{d}/{a}/{}", f.name());
                    v.push(case(name, move |c, cx| run(c, cx, d, a, f, &counts)));
                }
            }
        }
    }
    type Run = fn(&Communicator, &Cx, DType, Algorithm, &[usize]) -> Verdict;
    let plain: [(&str, OpKind, Run); 4] = [
        (
            "all_gather_v",
            OpKind::AllGatherV,
            |c, cx, d, a, _| with_dtype!(d, T => collective::all_gather_v::<T>(c, cx, a)),
        ),
        (
            "all_to_all_v",
            OpKind::AllToAllV,
            |c, cx, d, a, _| with_dtype!(d, T => collective::all_to_all_v::<T>(c, cx, a)),
        ),
        (
            "gather",
            OpKind::Gather,
            |c, cx, d, a, counts| with_dtype!(d, T => collective::gather::<T>(c, cx, a, counts)),
        ),
        (
            "scatter",
            OpKind::Scatter,
            |c, cx, d, a, counts| with_dtype!(d, T => collective::scatter::<T>(c, cx, a, counts)),
        ),
    ];
    for (family, kind, run) in plain {
        for d in dtypes(opts) {
            for a in algos(kind) {
                let counts = counts(n, opts, false);
                let name = format!("{family}/{d}/{a}");
                v.push(case(name, move |c, cx| run(c, cx, d, a, &counts)));
            }
        }
    }
    for a in algos(OpKind::Barrier) {
        v.push(case(format!("barrier/{a}"), move |c, _| collective::barrier(c, a)));
    }
    v.push(case_min("barrier/waits_for_the_last_rank".into(), 2, |c, _| collective::barrier_waits(c)));
}

fn extras(v: &mut Vec<Case>, n: usize, opts: &SuiteOptions) {
    // Float all_reduce results must be bitwise identical on every rank.
    let floats: Vec<DType> = dtypes(opts).into_iter().filter(|d| d.is_float()).collect();
    for &d in &floats {
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            for a in algos(OpKind::AllReduce) {
                let counts = if opts.quick { vec![13] } else { vec![1, 13, 4099] };
                let name = format!("bitwise/all_reduce/{d}/{op}/{a}");
                v.push(case(
                    name,
                    move |c, cx| with_dtype!(d, T => collective::all_reduce_bitwise::<T>(c, cx, op, a, &counts)),
                ));
            }
        }
    }
    // Sizes where the automatic choice moves to the bandwidth algorithms.
    if !opts.quick {
        v.push(case("large/all_reduce/f32/sum/auto".into(), |c, cx| {
            collective::all_reduce::<f32>(c, cx, ReduceOp::Sum, Algorithm::Auto, Form::InPlace, &[LARGE])
        }));
        v.push(case("large/reduce_scatter/f32/sum/auto".into(), move |c, cx| {
            let per_rank = LARGE / c.world_size() + 1;
            collective::reduce_scatter::<f32>(c, cx, ReduceOp::Sum, Algorithm::Auto, Form::OutOfPlace, &[per_rank])
        }));
        v.push(case("large/all_gather/i32/auto".into(), move |c, cx| {
            let per_rank = LARGE / c.world_size() + 1;
            collective::all_gather::<i32>(c, cx, Algorithm::Auto, Form::OutOfPlace, &[per_rank])
        }));
        // Up to 4 ranks, blocks past the `cpu` backend's single-copy scatter threshold (each
        // rank reads its block of the root's input from the root's process).
        v.push(case("large/scatter/i32/auto".into(), move |c, cx| {
            let per_rank = LARGE / c.world_size() + 1;
            collective::scatter::<i32>(c, cx, Algorithm::Auto, &[per_rank])
        }));
    }
    p2p::cases(v, n, opts);
    groups::cases(v, n, opts);
    async_ops::cases(v, n, opts);
}
