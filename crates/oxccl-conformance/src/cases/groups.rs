//! Sub-communicators: split (with reordering keys and non-participating ranks), new_group,
//! collectives inside sub-communicators, and two groups active at the same time without
//! interfering (disjoint groups running different collectives, and overlapping groups with
//! operations in flight on both at once).

use oxccl::{Algorithm, Communicator, DType, OpKind, ReduceOp};

use super::collective;
use super::support::{algos, case, Case, Form};
use crate::check::{call, Check, Cx, Point, Verdict};
use crate::inputs::{self, Dist};
use crate::options::SuiteOptions;
use crate::reference;

pub(crate) fn cases(v: &mut Vec<Case>, _n: usize, _opts: &SuiteOptions) {
    v.push(case("groups/split/parity_reversed_keys".into(), split_parity_reversed));
    v.push(case("groups/split/some_ranks_opt_out".into(), split_opt_out));
    v.push(case("groups/split/singletons".into(), split_singletons));
    v.push(case("groups/new_group/even_ranks_reversed".into(), new_group_even_reversed));
    v.push(case("groups/sub_communicator_collectives".into(), sub_collectives));
    v.push(case("groups/concurrent/disjoint_groups_different_collectives".into(), concurrent_disjoint));
    v.push(case("groups/concurrent/overlapping_groups_in_flight".into(), concurrent_overlapping));
}

/// A `Cx` whose inputs are keyed differently (one per group).
fn cx_for<'a>(cx: &Cx<'a>, salt: u64) -> Cx<'a> {
    Cx { seed: cx.seed, key: inputs::sub_key(cx.key, 0xC0_0000 + salt), opts: cx.opts }
}

/// Checks that `sub` has the given members (parent ranks, in sub-rank order), by its rank
/// and size and by an all_gather of the parent ranks and an all_reduce of them (on buffers
/// placed by `cx`). A call that fails aborts `sub` (so its peers stop waiting) and is
/// returned as the error.
fn check_members(
    chk: &mut Check,
    cx: &Cx,
    p: &Point,
    sub: &Communicator,
    me: usize,
    members: &[usize],
) -> Result<(), String> {
    let pos = members.iter().position(|&r| r == me);
    if sub.world_size() != members.len() || Some(sub.rank()) != pos {
        chk.fail(format!(
            "{p}: sub-communicator is rank {} of {}, expected rank {pos:?} of {} (members in order: {members:?})",
            sub.rank(),
            sub.world_size(),
            members.len()
        ));
        return Ok(());
    }
    let failed = |what: &str, e: oxccl::Error| {
        sub.abort("oxccl-conformance: a call failed on this rank");
        format!("{p}: {what} on the sub-communicator: {e}")
    };
    let mut order = vec![-1i64; members.len()];
    let mine = [me as i64];
    {
        let mine = cx.place(&mine).map_err(|e| failed("placing the all_gather input", e))?;
        let mut out = cx.place_mut(&mut order).map_err(|e| failed("placing the all_gather output", e))?;
        sub.all_gather(&mine, &mut out).map_err(|e| failed("all_gather", e))?;
        out.back().map_err(|e| failed("copying back the all_gather output", e))?;
    }
    let want: Vec<i64> = members.iter().map(|&r| r as i64).collect();
    chk.that(order == want, || {
        format!("{p}: the sub-communicator's ranks are parent ranks {order:?}, expected {want:?}")
    });
    let mut sum = [me as u64];
    {
        let mut buf = cx.place_mut(&mut sum).map_err(|e| failed("placing the all_reduce buffer", e))?;
        sub.all_reduce(&mut buf, ReduceOp::Sum).map_err(|e| failed("all_reduce", e))?;
        buf.back().map_err(|e| failed("copying back the all_reduce buffer", e))?;
    }
    let want_sum: u64 = members.iter().map(|&r| r as u64).sum();
    chk.that(sum[0] == want_sum, || format!("{p}: all_reduce of parent ranks gave {}, expected {want_sum}", sum[0]));
    Ok(())
}

