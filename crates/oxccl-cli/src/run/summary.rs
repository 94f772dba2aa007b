//! How a job ended: each rank's end, why the launcher stopped the job, the one-line-per-rank
//! summary printed on failure, and the launcher's exit code.

use std::fmt;
use std::time::Duration;

use super::signals::signal_name;

/// How one rank's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl End {
    /// Whether this end counts as success (exit code 0).
    pub fn ok(self) -> bool {
        self == End::Code(0)
    }

    /// Whether this end looks like a reaction to a lost peer rather than a first cause: an
    /// exit code other than 0 (what a rank returns once its communicator reports a lost peer),
    /// or SIGPIPE (what a program that does not ignore it gets when it writes to a dead
    /// peer's socket). Any other signal (SIGKILL, SIGSEGV, SIGTERM from outside, ...) came
    /// to the rank itself.
    fn may_be_a_reaction(self) -> bool {
        !matches!(self, End::Signal(s) if s != libc::SIGPIPE)
    }

    /// The end of a finished child.
    pub fn from_status(status: std::process::ExitStatus) -> End {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(c), _) => End::Code(c),
            (None, Some(s)) => End::Signal(s),
            // Neither a code nor a signal (stopped/continued are never reported by wait): treat
            // as a failure rather than guess success.
            (None, None) => End::Code(-1),
        }
    }
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            End::Code(c) => write!(f, "exit code {c}"),
            End::Signal(s) => write!(f, "killed by signal {s} ({})", signal_name(s)),
        }
    }
}

/// How long after the first failure seen the launcher still counts other failures as
/// simultaneous with it when choosing the first cause (see [`first_cause`]). Exits are
/// timestamped by a thread per rank as they happen, but those threads may be scheduled a few
/// milliseconds late on a busy machine, while a rank that loses a peer may exit within a
/// millisecond of it.
pub const SIMULTANEOUS: Duration = Duration::from_millis(30);

/// A rank that ended badly on its own (not stopped by the launcher): a candidate first cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// The rank.
    pub rank: usize,
    /// How it ended.
    pub end: End,
    /// When the launcher saw it end, since the job started.
    pub seen: Duration,
    /// The rank it reported losing before it ended, if it said (oxccl's ranks do under
    /// `oxccl run`: see `oxccl::bootstrap::env::lost_peer_key`).
    pub lost: Option<usize>,
}

/// The failure that caused the others, among `failures`. First what the ranks said: a rank
/// that reported losing another rank that also failed is a consequence, whenever it was
/// seen. Among the others (all of them when every one is a consequence, a cycle), timing
/// decides, for ranks that said nothing (killed by SIGKILL): of those seen within
/// [`SIMULTANEOUS`] of the first one seen, a rank killed by a signal (see
/// [`End::may_be_a_reaction`]) before one that exited with an error code (which ranks do
/// right after losing a peer), then the earliest seen, then the lowest rank. `None` when
/// there is no failure.
pub fn first_cause(failures: &[Failure]) -> Option<Failure> {
    let failed = |r: usize| failures.iter().any(|f| f.rank == r);
    let causes: Vec<Failure> =
        failures.iter().filter(|f| !f.lost.is_some_and(|p| p != f.rank && failed(p))).copied().collect();
    let pool = if causes.is_empty() { failures } else { &causes[..] };
    let first = pool.iter().map(|f| f.seen).min()?;
    pool.iter()
        .filter(|f| f.seen <= first + SIMULTANEOUS)
        .min_by_key(|f| (f.end.may_be_a_reaction(), f.seen, f.rank))
        .copied()
}

/// Why the launcher stopped the ranks that were still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// This rank failed first (see [`first_cause`]).
    RankFailed {
        /// The rank.
        rank: usize,
        /// How it ended.
        end: End,
    },
    /// The job ran past `--timeout`.
    Timeout(Duration),
    /// The launcher received this signal (and forwarded it).
    Signal(i32),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Cause::RankFailed { rank, .. } => write!(f, "rank {rank} failed"),
            Cause::Timeout(t) => write!(f, "the job's timeout of {} passed", fmt_duration(t)),
            Cause::Signal(s) => write!(f, "oxccl run received {}", signal_name(s)),
        }
    }
}

