//! The collectives, generic over the element type: each function runs one operation in one
//! form with one algorithm over a list of element counts (and roots, where it has one), and
//! checks every rank's result against the [`reference`](mod@crate::reference).
//!
//! Beyond the result, every case checks what the documentation promises about the other
//! buffers: out-of-place inputs are unchanged, non-root buffers of `reduce` are unchanged,
//! outputs passed off the root (`reduce_into`, `gather`) are ignored, inputs passed off the
//! root (`broadcast_into`, `scatter`) are ignored. Outputs start filled with sentinel values,
//! so an element that is never written is caught.

use std::time::Duration;

use oxccl::{Algorithm, Communicator, ReduceOp};

use super::support::{roots, Form};
use crate::check::{call, placed, Check, Cx, Point, Verdict};
use crate::element::TestElement;
use crate::inputs::Dist;
use crate::reference;

/// The sub-case key of a (root, count) pair.
fn rc_key(cx: &Cx, root: usize, count: usize) -> u64 {
    cx.sub((root as u64) << 32 | count as u64)
}

/// all_reduce (in place) or all_reduce_into (out of place).
pub(crate) fn all_reduce<T: TestElement>(
    comm: &Communicator,
    cx: &Cx,
    op: ReduceOp,
    algo: Algorithm,
    form: Form,
    counts: &[usize],
) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for &count in counts {
        let key = cx.sub(count as u64);
        let inputs = cx.inputs::<T>(key, n, |_| count, Dist::Reduce(op));
        let p = Point::new("all_reduce", comm).dtype(T::DTYPE).reduce(op).algo(algo).form(form.name()).count(count);
        match form {
            Form::InPlace => {
                let mut buf = inputs[me].clone();
                placed!(chk, p, cx; [] [buf] => c.all_reduce(&mut buf, op));
                chk.expect(&p, "buffer", &buf, &reference::all_reduce(&inputs, op));
            }
            Form::OutOfPlace => {
                let mut input = inputs[me].clone();
                let mut out = cx.sentinel::<T>(key, me, count);
                placed!(chk, p, cx; [] [input, out] => c.all_reduce_into(&input, &mut out, op));
                chk.expect(&p, "output", &out, &reference::all_reduce(&inputs, op));
                chk.bits(&p, "input (must be unchanged)", &input, &inputs[me]);
            }
        }
    }
    chk.finish()
}

/// all_reduce, then the result of every rank gathered with all_gather: every float result
/// must be bitwise identical on every rank (and correct).
pub(crate) fn all_reduce_bitwise<T: TestElement>(
    comm: &Communicator,
    cx: &Cx,
    op: ReduceOp,
    algo: Algorithm,
    counts: &[usize],
) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for &count in counts {
        let key = cx.sub(count as u64);
        let inputs = cx.inputs::<T>(key, n, |_| count, Dist::Reduce(op));
        let p = Point::new("all_reduce", comm).dtype(T::DTYPE).reduce(op).algo(algo).count(count);
        let mut buf = inputs[me].clone();
        placed!(chk, p, cx; [] [buf] => c.all_reduce(&mut buf, op));
        chk.expect(&p, "buffer", &buf, &reference::all_reduce(&inputs, op));
        let mut all = cx.sentinel::<T>(key, me, n * count);
        let pg = Point::new("all_gather of the all_reduce results", comm).dtype(T::DTYPE).count(count);
        placed!(chk, pg, cx; [buf] [all] => comm.all_gather(&buf, &mut all));
        for (r, theirs) in all.chunks(count.max(1)).enumerate().take(if count == 0 { 0 } else { n }) {
            if let Some(i) = theirs.iter().zip(&buf).position(|(a, b)| !a.same_bits(*b)) {
                chk.fail(format!(
                    "{p}: rank {r}'s result differs from this rank's at index {i}: {} vs {} \
                     (all ranks must get bitwise identical results)",
                    theirs[i].show(),
                    buf[i].show()
                ));
            }
        }
    }
    chk.finish()
}

