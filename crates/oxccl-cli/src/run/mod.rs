//! `oxccl run`: the launcher (like torchrun). It hosts the rendezvous store on node 0,
//! starts this node's ranks with the environment oxccl (and torch) read, prefixes their
//! output, forwards signals, and fails fast: when one rank fails, the others are stopped
//! (SIGTERM, then SIGKILL after a grace period) and a one-line summary per rank is printed.
//!
//! Exits are seen as they happen: a thread per rank blocks in `waitid` until its process
//! exits and timestamps it ([`spawn::watch_exit`]), and the supervision loop wakes on that
//! notice. Signals reach it the same way ([`signals::Catcher`]), and otherwise it sleeps
//! until its next deadline (the timeout, the end of the grace period): while the ranks run
//! the launcher takes no CPU time from them (it used to look every 10 ms, a hundred
//! preemptions a second of ranks that own every core). When one rank dies, the ranks that
//! lose it often exit (with an error code) within a millisecond; the summary blames the
//! first cause ([`summary::first_cause`]): among the failures seen together, a rank killed
//! by a signal before those that exited with an error, then the earliest. The others are
//! listed as consequences.
//!
//! - [`rendezvous`]: the job secret and the store;
//! - [`spawn`]: each rank's environment and process;
//! - [`bind`]: which CPU each rank runs on (`--bind-to`);
//! - [`output`]: forwarding output with `[rank R] ` prefixes;
//! - [`signals`]: catching and sending signals;
//! - [`summary`]: how the job ended, as lines and an exit code.

pub mod bind;
pub mod output;
pub mod rendezvous;
pub mod signals;
pub mod spawn;
pub mod summary;

use std::ffi::OsString;
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use spawn::{Output, Placement};
use summary::{Cause, End, Failure, JobReport, RankEnd, Stop};

/// The default grace period between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);

/// How often the launcher looks at ranks whose exit no thread watches (none, unless a
/// watcher could not start); exits, signals and deadlines wake it at once.
const POLL: Duration = Duration::from_millis(10);

/// How long the launcher waits, once every rank has exited, for their last output.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// What wakes the supervision loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notice {
    /// The rank at this index of the launcher's list exited; when that was seen.
    Exit(usize, Instant),
    /// The launcher caught this signal.
    Signal(i32),
}

/// Everything `oxccl run` needs to start a job on this node.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// Ranks to start on this node.
    pub nproc: usize,
    /// Number of nodes in the job.
    pub nnodes: usize,
    /// This node's index, in `0..nnodes`.
    pub node_rank: usize,
    /// The store's host; default 127.0.0.1 on a single node, required on several.
    pub master_addr: Option<String>,
    /// The store's port; default a free port on a single node, required on several.
    pub master_port: Option<u16>,
    /// The job secret's text; generated when absent on a single node, required on several.
    pub secret: Option<String>,
    /// Stop the job after this long.
    pub timeout: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when stopping ranks.
    pub grace: Duration,
    /// The program each rank runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// How rank 0's output reaches the user (the others' is always prefixed).
    pub rank0_output: Output,
    /// More environment variables for every rank.
    pub extra_env: Vec<(String, String)>,
    /// Where the ranks run ([`bind`]).
    pub bind: bind::BindTo,
    /// Elastic: replacements the launcher may start in all (0: fail fast).
    pub max_restarts: usize,
    /// Elastic: below this many running ranks a failure ends the job.
    pub min_ranks: usize,
}