/// The strongest signal the launcher sent to a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stop {
    /// The signal the launcher received, forwarded (SIGINT, SIGTERM, SIGHUP, SIGQUIT).
    Forwarded(i32),
    /// SIGTERM, asking it to stop.
    Term,
    /// SIGKILL, after the grace period.
    Kill,
    /// SIGKILL at once, because the launcher received a second signal.
    KillNow,
}

/// One rank's end as the launcher saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankEnd {
    /// The global rank.
    pub rank: usize,
    /// How its process ended.
    pub end: End,
    /// The launcher's signal, if it had to stop this rank.
    pub stopped: Option<Stop>,
    /// When the launcher saw it end, since the job started (`None`: not known).
    pub seen: Option<Duration>,
}

/// A finished job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobReport {
    /// Every rank of this node, in rank order.
    pub ranks: Vec<RankEnd>,
    /// Why the job was stopped, if it was.
    pub cause: Option<Cause>,
    /// The grace period between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Ranks that failed and were replaced (`--max-restarts`), in the order they failed:
    /// not counted in [`succeeded`](Self::succeeded).
    pub replaced: Vec<RankEnd>,
}

fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s}s")
    }
}

/// A short gap between two exits: `4ms`, `under 1ms`, `1.2s`.
fn fmt_gap(d: Duration) -> String {
    match d.as_millis() {
        0 => "under 1ms".to_string(),
        ms @ 1..=999 => format!("{ms}ms"),
        _ => format!("{:.1}s", d.as_secs_f64()),
    }
}

impl JobReport {
    /// Whether every rank exited with code 0 and nothing stopped the job.
    pub fn succeeded(&self) -> bool {
        self.cause.is_none() && self.ranks.iter().all(|r| r.end.ok())
    }

    /// The launcher's exit code: 0 on success; the first failed rank's exit code (or 128 +
    /// its signal); 124 after a timeout (like `timeout(1)`); 128 + the signal received.
    pub fn exit_code(&self) -> i32 {
        let clamp = |c: i32| if (1..=255).contains(&c) { c } else { 1 };
        match self.cause {
            Some(Cause::RankFailed { end: End::Code(c), .. }) => clamp(c),
            Some(Cause::RankFailed { end: End::Signal(s), .. }) | Some(Cause::Signal(s)) => clamp(128 + s),
            Some(Cause::Timeout(_)) => 124,
            None => match self.ranks.iter().find(|r| !r.end.ok()) {
                Some(r) => match r.end {
                    End::Code(c) => clamp(c),
                    End::Signal(s) => clamp(128 + s),
                },
                None => 0,
            },
        }
    }

    /// The rank that failed first, when a rank's failure stopped the job.
    fn first_failed(&self) -> Option<&RankEnd> {
        match self.cause {
            Some(Cause::RankFailed { rank, .. }) => self.ranks.iter().find(|r| r.rank == rank),
            _ => None,
        }
    }

    /// Whether `r` failed on its own after the rank that failed first (it was not stopped
    /// by the launcher): most likely because it lost that rank.
    fn is_consequence(&self, r: &RankEnd) -> bool {
        matches!(self.cause, Some(Cause::RankFailed { rank, .. }) if rank != r.rank)
            && r.stopped.is_none()
            && !r.end.ok()
    }

