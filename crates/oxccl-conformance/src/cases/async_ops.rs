//! Async operations in a [`Communicator::scope`]: operations in flight while the caller
//! computes, stream order with blocking calls, dropped and polled work handles.

use std::time::{Duration, Instant};

use half::bf16;
use oxccl::{Communicator, DType, ReduceOp};

use super::support::{case, Case};
use crate::check::{placed, Check, Cx, Point, Verdict};
use crate::inputs::Dist;
use crate::options::SuiteOptions;
use crate::reference;

pub(crate) fn cases(v: &mut Vec<Case>, _n: usize, _opts: &SuiteOptions) {
    v.push(case("async/two_all_reduces_while_computing".into(), two_all_reduces));
    v.push(case("async/many_collectives_in_flight".into(), many_in_flight));
    v.push(case("async/blocking_call_after_async_keeps_order".into(), blocking_after_async));
    v.push(case("async/dropped_and_polled_work".into(), dropped_and_polled));
}

/// Two all-reduces (f32 sum of 4099, i64 max of 131 out of place) in flight while the
/// caller computes the references; both results checked after `wait`.
fn two_all_reduces(comm: &Communicator, cx: &Cx) -> Verdict {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    let (ka, kb) = (cx.sub(1), cx.sub(2));
    let mut a = cx.input::<f32>(ka, me, 4099, Dist::Reduce(ReduceOp::Sum));
    let mut b_in = cx.input::<i64>(kb, me, 131, Dist::Reduce(ReduceOp::Max));
    let mut b_out = cx.sentinel::<i64>(kb, me, 131);
    let p = Point::new("scope all_reduce + all_reduce_into", comm).note("f32 sum x4099, i64 max x131");
    // b_in is checked for being unchanged: placed as writable, so the device copy is checked.
    let got = placed!(chk, p, cx; [] [a, b_in, b_out] => comm.scope(|s| {
        let wa = s.all_reduce(&mut a, ReduceOp::Sum)?;
        let wb = s.all_reduce_into(&b_in, &mut b_out, ReduceOp::Max)?;
        // The caller's own work, overlapping with the communication.
        let want_a =
            reference::all_reduce(&cx.inputs::<f32>(ka, n, |_| 4099, Dist::Reduce(ReduceOp::Sum)), ReduceOp::Sum);
        let want_b =
            reference::all_reduce(&cx.inputs::<i64>(kb, n, |_| 131, Dist::Reduce(ReduceOp::Max)), ReduceOp::Max);
        let rb = wb.wait()?.to_vec()?;
        let ra = wa.wait()?.to_vec()?;
        Ok((ra, want_a, rb, want_b))
    }));
    let (ra, want_a, rb, want_b) = got;
    let pa = Point::new("async all_reduce", comm).dtype(DType::F32).reduce(ReduceOp::Sum).count(4099);
    chk.expect(&pa, "buffer", &ra, &want_a);
    let pb = Point::new("async all_reduce_into", comm).dtype(DType::I64).reduce(ReduceOp::Max).count(131);
    chk.expect(&pb, "output", &rb, &want_b);
    chk.bits(&pb, "input (must be unchanged)", &b_in, &cx.input::<i64>(kb, me, 131, Dist::Reduce(ReduceOp::Max)));
    chk.finish()
}

/// broadcast, all_gather, reduce_scatter, all_to_all, barrier and reduce all started before
/// any is waited for, then waited in reverse order.
fn many_in_flight(comm: &Communicator, cx: &Cx) -> Verdict {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    let last = n - 1;
    let k = |i: u64| cx.sub(i);
    let bc_root = cx.input::<u32>(k(1), last, 13, Dist::Bits);
    let mut bc = if me == last { bc_root.clone() } else { cx.sentinel::<u32>(k(1), me, 13) };
    let ag_in = cx.inputs::<i8>(k(2), n, |_| 7, Dist::Bits);
    let mut ag = cx.sentinel::<i8>(k(2), me, 7 * n);
    let rs_in = cx.inputs::<f64>(k(3), n, |_| 5 * n, Dist::Reduce(ReduceOp::Sum));
    let mut rs = cx.sentinel::<f64>(k(3), me, 5);
    let aa_in = cx.inputs::<bf16>(k(4), n, |_| 3 * n, Dist::Bits);
    let mut aa = cx.sentinel::<bf16>(k(4), me, 3 * n);
    let rd_in = cx.inputs::<u64>(k(5), n, |_| 11, Dist::Reduce(ReduceOp::Min));
    let mut rd = rd_in[me].clone();
    let (ag_mine, rs_mine, aa_mine) = (&ag_in[me], &rs_in[me], &aa_in[me]);
    let p = Point::new("scope with six operations in flight", comm);
    let got = placed!(chk, p, cx; [ag_mine, rs_mine, aa_mine] [bc, ag, rs, aa, rd] => comm.scope(|s| {
        let w1 = s.broadcast(&mut bc, last)?;
        let w2 = s.all_gather(&ag_mine, &mut ag)?;
        let w3 = s.reduce_scatter(&rs_mine, &mut rs, ReduceOp::Sum)?;
        let w4 = s.all_to_all(&aa_mine, &mut aa)?;
        let w5 = s.barrier()?;
        let w6 = s.reduce(&mut rd, ReduceOp::Min, 0)?;
        let r6 = w6.wait()?.to_vec()?;
        w5.wait()?;
        let r4 = w4.wait()?.to_vec()?;
        let r3 = w3.wait()?.to_vec()?;
        let r2 = w2.wait()?.to_vec()?;
        let r1 = w1.wait()?.to_vec()?;
        Ok((r1, r2, r3, r4, r6))
    }));
    let (r1, r2, r3, r4, r6) = got;
    chk.bits(&Point::new("async broadcast", comm).dtype(DType::U32).root(last).count(13), "buffer", &r1, &bc_root);
    chk.bits(
        &Point::new("async all_gather", comm).dtype(DType::I8).count(7),
        "output",
        &r2,
        &reference::all_gather(&ag_in),
    );
    let p3 = Point::new("async reduce_scatter", comm).dtype(DType::F64).reduce(ReduceOp::Sum).count(5);
    chk.expect(&p3, "output", &r3, &reference::reduce_scatter(&rs_in, ReduceOp::Sum, me));
    let p4 = Point::new("async all_to_all", comm).dtype(DType::BF16).count(3);
    chk.bits(&p4, "output", &r4, &reference::all_to_all(&aa_in, me));
    let p6 = Point::new("async reduce", comm).dtype(DType::U64).reduce(ReduceOp::Min).root(0).count(11);
    if me == 0 {
        chk.expect(&p6, "root buffer", &r6, &reference::all_reduce(&rd_in, ReduceOp::Min));
    } else {
        chk.bits(&p6, "non-root buffer (must be unchanged)", &r6, &rd_in[me]);
    }
    chk.finish()
}

