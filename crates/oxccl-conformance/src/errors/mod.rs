//! Error cases: what every backend must do when things go wrong.
//!
//! * **Invalid arguments** (`errors/invalid/...`): roots and peers out of range, wrong
//!   buffer lengths for every operation, counts that do not divide by the world size, count
//!   lists of the wrong length, bad `new_group` lists, algorithms that do not apply to the
//!   operation. Each must return [`Error::InvalidArgument`] before any communication, and
//!   the communicator must stay usable: every such case ends with correct collectives on it,
//!   checked for values. Checks that only the root makes are made by the root alone (the other
//!   ranks do not call), which is exactly the situation where "before any communication" matters.
//! * **Mismatches** (`errors/mismatch/...`): ranks call different collectives, or the same one
//!   with another count, dtype, root, reduce op or algorithm. Every rank's call must end
//!   (no hang) with [`Error::Mismatch`] or [`Error::Aborted`] (a rank that only sends may
//!   also complete), at least one rank must report `Mismatch` (checked across ranks), a
//!   reported `Mismatch` must describe this rank's own call, and after an error every further
//!   call on that communicator returns [`Error::Aborted`]. A mismatch can be noticed one call
//!   late, when nobody receives during the mismatched call itself, so each case issues a
//!   `barrier` after it and judges both calls together.
//! * **Timeouts** (`errors/timeout/...`): rank 1 skips a collective. In a scatter from root 1,
//!   rank 0 waits with a 200 ms deadline and must fail within a bounded time (between 150 ms
//!   and 10.2 s) with [`Error::Timeout`] naming the operation, its sequence number and rank 1;
//!   the other ranks (10 s deadline) must end with `Aborted` (told by rank 0) or `Timeout`,
//!   and every later call returns `Aborted`. In an all_reduce where every other rank has the
//!   200 ms deadline, each must end with `Timeout` (naming a peer other than itself) or
//!   `Aborted` (a peer timed out first and said so), and at least one rank must report the
//!   `Timeout` (checked across ranks). A peer's failure notice may beat a rank's own deadline,
//!   which is why only one rank can be required to report `Timeout` itself.
//! * **Abort** (`errors/abort/...`): [`Communicator::abort`] from another thread ends a wait
//!   that could never complete with [`Error::Aborted`] within 10 s, on this rank and (when
//!   only rank 0 aborts) on its peers.
//! * **Lost peers** (`errors/peer_lost/...`): rank 1 drops its communicator while the
//!   others wait on it: they get [`Error::PeerLost`] naming rank 1 (or another error naming
//!   it), not a timeout. [`local_thread_exit`] checks the same when a rank's thread ends.
//! * **Receive mismatches** (`errors/recv_mismatch/...`): a message of another dtype, or
//!   longer than the receive buffer, gives [`Error::Mismatch`] on the receiver.
//!
//! Each case runs on its own communicator split off the suite's (which it may poison); after
//! the case every rank reports a one-byte outcome code through an all_to_all on the suite's
//! communicator, which also keeps every case communicator alive until all ranks are done
//! with it (a rank that skips a collective must not look like a lost peer).
//!
//! Each family lives in the file named after the middle part of its case names (`invalid.rs`,
//! `mismatch.rs`, `timeout.rs`, `abort.rs`, `peer_lost.rs`, `recv_mismatch.rs`); this file
//! keeps the list of cases in the order every rank runs them, the runner and the judges over
//! all ranks; `support.rs` keeps the helpers the families share.
//!
//! [`Error::InvalidArgument`]: oxccl::Error::InvalidArgument
//! [`Error::Mismatch`]: oxccl::Error::Mismatch
//! [`Error::Aborted`]: oxccl::Error::Aborted
//! [`Error::Timeout`]: oxccl::Error::Timeout
//! [`Error::PeerLost`]: oxccl::Error::PeerLost

mod abort;
mod invalid;
mod mismatch;
mod peer_lost;
mod recv_mismatch;
mod support;
mod timeout;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use oxccl::Communicator;

