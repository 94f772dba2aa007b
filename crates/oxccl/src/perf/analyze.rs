//! What a set of flight-recorder dumps says about a job (`oxccl trace analyze DIR`): in plain
//! words, the first collective where ranks disagree, ranks that never entered a collective
//! the others are in (and what they last did), ranks without a dump (dead), operations that
//! failed, and the slowest rank (the straggler).
//!
//! Ranks are matched collective by collective: the n-th collective of a communicator on one
//! rank is the n-th on every other (point-to-point batches are per rank by nature and are
//! not compared). Clocks are aligned at the communicator's creation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use super::dump::{Dump, OpRecord, OpState};
use crate::error::{Error, Result};

/// One thing the dumps show.
#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    /// A rank of the communicator left no dump: its process died (SIGKILL writes nothing),
    /// or never reached a failure or a `SIGUSR1`.
    MissingDump {
        /// The communicator (see [`Dump::comm`]).
        comm: u64,
        /// The rank without a dump.
        rank: usize,
    },
    /// Ranks called different collectives (or the same with other arguments) at the same
    /// position: the first such position.
    Diverged {
        /// The communicator.
        comm: u64,
        /// The collective's position among the communicator's collectives (0, 1, ...).
        collective: usize,
        /// Each distinct call and the ranks that made it (with their sequence numbers).
        calls: Vec<(String, Vec<(usize, u64)>)>,
    },
    /// Some ranks are in (or failed in) a collective that others never entered.
    NeverEntered {
        /// The communicator.
        comm: u64,
        /// The collective's position.
        collective: usize,
        /// The call the other ranks are in.
        call: String,
        /// The ranks in it.
        inside: Vec<usize>,
        /// The ranks that never entered it, with the last operation they recorded.
        absent: Vec<(usize, Option<String>)>,
    },
    /// An operation ended with an error (the first per rank), or was still running when the
    /// dump was written.
    Unfinished {
        /// The communicator.
        comm: u64,
        /// The rank.
        rank: usize,
        /// The operation.
        call: String,
        /// Its state.
        state: OpState,
        /// The rank it waited on, where known.
        waiting_on: Option<usize>,
        /// The error, if it failed.
        error: Option<String>,
        /// How long it had been running when the dump was written (unfinished ones), in
        /// microseconds.
        running_us: Option<f64>,
    },
    /// The rank that entered collectives last most often (not a problem by itself).
    Straggler {
        /// The communicator.
        comm: u64,
        /// The rank.
        rank: usize,
        /// In how many collectives (completed by every rank) it was the last to enter.
        last_in: usize,
        /// Of how many.
        of: usize,
        /// How late it entered them, on average, after the first rank, in microseconds.
        mean_late_us: f64,
    },
}

impl Finding {
    /// Whether this finding is a problem: everything but a straggler, and an operation still
    /// running for less than [`STUCK_AFTER_US`] when the dump was written (a snapshot of a
    /// job that works).
    pub fn is_problem(&self) -> bool {
        match self {
            Finding::Straggler { .. } => false,
            Finding::Unfinished { state: OpState::Failed, .. } => true,
            Finding::Unfinished { running_us, .. } => running_us.is_none_or(|t| t >= STUCK_AFTER_US),
            _ => true,
        }
    }
}