    /// The headline of a failed job (`oxccl run: ...`), or `None` on success.
    pub fn headline(&self) -> Option<String> {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        let stopped = self.ranks.iter().filter(|r| r.stopped.is_some()).count();
        let other = if matches!(self.cause, Some(Cause::RankFailed { .. })) { " other" } else { "" };
        let others =
            if stopped == 0 { String::new() } else { format!("; stopped {stopped}{other} rank{}", plural(stopped)) };
        let after = self.ranks.iter().filter(|r| self.is_consequence(r)).count();
        let consequences = if after == 0 {
            String::new()
        } else {
            format!(
                "; {after} other rank{} then failed on {}",
                plural(after),
                if after == 1 { "its own" } else { "their own" }
            )
        };
        match self.cause {
            None if self.succeeded() => None,
            None => Some("oxccl run: the job failed".to_string()),
            Some(Cause::RankFailed { rank, end }) => {
                Some(format!("oxccl run: rank {rank} failed first: {end}{consequences}{others}"))
            }
            Some(c @ Cause::Timeout(_)) => Some(format!("oxccl run: {c}{others}")),
            Some(Cause::Signal(s)) => Some(format!("oxccl run: received {}{others}", signal_name(s))),
        }
    }

    /// One line per rank: `rank 2: exit code 1, the first to fail`, `rank 3: killed by
    /// signal 9 (SIGKILL)`, `rank 1: exit code 1, 2ms after rank 2 failed (a consequence)`,
    /// `rank 0: terminated by the launcher after rank 2 failed (SIGTERM)`.
    pub fn lines(&self) -> Vec<String> {
        let replaced =
            self.replaced.iter().map(|r| format!("rank {}: {}, then replaced (--max-restarts)", r.rank, r.end));
        self.ranks.iter().map(|r| self.line(r)).chain(replaced).collect()
    }

