//! Receive mismatches (`errors/recv_mismatch/...`): a message of another dtype, or longer than
//! the receive buffer, gives [`Error::Mismatch`] on the receiver, which is poisoned afterwards.

use oxccl::{Communicator, DType, Error};

use super::support::{
    code, code_of, code_of_result, get_comm, next_call_is_aborted, verdict_of, ECx, Local, FAIL_FAST,
};

/// Rank 0 sends `send` to rank 1, which receives into `recv`; rank 1 must get a Mismatch
/// (checked by `check`) and be poisoned afterwards; rank 0's send completes or fails with
/// the receiver's abort (not a timeout).
fn recv_mismatch(
    slot: &mut Option<Communicator>,
    send: impl Fn(&Communicator) -> oxccl::Result<()>,
    recv: impl Fn(&Communicator) -> oxccl::Result<usize>,
    check: impl Fn(&Error) -> Option<String>,
) -> Local {
    let comm = get_comm!(slot);
    let c = comm.with_timeout(FAIL_FAST);
    let me = c.rank();
    match me {
        // The send may complete (eagerly, as on the cpu backend) or, where a send waits for
        // its receive (NCCL), fail once the receiver aborts over the mismatch; it must not
        // hang or blame its own arguments.
        0 => match send(&c) {
            Ok(()) => Local::new(Ok(()), code::OK),
            Err(e @ (Error::Timeout { .. } | Error::InvalidArgument(_))) => {
                Local::new(Err(format!("rank 0: the send failed: {e}")), code_of(&e))
            }
            Err(e) => Local::new(Ok(()), code_of(&e)),
        },
        1 => {
            let r = recv(&c);
            let mut problems = Vec::new();
            match &r {
                Err(e @ Error::Mismatch { .. }) => problems.extend(check(e)),
                other => problems.push(format!("the receive returned {other:?}, expected Error::Mismatch")),
            }
            problems.extend(next_call_is_aborted(&c, "the mismatch"));
            let code = code_of_result(&r);
            Local::new(verdict_of(problems), code)
        }
        _ => Local::new(Ok(()), code::OK),
    }
}

pub(super) fn recv_wrong_dtype(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    recv_mismatch(
        slot,
        |c| c.send(&[1.5f32; 4], 1, 3),
        |c| c.recv(&mut [0i32; 4], 0, 3),
        |e| match e {
            Error::Mismatch { peer: 0, ours, theirs } if ours.dtype == DType::I32 && theirs.dtype == DType::F32 => None,
            other => Some(format!("the Mismatch should name peer 0, dtype i32 (ours) and f32 (theirs): {other:?}")),
        },
    )
}

pub(super) fn recv_too_long(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    recv_mismatch(
        slot,
        |c| c.send(&[9u64; 8], 1, 4),
        |c| c.recv(&mut [0u64; 4], 0, 4),
        |e| match e {
            Error::Mismatch { peer: 0, ours, theirs } if ours.count == 4 && theirs.count == 8 => None,
            other => Some(format!("the Mismatch should name peer 0, count 4 (ours) and 8 (theirs): {other:?}")),
        },
    )
}
