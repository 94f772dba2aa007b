//! Invalid arguments (`errors/invalid/...`): every refused call returns
//! [`Error::InvalidArgument`] with a message before any communication, and the communicator
//! stays usable (each case ends with correct collectives on it, checked for values).

use oxccl::{Algorithm, Communicator, Error, OpKind, ReduceOp};

use super::support::{code, get_comm, ECx, Local, FAIL_FAST};
use crate::check::{Cx, Verdict};

/// Collects the outcome of the invalid-argument calls of one case.
struct Invalid {
    first: Option<String>,
    more: usize,
}

impl Invalid {
    fn new() -> Invalid {
        Invalid { first: None, more: 0 }
    }

    fn fail(&mut self, m: String) {
        if self.first.is_none() {
            self.first = Some(m);
        } else {
            self.more += 1;
        }
    }

    /// `r` must be `Err(InvalidArgument)` with a message.
    fn expect<T>(&mut self, what: &str, r: oxccl::Result<T>) {
        match r {
            Err(Error::InvalidArgument(m)) if !m.trim().is_empty() => {}
            Err(Error::InvalidArgument(_)) => self.fail(format!("{what}: InvalidArgument without a message")),
            Err(e) => self.fail(format!("{what}: expected Error::InvalidArgument, got {e:?}")),
            Ok(_) => self.fail(format!("{what}: expected Error::InvalidArgument, but the call was accepted")),
        }
    }

    /// Ends the case: the communicator must still work.
    fn finish(self, comm: &Communicator, cx: &Cx) -> Local {
        let usable = verify_usable(comm, cx);
        let mut msg = self.first;
        if self.more > 0 {
            if let Some(m) = &mut msg {
                m.push_str(&format!(" [+{} more]", self.more));
            }
        }
        let verdict = match (msg, usable) {
            (None, Ok(())) => Ok(()),
            (Some(m), Ok(())) => Err(m),
            (None, Err(u)) => Err(u),
            (Some(m), Err(u)) => Err(format!("{m}; {u}")),
        };
        let code = if verdict.is_ok() { code::OK } else { code::OTHER };
        Local::new(verdict, code)
    }
}

/// Correct collectives after refused calls: the communicator must be usable, in step, and
/// compute right results (a barrier, an all_to_all of rank-tagged values and a broadcast).
fn verify_usable(comm: &Communicator, cx: &Cx) -> Verdict {
    let c = comm.with_timeout(FAIL_FAST.min(cx.opts.timeout));
    let (n, me) = (c.world_size(), c.rank());
    let after = "after the refused calls, the communicator must still work";
    c.barrier().map_err(|e| format!("{after}: barrier: {e}"))?;
    let input: Vec<u32> = (0..n).map(|j| (me * 1000 + j) as u32).collect();
    let mut out = vec![u32::MAX; n];
    c.all_to_all(&input, &mut out).map_err(|e| format!("{after}: all_to_all: {e}"))?;
    let want: Vec<u32> = (0..n).map(|i| (i * 1000 + me) as u32).collect();
    if out != want {
        return Err(format!("{after}: all_to_all gave {out:?}, expected {want:?}"));
    }
    let root = n - 1;
    let mut b = if me == root { [7u64, 11, 13] } else { [0u64; 3] };
    c.broadcast(&mut b, root).map_err(|e| format!("{after}: broadcast: {e}"))?;
    if b != [7, 11, 13] {
        return Err(format!("{after}: broadcast gave {b:?}"));
    }
    Ok(())
}