/// color = rank parity, key = −rank: each group is ordered by descending parent rank.
fn split_parity_reversed(comm: &Communicator, cx: &Cx) -> Verdict {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    let p = Point::new("split", comm).note("color=rank%2 key=-rank");
    let sub = call!(chk, p, comm.split(Some((me % 2) as u32), -(me as i64)));
    let Some(sub) = sub else {
        chk.fail(format!("{p}: returned None for a rank that passed a color"));
        return chk.finish();
    };
    let members: Vec<usize> = (0..n).rev().filter(|r| r % 2 == me % 2).collect();
    if let Err(e) = check_members(&mut chk, cx, &p, &sub, me, &members) {
        chk.fail(e);
    }
    chk.finish()
}

/// Ranks with rank % 3 == 1 pass `None` and get `None`; the others form one group ordered
/// by parent rank (equal keys), which works without them.
fn split_opt_out(comm: &Communicator, cx: &Cx) -> Verdict {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    let p = Point::new("split", comm).note("color=None when rank%3==1, else 7; key=0");
    let out = me % 3 == 1;
    let sub = call!(chk, p, comm.split(if out { None } else { Some(7) }, 0));
    match (out, sub) {
        (true, None) => {}
        (true, Some(s)) => {
            chk.fail(format!("{p}: a rank that passed None got rank {} of {}", s.rank(), s.world_size()))
        }
        (false, None) => chk.fail(format!("{p}: a rank that passed a color got None")),
        (false, Some(sub)) => {
            let members: Vec<usize> = (0..n).filter(|r| r % 3 != 1).collect();
            if let Err(e) = check_members(&mut chk, cx, &p, &sub, me, &members) {
                chk.fail(e);
                return chk.finish();
            }
            if let Err(e) = collective::broadcast::<u32>(&sub, cx, Algorithm::Auto, Form::InPlace, &[13]) {
                chk.fail(format!("in the group of parent ranks {members:?}: {e}"));
            }
        }
    }
    chk.finish()
}

/// color = rank: every rank alone in a world of one.
fn split_singletons(comm: &Communicator, cx: &Cx) -> Verdict {
    let me = comm.rank();
    let mut chk = Check::new(comm);
    let p = Point::new("split", comm).note("color=rank");
    let sub = call!(chk, p, comm.split(Some(me as u32), 0));
    let Some(sub) = sub else {
        chk.fail(format!("{p}: returned None"));
        return chk.finish();
    };
    if let Err(e) = check_members(&mut chk, cx, &p, &sub, me, &[me]) {
        chk.fail(e);
        return chk.finish();
    }
    for a in algos(OpKind::AllReduce) {
        if let Err(e) = collective::all_reduce::<f64>(&sub, cx, ReduceOp::Avg, a, Form::InPlace, &[0, 13]) {
            chk.fail(e);
        }
    }
    chk.finish()
}

/// new_group of the even ranks listed in descending order: `ranks[i]` becomes rank i; the
/// odd ranks get `None`.
fn new_group_even_reversed(comm: &Communicator, cx: &Cx) -> Verdict {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    let members: Vec<usize> = (0..n).rev().filter(|r| r % 2 == 0).collect();
    let p = Point::new("new_group", comm).note(format!("ranks={members:?}"));
    let sub = call!(chk, p, comm.new_group(&members));
    match sub {
        None if me % 2 == 1 => {}
        None => chk.fail(format!("{p}: a listed rank got None")),
        Some(s) if me % 2 == 1 => {
            chk.fail(format!("{p}: an unlisted rank got rank {} of {}", s.rank(), s.world_size()))
        }
        Some(sub) => {
            if let Err(e) = check_members(&mut chk, cx, &p, &sub, me, &members) {
                chk.fail(e);
                return chk.finish();
            }
            if let Err(e) = collective::scatter::<i8>(&sub, cx, Algorithm::Auto, &[0, 5]) {
                chk.fail(e);
            }
        }
    }
    chk.finish()
}

