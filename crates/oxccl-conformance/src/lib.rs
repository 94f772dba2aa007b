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
pub mod reference;
pub mod report;
pub mod tolerance;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use oxccl::Communicator;

pub use element::TestElement;
pub use report::{CaseReport, Failure, Report, Status};

/// The seed used when none is given.
pub const DEFAULT_SEED: u64 = 0x0C0F_FEE0_DDBA_11AD;

/// Which cases to run, and how.
///
/// Every rank must pass equal options: they decide the sequence of cases.
///
/// Equality compares [`gpu`](Self::gpu) by the device it names (`cuda:0`, ...), not by the
/// runtime behind it.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Seed of every input (a failure reproduces from the seed and the case name).
    pub seed: u64,
    /// Run only cases whose name matches one of these patterns (all cases when empty; see
    /// [`pattern_matches`]). Names look like `all_reduce/f32/sum/ring/in_place`, `p2p/batch_all_pairs/i32`,
    /// `errors/mismatch/dtype`.
    pub filter: Vec<String>,
    /// Skip cases whose name matches one of these patterns.
    pub skip: Vec<String>,
    /// A reduced matrix: fewer dtypes and element counts, every op, reduce op and algorithm.
    pub quick: bool,
    /// Deadline of every call the suite makes, except where a case sets its own
    /// (a failure shows up as a timeout instead of a hang).
    pub timeout: Duration,
    /// Device placement: when set, every buffer a case passes to a communicator call is
    /// first copied to this GPU ([`oxccl::DeviceBuffer`]), the call runs on the device
    /// copy, and the outputs are copied back to the host before they are checked. `None`
    /// (the default): the calls get the host buffers themselves. The suite's own
    /// bookkeeping calls and the error cases always use host buffers.
    pub gpu: Option<oxccl::Gpu>,
    /// Print each case's name to stderr as it starts, and its time when it ends
    /// (`OXCCL_CONFORMANCE_PROGRESS=1`): a run stopped from outside (a device check's time
    /// limit) then shows which case it was in.
    pub progress: bool,
}

impl PartialEq for SuiteOptions {
    fn eq(&self, other: &Self) -> bool {
        self.seed == other.seed
            && self.filter == other.filter
            && self.skip == other.skip
            && self.quick == other.quick
            && self.timeout == other.timeout
            && self.progress == other.progress
            && self.gpu.as_ref().map(oxccl::Gpu::device) == other.gpu.as_ref().map(oxccl::Gpu::device)
    }
}

impl Eq for SuiteOptions {}

impl Default for SuiteOptions {
    fn default() -> Self {
        SuiteOptions {
            seed: DEFAULT_SEED,
            filter: Vec::new(),
            skip: Vec::new(),
            quick: false,
            timeout: Duration::from_secs(60),
            gpu: None,
            progress: false,
        }
    }
}

impl SuiteOptions {
    /// Every case, default seed and timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Options from the environment: `OXCCL_CONFORMANCE_FILTER` and `OXCCL_CONFORMANCE_SKIP`
    /// (comma-separated patterns), `OXCCL_CONFORMANCE_SEED` (integer),
    /// `OXCCL_CONFORMANCE_QUICK` and `OXCCL_CONFORMANCE_PROGRESS` (`1`/`true`), `OXCCL_CONFORMANCE_TIMEOUT` (seconds, or `250ms`, `2m` ...),
    /// `OXCCL_CONFORMANCE_DEVICE` (device placement, see [`gpu`](Self::gpu): unset, empty or
    /// `cpu` for host buffers; `cuda`, `cuda:N`, `rocm`, `rocm:N` for that GPU, ordinal 0
    /// when omitted).
    ///
    /// Unset or unparsable variables keep the defaults; a bad `OXCCL_CONFORMANCE_DEVICE`,
    /// or a GPU that cannot be opened, is reported on stderr and the suite runs on host
    /// buffers. Use [`try_from_env`](Self::try_from_env) to get that as an error instead.
    pub fn from_env() -> Self {
        let mut o = Self::from_env_host();
        match gpu_from_env() {
            Ok(gpu) => o.gpu = gpu,
            Err(e) => eprintln!("oxccl-conformance: {e}; running on host buffers"),
        }
        o
    }

    /// [`from_env`](Self::from_env), except that a bad `OXCCL_CONFORMANCE_DEVICE` is an error.
    ///
    /// # Errors
    /// `OXCCL_CONFORMANCE_DEVICE` is not one of `cpu`, `cuda`, `cuda:N`, `rocm`, `rocm:N`, or
    /// names a GPU that cannot be opened ([`oxccl::Gpu::of`] failed: no runtime, no such
    /// device); the message names the variable.
    pub fn try_from_env() -> Result<Self, String> {
        let mut o = Self::from_env_host();
        o.gpu = gpu_from_env()?;
        Ok(o)
    }