impl LaunchSpec {
    /// A single-node spec running `program args…` on `nproc` ranks with every default.
    pub fn local(nproc: usize, program: OsString, args: Vec<OsString>) -> LaunchSpec {
        LaunchSpec {
            nproc,
            nnodes: 1,
            node_rank: 0,
            master_addr: None,
            master_port: None,
            secret: None,
            timeout: None,
            grace: DEFAULT_GRACE,
            program,
            args,
            rank0_output: Output::Prefixed,
            extra_env: Vec::new(),
            bind: bind::BindTo::None,
            max_restarts: 0,
            min_ranks: 1,
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.nproc == 0 {
            return Err("-n must be at least 1 (the number of ranks to start on this node)".into());
        }
        if self.nnodes == 0 {
            return Err("--nnodes must be at least 1".into());
        }
        if self.node_rank >= self.nnodes {
            return Err(format!(
                "--node-rank {} is out of range for --nnodes {}: number the nodes 0 to {}",
                self.node_rank,
                self.nnodes,
                self.nnodes - 1
            ));
        }
        if self.nnodes > 1 {
            if self.master_addr.is_none() {
                return Err("a job on several nodes needs --master-addr: the address of node 0, where the \
                            rendezvous store runs, reachable from every node"
                    .into());
            }
            if self.master_port.is_none_or(|p| p == 0) {
                return Err("a job on several nodes needs --master-port: a free port on node 0, the same \
                            on every node (e.g. 29500)"
                    .into());
            }
        }
        if self.program.is_empty() {
            return Err("no program to run: put it after `--`, e.g. `oxccl run -n 2 -- python train.py`".into());
        }
        Ok(())
    }
}

/// One running rank.
struct Proc {
    /// Its global rank.
    rank: usize,
    /// Its index among this node's ranks (its slot: a replacement takes the same).
    local: usize,
    /// Whether a replacement was started for it (it failed and the job went on).
    replaced: bool,
    /// Its process (the leader of its own process group).
    child: Child,
    /// Whether a thread watches for its exit ([`spawn::watch_exit`]); if not, it is polled.
    watched: bool,
    /// How it ended, once reaped.
    end: Option<End>,
    /// When its exit was first seen: by its watching thread, or by the launcher's `try_wait`.
    seen: Option<Instant>,
    /// The strongest signal the launcher sent it.
    stopped: Option<Stop>,
}

impl Proc {
    /// Records that the rank's exit was seen at `at` (keeping the earliest sighting).
    fn saw_exit(&mut self, at: Instant) {
        self.seen = Some(self.seen.map_or(at, |s| s.min(at)));
    }

    /// Reaps the rank if it has exited; `at` is when that was noticed. A watched rank that
    /// turns out to be running (its watcher's wait failed) is polled from then on.
    fn reap(&mut self, at: Instant) {
        if self.end.is_some() {
            return;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => self.end = Some(End::from_status(status)),
            Ok(None) => {
                self.watched = false;
                return;
            }
            // The child cannot be waited for (should not happen): count it as failed.
            Err(_) => self.end = Some(End::Code(-1)),
        }
        self.saw_exit(at);
    }

    /// Signals the rank's process group, unless the rank has already exited (a rank that
    /// finished on its own is not reported as stopped by the launcher).
    fn signal(&mut self, sig: i32, stop: Stop) {
        if self.end.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.end = Some(End::from_status(status));
                self.saw_exit(Instant::now());
                return;
            }
            if signals::signal_group(self.child.id(), sig) {
                self.stopped = self.stopped.max(Some(stop));
            }
        }
    }
}