use crate::check::{Cx, Verdict};
use crate::inputs;
use crate::isolation::fresh_communicator;
use crate::options::SuiteOptions;
use crate::report::{CaseReport, Failure, Report, Status};

use abort::{abort_propagates, abort_self};
use invalid::{
    invalid_algorithm, invalid_count_lists, invalid_lengths, invalid_new_group, invalid_not_divisible, invalid_peer,
    invalid_root,
};
use mismatch::{
    mismatch_algorithm, mismatch_count, mismatch_count_all_reduce, mismatch_dtype, mismatch_dtype_all_reduce,
    mismatch_ops, mismatch_ops_all_reduce, mismatch_reduce_op, mismatch_root,
};
use peer_lost::peer_lost_dropped;
pub use peer_lost::{local_thread_exit, THREAD_EXIT_CASE};
use recv_mismatch::{recv_too_long, recv_wrong_dtype};
use support::{code, ECx, Local};
use timeout::{timeout_all_reduce, timeout_scatter};

type RunFn = fn(&mut Option<Communicator>, &ECx) -> Local;
type JudgeFn = fn(&[u8]) -> Result<(), String>;

struct ErrorCase {
    name: &'static str,
    min_world: usize,
    run: RunFn,
    /// A check over every rank's outcome code.
    judge: Option<JudgeFn>,
}

const fn ec(name: &'static str, min_world: usize, run: RunFn, judge: Option<JudgeFn>) -> ErrorCase {
    ErrorCase { name, min_world, run, judge }
}

fn cases() -> Vec<ErrorCase> {
    vec![
        ec("errors/invalid/root_out_of_range", 1, invalid_root, None),
        ec("errors/invalid/buffer_lengths", 1, invalid_lengths, None),
        ec("errors/invalid/count_not_divisible", 2, invalid_not_divisible, None),
        ec("errors/invalid/count_list_length", 1, invalid_count_lists, None),
        ec("errors/invalid/new_group_ranks", 1, invalid_new_group, None),
        ec("errors/invalid/peer_out_of_range", 1, invalid_peer, None),
        ec("errors/invalid/algorithm_not_applicable", 1, invalid_algorithm, None),
        ec("errors/mismatch/different_collectives", 2, mismatch_ops, Some(some_mismatch)),
        ec("errors/mismatch/all_reduce_vs_all_gather", 2, mismatch_ops_all_reduce, Some(some_mismatch)),
        ec("errors/mismatch/count", 2, mismatch_count, Some(some_mismatch)),
        ec("errors/mismatch/count_all_reduce", 2, mismatch_count_all_reduce, Some(some_mismatch)),
        ec("errors/mismatch/dtype", 2, mismatch_dtype, Some(some_mismatch)),
        ec("errors/mismatch/dtype_all_reduce", 2, mismatch_dtype_all_reduce, Some(some_mismatch)),
        ec("errors/mismatch/root", 2, mismatch_root, Some(some_mismatch)),
        ec("errors/mismatch/reduce_op", 2, mismatch_reduce_op, Some(some_mismatch)),
        ec("errors/mismatch/algorithm", 2, mismatch_algorithm, Some(some_mismatch)),
        ec("errors/timeout/scatter_root_absent", 2, timeout_scatter, None),
        ec("errors/timeout/all_reduce_rank_absent", 2, timeout_all_reduce, Some(some_timeout)),
        ec("errors/abort/from_another_thread", 1, abort_self, None),
        ec("errors/abort/reaches_peers", 2, abort_propagates, None),
        ec("errors/peer_lost/dropped_communicator", 2, peer_lost_dropped, None),
        ec("errors/recv_mismatch/dtype", 2, recv_wrong_dtype, Some(rank1_mismatch)),
        ec("errors/recv_mismatch/too_long", 2, recv_too_long, Some(rank1_mismatch)),
    ]
}

/// The names of the error cases [`run_error_cases`] runs under `opts`.
pub fn names(opts: &SuiteOptions) -> Vec<String> {
    cases().into_iter().map(|c| c.name.to_string()).filter(|n| opts.selects(n)).collect()
}