/// A representative set of collectives (every algorithm of the reductions) on a
/// sub-communicator whose rank order differs from the parent's, so algorithms must use
/// communicator ranks, not parent ranks.
fn sub_collectives(comm: &Communicator, cx: &Cx) -> Verdict {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    let color = if n >= 4 { (me % 2) as u32 } else { 0 };
    let p = Point::new("split", comm).note(format!("color={color} key=-rank"));
    let Some(sub) = call!(chk, p, comm.split(Some(color), -(me as i64))) else {
        chk.fail(format!("{p}: returned None"));
        return chk.finish();
    };
    let cx = cx_for(cx, u64::from(color));
    let cx = &cx;
    let s = &sub;
    let runs: Vec<Box<dyn Fn() -> Verdict + '_>> = vec![
        Box::new(|| {
            algos(OpKind::AllReduce).into_iter().try_for_each(|a| {
                collective::all_reduce::<i32>(s, cx, ReduceOp::Sum, a, Form::InPlace, &[0, 1, 13, 131])?;
                collective::all_reduce::<f32>(s, cx, ReduceOp::Avg, a, Form::OutOfPlace, &[7, 131])
            })
        }),
        Box::new(|| collective::reduce::<u8>(s, cx, ReduceOp::Max, Algorithm::Auto, Form::InPlace, &[13])),
        Box::new(|| collective::broadcast::<f64>(s, cx, Algorithm::Auto, Form::InPlace, &[13])),
        Box::new(|| {
            algos(OpKind::AllGather)
                .into_iter()
                .try_for_each(|a| collective::all_gather::<i64>(s, cx, a, Form::InPlace, &[5]))
        }),
        Box::new(|| {
            algos(OpKind::ReduceScatter).into_iter().try_for_each(|a| {
                collective::reduce_scatter::<half::bf16>(s, cx, ReduceOp::Sum, a, Form::OutOfPlace, &[3, 7])
            })
        }),
        Box::new(|| collective::all_to_all::<u32>(s, cx, Algorithm::Auto, Form::OutOfPlace, &[3])),
        Box::new(|| collective::all_to_all_v::<i64>(s, cx, Algorithm::Auto)),
        Box::new(|| collective::all_gather_v::<half::f16>(s, cx, Algorithm::Auto)),
        Box::new(|| collective::gather::<i8>(s, cx, Algorithm::Auto, &[4])),
        Box::new(|| collective::scatter::<u64>(s, cx, Algorithm::Auto, &[4])),
        Box::new(|| collective::barrier(s, Algorithm::Auto)),
    ];
    for run in runs {
        if let Err(e) = run() {
            chk.fail(format!("in the sub-communicator of color {color}: {e}"));
            break;
        }
    }
    chk.finish()
}

/// Even and odd ranks form two groups that run different collectives at the same time, then
/// the same collective with different data; neither may see the other's traffic.
fn concurrent_disjoint(comm: &Communicator, cx: &Cx) -> Verdict {
    let me = comm.rank();
    let mut chk = Check::new(comm);
    let color = (me % 2) as u32;
    let p = Point::new("split", comm).note("color=rank%2 key=rank");
    let Some(sub) = call!(chk, p, comm.split(Some(color), me as i64)) else {
        chk.fail(format!("{p}: returned None"));
        return chk.finish();
    };
    let cx = cx_for(cx, u64::from(color));
    let r = if color == 0 {
        collective::all_reduce::<f32>(&sub, &cx, ReduceOp::Sum, Algorithm::Auto, Form::InPlace, &[131, 4099])
            .and_then(|()| collective::reduce::<i32>(&sub, &cx, ReduceOp::Min, Algorithm::Auto, Form::OutOfPlace, &[7]))
    } else {
        collective::all_gather::<i32>(&sub, &cx, Algorithm::Auto, Form::OutOfPlace, &[7, 131])
            .and_then(|()| collective::broadcast::<u8>(&sub, &cx, Algorithm::Auto, Form::InPlace, &[5]))
            .and_then(|()| collective::all_to_all::<f64>(&sub, &cx, Algorithm::Auto, Form::InPlace, &[2]))
    };
    let r = r.and_then(|()| {
        collective::all_reduce::<i64>(&sub, &cx, ReduceOp::Sum, Algorithm::Auto, Form::OutOfPlace, &[13, 4099])
    });
    if let Err(e) = r {
        chk.fail(format!("in the group of color {color}: {e}"));
    }
    chk.finish()
}