fn ranks(rs: &[usize]) -> String {
    let s: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
    match s.len() {
        1 => format!("rank {}", s[0]),
        _ => format!("ranks {}", s.join(", ")),
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::MissingDump { comm, rank } => write!(
                f,
                "communicator {comm}: rank {rank} left no dump: its process died (a SIGKILL writes nothing) \
                 or it never failed nor got SIGUSR1"
            ),
            Finding::Diverged { comm, collective, calls } => {
                let parts: Vec<String> = calls
                    .iter()
                    .map(|(call, who)| {
                        let rs: Vec<usize> = who.iter().map(|w| w.0).collect();
                        let seqs: BTreeSet<u64> = who.iter().map(|w| w.1).collect();
                        let seqs: Vec<String> = seqs.iter().map(|s| s.to_string()).collect();
                        format!("{} called {call} (seq {})", ranks(&rs), seqs.join("/"))
                    })
                    .collect();
                write!(f, "communicator {comm}: the ranks diverged at collective #{collective}: {}", parts.join("; "))
            }
            Finding::NeverEntered { comm, collective, call, inside, absent } => {
                write!(f, "communicator {comm}: {} entered collective #{collective} ({call}), but", ranks(inside))?;
                for (i, (r, last)) in absent.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ";" };
                    match last {
                        Some(l) => write!(f, "{sep} rank {r} never did (its last operation: {l})")?,
                        None => write!(f, "{sep} rank {r} never did (it recorded no operation)")?,
                    }
                }
                Ok(())
            }
            Finding::Unfinished { comm, rank, call, state, waiting_on, error, running_us } => {
                let what = match state {
                    OpState::Failed => "failed in",
                    OpState::Queued => "had queued",
                    _ => "was still in",
                };
                write!(f, "communicator {comm}: rank {rank} {what} {call}")?;
                if let (OpState::Started | OpState::Queued, Some(t)) = (state, running_us) {
                    write!(f, " for {:.3} s", t / 1e6)?;
                }
                match (state, waiting_on) {
                    (OpState::Failed, Some(p)) => write!(f, " (the error names rank {p})")?,
                    (_, Some(p)) => write!(f, ", waiting on rank {p}")?,
                    _ => {}
                }
                if let Some(e) = error {
                    write!(f, ": {e}")?;
                }
                Ok(())
            }
            Finding::Straggler { comm, rank, last_in, of, mean_late_us } => write!(
                f,
                "communicator {comm}: the slowest rank is {rank}: it entered {last_in} of {of} collectives last, \
                 {mean_late_us:.1} us after the first rank on average"
            ),
        }
    }
}

/// An operation running this long when its dump was written counts as stuck (1 s).
pub const STUCK_AFTER_US: f64 = 1e6;

/// Everything found, communicator by communicator.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Analysis {
    /// The dumps read.
    pub dumps: usize,
    /// The findings, problems first within each communicator.
    pub findings: Vec<Finding>,
}

impl Analysis {
    /// Whether any finding is a problem.
    pub fn has_problems(&self) -> bool {
        self.findings.iter().any(Finding::is_problem)
    }
}

/// How a record reads in a finding: `seq 3 all_reduce(f32 × 4096, sum)`.
fn call(o: &OpRecord) -> String {
    let mut args = format!("{} × {}", o.dtype, o.count);
    if let Some(r) = &o.reduce {
        args.push_str(&format!(", {r}"));
    }
    if let Some(r) = o.root {
        args.push_str(&format!(", root {r}"));
    }
    format!("{}({args})", o.op)
}

fn is_collective(o: &OpRecord) -> bool {
    !matches!(o.op.as_str(), "send" | "recv" | "batch")
}

/// Reads every `oxccl-fr-*.json` file in `dir` and analyzes them.
///
/// # Errors
/// [`Error::Io`] when `dir` cannot be read; [`Error::InvalidArgument`] when it holds no
/// dump, or a file that is not one.
pub fn analyze(dir: &Path) -> Result<Analysis> {
    let mut dumps = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), &e))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("oxccl-fr-") && name.ends_with(".json") {
            dumps.push(Dump::read(&e.path())?);
        }
    }
    if dumps.is_empty() {
        return Err(Error::invalid(format!(
            "{} holds no flight-recorder dump (oxccl-fr-*.json); they are written to OXCCL_FR_DIR \
             (default: the temporary directory) on a failure or SIGUSR1",
            dir.display()
        )));
    }
    Ok(analyze_dumps(dumps))
}

/// Analyzes dumps (of one job; several communicators allowed).
pub fn analyze_dumps(dumps: Vec<Dump>) -> Analysis {
    let count = dumps.len();
    let mut groups: BTreeMap<(Option<String>, u64), BTreeMap<usize, Dump>> = BTreeMap::new();
    for d in dumps {
        groups.entry((d.job.clone(), d.comm)).or_default().insert(d.rank, d);
    }
    let mut findings = Vec::new();
    for ((_, comm), by_rank) in groups {
        findings.extend(communicator(comm, &by_rank));
    }
    Analysis { dumps: count, findings }
}

