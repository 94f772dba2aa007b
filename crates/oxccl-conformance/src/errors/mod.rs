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

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use oxccl::{Algorithm, Communicator, DType, Error, OpKind, ReduceOp};

use crate::check::{Cx, Verdict};
use crate::report::{CaseReport, Failure, Report, Status};
use crate::{fresh_communicator, inputs, SuiteOptions};

/// Deadline of calls that are expected to fail quickly (a wrong acceptance then shows up
/// as a failure after this long instead of a hang).
const FAIL_FAST: Duration = Duration::from_secs(10);
/// The deadline used by the timeout cases.
const SHORT: Duration = Duration::from_millis(200);
/// The longest an error that should be prompt may take.
const PROMPT: Duration = Duration::from_secs(10);

/// Outcome codes shared across ranks after each case.
mod code {
    pub const OK: u8 = 0;
    pub const MISMATCH: u8 = 1;
    pub const ABORTED: u8 = 2;
    pub const TIMEOUT: u8 = 3;
    pub const PEER_LOST: u8 = 4;
    pub const INVALID: u8 = 5;
    pub const OTHER: u8 = 6;
    pub const NOT_RUN: u8 = 7;
}

/// A problem unless the next call on `c` returns `Aborted`, as every call on a communicator
/// that failed must (`after` says what failed, for the message).
fn next_call_is_aborted(c: &Communicator, after: &str) -> Option<String> {
    match c.barrier() {
        Err(Error::Aborted { .. }) => None,
        other => Some(format!("after {after}, the next call returned {other:?} instead of Error::Aborted")),
    }
}

/// The outcome code of a call's result: OK, or its error's code.
fn code_of_result<T>(r: &oxccl::Result<T>) -> u8 {
    r.as_ref().err().map_or(code::OK, code_of)
}

fn code_of(e: &Error) -> u8 {
    match e {
        Error::Mismatch { .. } => code::MISMATCH,
        Error::Aborted { .. } => code::ABORTED,
        Error::Timeout { .. } => code::TIMEOUT,
        Error::PeerLost { .. } => code::PEER_LOST,
        Error::InvalidArgument(_) => code::INVALID,
        _ => code::OTHER,
    }
}

/// What one rank observed in one error case.
struct Local {
    verdict: Verdict,
    code: u8,
}

impl Local {
    fn new(verdict: Verdict, code: u8) -> Local {
        Local { verdict, code }
    }
}

/// What an error case gets besides its communicator.
struct ECx<'a> {
    cx: Cx<'a>,
    /// The suite's communicator (healthy; only for [`ECx::sync`]).
    parent: &'a Communicator,
}

impl ECx<'_> {
    /// A barrier on the suite's communicator: every rank has got this far, whatever state
    /// the case's communicator is in. Every rank must call it at the same points.
    fn sync(&self) -> Result<(), Local> {
        self.parent
            .barrier()
            .map_err(|e| Local::new(Err(format!("barrier on the suite's communicator failed: {e}")), code::OTHER))
    }
}

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

/// The name of the local-only case run by [`local_thread_exit`].
pub const THREAD_EXIT_CASE: &str = "errors/peer_lost/thread_exit_local";

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
    let mut slot = Some(fresh_communicator(parent)?);
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

// ---------------------------------------------------------------- helpers

fn comm_of(slot: &Option<Communicator>) -> Result<&Communicator, Local> {
    slot.as_ref().ok_or_else(|| Local::new(Err("the case's communicator is missing".into()), code::OTHER))
}

macro_rules! get_comm {
    ($slot:expr) => {
        match comm_of($slot) {
            Ok(c) => c,
            Err(l) => return l,
        }
    };
}

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

// ---------------------------------------------------------------- invalid arguments

fn invalid_root(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
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
        v.expect(&format!("gather(root={root})"), c.gather(&buf, Some(&mut big), root));
        v.expect(&format!("scatter(root={root})"), c.scatter(Some(&big), &mut out, root));
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

fn invalid_lengths(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
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
            c.reduce_into(&four, Some(&mut five), ReduceOp::Sum, root),
        );
        v.expect("reduce_into at the root (no output)", c.reduce_into(&four, None, ReduceOp::Sum, root));
        v.expect("broadcast_into at the root (input 4, output 5)", c.broadcast_into(Some(&four), &mut five, root));
        v.expect("broadcast_into at the root (no input)", c.broadcast_into(None, &mut five, root));
        v.expect("gather at the root (output != n * input)", c.gather(&four, Some(&mut vec![0f32; 4 * n + 2]), root));
        v.expect("gather at the root (no output)", c.gather(&four, None, root));
        v.expect(
            "scatter at the root (input != n * output)",
            c.scatter(Some(&vec![0f32; 4 * n + 3]), &mut [0f32; 4], root),
        );
        v.expect("scatter at the root (no input)", c.scatter(None, &mut [0f32; 4], root));
    }
    v.finish(comm, &cx.cx)
}