pub(super) fn invalid_root(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
    let comm = get_comm!(slot);
    let c = comm.with_timeout(FAIL_FAST);
    let n = c.world_size();
    let mut v = Invalid::new();
    for root in [n, n + 1, usize::MAX] {
        let mut buf = [1i32; 4];
        let mut out = [0i32; 4];
        let mut big = vec![0i32; 4 * n];
        v.expect(&format!("reduce(root={root})"), c.reduce(&mut buf, ReduceOp::Sum, root));
        v.expect(&format!("reduce_into(root={root})"), c.reduce_into(&buf, Some(&mut out), ReduceOp::Sum, root));
        v.expect(&format!("reduce_into(root={root}, output=None)"), c.reduce_into(&buf, None, ReduceOp::Sum, root));
        v.expect(&format!("broadcast(root={root})"), c.broadcast(&mut buf, root));
        v.expect(&format!("broadcast_into(root={root})"), c.broadcast_into(Some(&buf), &mut out, root));
        v.expect(&format!("gather(root={root})"), c.gather(&buf[..], Some(&mut big), root));
        v.expect(&format!("scatter(root={root})"), c.scatter(Some(&big[..]), &mut out, root));
        let r = c.scope(|s| {
            v.expect(&format!("async reduce(root={root})"), s.reduce(&mut buf, ReduceOp::Max, root).map(drop));
            v.expect(&format!("async broadcast(root={root})"), s.broadcast(&mut out, root).map(drop));
            Ok(())
        });
        v.expect_ok("scope after refused async calls", r);
    }
    v.finish(comm, &cx.cx)
}

impl Invalid {
    fn expect_ok<T>(&mut self, what: &str, r: oxccl::Result<T>) {
        if let Err(e) = r {
            self.fail(format!("{what}: unexpected error {e:?}"));
        }
    }
}

pub(super) fn invalid_lengths(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
    let comm = get_comm!(slot);
    let c = comm.with_timeout(FAIL_FAST);
    let (n, me) = (c.world_size(), c.rank());
    let root = n - 1;
    let mut v = Invalid::new();
    let four = [3f32; 4];
    let mut five = [0f32; 5];
    v.expect("all_reduce_into(input 4, output 5)", c.all_reduce_into(&four, &mut five, ReduceOp::Sum));
    v.expect("all_reduce_into(input 5, output 4)", c.all_reduce_into(&[0f32; 5], &mut [0f32; 4], ReduceOp::Sum));
    v.expect("all_gather(output != n * input)", c.all_gather(&four, &mut vec![0f32; 4 * n + 1]));
    v.expect("all_gather(output too short)", c.all_gather(&four, &mut vec![0f32; 4 * n - 1]));
    v.expect(
        "reduce_scatter(input != n * output)",
        c.reduce_scatter(&vec![0f32; 3 * n + 1], &mut [0f32; 3], ReduceOp::Sum),
    );
    v.expect(
        "reduce_scatter(input too short)",
        c.reduce_scatter(&vec![0f32; 3 * n - 1], &mut [0f32; 3], ReduceOp::Max),
    );
    v.expect("all_to_all(output != input)", c.all_to_all(&vec![0u8; 2 * n], &mut vec![0u8; 3 * n]));
    let ones = vec![1usize; n];
    v.expect("all_gather_v(input != counts[rank])", c.all_gather_v(&[0i64; 2], &mut vec![0i64; n], &ones));
    v.expect("all_gather_v(output != sum(counts))", c.all_gather_v(&[0i64; 1], &mut vec![0i64; n + 1], &ones));
    v.expect(
        "all_to_all_v(input != sum(send_counts))",
        c.all_to_all_v(&vec![0u32; n + 1], &ones, &mut vec![0u32; n], &ones),
    );
    v.expect(
        "all_to_all_v(output != sum(recv_counts))",
        c.all_to_all_v(&vec![0u32; n], &ones, &mut vec![0u32; n + 2], &ones),
    );
    let mut sc = ones.clone();
    sc[me] = 2;
    v.expect(
        "all_to_all_v(send_counts[rank] != recv_counts[rank])",
        c.all_to_all_v(&vec![0u32; n + 1], &sc, &mut vec![0u32; n], &ones),
    );
    // Checks only the root makes: only the root calls.
    if me == root {
        v.expect(
            "reduce_into at the root (output 5 for input 4)",
            c.reduce_into(&four[..], Some(&mut five), ReduceOp::Sum, root),
        );
        v.expect("reduce_into at the root (no output)", c.reduce_into(&four, None, ReduceOp::Sum, root));
        v.expect("broadcast_into at the root (input 4, output 5)", c.broadcast_into(Some(&four[..]), &mut five, root));
        v.expect("broadcast_into at the root (no input)", c.broadcast_into(None, &mut five, root));
        v.expect(
            "gather at the root (output != n * input)",
            c.gather(&four[..], Some(&mut vec![0f32; 4 * n + 2]), root),
        );
        v.expect("gather at the root (no output)", c.gather(&four, None, root));
        v.expect(
            "scatter at the root (input != n * output)",
            c.scatter(Some(&vec![0f32; 4 * n + 3][..]), &mut [0f32; 4], root),
        );
        v.expect("scatter at the root (no input)", c.scatter(None, &mut [0f32; 4], root));
    }
    v.finish(comm, &cx.cx)
}

