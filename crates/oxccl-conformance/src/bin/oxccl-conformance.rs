//! `oxccl-conformance`: the conformance suite as a program, one process per rank.
//!
//! ```text
//! oxccl run -n 4 target/release/oxccl-conformance
//! OXCCL_TRANSPORT=tcp OXCCL_CONFORMANCE_QUICK=1 oxccl run -n 8 target/release/oxccl-conformance
//! torchrun --nproc-per-node 2 target/release/oxccl-conformance    # with OXCCL_SECRET exported
//! ```
//!
//! Every rank joins the world with `oxccl::init()` (backend `cpu` unless `OXCCL_BACKEND`
//! says otherwise; rank, world and store from the launcher's environment), runs
//! [`run_suite`] with [`SuiteOptions::try_from_env`] (`OXCCL_CONFORMANCE_FILTER`, `_SKIP`,
//! `_SEED`, `_QUICK`, `_TIMEOUT`, `_DEVICE`; every rank must see the same values), and prints its own
//! failures, each line prefixed with its rank. The ranks then combine their outcomes with
//! an `all_reduce` on the world communicator, so every rank reaches the same verdict, and
//! rank 0 prints the world's totals as its last line:
//!
//! ```text
//! conformance: 1234 passed, 0 failed, 12 skipped
//! ```
//!
//! A case counts as failed when it failed on any rank, as skipped when it was skipped on
//! some rank and failed on none.
//!
//! Every rank also prints what it holds once the suite ran: `[rank R] resources:
//! threads=T fds=F sockets=S` (the scale test bounds them).
//!
//! Exit status: 0 when the whole world passed; 1 when a case failed on some rank (or the
//! final exchange failed: rank 0 then closes with its own counts, the exchange counted as
//! one more failure); 2 when this process could not join the world (the error is printed).

use std::process::ExitCode;
use std::time::Instant;

use oxccl::{Communicator, Config, ReduceOp};
use oxccl_conformance::{run_suite, Report, Status, SuiteOptions};

/// Per-case outcome codes, combined across ranks with `Max`.
const PASSED: u64 = 0;
const SKIPPED: u64 = 1;
const FAILED: u64 = 2;

/// The world's totals.
struct Totals {
    passed: u64,
    failed: u64,
    skipped: u64,
    /// Why the ranks' reports could not be combined case by case, if they could not.
    inconsistent: Option<String>,
}

impl Totals {
    fn success(&self) -> bool {
        self.failed == 0 && self.inconsistent.is_none()
    }

    fn line(&self) -> String {
        let mut s = format!("conformance: {} passed, {} failed", self.passed, self.failed);
        if self.skipped > 0 {
            s.push_str(&format!(", {} skipped", self.skipped));
        }
        s
    }
}

fn code_of(status: &Status) -> u64 {
    match status {
        Status::Passed => PASSED,
        Status::Skipped(_) => SKIPPED,
        Status::Failed(_) => FAILED,
    }
}

/// Combines every rank's report: one `all_reduce` to check that the ranks ran the same
/// number of cases, then one over the per-case outcomes (or, when the numbers differ, over
/// the per-rank counts). Every rank gets the same totals.
fn world_totals(comm: &Communicator, report: &Report) -> oxccl::Result<Totals> {
    let total = report.total() as u64;
    // [max of the totals, u64::MAX - min of the totals] in one call.
    let mut shape = [total, u64::MAX - total];
    comm.all_reduce(&mut shape, ReduceOp::Max)?;
    let (max, min) = (shape[0], u64::MAX - shape[1]);
    if max == min {
        let mut codes: Vec<u64> = report.cases.iter().map(|c| code_of(&c.status)).collect();
        comm.all_reduce(&mut codes, ReduceOp::Max)?;
        let count = |code| codes.iter().filter(|&&c| c == code).count() as u64;
        return Ok(Totals {
            passed: count(PASSED),
            failed: count(FAILED),
            skipped: count(SKIPPED),
            inconsistent: None,
        });
    }
    let mut counts = [report.passed() as u64, report.failed() as u64, report.skipped() as u64];
    comm.all_reduce(&mut counts, ReduceOp::Sum)?;
    let n = comm.world_size() as u64;
    Ok(Totals {
        passed: counts[0] / n,
        failed: counts[1].max(1),
        skipped: counts[2] / n,
        inconsistent: Some(format!(
            "the ranks ran different numbers of cases ({min} to {max}): they did not see the same \
             OXCCL_CONFORMANCE_* settings, or a rank's suite went wrong"
        )),
    })
}

