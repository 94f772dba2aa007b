//! # oxccl-conformance: one suite that every oxccl backend must pass, unchanged
//!
//! Every rank calls [`run_suite`] with its own [`Communicator`] and the same
//! [`SuiteOptions`]; every rank then runs the same sequence of cases (so the suite works
//! across processes as well as across threads), and each returns a [`Report`] of its own
//! checks. [`run_local`] does this on the in-process `local` backend and merges the ranks'
//! reports.
//!
//! ```
//! let opts = oxccl_conformance::SuiteOptions::new().only(["broadcast/i32"]).quick(true);
//! let report = oxccl_conformance::run_local(3, &opts).unwrap();
//! assert!(report.is_success(), "{report}");
//! ```
//!
//! ## How a case checks a result
//!
//! Inputs are pseudo-random but a pure function of `(seed, case, rank, index)`
//! ([`inputs`]), so every rank generates every rank's input and computes the expected
//! result with the sequential [`reference`](mod@reference) implementations, without extra communication.
//! Results are compared exactly (integers, data movement: bit for bit) or within the
//! tolerances stated in [`tolerance`] (floating-point reductions).
//!
//! ## Isolation
//!
//! Each case runs on a fresh communicator split off the one given to [`run_suite`]
//! (`comm.split(Some(0), rank)`), so a case that fails (and poisons its communicator, or
//! leaves unreceived messages behind) cannot disturb the next one. A failing call ends its
//! case and aborts the case's communicator so peers fail fast instead of waiting for their
//! deadlines; a wrong value is recorded and the case goes on, so all ranks keep issuing the
//! same calls. The error cases ([`errors`]) deliberately poison their communicators the
//! same way.
//!
//! ## Device placement
//!
//! With [`SuiteOptions::on_gpu`] (or `OXCCL_CONFORMANCE_DEVICE=cuda:0`, see
//! [`SuiteOptions::from_env`]) every buffer a case hands to a communicator call is first
//! copied to that GPU, the call runs on the device copy, and its outputs (and the inputs
//! checked for being unchanged) are copied back before the comparison; the same cases then
//! check a backend's device-buffer paths. Without it the calls get the host buffers
//! themselves.
//!
//! ## Coverage
//!
//! Every collective × every dtype ([`oxccl::DType::ALL`]) × every reduce op (for the
//! reductions) × every algorithm of the operation ([`oxccl::Algorithm::for_op`], plus
//! `Auto`) × element counts including 0, 1, primes, a count below the world size and a
//! larger one; in-place and out-of-place forms; roots 0, last and middle; uneven counts
//! with zeros for the `_v` variants; point-to-point send/recv/probe/batches; barrier;
//! split and new_group with two groups active at once; async operations in a scope;
//! bitwise agreement of float all_reduce results across ranks; and the error behaviour
//! (invalid arguments, mismatches, timeouts, abort, lost peers). [`case_names`] lists the
//! cases for a world size.

#![deny(missing_docs)]

mod cases;
mod check;
pub mod element;
pub mod errors;
pub mod inputs;
mod isolation;
mod options;
pub mod reference;
pub mod report;
pub mod tolerance;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use oxccl::Communicator;

use isolation::fresh_communicator;

pub use element::TestElement;
pub use options::{pattern_matches, SuiteOptions, DEFAULT_SEED};
pub use report::{CaseReport, Failure, Report, Status};

/// The names of the cases [`run_suite`] runs on a world of `world_size` ranks (error cases
/// included; cases that need more ranks are listed and reported as skipped).
pub fn case_names(world_size: usize, opts: &SuiteOptions) -> Vec<String> {
    let mut v: Vec<String> =
        cases::build(world_size, opts).into_iter().map(|c| c.name).filter(|n| opts.selects(n)).collect();
    v.extend(errors::names(opts));
    v
}

/// Runs the whole suite (collective cases, then error cases) on this rank. Every rank of
/// `comm` must call it with equal options; each returns its own [`Report`]
/// (merge them with [`Report::merge`]).
///
/// `comm` itself only creates a fresh communicator per case and must stay healthy; it is
/// used with [`SuiteOptions::timeout`] as deadline.
pub fn run_suite(comm: &Communicator, opts: &SuiteOptions) -> Report {
    let mut report = run_collective_cases(comm, opts);
    report.extend(errors::run_error_cases(comm, opts));
    report
}