/// reduce (in place) or reduce_into (out of place), for roots 0, middle and last.
pub(crate) fn reduce<T: TestElement>(
    comm: &Communicator,
    cx: &Cx,
    op: ReduceOp,
    algo: Algorithm,
    form: Form,
    counts: &[usize],
) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for root in roots(n) {
        for &count in counts {
            let key = rc_key(cx, root, count);
            let mine = cx.input::<T>(key, me, count, Dist::Reduce(op));
            let want = || reference::all_reduce(&cx.inputs::<T>(key, n, |_| count, Dist::Reduce(op)), op);
            let p = Point::new("reduce", comm)
                .dtype(T::DTYPE)
                .reduce(op)
                .algo(algo)
                .form(form.name())
                .root(root)
                .count(count);
            match form {
                Form::InPlace => {
                    let mut buf = mine.clone();
                    placed!(chk, p, cx; [] [buf] => c.reduce(&mut buf, op, root));
                    if me == root {
                        chk.expect(&p, "root buffer", &buf, &want());
                    } else {
                        chk.bits(&p, "non-root buffer (must be unchanged)", &buf, &mine);
                    }
                }
                Form::OutOfPlace => {
                    let mut input = mine.clone();
                    if me == root {
                        let mut out = cx.sentinel::<T>(key, me, count);
                        placed!(chk, p, cx; [] [input, out] => c.reduce_into(&input, Some(&mut out), op, root));
                        chk.expect(&p, "root output", &out, &want());
                    } else if me % 2 == 1 {
                        // Off the root the output is ignored: it must stay untouched.
                        let before = cx.sentinel::<T>(key, me, count);
                        let mut out = before.clone();
                        placed!(chk, p, cx; [] [input, out] => c.reduce_into(&input, Some(&mut out), op, root));
                        chk.bits(&p, "non-root output (ignored, must be unchanged)", &out, &before);
                    } else {
                        placed!(chk, p, cx; [] [input] => c.reduce_into(&input, None, op, root));
                    }
                    chk.bits(&p, "input (must be unchanged)", &input, &mine);
                }
            }
        }
    }
    chk.finish()
}

/// reduce_scatter (out of place, `counts` are per-rank block sizes) or
/// reduce_scatter_in_place (block `rank` of the buffer is checked).
pub(crate) fn reduce_scatter<T: TestElement>(
    comm: &Communicator,
    cx: &Cx,
    op: ReduceOp,
    algo: Algorithm,
    form: Form,
    counts: &[usize],
) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for &count in counts {
        let key = cx.sub(count as u64);
        let mine = cx.input::<T>(key, me, n * count, Dist::Reduce(op));
        // The reduction of block `me` of every rank's input; not every rank's whole input,
        // which is n² × count values per rank (n³ × count on one machine's CPUs at scale).
        let blocks = cx.slices::<T>(key, n, |_| me * count..(me + 1) * count, Dist::Reduce(op));
        let want = reference::all_reduce(&blocks, op);
        let p = Point::new("reduce_scatter", comm).dtype(T::DTYPE).reduce(op).algo(algo).form(form.name()).count(count);
        match form {
            Form::OutOfPlace => {
                let mut input = mine.clone();
                let mut out = cx.sentinel::<T>(key, me, count);
                placed!(chk, p, cx; [] [input, out] => c.reduce_scatter(&input, &mut out, op));
                chk.expect(&p, "output", &out, &want);
                chk.bits(&p, "input (must be unchanged)", &input, &mine);
            }
            Form::InPlace => {
                let mut buf = mine;
                placed!(chk, p, cx; [] [buf] => c.reduce_scatter_in_place(&mut buf, op));
                let block = &buf[me * count..(me + 1) * count];
                chk.expect(&p, "this rank's block", block, &want);
            }
        }
    }
    chk.finish()
}

