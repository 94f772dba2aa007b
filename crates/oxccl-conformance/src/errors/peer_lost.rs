//! Lost peers (`errors/peer_lost/...`): when rank 1 drops its communicator (or, on the local
//! backend, its thread ends) while the others wait on it, they get [`Error::PeerLost`] naming
//! rank 1 promptly, not a timeout.

use std::time::{Duration, Instant};

use oxccl::{Communicator, Error};

use super::support::{
    code, code_of_result, get_comm, next_call_is_aborted, verdict_of, warm_up, ECx, Local, FAIL_FAST, PROMPT,
};
use crate::check::Verdict;
use crate::options::SuiteOptions;
use crate::report::{CaseReport, Failure, Status};

/// Checks the error of a rank that waited on a lost rank 1.
fn check_lost(r: &oxccl::Result<()>, elapsed: Duration) -> Vec<String> {
    let mut problems = Vec::new();
    match r {
        Err(Error::PeerLost { rank: 1, .. }) => {}
        Err(Error::Timeout { .. }) => {
            problems.push(format!("expected Error::PeerLost naming rank 1, got a timeout: {r:?}"))
        }
        Err(e) if e.to_string().contains("rank 1") => {}
        other => problems.push(format!("expected Error::PeerLost naming rank 1, got {other:?}")),
    }
    if elapsed > PROMPT {
        problems.push(format!("the loss took {elapsed:?} to be noticed"));
    }
    problems
}

/// Rank 1 drops its communicator while the others wait in a scatter from root 1.
pub(super) fn peer_lost_dropped(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
    let me = {
        let c = get_comm!(slot);
        if let Err(l) = warm_up(&c.with_timeout(FAIL_FAST), cx) {
            return l;
        }
        c.rank()
    };
    if me == 1 {
        drop(slot.take());
        return Local::new(Ok(()), code::OK);
    }
    let c = get_comm!(slot).with_timeout(Duration::from_secs(20));
    let t = Instant::now();
    let r = c.scatter(None, &mut [0u32; 3], 1);
    let elapsed = t.elapsed();
    let mut problems = check_lost(&r, elapsed);
    problems.extend(next_call_is_aborted(&c, "losing rank 1"));
    let code = code_of_result(&r);
    Local::new(verdict_of(problems), code)
}

/// The name of the local-only case run by [`local_thread_exit`].
pub const THREAD_EXIT_CASE: &str = "errors/peer_lost/thread_exit_local";

/// Local backend only: rank 1's thread returns (dropping its communicator) while the others
/// wait in a scatter from root 1; they must get [`Error::PeerLost`] naming rank 1 promptly.
/// Returns `None` when the case is not selected. `cfg`: the world's configuration.
///
/// # Errors
/// Those of [`oxccl::local::run_with`].
pub fn local_thread_exit(cfg: &oxccl::Config, n: usize, opts: &SuiteOptions) -> oxccl::Result<Option<CaseReport>> {
    if !opts.selects(THREAD_EXIT_CASE) {
        return Ok(None);
    }
    let t = Instant::now();
    let mut case = CaseReport { name: THREAD_EXIT_CASE.into(), status: Status::Passed, elapsed: Duration::ZERO };
    if n < 2 {
        case.status = Status::Skipped("needs at least 2 ranks".into());
        return Ok(Some(case));
    }
    let results = oxccl::local::run_with(cfg, n, |comm| -> Verdict {
        let me = comm.rank();
        if me == 1 {
            return Ok(());
        }
        let c = comm.with_timeout(Duration::from_secs(20));
        let t = Instant::now();
        let r = c.scatter(None, &mut [0u8; 2], 1);
        verdict_of(check_lost(&r, t.elapsed()))
    })?;
    let failures: Vec<Failure> = results
        .into_iter()
        .enumerate()
        .filter_map(|(rank, r)| r.err().map(|message| Failure { rank, message }))
        .collect();
    if !failures.is_empty() {
        case.status = Status::Failed(failures);
    }
    case.elapsed = t.elapsed();
    Ok(Some(case))
}
