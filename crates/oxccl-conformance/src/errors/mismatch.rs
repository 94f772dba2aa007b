//! Mismatches (`errors/mismatch/...`): ranks that call different collectives, or the same one
//! with another count, dtype, root, reduce op or algorithm, end with [`Error::Mismatch`] or
//! [`Error::Aborted`] promptly, and the communicator is poisoned afterwards.

use std::time::Instant;

use oxccl::{Algorithm, Communicator, Error, OpKind, ReduceOp};

use super::support::{code, code_of, get_comm, ECx, Local, FAIL_FAST, PROMPT};

/// Runs a mismatched call (`call`, which differs by rank) and a barrier after it, and
/// judges this rank's side; `own` is the operation this rank called.
fn mismatch(
    slot: &mut Option<Communicator>,
    own: impl Fn(usize) -> OpKind,
    call: impl Fn(&Communicator) -> oxccl::Result<()>,
) -> Local {
    let comm = get_comm!(slot);
    let c = comm.with_timeout(FAIL_FAST);
    let (n, me) = (c.world_size(), c.rank());
    let t = Instant::now();
    let r1 = call(&c);
    let r2 = c.barrier();
    let elapsed = t.elapsed();
    let mut problems = Vec::new();
    for (which, r) in [("the mismatched call", &r1), ("the barrier after it", &r2)] {
        match r {
            Ok(()) | Err(Error::Mismatch { .. } | Error::Aborted { .. }) => {}
            Err(e) => problems.push(format!("{which} returned {e:?}, expected Mismatch or Aborted")),
        }
    }
    if let Err(Error::Mismatch { peer, ours, theirs }) = &r1 {
        if *peer >= n || *peer == me {
            problems.push(format!("Mismatch names peer {peer}, not another rank of the world of {n}"));
        }
        if ours.op != own(me) {
            problems.push(format!("Mismatch says this rank runs {ours}, but it called {}", own(me)));
        }
        if ours == theirs {
            problems.push(format!("Mismatch with identical fingerprints {ours}"));
        }
    }
    if r1.is_err() && !matches!(r2, Err(Error::Aborted { .. })) {
        problems.push(format!("after the error {r1:?}, the next call returned {r2:?} instead of Error::Aborted"));
    }
    if elapsed > PROMPT {
        problems.push(format!("took {elapsed:?} (must not wait for a deadline)"));
    }
    let code = match (&r1, &r2) {
        (Err(e), _) | (Ok(()), Err(e)) => code_of(e),
        (Ok(()), Ok(())) => code::OK,
    };
    let verdict = if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{} (call: {r1:?}; barrier: {r2:?})", problems.join("; ")))
    };
    Local::new(verdict, code)
}

pub(super) fn mismatch_ops(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    let own = |r: usize| if r == 0 { OpKind::Barrier } else { OpKind::AllToAll };
    mismatch(slot, own, |c| {
        if c.rank() == 0 {
            c.barrier()
        } else {
            c.all_to_all(&vec![1u32; c.world_size()], &mut vec![0u32; c.world_size()])
        }
    })
}

pub(super) fn mismatch_ops_all_reduce(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    let own = |r: usize| if r == 0 { OpKind::AllReduce } else { OpKind::AllGather };
    mismatch(slot, own, |c| {
        let n = c.world_size();
        if c.rank() == 0 {
            c.all_reduce(&mut vec![1f32; n], ReduceOp::Sum)
        } else {
            c.all_gather(&[1f32], &mut vec![0f32; n])
        }
    })
}

pub(super) fn mismatch_count(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    mismatch(
        slot,
        |_| OpKind::AllToAll,
        |c| {
            let len = c.world_size() * if c.rank() == 0 { 2 } else { 3 };
            c.all_to_all(&vec![1u32; len], &mut vec![0u32; len])
        },
    )
}

pub(super) fn mismatch_count_all_reduce(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    mismatch(
        slot,
        |_| OpKind::AllReduce,
        |c| {
            let len = if c.rank() == 0 { 8 } else { 9 };
            c.all_reduce(&mut vec![1f32; len], ReduceOp::Sum)
        },
    )
}

pub(super) fn mismatch_dtype(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    mismatch(
        slot,
        |_| OpKind::AllToAll,
        |c| {
            let n = c.world_size();
            if c.rank() == 0 {
                c.all_to_all(&vec![1f32; n], &mut vec![0f32; n])
            } else {
                c.all_to_all(&vec![1i32; n], &mut vec![0i32; n])
            }
        },
    )
}

pub(super) fn mismatch_dtype_all_reduce(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    mismatch(
        slot,
        |_| OpKind::AllReduce,
        |c| {
            if c.rank() == 0 {
                c.all_reduce(&mut [1f32; 8], ReduceOp::Sum)
            } else {
                c.all_reduce(&mut [1i32; 8], ReduceOp::Sum)
            }
        },
    )
}

pub(super) fn mismatch_root(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    mismatch(
        slot,
        |_| OpKind::Broadcast,
        |c| {
            let root = if c.rank() == 0 { 0 } else { c.world_size() - 1 };
            c.broadcast(&mut [5u8; 8], root)
        },
    )
}

pub(super) fn mismatch_reduce_op(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    mismatch(
        slot,
        |_| OpKind::AllReduce,
        |c| {
            let op = if c.rank() == 0 { ReduceOp::Sum } else { ReduceOp::Max };
            c.all_reduce(&mut [2f64; 16], op)
        },
    )
}

/// The first operation with two algorithms, and those two.
fn two_algorithms() -> Option<(OpKind, Algorithm, Algorithm)> {
    [OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter].into_iter().find_map(|k| match Algorithm::for_op(k) {
        [a, b, ..] => Some((k, *a, *b)),
        _ => None,
    })
}

pub(super) fn mismatch_algorithm(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    let Some((kind, a, b)) = two_algorithms() else {
        // Nothing to mismatch: report a mismatch so the judge passes.
        return Local::new(Ok(()), code::MISMATCH);
    };
    mismatch(
        slot,
        move |_| kind,
        move |c| {
            let n = c.world_size();
            let c = c.with_algorithm(if c.rank() == 0 { a } else { b });
            match kind {
                OpKind::AllReduce => c.all_reduce(&mut vec![1f32; 64], ReduceOp::Sum),
                OpKind::AllGather => c.all_gather(&[1f32; 16], &mut vec![0f32; 16 * n]),
                _ => c.reduce_scatter(&vec![1f32; 16 * n], &mut [0f32; 16], ReduceOp::Sum),
            }
        },
    )
}