/// Runs the job described by `spec` on this node and reports how it ended. Prints nothing
/// itself except the ranks' output; the caller prints the summary.
///
/// # Errors
/// When the job cannot start: invalid options, no secret for a multi-node job, the store
/// cannot be hosted, the signal handlers cannot be installed, or the program cannot be
/// started (ranks already started are then killed).
pub fn launch(spec: &LaunchSpec) -> Result<JobReport, String> {
    spec.check()?;
    let secret = rendezvous::secret(spec.secret.as_deref(), spec.nnodes)?;
    let host = spec.master_addr.clone().unwrap_or_else(|| "127.0.0.1".to_string());
    let store = if spec.node_rank == 0 {
        Some(rendezvous::HostedStore::bind(&host, spec.master_port.unwrap_or(0), &secret)?)
    } else {
        None
    };
    let port = store.as_ref().map(|s| s.port()).or(spec.master_port).unwrap_or(0);
    let placement = Placement {
        nproc: spec.nproc,
        nnodes: spec.nnodes,
        node_rank: spec.node_rank,
        master_addr: host,
        master_port: port,
    };

    // Catch signals before any rank exists, so none can be orphaned by an early Ctrl-C.
    let (exit_tx, exit_rx) = mpsc::channel::<Notice>();
    let signal_tx = exit_tx.clone();
    let catcher = signals::Catcher::install(move |sig| signal_tx.send(Notice::Signal(sig)).is_ok())
        .map_err(|e| format!("could not install the launcher's signal handlers: {e}"))?;
    let (done_tx, done_rx) = mpsc::channel();
    let cpus = bind::cpus_for(spec.bind, spec.nproc, &oxccl::tuning::allowed_cpus())?;
    let mut forwarders = Vec::new();
    // Starts the rank of slot `local` as `procs[index]`; a replacement joins (OXCCL_JOIN).
    let mut start = |local: usize, index: usize, join: bool| -> Result<Proc, String> {
        let rank = placement.rank(local);
        let mut env: Vec<(String, String)> =
            placement.env(local, secret.text()).into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        env.extend(spec.extra_env.iter().cloned());
        if join {
            env.push(("OXCCL_JOIN".into(), "1".into()));
        }
        let how = if rank == 0 && !join { spec.rank0_output } else { Output::Prefixed };
        let cpu = cpus.as_ref().map(|c| c[local]);
        let mut child = spawn::spawn(&spec.program, &spec.args, &env, how, cpu).map_err(|e| {
            format!(
                "could not start `{}` for rank {rank}: {e}; check the program's name, your PATH and its permissions",
                spec.program.to_string_lossy()
            )
        })?;
        let prefix = output::prefix(rank);
        let pipes = [
            child.stdout.take().map(|p| output::spawn(p, output::Sink::Stdout, prefix.clone(), done_tx.clone())),
            child.stderr.take().map(|p| output::spawn(p, output::Sink::Stderr, prefix.clone(), done_tx.clone())),
        ];
        let tx = exit_tx.clone();
        // Without a watcher (no thread to be had) the rank is polled, as precisely as POLL.
        let watched = spawn::watch_exit(child.id(), move |at| {
            let _ = tx.send(Notice::Exit(index, at));
        })
        .is_ok();
        let mut proc = Proc { rank, local, replaced: false, child, watched, end: None, seen: None, stopped: None };
        for p in pipes.into_iter().flatten() {
            match p {
                Ok(f) => forwarders.push(f),
                Err(e) => {
                    abandon(std::slice::from_mut(&mut proc));
                    return Err(format!("could not start a thread to forward rank {rank}'s output: {e}"));
                }
            }
        }
        Ok(proc)
    };
    let mut procs: Vec<Proc> = Vec::with_capacity(spec.nproc);
    for local in 0..spec.nproc {
        match start(local, procs.len(), false) {
            Ok(p) => procs.push(p),
            Err(e) => {
                abandon(&mut procs);
                return Err(e);
            }
        }
    }
    let elastic = Elastic { restarts_left: spec.max_restarts, min_ranks: spec.min_ranks, total: spec.max_restarts };
    let mut reports = Reports { store: store.as_ref().map(|s| (s, &secret)), client: None, read: Default::default() };
    let report = supervise(&mut procs, &exit_rx, spec.timeout, spec.grace, elastic, &mut start, &mut reports);
    drop(reports);
    // `start` (which borrowed the senders) is done: the last senders of exits and output go.
    drop(exit_tx);
    drop(done_tx);
    drop(catcher);
    output::finish(forwarders, &done_rx, Instant::now() + OUTPUT_DRAIN);
    if let Some(s) = store {
        s.shutdown();
    }
    Ok(report)
}

/// Kills and reaps ranks started before a failure to start the others.
fn abandon(procs: &mut [Proc]) {
    for p in procs.iter_mut() {
        signals::signal_group(p.child.id(), signal_hook::consts::SIGKILL);
        let _ = p.child.wait();
    }
}

/// What the failed ranks reported before they ended (the peer each lost, under
/// `oxccl::bootstrap::env::lost_peer_key`), read from the store this launcher hosts when a
/// failure must be blamed; connected on first use, each rank read once.
struct Reports<'a> {
    store: Option<(&'a rendezvous::HostedStore, &'a oxccl::bootstrap::auth::Secret)>,
    client: Option<Option<oxccl::bootstrap::store::StoreClient>>,
    read: std::collections::HashMap<usize, Option<usize>>,
}

impl Reports<'_> {
    /// The rank that `rank` reported losing, if it did.
    fn lost(&mut self, rank: usize) -> Option<usize> {
        if let Some(&r) = self.read.get(&rank) {
            return r;
        }
        let store = self.store;
        let client = self.client.get_or_insert_with(|| store.and_then(|(s, secret)| s.client(secret)));
        let lost = client.as_ref().and_then(|c| {
            let v = c.get(&oxccl::bootstrap::env::lost_peer_key(rank)).ok()??;
            String::from_utf8(v).ok()?.trim().parse().ok()
        });
        self.read.insert(rank, lost);
        lost
    }
}