pub(super) fn invalid_not_divisible(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
    let comm = get_comm!(slot);
    let c = comm.with_timeout(FAIL_FAST);
    let n = c.world_size();
    let mut v = Invalid::new();
    for len in [n + 1, 3 * n - 1, 1] {
        v.expect(&format!("all_gather_in_place(len {len})"), c.all_gather_in_place(&mut vec![0u32; len]));
        v.expect(
            &format!("reduce_scatter_in_place(len {len})"),
            c.reduce_scatter_in_place(&mut vec![0u32; len], ReduceOp::Sum),
        );
        v.expect(&format!("all_to_all_in_place(len {len})"), c.all_to_all_in_place(&mut vec![0u32; len]));
        v.expect(&format!("all_to_all(len {len})"), c.all_to_all(&vec![0u32; len], &mut vec![0u32; len]));
    }
    v.finish(comm, &cx.cx)
}

pub(super) fn invalid_count_lists(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
    let comm = get_comm!(slot);
    let c = comm.with_timeout(FAIL_FAST);
    let n = c.world_size();
    let mut v = Invalid::new();
    for len in [n + 1, n - 1, 0] {
        let counts = vec![1usize; len];
        let ok = vec![1usize; n];
        v.expect(
            &format!("all_gather_v(counts of length {len})"),
            c.all_gather_v(&[0i8; 1], &mut vec![0i8; len.max(1)], &counts),
        );
        v.expect(
            &format!("all_to_all_v(send_counts of length {len})"),
            c.all_to_all_v(&vec![0i8; len], &counts, &mut vec![0i8; n], &ok),
        );
        v.expect(
            &format!("all_to_all_v(recv_counts of length {len})"),
            c.all_to_all_v(&vec![0i8; n], &ok, &mut vec![0i8; len], &counts),
        );
    }
    v.finish(comm, &cx.cx)
}

pub(super) fn invalid_new_group(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
    let comm = get_comm!(slot);
    let c = comm.with_timeout(FAIL_FAST);
    let n = c.world_size();
    let mut v = Invalid::new();
    v.expect("new_group([n])", c.new_group(&[n]));
    v.expect("new_group([0, n + 5])", c.new_group(&[0, n + 5]));
    v.expect("new_group([0, 0])", c.new_group(&[0, 0]));
    let mut twice: Vec<usize> = (0..n).collect();
    twice.push(n - 1);
    v.expect("new_group(every rank, last one twice)", c.new_group(&twice));
    v.expect("new_group([])", c.new_group(&[]));
    v.finish(comm, &cx.cx)
}