/// A blocking broadcast issued while an async all_reduce is in flight runs after it (stream
/// order), on every rank; both results are right.
fn blocking_after_async(comm: &Communicator, cx: &Cx) -> Verdict {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    let k = cx.sub(0);
    let ar_in = cx.inputs::<i32>(k, n, |_| 131, Dist::Reduce(ReduceOp::Sum));
    let mut ar = ar_in[me].clone();
    let root = n / 2;
    let bc_root = cx.input::<f32>(k ^ 1, root, 4099, Dist::Bits);
    let mut bc = if me == root { bc_root.clone() } else { cx.sentinel::<f32>(k, me, 4099) };
    let p = Point::new("scope all_reduce, then blocking broadcast", comm);
    let r = placed!(chk, p, cx; [] [ar, bc] => comm.scope(|s| {
        let w = s.all_reduce(&mut ar, ReduceOp::Sum)?;
        comm.broadcast(&mut bc, root)?;
        w.wait()?.to_vec()
    }));
    let pa = Point::new("async all_reduce", comm).dtype(DType::I32).reduce(ReduceOp::Sum).count(131);
    chk.expect(&pa, "buffer", &r, &reference::all_reduce(&ar_in, ReduceOp::Sum));
    let pb = Point::new("blocking broadcast", comm).dtype(DType::F32).root(root).count(4099);
    chk.bits(&pb, "buffer", &bc, &bc_root);
    chk.finish()
}

/// A work handle dropped without `wait` still completes before the scope returns; a handle
/// polled with `wait_timeout` reports completion and then yields its result.
fn dropped_and_polled(comm: &Communicator, cx: &Cx) -> Verdict {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    let k = cx.sub(0);
    let a_in = cx.inputs::<u8>(k, n, |_| 131, Dist::Reduce(ReduceOp::Max));
    let b_in = cx.inputs::<f64>(k ^ 1, n, |_| 13, Dist::Reduce(ReduceOp::Prod));
    let mut a = a_in[me].clone();
    let mut b = b_in[me].clone();
    let p = Point::new("scope: dropped work, polled work", comm);
    let deadline = Instant::now() + cx.opts.timeout;
    let got = placed!(chk, p, cx; [] [a, b] => comm.scope(|s| {
        drop(s.all_reduce(&mut a, ReduceOp::Max)?);
        let mut w = s.all_reduce(&mut b, ReduceOp::Prod)?;
        let mut polls = 0u32;
        while !w.wait_timeout(Duration::from_millis(5))? && Instant::now() < deadline {
            polls += 1;
        }
        let done = w.is_completed();
        Ok((done, polls, w.wait()?.to_vec()?))
    }));
    let (done, polls, rb) = got;
    chk.that(done, || format!("{p}: is_completed() is false after wait_timeout reported completion ({polls} polls)"));
    let pa = Point::new("async all_reduce (handle dropped)", comm).dtype(DType::U8).reduce(ReduceOp::Max).count(131);
    chk.expect(&pa, "buffer", &a, &reference::all_reduce(&a_in, ReduceOp::Max));
    let pb = Point::new("async all_reduce (polled)", comm).dtype(DType::F64).reduce(ReduceOp::Prod).count(13);
    chk.expect(&pb, "buffer", &rb, &reference::all_reduce(&b_in, ReduceOp::Prod));
    chk.finish()
}