/// The elastic launch's budget (`--max-restarts`, `--min-ranks`).
#[derive(Debug, Clone, Copy)]
struct Elastic {
    /// Replacements that may still be started.
    restarts_left: usize,
    /// Below this many running ranks a failure stops the job.
    min_ranks: usize,
    /// `--max-restarts`, for messages.
    total: usize,
}

/// Starts a replacement for every rank that failed on its own while the elastic budget
/// allows it (restarts left, and at least `min_ranks` others running); each replacement
/// joins the survivors (`OXCCL_JOIN`). Returns an error message when one cannot start.
fn replace_failed(
    procs: &mut Vec<Proc>,
    elastic: &mut Elastic,
    start: &mut dyn FnMut(usize, usize, bool) -> Result<Proc, String>,
) -> Result<(), String> {
    loop {
        let running = procs.iter().filter(|p| p.end.is_none()).count();
        let Some(i) = procs.iter().position(|p| !p.replaced && p.stopped.is_none() && p.end.is_some_and(|e| !e.ok()))
        else {
            return Ok(());
        };
        if elastic.restarts_left == 0 || running < elastic.min_ranks {
            return Ok(());
        }
        let (rank, local, end) = (procs[i].rank, procs[i].local, procs[i].end.unwrap_or(End::Code(-1)));
        let index = procs.len();
        let replacement = match start(local, index, true) {
            Ok(p) => p,
            Err(e) => {
                // No more restarts: the failure is blamed and stops the job as without them.
                elastic.restarts_left = 0;
                return Err(e);
            }
        };
        procs[i].replaced = true;
        procs.push(replacement);
        elastic.restarts_left -= 1;
        eprintln!(
            "oxccl run: rank {rank} failed ({end}); starting a replacement that joins the {running} running rank{} \
             (restart {} of {})",
            if running == 1 { "" } else { "s" },
            elastic.total - elastic.restarts_left,
            elastic.total
        );
    }
}

