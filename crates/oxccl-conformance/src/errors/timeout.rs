//! Timeouts (`errors/timeout/...`): when rank 1 skips a collective, the ranks waiting on it
//! fail within a bounded time with an [`Error::Timeout`] that names the operation, its
//! sequence number and a peer (or are aborted by a peer that timed out first).

use std::time::{Duration, Instant};

use oxccl::{Communicator, Error, OpKind, ReduceOp};

use super::support::{
    code, code_of_result, get_comm, next_call_is_aborted, verdict_of, warm_up, ECx, Local, FAIL_FAST, PROMPT, SHORT,
};

/// Checks a timeout error: kind, op, sequence number, peer, and how long it took.
fn check_timeout(
    r: &oxccl::Result<()>,
    elapsed: Duration,
    op: OpKind,
    seq: u64,
    peer: Option<usize>,
    me: usize,
) -> Vec<String> {
    let mut problems = Vec::new();
    match r {
        Err(Error::Timeout { op: o, seq: s, peer: p, waited }) => {
            if *o != op {
                problems.push(format!("Timeout names operation {o}, expected {op}"));
            }
            if *s != seq {
                problems.push(format!("Timeout names sequence number {s}, expected {seq}"));
            }
            match (peer, p) {
                (Some(want), got) if *got != Some(want) => {
                    problems.push(format!("Timeout names peer {got:?}, expected Some({want})"))
                }
                (None, Some(q)) if *q == me => problems.push(format!("Timeout names this rank ({me}) as the peer")),
                (None, None) => problems.push("Timeout names no peer".into()),
                _ => {}
            }
            if *waited < SHORT.mul_f32(0.75) {
                problems.push(format!("Timeout reports waiting {waited:?}, less than the {SHORT:?} deadline"));
            }
        }
        other => problems.push(format!("expected Error::Timeout, got {other:?}")),
    }
    if elapsed < SHORT.mul_f32(0.75) || elapsed > SHORT + PROMPT {
        problems.push(format!("the call returned after {elapsed:?} with a {SHORT:?} deadline"));
    }
    problems
}

/// Rank 1 never joins a scatter from root 1 (sequence number 1 after the warm-up). Rank 0
/// waits on it with a 200 ms deadline and must report the timeout precisely; the other
/// ranks wait with a 10 s deadline and must end with an error (told by rank 0, or their own
/// timeout) rather than hang.
pub(super) fn timeout_scatter(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
    let comm = get_comm!(slot);
    let c = comm.with_timeout(FAIL_FAST);
    let me = c.rank();
    if let Err(l) = warm_up(&c, cx) {
        return l;
    }
    if me == 1 {
        return Local::new(Ok(()), code::OK);
    }
    let deadline = if me == 0 { SHORT } else { FAIL_FAST };
    let t = Instant::now();
    let r = c.with_timeout(deadline).scatter(None, &mut [0u32; 4], 1);
    let elapsed = t.elapsed();
    let code = code_of_result(&r);
    let mut problems = if me == 0 {
        check_timeout(&r, elapsed, OpKind::Scatter, 1, Some(1), me)
    } else {
        match &r {
            Err(Error::Aborted { .. } | Error::Timeout { .. }) => Vec::new(),
            other => vec![format!("expected Error::Aborted (rank 0 timed out) or Error::Timeout, got {other:?}")],
        }
    };
    problems.extend(next_call_is_aborted(&c, "the timeout"));
    Local::new(verdict_of(problems), code)
}

/// Rank 1 never joins an all_reduce: each other rank times out (naming a peer other than
/// itself) or is aborted by a peer that timed out first; at least one reports the timeout.
pub(super) fn timeout_all_reduce(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
    let comm = get_comm!(slot);
    let c = comm.with_timeout(FAIL_FAST);
    let me = c.rank();
    if let Err(l) = warm_up(&c, cx) {
        return l;
    }
    if me == 1 {
        return Local::new(Ok(()), code::OK);
    }
    let t = Instant::now();
    let r = c.with_timeout(SHORT).all_reduce(&mut [1f32; 8], ReduceOp::Sum);
    let elapsed = t.elapsed();
    let code = code_of_result(&r);
    let problems = match &r {
        Err(Error::Aborted { .. }) if elapsed <= SHORT + PROMPT => Vec::new(),
        _ => check_timeout(&r, elapsed, OpKind::AllReduce, 1, None, me),
    };
    Local::new(verdict_of(problems), code)
}