pub(super) fn invalid_peer(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
    let comm = get_comm!(slot);
    let c = comm.with_timeout(FAIL_FAST);
    let n = c.world_size();
    let mut v = Invalid::new();
    for peer in [n, n + 1, usize::MAX] {
        let data = [1u8; 3];
        let mut buf = [0u8; 3];
        v.expect(&format!("send(peer={peer})"), c.send(&data, peer, 0));
        v.expect(&format!("recv(peer={peer})"), c.recv(&mut buf, peer, 0));
        v.expect(&format!("probe(peer={peer})"), c.probe(peer, 0));
        let mut b = c.batch();
        v.expect(&format!("batch send(peer={peer})"), b.send(&data, peer, 0).map(drop));
        v.expect(&format!("batch recv(peer={peer})"), b.recv(&mut buf, peer, 0).map(drop));
        if !b.is_empty() {
            v.fail(format!("batch with peer {peer}: refused operations were added ({} operations)", b.len()));
        }
        let r = c.scope(|s| {
            v.expect(&format!("async send(peer={peer})"), s.send(&data, peer, 0).map(drop));
            v.expect(&format!("async recv(peer={peer})"), s.recv(&mut buf, peer, 0).map(drop));
            Ok(())
        });
        v.expect_ok("scope after refused async calls", r);
    }
    v.finish(comm, &cx.cx)
}

/// Every operation called through `with_algorithm(a)` for every algorithm `a` that does not
/// apply to it.
pub(super) fn invalid_algorithm(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
    let comm = get_comm!(slot);
    let (n, me) = (comm.world_size(), comm.rank());
    let mut v = Invalid::new();
    let ones = vec![1usize; n];
    // Every operation a user can call (split is not called through `with_algorithm`).
    let kinds = OpKind::ALL.into_iter().filter(|&k| k != OpKind::Split);
    for kind in kinds {
        for a in Algorithm::ALL {
            if a == Algorithm::Auto || Algorithm::for_op(kind).contains(&a) {
                continue;
            }
            // `shared_memory` runs some operations, but only on communicators whose ranks
            // share a host (the `cpu` backend): there it may be accepted, elsewhere it must be
            // refused. Every rank of a communicator decides the same way.
            let optional = a.applies_to(kind);
            let c = comm.with_timeout(FAIL_FAST).with_algorithm(a);
            let what = format!("{kind} with algorithm {a}");
            let mut x = vec![1i32; n];
            let mut y = vec![0i32; n];
            let r = match kind {
                OpKind::AllReduce => c.all_reduce(&mut x, ReduceOp::Sum),
                OpKind::Reduce => c.reduce(&mut x, ReduceOp::Sum, 0),
                OpKind::Broadcast => c.broadcast(&mut x, 0),
                OpKind::AllGather => c.all_gather(&x[..1], &mut y),
                OpKind::AllGatherV => c.all_gather_v(&x[..1], &mut y, &ones),
                OpKind::ReduceScatter => c.reduce_scatter(&x, &mut y[..1], ReduceOp::Sum),
                OpKind::AllToAll => c.all_to_all(&x, &mut y),
                OpKind::AllToAllV => c.all_to_all_v(&x, &ones, &mut y, &ones),
                OpKind::Gather => c.gather(&x[..1], (me == 0).then_some(&mut y), 0),
                OpKind::Scatter => c.scatter((me == 0).then_some(&x[..]), &mut y[..1], 0),
                OpKind::Barrier => c.barrier(),
                OpKind::Send => c.send(&x, me, 0),
                OpKind::Recv => c.recv(&mut x, me, 0).map(drop),
                _ => {
                    let mut b = c.batch();
                    let r = b.send(&x, me, 0).and_then(|b| b.recv(&mut y, me, 0)).map(drop);
                    r.and_then(|()| c.run_batch(b)).map(drop)
                }
            };
            match &r {
                Ok(()) if optional => {}
                Err(Error::InvalidArgument(m)) if !m.contains(a.name()) => {
                    v.fail(format!("{what}: the InvalidArgument message does not name the algorithm: {m}"))
                }
                _ => v.expect(&what, r),
            }
        }
    }
    v.finish(comm, &cx.cx)
}