/// Watches the ranks until all have exited, stopping them all on the first failure, a
/// signal to the launcher or the timeout; under `elastic`, a failure starts a replacement
/// instead while the budget allows ([`replace_failed`]). `notices` brings each watched
/// rank's exit (its index in `procs`, and when) and each caught signal; between them the
/// loop sleeps until its next deadline ([`next_wake`]).
fn supervise(
    procs: &mut Vec<Proc>,
    notices: &mpsc::Receiver<Notice>,
    timeout: Option<Duration>,
    grace: Duration,
    mut elastic: Elastic,
    spawn_rank: &mut dyn FnMut(usize, usize, bool) -> Result<Proc, String>,
    reports: &mut Reports<'_>,
) -> JobReport {
    use signal_hook::consts::{SIGKILL, SIGTERM};
    let start = Instant::now();
    let mut cause: Option<Cause> = None;
    // When the ranks still running get SIGKILL, and how that is reported; set once the stop begins.
    let mut kill_at: Option<Instant> = None;
    let mut kill_as = Stop::Kill;
    let mut killed = false;
    loop {
        // Sleep until a notice or the next deadline; then take every notice already sent.
        let wake = next_wake(procs, start, cause.is_some(), timeout, kill_at.filter(|_| !killed));
        let first = match wake {
            Some(at) => notices.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => notices.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        let first = match first {
            Ok(notice) => Some(notice),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // No watcher and no catcher is left to send (they end with the job, so
                // this should not happen): poll.
                std::thread::sleep(POLL);
                None
            }
        };
        let mut sigs = Vec::new();
        for notice in first.into_iter().chain(notices.try_iter()) {
            match notice {
                Notice::Exit(i, at) => {
                    if let Some(p) = procs.get_mut(i) {
                        p.saw_exit(at);
                        p.reap(at);
                    }
                }
                Notice::Signal(sig) => sigs.push(sig),
            }
        }
        let now = Instant::now();
        for p in procs.iter_mut().filter(|p| !p.watched) {
            p.reap(now);
        }
        if cause.is_none() {
            if let Err(e) = replace_failed(procs, &mut elastic, spawn_rank) {
                eprintln!("oxccl run: {e}; stopping the job");
            }
        }
        let all_done = procs.iter().all(|p| p.end.is_some());
        if all_done {
            sigs.clear();
        }
        // Passed on (the ranks' flight recorders dump), not a reason to stop.
        let (passed, sigs): (Vec<i32>, Vec<i32>) = sigs.into_iter().partition(|s| signals::PASSED.contains(s));
        for sig in passed {
            for p in procs.iter().filter(|p| p.end.is_none()) {
                signals::signal_group(p.child.id(), sig);
            }
        }
        let timed_out = timeout.is_some_and(|t| now.duration_since(start) >= t);
        if cause.is_none() {
            // A rank's failure that came before the signal or the deadline is still the
            // cause; otherwise wait a moment for simultaneous failures before choosing.
            let decide_now = all_done || !sigs.is_empty() || timed_out;
            cause = blame(procs, start, now, decide_now, reports);
        }
        if all_done {
            break;
        }
        for sig in sigs {
            if kill_at.is_none() {
                // The first signal is forwarded as is; the ranks get the grace period.
                cause.get_or_insert(Cause::Signal(sig));
                procs.iter_mut().for_each(|p| p.signal(sig, Stop::Forwarded(sig)));
                kill_at = Some(now + grace);
            } else {
                // Another signal while stopping: the user is impatient, kill now.
                kill_at = Some(now);
                kill_as = Stop::KillNow;
            }
        }
        if cause.is_none() && timed_out {
            cause = timeout.map(Cause::Timeout);
        }
        if cause.is_some() && kill_at.is_none() {
            procs.iter_mut().for_each(|p| p.signal(SIGTERM, Stop::Term));
            kill_at = Some(now + grace);
        }
        if !killed && kill_at.is_some_and(|k| now >= k) {
            procs.iter_mut().for_each(|p| p.signal(SIGKILL, kill_as));
            killed = true;
        }
    }
    let since = |at: Option<Instant>| at.map(|a| a.saturating_duration_since(start));
    let end = |p: &Proc| RankEnd {
        rank: p.rank,
        end: p.end.unwrap_or(End::Code(-1)),
        stopped: p.stopped,
        seen: since(p.seen),
    };
    let mut ranks: Vec<RankEnd> = procs.iter().filter(|p| !p.replaced).map(end).collect();
    ranks.sort_by_key(|r| r.rank);
    let replaced = procs.iter().filter(|p| p.replaced).map(end).collect();
    JobReport { ranks, cause, grace, replaced }
}

/// When the supervision loop must look again without a notice: the timeout (until a cause
/// is chosen), the end of the wait for simultaneous failures ([`blame`]), `kill_at` (the end
/// of the grace period, until the kill is sent), and every [`POLL`] while a rank's exit has
/// no watcher. `None`: only a notice can change anything.
fn next_wake(
    procs: &[Proc],
    start: Instant,
    decided: bool,
    timeout: Option<Duration>,
    kill_at: Option<Instant>,
) -> Option<Instant> {
    let deadline = timeout.filter(|_| !decided).and_then(|t| start.checked_add(t));
    // Once a cause is chosen, later failures change nothing.
    let failures_seen = if decided {
        None
    } else {
        // The end of the wait for simultaneous failures, then of the wait for a reported
        // cause ([`blame`]).
        let now = Instant::now();
        failed_on_their_own(procs).map(|(_, _, seen)| seen).min().and_then(|first| {
            [first + summary::SIMULTANEOUS, first + REPORTED_CAUSE_WAIT].into_iter().find(|&t| t > now)
        })
    };
    let poll = procs.iter().any(|p| !p.watched && p.end.is_none()).then(|| Instant::now() + POLL);
    [deadline, failures_seen, kill_at, poll].into_iter().flatten().min()
}

/// The ranks that failed without the launcher stopping them, with how they ended and when
/// their exit was seen.
fn failed_on_their_own(procs: &[Proc]) -> impl Iterator<Item = (usize, End, Instant)> + '_ {
    procs
        .iter()
        .filter(|p| p.stopped.is_none() && !p.replaced)
        .filter_map(|p| Some((p.rank, p.end.filter(|e| !e.ok())?, p.seen?)))
}

