//! Abort (`errors/abort/...`): [`Communicator::abort`] from another thread ends a wait that
//! could never complete with [`Error::Aborted`] promptly, on this rank and on its peers.

use std::time::{Duration, Instant};

use oxccl::{Communicator, Error};

use super::support::{code_of_result, get_comm, next_call_is_aborted, verdict_of, ECx, Local, PROMPT};

/// Waits in an operation that can never complete, without any rank calling something that
/// disagrees with another rank's call (that would be a mismatch, which a backend may detect):
/// rank 0 waits for a message nobody sends (from rank 1, or from itself when alone), the
/// other ranks wait in a barrier that rank 0 never joins.
fn wait_forever(c: &Communicator) -> oxccl::Result<()> {
    let n = c.world_size();
    if c.rank() == 0 {
        c.recv(&mut [0u8; 4], 1 % n, 0xAB07).map(drop)
    } else {
        c.barrier()
    }
}

fn abort_case(slot: &mut Option<Communicator>, aborter: impl Fn(usize) -> bool) -> Local {
    let comm = get_comm!(slot);
    let me = comm.rank();
    let c = comm.with_timeout(Duration::from_secs(30));
    let t = Instant::now();
    let r = std::thread::scope(|s| {
        if aborter(me) {
            let h = c.clone();
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                h.abort("oxccl-conformance abort test");
            });
        }
        wait_forever(&c)
    });
    let elapsed = t.elapsed();
    let mut problems = Vec::new();
    if !matches!(r, Err(Error::Aborted { .. })) {
        problems.push(format!("the waiting call returned {r:?}, expected Error::Aborted"));
    }
    if elapsed > PROMPT {
        problems.push(format!("the abort took {elapsed:?} to end the wait"));
    }
    problems.extend(next_call_is_aborted(&c, "the abort"));
    let code = code_of_result(&r);
    Local::new(verdict_of(problems), code)
}

pub(super) fn abort_self(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    abort_case(slot, |_| true)
}

pub(super) fn abort_propagates(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    abort_case(slot, |r| r == 0)
}