/// broadcast (in place) or broadcast_into (out of place), for roots 0, middle and last.
pub(crate) fn broadcast<T: TestElement>(
    comm: &Communicator,
    cx: &Cx,
    algo: Algorithm,
    form: Form,
    counts: &[usize],
) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for root in roots(n) {
        for &count in counts {
            let key = rc_key(cx, root, count);
            let data = cx.input::<T>(key, root, count, Dist::Bits);
            let p = Point::new("broadcast", comm).dtype(T::DTYPE).algo(algo).form(form.name()).root(root).count(count);
            match form {
                Form::InPlace => {
                    let mut buf = if me == root { data.clone() } else { cx.sentinel::<T>(key, me, count) };
                    placed!(chk, p, cx; [] [buf] => c.broadcast(&mut buf, root));
                    chk.bits(&p, "buffer", &buf, &reference::broadcast(std::slice::from_ref(&data), 0));
                }
                Form::OutOfPlace => {
                    let mut input = data.clone();
                    // Off the root the input is ignored, even when its length is wrong.
                    let mut junk = cx.sentinel::<T>(key ^ 1, me, count + 1);
                    let mut out = cx.sentinel::<T>(key, me, count);
                    placed!(chk, p, cx; [] [input, junk, out] => {
                        let inp = if me == root {
                            Some(&input)
                        } else if me % 2 == 1 {
                            Some(&junk)
                        } else {
                            None
                        };
                        c.broadcast_into(inp, &mut out, root)
                    });
                    chk.bits(&p, "output", &out, &data);
                    chk.bits(&p, "root input (must be unchanged)", &input, &data);
                }
            }
        }
    }
    chk.finish()
}

/// all_gather (out of place) or all_gather_in_place; `counts` are per-rank block sizes.
pub(crate) fn all_gather<T: TestElement>(
    comm: &Communicator,
    cx: &Cx,
    algo: Algorithm,
    form: Form,
    counts: &[usize],
) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for &count in counts {
        let key = cx.sub(count as u64);
        let inputs = cx.inputs::<T>(key, n, |_| count, Dist::Bits);
        let want = reference::all_gather(&inputs);
        let p = Point::new("all_gather", comm).dtype(T::DTYPE).algo(algo).form(form.name()).count(count);
        let mut buf = cx.sentinel::<T>(key, me, n * count);
        match form {
            Form::OutOfPlace => {
                let mut input = inputs[me].clone();
                placed!(chk, p, cx; [] [input, buf] => c.all_gather(&input, &mut buf));
                chk.bits(&p, "input (must be unchanged)", &input, &inputs[me]);
            }
            Form::InPlace => {
                buf[me * count..(me + 1) * count].copy_from_slice(&inputs[me]);
                placed!(chk, p, cx; [] [buf] => c.all_gather_in_place(&mut buf));
            }
        }
        chk.bits(&p, "output", &buf, &want);
    }
    chk.finish()
}

/// Uneven per-rank counts for all_gather_v, zeros included.
fn gather_v_patterns(n: usize) -> Vec<(&'static str, Vec<usize>)> {
    const UNEVEN: [usize; 8] = [7, 0, 1, 13, 0, 131, 2, 4099];
    vec![
        ("all_zero", vec![0; n]),
        ("uneven", (0..n).map(|i| UNEVEN[i % UNEVEN.len()]).collect()),
        ("one_nonzero_last", (0..n).map(|i| if i + 1 == n { 13 } else { 0 }).collect()),
        ("ascending_from_zero", (0..n).collect()),
        ("large_first", (0..n).map(|i| if i == 0 { 4099 } else { i % 3 }).collect()),
    ]
}

/// all_gather_v over several uneven count patterns.
pub(crate) fn all_gather_v<T: TestElement>(comm: &Communicator, cx: &Cx, algo: Algorithm) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for (i, (pattern, counts)) in gather_v_patterns(n).into_iter().enumerate() {
        let key = cx.sub(i as u64);
        let inputs = cx.inputs::<T>(key, n, |r| counts[r], Dist::Bits);
        let total: usize = counts.iter().sum();
        let p = Point::new("all_gather_v", comm)
            .dtype(T::DTYPE)
            .algo(algo)
            .count(counts[me])
            .note(format!("pattern={pattern} {counts:?}"));
        let mut input = inputs[me].clone();
        let mut out = cx.sentinel::<T>(key, me, total);
        placed!(chk, p, cx; [] [input, out] => c.all_gather_v(&input, &mut out, &counts));
        chk.bits(&p, "output", &out, &reference::all_gather(&inputs));
        chk.bits(&p, "input (must be unchanged)", &input, &inputs[me]);
    }
    chk.finish()
}