fn communicator(comm: u64, by_rank: &BTreeMap<usize, Dump>) -> Vec<Finding> {
    let mut out = Vec::new();
    let world = by_rank.values().map(|d| d.world_size).max().unwrap_or(0);
    for rank in 0..world {
        if !by_rank.contains_key(&rank) {
            out.push(Finding::MissingDump { comm, rank });
        }
    }
    // Each rank's collectives by position. A recorder that dropped old entries still
    // counts them: the position of its first kept collective is unknown, so positions are
    // counted from the newest, aligned on the ranks' sequence numbers of collectives.
    let colls: BTreeMap<usize, Vec<&OpRecord>> =
        by_rank.iter().map(|(r, d)| (*r, d.ops.iter().filter(|o| is_collective(o)).collect())).collect();
    let offset = |r: usize| -> usize {
        // Collectives before the first kept one: seq counts every operation, so this is
        // exact only without point-to-point traffic among the dropped ones.
        let d = &by_rank[&r];
        if d.dropped == 0 {
            0
        } else {
            colls[&r].first().map_or(0, |o| o.seq as usize)
        }
    };
    let longest = colls.iter().map(|(r, c)| offset(*r) + c.len()).max().unwrap_or(0);
    let at =
        |r: usize, i: usize| -> Option<&OpRecord> { i.checked_sub(offset(r)).and_then(|j| colls[&r].get(j).copied()) };
    let mut diverged = false;
    for i in 0..longest {
        let mut calls: BTreeMap<String, Vec<(usize, u64)>> = BTreeMap::new();
        let mut absent = Vec::new();
        for &r in by_rank.keys() {
            match at(r, i) {
                Some(o) => calls.entry(call(o)).or_default().push((r, o.seq)),
                None if i >= offset(r) => absent.push(r),
                None => {}
            }
        }
        if calls.len() > 1 {
            out.push(Finding::Diverged { comm, collective: i, calls: calls.into_iter().collect() });
            diverged = true;
            break;
        }
        // Ranks short of a collective that the others completed were only dumped earlier;
        // ranks short of one the others are stuck or failed in never entered it.
        let stuck = by_rank.keys().filter_map(|&r| at(r, i)).any(|o| o.state != OpState::Completed);
        if !absent.is_empty() && stuck {
            let (call, inside) =
                calls.into_iter().next().map(|(c, w)| (c, w.into_iter().map(|x| x.0).collect())).unwrap_or_default();
            let absent = absent
                .into_iter()
                .map(|r| {
                    let last =
                        by_rank[&r].ops.last().map(|o| format!("seq {} {} ({:?})", o.seq, self::call(o), o.state));
                    (r, last.map(|l| l.to_lowercase()))
                })
                .collect();
            out.push(Finding::NeverEntered { comm, collective: i, call, inside, absent });
            break;
        }
    }
    for (&r, d) in by_rank {
        if let Some(o) = d.ops.iter().find(|o| o.state != OpState::Completed) {
            out.push(Finding::Unfinished {
                comm,
                rank: r,
                call: format!("seq {} {}", o.seq, call(o)),
                state: o.state,
                waiting_on: o.waiting_on,
                error: o.error.clone(),
                running_us: (o.state != OpState::Failed).then(|| d.dumped_us - o.started_us.unwrap_or(o.enqueued_us)),
            });
        }
    }
    if !diverged && by_rank.len() > 1 {
        out.extend(straggler(comm, by_rank, &colls, longest, at));
    }
    out
}