/// This process's threads, open descriptors, and the sockets among them (from /proc; zeros
/// where it cannot be read).
fn resources() -> (usize, usize, usize) {
    let threads = std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0);
    let fds: Vec<std::path::PathBuf> =
        std::fs::read_dir("/proc/self/fd").map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    let sockets =
        fds.iter().filter(|p| std::fs::read_link(p).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))).count();
    (threads, fds.len(), sockets)
}

fn main() -> ExitCode {
    let started = Instant::now();
    // The cpu backend unless OXCCL_BACKEND names another (or `auto`).
    let cfg = match std::env::var("OXCCL_BACKEND") {
        Ok(v) if !v.trim().is_empty() => Config::new(),
        _ => Config::new().backend("cpu"),
    };
    let comm = match cfg.init() {
        Ok(c) => c,
        Err(e) => {
            let who = std::env::var("RANK").map(|r| format!("rank {r}")).unwrap_or_else(|_| "this process".into());
            eprintln!("oxccl-conformance: {who} could not join the world: {e}");
            return ExitCode::from(2);
        }
    };
    let (rank, n) = (comm.rank(), comm.world_size());
    // A device that cannot be opened ends the run (every rank opens it, and `oxccl run`
    // stops the others when one fails) instead of testing host buffers by mistake.
    let opts = match SuiteOptions::try_from_env() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("[rank {rank}] oxccl-conformance: {e}");
            return ExitCode::from(2);
        }
    };
    if rank == 0 {
        println!(
            "oxccl-conformance: backend `{}`, world size {n}, buffers on {}, {} suite, seed {:#x}{}{}",
            comm.backend(),
            opts.gpu.as_ref().map_or_else(|| "cpu".to_string(), |g| g.device().to_string()),
            if opts.quick { "quick" } else { "full" },
            opts.seed,
            if opts.filter.is_empty() { String::new() } else { format!(", only {:?}", opts.filter) },
            if opts.skip.is_empty() { String::new() } else { format!(", skipping {:?}", opts.skip) },
        );
    }

    let report = run_suite(&comm, &opts);

    for line in report.failure_details(usize::MAX, usize::MAX).lines() {
        println!("[rank {rank}] {line}");
    }
    println!(
        "[rank {rank}] {} cases: {} passed, {} failed, {} skipped in {:.2}s",
        report.total(),
        report.passed(),
        report.failed(),
        report.skipped(),
        report.elapsed.as_secs_f64()
    );

    let totals = match world_totals(&comm.with_timeout(opts.timeout), &report) {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "[rank {rank}] oxccl-conformance: combining the ranks' results failed: {e}; \
                 this rank's own result: {} passed, {} failed",
                report.passed(),
                report.failed()
            );
            if rank == 0 {
                // Still a closing line a script can match, counting the exchange as a failure.
                println!(
                    "conformance: {} passed, {} failed (rank 0's own results: the ranks' results could not be \
                     combined)",
                    report.passed(),
                    report.failed() + 1
                );
            }
            return ExitCode::from(1);
        }
    };
    // What this rank holds once the whole suite ran (the scale test bounds it).
    let (threads, fds, sockets) = resources();
    println!("[rank {rank}] resources: threads={threads} fds={fds} sockets={sockets}");
    if rank == 0 {
        if let Some(why) = &totals.inconsistent {
            println!("[rank 0] FAILED suite/consistency: {why}");
        }
        for (name, t) in report.slowest(3) {
            println!("[rank 0] slowest: {name} {:.3}s", t.as_secs_f64());
        }
        println!("oxccl-conformance: finished in {:.2}s", started.elapsed().as_secs_f64());
        println!("{}", totals.line());
    }
    if totals.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