/// Runs only the collective (non-error) cases on this rank; see [`run_suite`].
pub fn run_collective_cases(comm: &Communicator, opts: &SuiteOptions) -> Report {
    let started = Instant::now();
    let (n, me) = (comm.world_size(), comm.rank());
    let parent = comm.with_timeout(opts.timeout);
    let mut report = Report::new(comm.backend(), n, me);
    let mut previous: Option<Communicator> = None;
    let mut broken: Option<String> = None;
    for case in cases::build(n, opts) {
        if !opts.selects(&case.name) {
            continue;
        }
        let t = Instant::now();
        let mut push = |status| report.cases.push(CaseReport { name: case.name.clone(), status, elapsed: t.elapsed() });
        if n < case.min_world {
            push(Status::Skipped(format!("needs at least {} ranks", case.min_world)));
            continue;
        }
        if let Some(why) = &broken {
            push(Status::Skipped(format!("not run: {why}")));
            continue;
        }
        let child = match fresh_communicator(&parent) {
            Ok(c) => c,
            Err(why) => {
                push(Status::Failed(vec![Failure { rank: me, message: why.clone() }]));
                broken = Some(why);
                continue;
            }
        };
        // The split is collective: every rank has finished the previous case.
        drop(previous.take());
        if opts.progress {
            eprintln!("[rank {me}] case {} ...", case.name);
        }
        let cx = check::Cx { seed: opts.seed, key: inputs::case_key(&case.name), opts };
        let verdict = catch_unwind(AssertUnwindSafe(|| (case.run)(&child, &cx))).unwrap_or_else(|panic| {
            child.abort("oxccl-conformance: the case panicked on this rank");
            Err(format!("the case panicked: {}", panic_message(&panic)))
        });
        if opts.progress {
            eprintln!(
                "[rank {me}] case {} {} in {:.3}s",
                case.name,
                if verdict.is_ok() { "ok" } else { "FAILED" },
                t.elapsed().as_secs_f64()
            );
        }
        push(match verdict {
            Ok(()) => Status::Passed,
            Err(message) => Status::Failed(vec![Failure { rank: me, message }]),
        });
        previous = Some(child);
    }
    report.elapsed = started.elapsed();
    report
}

/// Runs only the error cases on this rank; see [`errors`] and [`run_suite`].
pub fn run_error_cases(comm: &Communicator, opts: &SuiteOptions) -> Report {
    errors::run_error_cases(comm, opts)
}

/// Runs [`run_suite`] on a new `local` world of `n` ranks (threads of this process) and
/// merges the ranks' reports; the local-only error case (a rank's thread ends early) is
/// appended when selected.
///
/// # Errors
/// Those of [`oxccl::local::run`] (`n == 0`, unusable `OXCCL_*` configuration).
pub fn run_local(n: usize, opts: &SuiteOptions) -> oxccl::Result<Report> {
    run_local_in(&oxccl::Config::new(), n, opts)
}

/// [`run_local`] with a configuration on top of the environment's, every case `opts`
/// selects (the error cases too).
///
/// # Errors
/// The world could not be created.
pub fn run_local_in(cfg: &oxccl::Config, n: usize, opts: &SuiteOptions) -> oxccl::Result<Report> {
    let reports = oxccl::local::run_with(cfg, n, |comm| run_suite(&comm, opts))?;
    let mut report = Report::merge(reports);
    if let Some(case) = errors::local_thread_exit(cfg, n, opts)? {
        report.cases.push(case);
    }
    Ok(report)
}

/// [`run_local`] with a configuration (`OXCCL_CPU_FORCE_STAGING`, an algorithm, ...) on
/// top of the environment's; the collective cases only.
///
/// # Errors
/// The world could not be created.
pub fn run_local_with(cfg: &oxccl::Config, n: usize, opts: &SuiteOptions) -> oxccl::Result<Report> {
    let reports = oxccl::local::run_with(cfg, n, |comm| run_suite(&comm, opts))?;
    Ok(Report::merge(reports))
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}