/// Runs the error cases on this rank; every rank of `comm` must call it with equal options.
/// `comm` is only used to create a fresh communicator per case and to share outcome codes,
/// and must stay healthy.
pub fn run_error_cases(comm: &Communicator, opts: &SuiteOptions) -> Report {
    let started = Instant::now();
    let (n, me) = (comm.world_size(), comm.rank());
    let parent = comm.with_timeout(opts.timeout);
    let mut report = Report::new(comm.backend(), n, me);
    let mut broken: Option<String> = None;
    for case in cases() {
        if !opts.selects(case.name) {
            continue;
        }
        let t = Instant::now();
        let status = if n < case.min_world {
            Status::Skipped(format!("needs at least {} ranks", case.min_world))
        } else if let Some(why) = &broken {
            Status::Skipped(format!("not run: {why}"))
        } else {
            match run_one(&case, &parent, opts) {
                Ok(Ok(())) => Status::Passed,
                Ok(Err(message)) => Status::Failed(vec![Failure { rank: me, message }]),
                Err(why) => {
                    broken = Some(why.clone());
                    Status::Failed(vec![Failure { rank: me, message: why }])
                }
            }
        };
        report.cases.push(CaseReport { name: case.name.to_string(), status, elapsed: t.elapsed() });
    }
    report.elapsed = started.elapsed();
    report
}

/// Runs one case; the outer `Err` means the suite's own communicator failed.
fn run_one(case: &ErrorCase, parent: &Communicator, opts: &SuiteOptions) -> Result<Verdict, String> {
    let made = fresh_communicator(parent);
    // Every rank holds its communicator before any rank runs the case. A case aborts or
    // drops it at once on some ranks; a rank still creating it would take that for a failed
    // creation (NCCL's non-blocking init reports a peer's abort as its own error) and stop
    // the suite. Every rank syncs, whether its split succeeded or not, so none waits alone.
    let synced = parent.barrier();
    let mut slot = Some(made?);
    synced.map_err(|e| format!("the barrier after creating the case's communicator failed: {e}"))?;
    let ecx = ECx { cx: Cx { seed: opts.seed, key: inputs::case_key(case.name), opts }, parent };
    let local = catch_unwind(AssertUnwindSafe(|| (case.run)(&mut slot, &ecx))).unwrap_or_else(|_| {
        if let Some(c) = &slot {
            c.abort("oxccl-conformance: the case panicked on this rank");
        }
        Local::new(Err("the case panicked".into()), code::OTHER)
    });
    // Share the outcome codes; until this returns on every rank, every case communicator
    // that a rank kept is still alive.
    let n = parent.world_size();
    let mut codes = vec![code::NOT_RUN; n];
    parent
        .all_to_all(&vec![local.code; n], &mut codes)
        .map_err(|e| format!("all_to_all of outcome codes on the suite's communicator failed: {e}"))?;
    drop(slot);
    let global = case.judge.map_or(Ok(()), |j| j(&codes).map_err(|e| format!("{e} (codes by rank: {codes:?})")));
    Ok(match (local.verdict, global) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(l), Ok(())) => Err(l),
        (Ok(()), Err(g)) => Err(format!("across ranks: {g}")),
        (Err(l), Err(g)) => Err(format!("{l}; across ranks: {g}")),
    })
}

// ---------------------------------------------------------------- judges over all ranks

fn some_mismatch(codes: &[u8]) -> Result<(), String> {
    if codes.contains(&code::MISMATCH) {
        Ok(())
    } else {
        Err("no rank reported Error::Mismatch".into())
    }
}

fn some_timeout(codes: &[u8]) -> Result<(), String> {
    if codes.contains(&code::TIMEOUT) {
        Ok(())
    } else {
        Err("no rank reported Error::Timeout".into())
    }
}

fn rank1_mismatch(codes: &[u8]) -> Result<(), String> {
    if codes.get(1) == Some(&code::MISMATCH) {
        Ok(())
    } else {
        Err("rank 1 (the receiver) did not report Error::Mismatch".into())
    }
}