/// all_to_all (out of place) or all_to_all_in_place; `counts` are per-pair block sizes.
pub(crate) fn all_to_all<T: TestElement>(
    comm: &Communicator,
    cx: &Cx,
    algo: Algorithm,
    form: Form,
    counts: &[usize],
) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for &count in counts {
        let key = cx.sub(count as u64);
        let mine = cx.input::<T>(key, me, n * count, Dist::Bits);
        // Block `me` of every rank's input, in rank order (not every whole input).
        let want = cx.slices::<T>(key, n, |_| me * count..(me + 1) * count, Dist::Bits).concat();
        let p = Point::new("all_to_all", comm).dtype(T::DTYPE).algo(algo).form(form.name()).count(count);
        match form {
            Form::OutOfPlace => {
                let mut input = mine.clone();
                let mut out = cx.sentinel::<T>(key, me, n * count);
                placed!(chk, p, cx; [] [input, out] => c.all_to_all(&input, &mut out));
                chk.bits(&p, "output", &out, &want);
                chk.bits(&p, "input (must be unchanged)", &input, &mine);
            }
            Form::InPlace => {
                let mut buf = mine;
                placed!(chk, p, cx; [] [buf] => c.all_to_all_in_place(&mut buf));
                chk.bits(&p, "buffer", &buf, &want);
            }
        }
    }
    chk.finish()
}

/// Per-pair counts for all_to_all_v: `m[i][j]` elements go from rank i to rank j.
fn to_all_v_patterns(n: usize) -> Vec<(&'static str, Vec<Vec<usize>>)> {
    let m = |f: &dyn Fn(usize, usize) -> usize| (0..n).map(|i| (0..n).map(|j| f(i, j)).collect()).collect();
    vec![
        ("all_zero", m(&|_, _| 0)),
        ("uneven_with_zeros", m(&|i, j| if (i + 2 * j) % 3 == 0 { 0 } else { (i * 7 + j * 3) % 11 + 1 })),
        ("self_only", m(&|i, j| if i == j { 5 } else { 0 })),
        ("one_sender", m(&|i, j| if i == 0 { 13 + j } else { 0 })),
        ("one_receiver_large", m(&|i, j| if j + 1 == n { 1031 } else { i % 2 })),
    ]
}

/// all_to_all_v over several per-pair count patterns.
pub(crate) fn all_to_all_v<T: TestElement>(comm: &Communicator, cx: &Cx, algo: Algorithm) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for (i, (pattern, m)) in to_all_v_patterns(n).into_iter().enumerate() {
        let key = cx.sub(i as u64);
        let mine = cx.input::<T>(key, me, m[me].iter().sum(), Dist::Bits);
        // What every rank sends this one, in rank order (not every whole input).
        let want = cx.slices::<T>(key, n, |r| reference::sent(&m, r, me), Dist::Bits).concat();
        let send_counts = m[me].clone();
        let recv_counts: Vec<usize> = (0..n).map(|j| m[j][me]).collect();
        let p = Point::new("all_to_all_v", comm)
            .dtype(T::DTYPE)
            .algo(algo)
            .count(mine.len())
            .note(format!("pattern={pattern} send_counts={send_counts:?} recv_counts={recv_counts:?}"));
        let mut input = mine.clone();
        let mut out = cx.sentinel::<T>(key, me, recv_counts.iter().sum());
        placed!(chk, p, cx; [] [input, out] => c.all_to_all_v(&input, &send_counts, &mut out, &recv_counts));
        chk.bits(&p, "output", &out, &want);
        chk.bits(&p, "input (must be unchanged)", &input, &mine);
    }
    chk.finish()
}