    /// The options of [`from_env`](Self::from_env) but the device.
    fn from_env_host() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let list = |v: String| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        let mut o = SuiteOptions::default();
        if let Some(v) = var("OXCCL_CONFORMANCE_FILTER") {
            o.filter = list(v);
        }
        if let Some(v) = var("OXCCL_CONFORMANCE_SKIP") {
            o.skip = list(v);
        }
        if let Some(s) = var("OXCCL_CONFORMANCE_SEED").and_then(|v| v.trim().parse().ok()) {
            o.seed = s;
        }
        if let Some(v) = var("OXCCL_CONFORMANCE_QUICK") {
            o.quick = matches!(v.trim(), "1" | "true" | "yes");
        }
        if let Some(v) = var("OXCCL_CONFORMANCE_PROGRESS") {
            o.progress = matches!(v.trim(), "1" | "true" | "yes");
        }
        let timeout = var("OXCCL_CONFORMANCE_TIMEOUT").and_then(|v| oxccl::config::parse_duration(&v).ok());
        if let Some(t) = timeout.filter(|t| !t.is_zero()) {
            o.timeout = t;
        }
        o
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Adds patterns to the filter: only cases whose name contains one of them run.
    pub fn only<S: Into<String>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.filter.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// Adds patterns of cases to skip.
    pub fn skipping<S: Into<String>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.skip.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// Chooses the reduced matrix.
    pub fn quick(mut self, quick: bool) -> Self {
        self.quick = quick;
        self
    }

    /// Sets the deadline of the suite's calls.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Chooses device placement on `gpu` (see [`gpu`](Self::gpu)): every buffer a case
    /// passes to a communicator call is copied to `gpu` first and its outputs copied back
    /// before they are checked. Every rank of a run should place its buffers on a GPU (its
    /// own, or the same one), or none.
    pub fn on_gpu(mut self, gpu: oxccl::Gpu) -> Self {
        self.gpu = Some(gpu);
        self
    }

    /// Whether the case named `name` runs under these options.
    pub fn selects(&self, name: &str) -> bool {
        (self.filter.is_empty() || self.filter.iter().any(|p| pattern_matches(p, name)))
            && !self.skip.iter().any(|p| pattern_matches(p, name))
    }
}

/// The GPU `OXCCL_CONFORMANCE_DEVICE` names (`None` for unset, empty or `cpu`), opened.
fn gpu_from_env() -> Result<Option<oxccl::Gpu>, String> {
    const VAR: &str = "OXCCL_CONFORMANCE_DEVICE";
    let raw = match std::env::var(VAR) {
        Ok(v) => v,
        Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => return Err(format!("{VAR}={v:?} is not valid UTF-8")),
    };
    if raw.trim().is_empty() {
        return Ok(None);
    }
    let device = match raw.parse::<oxccl::Device>() {
        Ok(oxccl::Device::Cpu) => return Ok(None),
        Ok(d) => d,
        Err(e) => return Err(format!("{VAR}={raw:?}: {e}")),
    };
    oxccl::Gpu::of(device).map(Some).map_err(|e| format!("{VAR}={raw:?}: cannot open {device}: {e}"))
}

/// Whether a filter pattern matches a case name: `^prefix` matches names that start with
/// `prefix`, any other pattern names that contain it (`reduce/` also matches
/// `all_reduce/...`; `^reduce/` does not).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix('^') {
        Some(prefix) => name.starts_with(prefix),
        None => name.contains(pattern),
    }
}

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

/// A communicator with the same ranks as `parent`, fresh (its own sequence numbers and
/// failure state).
pub(crate) fn fresh_communicator(parent: &Communicator) -> Result<Communicator, String> {
    let (n, me) = (parent.world_size(), parent.rank());
    match parent.split(Some(0), me as i64) {
        Ok(Some(c)) if c.world_size() == n && c.rank() == me => Ok(c),
        Ok(Some(c)) => Err(format!(
            "split(Some(0), rank) of the suite's communicator gave rank {} of {}, expected rank {me} of {n}; \
             the remaining cases are not run",
            c.rank(),
            c.world_size()
        )),
        Ok(None) => Err("split(Some(0), rank) of the suite's communicator returned None; \
                         the remaining cases are not run"
            .into()),
        Err(e) => Err(format!(
            "split(Some(0), rank) of the suite's communicator failed: {e}; the remaining cases are not run"
        )),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equality_compares_the_gpu_by_device() {
        let gpu = oxccl::testing::host_gpu(1, 0).unwrap();
        let host = SuiteOptions::new();
        assert_eq!(host, SuiteOptions::new());
        assert_ne!(host, host.clone().on_gpu(gpu.clone()));
        assert_eq!(host.clone().on_gpu(gpu.clone()), host.on_gpu(gpu));
    }
}
