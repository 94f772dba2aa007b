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

/// Why the launcher stopped the ranks that were still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// This rank failed first.
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
}

fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s}s")
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

    /// The headline of a failed job (`oxccl run: ...`), or `None` on success.
    pub fn headline(&self) -> Option<String> {
        let stopped = self.ranks.iter().filter(|r| r.stopped.is_some()).count();
        let other = if matches!(self.cause, Some(Cause::RankFailed { .. })) { " other" } else { "" };
        let others = if stopped == 0 {
            String::new()
        } else {
            format!("; stopped {stopped}{other} rank{}", if stopped == 1 { "" } else { "s" })
        };
        match self.cause {
            None if self.succeeded() => None,
            None => Some("oxccl run: the job failed".to_string()),
            Some(Cause::RankFailed { rank, end }) => Some(format!("oxccl run: rank {rank} failed: {end}{others}")),
            Some(c @ Cause::Timeout(_)) => Some(format!("oxccl run: {c}{others}")),
            Some(Cause::Signal(s)) => Some(format!("oxccl run: received {}{others}", signal_name(s))),
        }
    }

    /// One line per rank: `rank 2: exit code 1`, `rank 3: killed by signal 9 (SIGKILL)`,
    /// `rank 0: terminated by the launcher after rank 2 failed`.
    pub fn lines(&self) -> Vec<String> {
        self.ranks.iter().map(|r| self.line(r)).collect()
    }

    fn line(&self, r: &RankEnd) -> String {
        let Some(stop) = r.stopped else {
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
        JobReport { ranks, cause, grace: Duration::from_secs(3) }
    }

    fn ok(rank: usize) -> RankEnd {
        RankEnd { rank, end: End::Code(0), stopped: None }
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
        let failed = RankEnd { rank: 1, end: End::Code(3), stopped: None };
        let term = RankEnd { rank: 0, end: End::Signal(15), stopped: Some(Stop::Term) };
        let kill = RankEnd { rank: 2, end: End::Signal(9), stopped: Some(Stop::Kill) };
        let r = report(vec![term, failed, kill], Some(Cause::RankFailed { rank: 1, end: End::Code(3) }));
        assert!(!r.succeeded());
        assert_eq!(r.exit_code(), 3);
        assert_eq!(r.headline().unwrap(), "oxccl run: rank 1 failed: exit code 3; stopped 2 other ranks");
        assert_eq!(
            r.lines(),
            vec![
                "rank 0: terminated by the launcher after rank 1 failed (SIGTERM)",
                "rank 1: exit code 3",
                "rank 2: terminated by the launcher after rank 1 failed (SIGKILL: it was still running 3s after SIGTERM)",
            ]
        );
    }

    #[test]
    fn signals_timeouts_and_codes() {
        let killed = RankEnd { rank: 3, end: End::Signal(9), stopped: None };
        assert_eq!(report(vec![killed], None).lines(), vec!["rank 3: killed by signal 9 (SIGKILL)"]);
        let r = report(vec![killed], Some(Cause::RankFailed { rank: 3, end: End::Signal(9) }));
        assert_eq!(r.exit_code(), 137);

        let handled = RankEnd { rank: 0, end: End::Code(143), stopped: Some(Stop::Term) };
        let r = report(vec![handled], Some(Cause::Timeout(Duration::from_millis(1500))));
        assert_eq!(r.exit_code(), 124);
        assert_eq!(r.headline().unwrap(), "oxccl run: the job's timeout of 1.5s passed; stopped 1 rank");
        assert_eq!(
            r.lines(),
            vec!["rank 0: terminated by the launcher after the job's timeout of 1.5s passed (it then exited with code 143)"]
        );

        let int = RankEnd { rank: 0, end: End::Signal(2), stopped: Some(Stop::Forwarded(2)) };
        let now = RankEnd { rank: 1, end: End::Signal(9), stopped: Some(Stop::KillNow) };
        let late = RankEnd { rank: 2, end: End::Signal(9), stopped: Some(Stop::Kill) };
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
        assert_eq!(report(vec![RankEnd { rank: 0, end: End::Code(300), stopped: None }], None).exit_code(), 1);
    }
}