/// Two communicators over the same ranks (one in parent order, one reversed), with async
/// operations in flight on both at once, started in one order and waited in another.
fn concurrent_overlapping(comm: &Communicator, cx: &Cx) -> Verdict {
    let (n, me) = (comm.world_size(), comm.rank());
    let mut chk = Check::new(comm);
    let p = Point::new("split", comm).note("two communicators over all ranks, one reversed");
    let Some(x) = call!(chk, p, comm.split(Some(0), me as i64)) else {
        chk.fail(format!("{p}: returned None"));
        return chk.finish();
    };
    let Some(y) = call!(chk, p, comm.split(Some(0), -(me as i64))) else {
        chk.fail(format!("{p}: returned None"));
        return chk.finish();
    };
    let (xr, yr) = (x.rank(), y.rank());
    chk.that(xr == me && yr == n - 1 - me, || format!("{p}: ranks {xr} and {yr}, expected {me} and {}", n - 1 - me));
    let key = cx.sub(0);
    // x: all_reduce f32 sum (4099) and broadcast u8 from x-rank 0; y: all_reduce i64 max (131)
    // and all_gather i32 (7). Inputs are indexed by the rank in the communicator used.
    let a_in = cx.inputs::<f32>(key ^ 1, n, |_| 4099, Dist::Reduce(ReduceOp::Sum));
    let b_in = cx.inputs::<i64>(key ^ 2, n, |_| 131, Dist::Reduce(ReduceOp::Max));
    let c_root = cx.input::<u8>(key ^ 3, 0, 13, Dist::Bits);
    let g_in = cx.inputs::<i32>(key ^ 4, n, |_| 7, Dist::Bits);
    let mut a = a_in[xr].clone();
    let mut b = b_in[yr].clone();
    let mut cb = if xr == 0 { c_root.clone() } else { vec![0u8; 13] };
    let mut g = vec![0i32; 7 * n];
    let g_mine = &g_in[yr];
    let pr = Point::new("async all_reduce/broadcast on x with all_reduce/all_gather on y", comm);
    // Placed by hand, not with `placed!`: a failure of the scopes must abort x and y too. The
    // results are read from the buffers `wait` hands back, so nothing needs copying back.
    let g_mine = call!(chk, pr, cx.place(g_mine));
    let (mut a, mut b) = (call!(chk, pr, cx.place_mut(&mut a)), call!(chk, pr, cx.place_mut(&mut b)));
    let (mut cb, mut g) = (call!(chk, pr, cx.place_mut(&mut cb)), call!(chk, pr, cx.place_mut(&mut g)));
    let got = x.scope(|sx| {
        y.scope(|sy| {
            let wa = sx.all_reduce(&mut a, ReduceOp::Sum)?;
            let wb = sy.all_reduce(&mut b, ReduceOp::Max)?;
            let wc = sx.broadcast(&mut cb, 0)?;
            let wg = sy.all_gather(&g_mine, &mut g)?;
            let g = wg.wait()?.to_vec()?;
            let b = wb.wait()?.to_vec()?;
            let c = wc.wait()?.to_vec()?;
            let a = wa.wait()?.to_vec()?;
            Ok((a, b, c, g))
        })
    });
    let (a, b, c, g) = match got {
        Ok(v) => v,
        Err(e) => {
            x.abort("oxccl-conformance: a call failed on this rank");
            y.abort("oxccl-conformance: a call failed on this rank");
            return chk.call_failed(&pr, &e);
        }
    };
    let pa = Point::new("all_reduce on x", comm).dtype(DType::F32).reduce(ReduceOp::Sum).count(4099);
    chk.expect(&pa, "buffer", &a, &reference::all_reduce(&a_in, ReduceOp::Sum));
    let pb = Point::new("all_reduce on y (reversed)", comm).dtype(DType::I64).reduce(ReduceOp::Max).count(131);
    chk.expect(&pb, "buffer", &b, &reference::all_reduce(&b_in, ReduceOp::Max));
    let pc = Point::new("broadcast on x", comm).dtype(DType::U8).root(0).count(13);
    chk.bits(&pc, "buffer", &c, &c_root);
    let pg = Point::new("all_gather on y (reversed)", comm).dtype(DType::I32).count(7);
    chk.bits(&pg, "output", &g, &reference::all_gather(&g_in));
    chk.finish()
}