/// gather to roots 0, middle and last; off the root the output is omitted or ignored.
pub(crate) fn gather<T: TestElement>(comm: &Communicator, cx: &Cx, algo: Algorithm, counts: &[usize]) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for root in roots(n) {
        for &count in counts {
            let key = rc_key(cx, root, count);
            // The input shares the output's buffer type: placed as writable, never checked.
            let mut mine = cx.input::<T>(key, me, count, Dist::Bits);
            let p = Point::new("gather", comm).dtype(T::DTYPE).algo(algo).root(root).count(count);
            if me == root {
                let mut out = cx.sentinel::<T>(key, me, n * count);
                placed!(chk, p, cx; [] [mine, out] => c.gather(&mine, Some(&mut out), root));
                let inputs = cx.inputs::<T>(key, n, |_| count, Dist::Bits);
                chk.bits(&p, "root output", &out, &reference::all_gather(&inputs));
            } else if me % 2 == 1 {
                let before = cx.sentinel::<T>(key, me, 3);
                let mut out = before.clone();
                placed!(chk, p, cx; [] [mine, out] => c.gather(&mine, Some(&mut out), root));
                chk.bits(&p, "non-root output (ignored, must be unchanged)", &out, &before);
            } else {
                placed!(chk, p, cx; [] [mine] => c.gather(&mine, None, root));
            }
        }
    }
    chk.finish()
}

/// scatter from roots 0, middle and last; off the root the input is omitted or ignored.
pub(crate) fn scatter<T: TestElement>(comm: &Communicator, cx: &Cx, algo: Algorithm, counts: &[usize]) -> Verdict {
    let c = comm.with_algorithm(algo);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    for root in roots(n) {
        for &count in counts {
            let key = rc_key(cx, root, count);
            let mut data = cx.input::<T>(key, root, n * count, Dist::Bits);
            let mut junk = cx.sentinel::<T>(key ^ 1, me, 5);
            let p = Point::new("scatter", comm).dtype(T::DTYPE).algo(algo).root(root).count(count);
            // Computed before the call: the inputs share the output's buffer type, so they are
            // placed as writable (and copied back).
            let want = reference::scatter(&data, n, me);
            let mut out = cx.sentinel::<T>(key, me, count);
            placed!(chk, p, cx; [] [data, junk, out] => {
                let input = if me == root {
                    Some(&data)
                } else if me % 2 == 1 {
                    Some(&junk)
                } else {
                    None
                };
                c.scatter(input, &mut out, root)
            });
            chk.bits(&p, "output", &out, &want);
        }
    }
    chk.finish()
}

/// Several barriers in a row.
pub(crate) fn barrier(comm: &Communicator, algo: Algorithm) -> Verdict {
    let c = comm.with_algorithm(algo);
    let chk = Check::new(comm);
    for i in 0..5 {
        let p = Point::new("barrier", comm).algo(algo).note(format!("iteration={i}"));
        call!(chk, p, c.barrier());
    }
    chk.finish()
}

/// How long rank 0 arrives late at the barrier in [`barrier_waits`].
const LATE: Duration = Duration::from_millis(150);

/// No rank leaves a barrier before every rank entered: rank 0 enters 150 ms late, and every
/// other rank must leave after rank 0 entered. Rank 0 broadcasts when it entered (the
/// system clock, in µs since the epoch) and each rank compares its own leaving time, less
/// [`CLOCK_SLACK`] for clocks of different hosts. A rank's own wait is not the measure: on a
/// crowded host (256 ranks on 2 CPUs) a rank may leave the first barrier 100 ms after rank 0
/// and rightly wait only a little at the second.
pub(crate) fn barrier_waits(comm: &Communicator) -> Verdict {
    let mut chk = Check::new(comm);
    let p = Point::new("barrier", comm).note("rank 0 enters 150 ms late");
    call!(chk, p, comm.barrier());
    let mut entered = [0u64];
    if comm.rank() == 0 {
        std::thread::sleep(LATE);
        entered[0] = now_us();
    }
    call!(chk, p, comm.barrier());
    let left = now_us();
    call!(chk, p, comm.broadcast(&mut entered, 0));
    if comm.rank() != 0 {
        let slack = CLOCK_SLACK.as_micros() as u64;
        chk.that(left + slack >= entered[0], || {
            format!("{p}: left the barrier {} µs before rank 0 entered it", entered[0].saturating_sub(left))
        });
    }
    chk.finish()
}

/// How far the clocks of two hosts may differ in [`barrier_waits`] (a third of [`LATE`]).
const CLOCK_SLACK: Duration = Duration::from_millis(50);

/// The system clock in µs since the epoch (0 before it).
fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}