    fn line(&self, r: &RankEnd) -> String {
        let Some(stop) = r.stopped else {
            let first = self.first_failed();
            if first.is_some_and(|f| f.rank == r.rank) {
                return format!("rank {}: {}, the first to fail", r.rank, r.end);
            }
            if let Some(f) = first.filter(|_| self.is_consequence(r)) {
                let when = match (r.seen, f.seen) {
                    (Some(mine), Some(theirs)) if mine >= theirs => format!("{} after", fmt_gap(mine - theirs)),
                    // Seen a little before the first failure (see `first_cause`).
                    (Some(mine), Some(theirs)) => format!("within {} of when", fmt_gap(theirs - mine)),
                    _ => "after".to_string(),
                };
                return format!("rank {}: {}, {when} rank {} failed (a consequence)", r.rank, r.end, f.rank);
            }
            return format!("rank {}: {}", r.rank, r.end);
        };
        let why = self.cause.map(|c| format!(" after {c}")).unwrap_or_default();
        let first = match self.cause {
            Some(Cause::Signal(s)) => signal_name(s),
            _ => "SIGTERM".to_string(),
        };
        let how = match (stop, r.end) {
            (Stop::Kill, End::Signal(9)) => {
                format!(" (SIGKILL: it was still running {} after {first})", fmt_duration(self.grace))
            }
            (Stop::KillNow, End::Signal(9)) => {
                " (SIGKILL: oxccl run got a second signal before it stopped)".to_string()
            }
            (_, End::Signal(s)) => format!(" ({})", signal_name(s)),
            (_, End::Code(c)) => format!(" (it then exited with code {c})"),
        };
        format!("rank {}: terminated by the launcher{why}{how}", r.rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(ranks: Vec<RankEnd>, cause: Option<Cause>) -> JobReport {
        JobReport { ranks, cause, grace: Duration::from_secs(3), replaced: Vec::new() }
    }

    fn ok(rank: usize) -> RankEnd {
        RankEnd { rank, end: End::Code(0), stopped: None, seen: None }
    }

    #[test]
    fn success_is_quiet_and_exits_zero() {
        let r = report(vec![ok(0), ok(1)], None);
        assert!(r.succeeded());
        assert_eq!(r.exit_code(), 0);
        assert_eq!(r.headline(), None);
        assert_eq!(r.lines(), vec!["rank 0: exit code 0", "rank 1: exit code 0"]);
    }

    #[test]
    fn a_failed_rank_names_itself_and_the_stopped_ones() {
        let failed = RankEnd { rank: 1, end: End::Code(3), stopped: None, seen: None };
        let term = RankEnd { rank: 0, end: End::Signal(15), stopped: Some(Stop::Term), seen: None };
        let kill = RankEnd { rank: 2, end: End::Signal(9), stopped: Some(Stop::Kill), seen: None };
        let r = report(vec![term, failed, kill], Some(Cause::RankFailed { rank: 1, end: End::Code(3) }));
        assert!(!r.succeeded());
        assert_eq!(r.exit_code(), 3);
        assert_eq!(r.headline().unwrap(), "oxccl run: rank 1 failed first: exit code 3; stopped 2 other ranks");
        assert_eq!(
            r.lines(),
            vec![
                "rank 0: terminated by the launcher after rank 1 failed (SIGTERM)",
                "rank 1: exit code 3, the first to fail",
                "rank 2: terminated by the launcher after rank 1 failed (SIGKILL: it was still running 3s after SIGTERM)",
            ]
        );
    }

    #[test]
    fn signals_timeouts_and_codes() {
        let killed = RankEnd { rank: 3, end: End::Signal(9), stopped: None, seen: None };
        assert_eq!(report(vec![killed], None).lines(), vec!["rank 3: killed by signal 9 (SIGKILL)"]);
        let r = report(vec![killed], Some(Cause::RankFailed { rank: 3, end: End::Signal(9) }));
        assert_eq!(r.exit_code(), 137);

        let handled = RankEnd { rank: 0, end: End::Code(143), stopped: Some(Stop::Term), seen: None };
        let r = report(vec![handled], Some(Cause::Timeout(Duration::from_millis(1500))));
        assert_eq!(r.exit_code(), 124);
        assert_eq!(r.headline().unwrap(), "oxccl run: the job's timeout of 1.5s passed; stopped 1 rank");
        assert_eq!(
            r.lines(),
            vec!["rank 0: terminated by the launcher after the job's timeout of 1.5s passed (it then exited with code 143)"]
        );

        let int = RankEnd { rank: 0, end: End::Signal(2), stopped: Some(Stop::Forwarded(2)), seen: None };
        let now = RankEnd { rank: 1, end: End::Signal(9), stopped: Some(Stop::KillNow), seen: None };
        let late = RankEnd { rank: 2, end: End::Signal(9), stopped: Some(Stop::Kill), seen: None };
        let r = report(vec![now, late], Some(Cause::Signal(2)));
        assert_eq!(
            r.lines(),
            vec![
                "rank 1: terminated by the launcher after oxccl run received SIGINT (SIGKILL: oxccl run got a second \
                 signal before it stopped)",
                "rank 2: terminated by the launcher after oxccl run received SIGINT (SIGKILL: it was still running 3s \
                 after SIGINT)",
            ]
        );
        let r = report(vec![int], Some(Cause::Signal(2)));
        assert_eq!(r.exit_code(), 130);
        assert_eq!(r.headline().unwrap(), "oxccl run: received SIGINT; stopped 1 rank");
        assert_eq!(r.lines(), vec!["rank 0: terminated by the launcher after oxccl run received SIGINT (SIGINT)"]);
        assert_eq!(
            report(vec![RankEnd { rank: 0, end: End::Code(300), stopped: None, seen: None }], None).exit_code(),
            1
        );
    }

    fn failure(rank: usize, end: End, seen_ms: u64) -> Failure {
        Failure { rank, end, seen: Duration::from_millis(seen_ms), lost: None }
    }

    #[test]
    fn the_first_cause_is_the_killed_rank_not_the_ones_that_lost_it() {
        assert_eq!(first_cause(&[]), None);
        // The survivor's exit was timestamped first, but within the same moment as the
        // SIGKILL: the signal is the cause.
        let survivor = failure(0, End::Code(1), 100);
        let killed = failure(1, End::Signal(9), 102);
        assert_eq!(first_cause(&[survivor, killed]), Some(killed));
        assert_eq!(first_cause(&[killed, survivor]), Some(killed));
        // A signal well after the first failure is a consequence like any other.
        let late = failure(1, End::Signal(9), 100 + SIMULTANEOUS.as_millis() as u64 + 50);
        assert_eq!(first_cause(&[survivor, late]), Some(survivor));
        // SIGPIPE is what a rank gets writing to a dead peer: no preference.
        let pipe = failure(2, End::Signal(libc::SIGPIPE), 101);
        assert_eq!(first_cause(&[pipe, survivor]), Some(survivor));
        // Among exit codes (or among signals): the earliest seen, then the lowest rank.
        let a = failure(3, End::Code(2), 105);
        let b = failure(2, End::Code(1), 103);
        assert_eq!(first_cause(&[a, b]), Some(b));
        let c = failure(1, End::Code(1), 103);
        assert_eq!(first_cause(&[a, b, c]), Some(c));
    }

    #[test]
    fn what_the_ranks_report_decides_before_timing() {
        // Rank 0 raised an exception (exit 1) and rank 1, which lost it, exited 1 earlier
        // (the race the issue saw): rank 1 said it lost rank 0, so rank 0 is the cause.
        let r0 = failure(0, End::Code(1), 20);
        let r1 = Failure { lost: Some(0), ..failure(1, End::Code(1), 5) };
        assert_eq!(first_cause(&[r0, r1]), Some(r0));
        assert_eq!(first_cause(&[r1, r0]), Some(r0));
        // Even seen long after: a report is not a matter of timing.
        let late = failure(0, End::Code(1), 5_000);
        assert_eq!(first_cause(&[late, r1]), Some(late));
        // A report naming a rank that did not fail (it was stopped, or is fine) says nothing.
        let r2 = Failure { lost: Some(3), ..failure(2, End::Code(1), 1) };
        assert_eq!(first_cause(&[r0, r2]), Some(r2));
        // Each names the other (a cycle): timing decides among them.
        let a = Failure { lost: Some(1), ..failure(0, End::Code(1), 10) };
        let b = Failure { lost: Some(0), ..failure(1, End::Code(1), 12) };
        assert_eq!(first_cause(&[a, b]), Some(a));
    }

    #[test]
    fn the_others_are_listed_as_consequences() {
        let ms = |m: u64| Some(Duration::from_millis(m));
        let killed = RankEnd { rank: 1, end: End::Signal(9), stopped: None, seen: ms(10) };
        let before = RankEnd { rank: 0, end: End::Code(1), stopped: None, seen: ms(9) };
        let after = RankEnd { rank: 2, end: End::Code(1), stopped: None, seen: ms(14) };
        let fine = RankEnd { rank: 3, end: End::Code(0), stopped: None, seen: ms(12) };
        let term = RankEnd { rank: 4, end: End::Signal(15), stopped: Some(Stop::Term), seen: ms(40) };
        let r =
            report(vec![before, killed, after, fine, term], Some(Cause::RankFailed { rank: 1, end: End::Signal(9) }));
        assert_eq!(r.exit_code(), 137);
        assert_eq!(
            r.headline().unwrap(),
            "oxccl run: rank 1 failed first: killed by signal 9 (SIGKILL); 2 other ranks then failed on their own; \
             stopped 1 other rank"
        );
        assert_eq!(
            r.lines(),
            vec![
                "rank 0: exit code 1, within 1ms of when rank 1 failed (a consequence)",
                "rank 1: killed by signal 9 (SIGKILL), the first to fail",
                "rank 2: exit code 1, 4ms after rank 1 failed (a consequence)",
                "rank 3: exit code 0",
                "rank 4: terminated by the launcher after rank 1 failed (SIGTERM)",
            ]
        );
        let unknown = RankEnd { seen: None, ..after };
        let r = report(vec![killed, unknown], Some(Cause::RankFailed { rank: 1, end: End::Signal(9) }));
        assert_eq!(r.lines()[1], "rank 2: exit code 1, after rank 1 failed (a consequence)");
        assert!(r.headline().unwrap().ends_with("; 1 other rank then failed on its own"), "{:?}", r.headline());
        assert_eq!(fmt_gap(Duration::from_micros(300)), "under 1ms");
        assert_eq!(fmt_gap(Duration::from_millis(1234)), "1.2s");
    }
}