/// The rank failure that stops the job, if one is due: the [`summary::first_cause`] of the
/// ranks that failed on their own, once [`summary::SIMULTANEOUS`] has passed since the first
/// of them was seen (so that ranks dying together are compared), or at once with `now`.
fn blame(procs: &[Proc], start: Instant, at: Instant, now: bool, reports: &mut Reports) -> Option<Cause> {
    let failures: Vec<Failure> = failed_on_their_own(procs)
        .map(|(rank, end, seen)| Failure { rank, end, seen: seen.saturating_duration_since(start), lost: None })
        .collect();
    let first_seen = failures.iter().map(|f| f.seen).min()?;
    if !now && at.saturating_duration_since(start) < first_seen + summary::SIMULTANEOUS {
        return None;
    }
    let failures: Vec<Failure> = failures.into_iter().map(|f| Failure { lost: reports.lost(f.rank), ..f }).collect();
    // Every failure so far reports losing a rank that still runs: that rank is most likely
    // failing too (an exception being handled); wait a little for it before blaming.
    let running = |r: usize| procs.iter().any(|p| p.rank == r && p.end.is_none() && !p.replaced);
    let waiting_for_cause = failures.iter().all(|f| f.lost.is_some_and(|p| p != f.rank && running(p)));
    if !now && waiting_for_cause && at.saturating_duration_since(start) < first_seen + REPORTED_CAUSE_WAIT {
        return None;
    }
    summary::first_cause(&failures).map(|f| Cause::RankFailed { rank: f.rank, end: f.end })
}

/// How long the launcher waits for a rank that every failed rank reports losing, while it
/// still runs, before blaming the failures it has.
const REPORTED_CAUSE_WAIT: Duration = Duration::from_secs(1);

/// Prints the summary of a failed job to stderr (nothing on success).
pub fn print_summary(report: &JobReport) {
    if let Some(h) = report.headline() {
        eprintln!("{h}");
        for line in report.lines() {
            eprintln!("  {line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_with_advice() {
        let base = LaunchSpec::local(2, "true".into(), vec![]);
        assert!(base.check().is_ok());
        let e = LaunchSpec { nproc: 0, ..base.clone() }.check().unwrap_err();
        assert!(e.contains("-n"), "{e}");
        let e = LaunchSpec { nnodes: 2, node_rank: 2, ..base.clone() }.check().unwrap_err();
        assert!(e.contains("--node-rank"), "{e}");
        let e = LaunchSpec { nnodes: 2, ..base.clone() }.check().unwrap_err();
        assert!(e.contains("--master-addr"), "{e}");
        let e = LaunchSpec { nnodes: 2, master_addr: Some("10.0.0.1".into()), ..base.clone() }.check().unwrap_err();
        assert!(e.contains("--master-port"), "{e}");
        let e = LaunchSpec { program: OsString::new(), ..base }.check().unwrap_err();
        assert!(e.contains("--"), "{e}");
    }

    #[test]
    fn a_short_job_runs_and_succeeds() {
        let r = launch(&LaunchSpec::local(2, "true".into(), vec![])).unwrap();
        assert!(r.succeeded(), "{r:?}");
        assert_eq!(r.ranks.len(), 2);
    }

    /// This thread's voluntary context switches so far (each one a sleep it woke from).
    fn wakeups() -> i64 {
        // SAFETY: rusage is plain data that getrusage fills; RUSAGE_THREAD is this thread.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: the pointer is to `usage`, which lives across the call.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) }, 0);
        usage.ru_nvcsw
    }

    #[test]
    fn the_launcher_sleeps_while_its_ranks_run() {
        // Supervision runs on the calling thread. It used to look every 10 ms, about 80
        // wake-ups in this job; now only the rank's exit (and the end of the job's own
        // threads) wakes it.
        let before = wakeups();
        let r = launch(&LaunchSpec::local(2, "sleep".into(), vec!["0.8".into()])).unwrap();
        let woke = wakeups() - before;
        assert!(r.succeeded(), "{r:?}");
        assert!(woke < 25, "the launcher woke {woke} times in a job of 0.8 s");
    }

    #[test]
    fn a_program_that_does_not_exist_is_reported() {
        let e = launch(&LaunchSpec::local(2, "/nonexistent/program".into(), vec![])).unwrap_err();
        assert!(e.contains("rank 0") && e.contains("PATH"), "{e}");
    }
}