fn invalid_not_divisible(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
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

fn invalid_count_lists(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
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

fn invalid_new_group(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
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

fn invalid_peer(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
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
fn invalid_algorithm(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
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
                OpKind::Gather => c.gather(&x[..1], Some(&mut y), me),
                OpKind::Scatter => c.scatter(Some(&x), &mut y[..1], me),
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

// ---------------------------------------------------------------- mismatches

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

fn mismatch_ops(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    let own = |r: usize| if r == 0 { OpKind::Barrier } else { OpKind::AllToAll };
    mismatch(slot, own, |c| {
        if c.rank() == 0 {
            c.barrier()
        } else {
            c.all_to_all(&vec![1u32; c.world_size()], &mut vec![0u32; c.world_size()])
        }
    })
}

fn mismatch_ops_all_reduce(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
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

fn mismatch_count(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    mismatch(
        slot,
        |_| OpKind::AllToAll,
        |c| {
            let len = c.world_size() * if c.rank() == 0 { 2 } else { 3 };
            c.all_to_all(&vec![1u32; len], &mut vec![0u32; len])
        },
    )
}

fn mismatch_count_all_reduce(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    mismatch(
        slot,
        |_| OpKind::AllReduce,
        |c| {
            let len = if c.rank() == 0 { 8 } else { 9 };
            c.all_reduce(&mut vec![1f32; len], ReduceOp::Sum)
        },
    )
}

fn mismatch_dtype(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
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

fn mismatch_dtype_all_reduce(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
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

fn mismatch_root(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    mismatch(
        slot,
        |_| OpKind::Broadcast,
        |c| {
            let root = if c.rank() == 0 { 0 } else { c.world_size() - 1 };
            c.broadcast(&mut [5u8; 8], root)
        },
    )
}

fn mismatch_reduce_op(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
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

fn mismatch_algorithm(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
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

// ---------------------------------------------------------------- timeouts

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

fn verdict_of(problems: Vec<String>) -> Verdict {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// A warm-up barrier on the case's communicator, then a barrier on the suite's, so that
/// every rank is past the warm-up before anything is expected to fail.
fn warm_up(c: &Communicator, cx: &ECx) -> Result<(), Local> {
    let r = c.barrier();
    cx.sync()?;
    r.map_err(|e| Local::new(Err(format!("the warm-up barrier failed: {e}")), code_of(&e)))
}

/// Rank 1 never joins a scatter from root 1 (sequence number 1 after the warm-up). Rank 0
/// waits on it with a 200 ms deadline and must report the timeout precisely; the other
/// ranks wait with a 10 s deadline and must end with an error (told by rank 0, or their own
/// timeout) rather than hang.
fn timeout_scatter(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
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
fn timeout_all_reduce(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
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

// ---------------------------------------------------------------- abort

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

fn abort_self(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    abort_case(slot, |_| true)
}

fn abort_propagates(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
    abort_case(slot, |r| r == 0)
}

// ---------------------------------------------------------------- lost peers

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
fn peer_lost_dropped(slot: &mut Option<Communicator>, cx: &ECx) -> Local {
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

/// Local backend only: rank 1's thread returns (dropping its communicator) while the others
/// wait in a scatter from root 1; they must get [`Error::PeerLost`] naming rank 1 promptly.
/// Returns `None` when the case is not selected.
///
/// # Errors
/// Those of [`oxccl::local::run`].
pub fn local_thread_exit(n: usize, opts: &SuiteOptions) -> oxccl::Result<Option<CaseReport>> {
    if !opts.selects(THREAD_EXIT_CASE) {
        return Ok(None);
    }
    let t = Instant::now();
    let mut case = CaseReport { name: THREAD_EXIT_CASE.into(), status: Status::Passed, elapsed: Duration::ZERO };
    if n < 2 {
        case.status = Status::Skipped("needs at least 2 ranks".into());
        return Ok(Some(case));
    }
    let results = oxccl::local::run(n, |comm| -> Verdict {
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

// ---------------------------------------------------------------- receive mismatches

/// Rank 0 sends `send` to rank 1, which receives into `recv`; rank 1 must get a Mismatch
/// (checked by `check`) and be poisoned afterwards.
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
        0 => match send(&c) {
            Ok(()) => Local::new(Ok(()), code::OK),
            Err(e) => Local::new(Err(format!("rank 0: the send failed: {e}")), code_of(&e)),
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

fn recv_wrong_dtype(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
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

fn recv_too_long(slot: &mut Option<Communicator>, _cx: &ECx) -> Local {
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