/// The rank that entered the collectives every rank completed last most often.
fn straggler<'a>(
    comm: u64,
    by_rank: &BTreeMap<usize, Dump>,
    colls: &BTreeMap<usize, Vec<&'a OpRecord>>,
    longest: usize,
    at: impl Fn(usize, usize) -> Option<&'a OpRecord>,
) -> Option<Finding> {
    let _ = colls;
    let mut last_count: BTreeMap<usize, (usize, f64)> = BTreeMap::new();
    let mut of = 0;
    for i in 0..longest {
        let mut starts = Vec::new();
        for (&r, d) in by_rank {
            match at(r, i) {
                Some(o) if o.state == OpState::Completed => {
                    // Entered: when this rank submitted it (aligned on the creation).
                    starts.push((r, d.created_unix_us as f64 + o.enqueued_us));
                }
                _ => break,
            }
        }
        if starts.len() != by_rank.len() {
            continue;
        }
        of += 1;
        let first = starts.iter().map(|s| s.1).fold(f64::MAX, f64::min);
        let (r, t) = starts.iter().copied().fold((0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
        let e = last_count.entry(r).or_default();
        e.0 += 1;
        e.1 += t - first;
    }
    let (&rank, &(n, late)) = last_count.iter().max_by_key(|(_, v)| v.0)?;
    Some(Finding::Straggler { comm, rank, last_in: n, of, mean_late_us: late / n as f64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, op: &str, count: u64, state: OpState, start: f64) -> OpRecord {
        OpRecord {
            seq,
            op: op.into(),
            dtype: "f32".into(),
            count,
            bytes: count * 4,
            root: None,
            reduce: Some("sum".into()),
            state,
            enqueued_us: start,
            started_us: Some(start),
            ended_us: (state == OpState::Completed).then_some(start + 5.0),
            waiting_on: None,
            error: (state == OpState::Failed).then(|| "timed out".to_string()),
        }
    }

    fn dump(rank: usize, ops: Vec<OpRecord>) -> Dump {
        Dump {
            version: super::super::dump::VERSION,
            job: Some("j".into()),
            rank,
            world_size: 3,
            comm: 0,
            backend: "cpu".into(),
            pid: 1,
            created_unix_us: 1_000_000,
            dumped_us: 100.0,
            reason: "test".into(),
            dropped: 0,
            ops,
        }
    }

    #[test]
    fn a_diverging_call_names_the_position_and_both_groups() {
        use OpState::*;
        let a = analyze_dumps(vec![
            dump(0, vec![rec(0, "all_reduce", 4, Completed, 0.0), rec(1, "all_reduce", 8, Failed, 10.0)]),
            dump(1, vec![rec(0, "all_reduce", 4, Completed, 0.0), rec(1, "barrier", 0, Failed, 10.0)]),
            dump(2, vec![rec(0, "all_reduce", 4, Completed, 0.0), rec(1, "all_reduce", 8, Failed, 10.0)]),
        ]);
        assert!(a.has_problems());
        let d = a.findings.iter().find(|f| matches!(f, Finding::Diverged { .. })).expect("a divergence");
        let Finding::Diverged { collective, calls, .. } = d else { unreachable!() };
        assert_eq!(*collective, 1);
        assert_eq!(calls.len(), 2);
        let text = d.to_string();
        assert!(
            text.contains("ranks 0, 2 called all_reduce(f32 × 8, sum)") && text.contains("rank 1 called barrier"),
            "{text}"
        );
    }

    #[test]
    fn a_rank_that_never_entered_and_a_missing_one_are_named() {
        use OpState::*;
        let a = analyze_dumps(vec![
            dump(0, vec![rec(0, "all_reduce", 4, Completed, 0.0), rec(1, "all_reduce", 4, Failed, 10.0)]),
            dump(1, vec![rec(0, "all_reduce", 4, Completed, 30.0)]),
        ]);
        let text: Vec<String> = a.findings.iter().map(|f| f.to_string()).collect();
        assert!(a.findings.contains(&Finding::MissingDump { comm: 0, rank: 2 }), "{text:?}");
        let never = a.findings.iter().find(|f| matches!(f, Finding::NeverEntered { .. })).expect("never entered");
        let Finding::NeverEntered { collective, inside, absent, .. } = never else { unreachable!() };
        assert_eq!((*collective, inside.as_slice()), (1, &[0][..]));
        assert_eq!(absent[0].0, 1);
        assert!(never.to_string().contains("rank 1 never did (its last operation: seq 0 all_reduce"), "{never}");
        // Rank 1 entered collective 0 last (30 us after rank 0).
        let Some(Finding::Straggler { rank, last_in, of, mean_late_us, .. }) =
            a.findings.iter().find(|f| matches!(f, Finding::Straggler { .. })).cloned()
        else {
            panic!("no straggler: {text:?}")
        };
        assert_eq!((rank, last_in, of), (1, 1, 1));
        assert!((mean_late_us - 30.0).abs() < 1e-9);
    }

    #[test]
    fn an_operation_in_progress_is_a_problem_only_once_it_looks_stuck() {
        use OpState::*;
        let snapshot = |dumped_us: f64| {
            let mut ds: Vec<Dump> = (0..3).map(|r| dump(r, vec![rec(0, "all_reduce", 4, Started, 10.0)])).collect();
            ds.iter_mut().for_each(|d| d.dumped_us = dumped_us);
            analyze_dumps(ds)
        };
        let young = snapshot(500_000.0);
        assert!(!young.has_problems(), "{:?}", young.findings);
        let old = snapshot(2_500_000.0);
        assert!(old.has_problems());
        assert!(
            old.findings[0].to_string().contains("was still in seq 0 all_reduce(f32 × 4, sum) for 2.500 s"),
            "{}",
            old.findings[0]
        );
    }

    #[test]
    fn a_healthy_job_has_no_problem() {
        use OpState::*;
        let ops = |late: f64| vec![rec(0, "all_reduce", 4, Completed, late), rec(1, "batch", 0, Completed, 9.0)];
        let a = analyze_dumps(vec![dump(0, ops(0.0)), dump(1, ops(2.0)), dump(2, ops(1.0))]);
        assert!(!a.has_problems(), "{:?}", a.findings);
        assert!(matches!(a.findings.as_slice(), [Finding::Straggler { rank: 1, .. }]), "{:?}", a.findings);
    }
}
