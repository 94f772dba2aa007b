//! The outcome of a suite run: pass, fail or skip per case, with every failing rank's message.

use std::fmt;
use std::time::Duration;

/// One rank's failure in one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The rank (in the communicator the suite was given) that saw the failure.
    pub rank: usize,
    /// What went wrong: the operation, dtype, reduce op, algorithm, world size, count, rank
    /// and the first differing index (or the error), plus how many further checks failed.
    pub message: String,
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Every check passed (on every rank the report covers).
    Passed,
    /// At least one rank failed; one entry per failing rank.
    Failed(Vec<Failure>),
    /// Not run, and why (for example: needs more ranks).
    Skipped(String),
}

/// One case of a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseReport {
    /// The case's name, `family/...` (for example `all_reduce/f32/sum/ring/in_place`).
    pub name: String,
    /// Its outcome.
    pub status: Status,
    /// How long it ran (the longest of the ranks, in merged reports).
    pub elapsed: Duration,
}

impl CaseReport {
    /// Whether the case failed.
    pub fn is_failed(&self) -> bool {
        matches!(self.status, Status::Failed(_))
    }
}

/// The outcome of a suite run on one rank, or merged over several ranks
/// ([`Report::merge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The backend's name.
    pub backend: String,
    /// The world size of the communicator the suite ran on.
    pub world_size: usize,
    /// The ranks whose results this report holds.
    pub ranks: Vec<usize>,
    /// Every case, in the order they ran.
    pub cases: Vec<CaseReport>,
    /// Wall time of the run (the longest rank's, in merged reports).
    pub elapsed: Duration,
}

impl Report {
    /// An empty report for one rank.
    pub fn new(backend: &str, world_size: usize, rank: usize) -> Report {
        Report { backend: backend.into(), world_size, ranks: vec![rank], cases: Vec::new(), elapsed: Duration::ZERO }
    }

    /// The number of cases.
    pub fn total(&self) -> usize {
        self.cases.len()
    }

    /// The number of passed cases.
    pub fn passed(&self) -> usize {
        self.cases.iter().filter(|c| c.status == Status::Passed).count()
    }

    /// The number of failed cases.
    pub fn failed(&self) -> usize {
        self.cases.iter().filter(|c| c.is_failed()).count()
    }

    /// The number of skipped cases.
    pub fn skipped(&self) -> usize {
        self.cases.iter().filter(|c| matches!(c.status, Status::Skipped(_))).count()
    }

    /// Whether no case failed.
    pub fn is_success(&self) -> bool {
        self.failed() == 0
    }

    /// How a test checks a world: prints the report's first line, and panics with the first
    /// failures unless some case ran and every case passed.
    ///
    /// # Panics
    /// When no case ran or a case failed.
    pub fn assert_passed(&self) {
        println!("{}", self.to_string().lines().next().unwrap_or_default());
        assert!(self.total() > 0, "no case ran on a world of {}", self.world_size);
        assert!(
            self.is_success(),
            "{} of {} cases failed on a world of {}:\n{}",
            self.failed(),
            self.total(),
            self.world_size,
            self.failure_details(40, 3)
        );
    }

    /// The failed cases.
    pub fn failures(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases.iter().filter(|c| c.is_failed())
    }

    /// Appends the cases of `other` (a later part of the same run on the same ranks).
    pub fn extend(&mut self, other: Report) {
        self.cases.extend(other.cases);
        self.elapsed += other.elapsed;
    }

    /// Merges the reports of several ranks that ran the same sequence of cases: a case fails
    /// when it failed on any rank (with every rank's message), passes when it passed on all.
    /// Reports whose case lists disagree produce a failing `suite/consistency` case.
    pub fn merge(reports: impl IntoIterator<Item = Report>) -> Report {
        let mut it = reports.into_iter();
        let Some(mut out) = it.next() else {
            return Report::new("none", 0, 0);
        };
        for r in it {
            out.ranks.extend(&r.ranks);
            out.elapsed = out.elapsed.max(r.elapsed);
            let names_agree =
                r.cases.len() == out.cases.len() && r.cases.iter().zip(&out.cases).all(|(a, b)| a.name == b.name);
            if !names_agree {
                out.cases.push(CaseReport {
                    name: "suite/consistency".into(),
                    status: Status::Failed(vec![Failure {
                        rank: r.ranks.first().copied().unwrap_or(0),
                        message: format!(
                            "rank(s) {:?} ran {} cases, the others {}: ranks did not run the same sequence",
                            r.ranks,
                            r.cases.len(),
                            out.cases.len()
                        ),
                    }]),
                    elapsed: Duration::ZERO,
                });
                continue;
            }
            for (mine, theirs) in out.cases.iter_mut().zip(r.cases) {
                mine.elapsed = mine.elapsed.max(theirs.elapsed);
                mine.status = match (std::mem::replace(&mut mine.status, Status::Passed), theirs.status) {
                    (Status::Failed(mut a), Status::Failed(b)) => {
                        a.extend(b);
                        Status::Failed(a)
                    }
                    (Status::Failed(a), _) | (_, Status::Failed(a)) => Status::Failed(a),
                    (Status::Skipped(why), Status::Skipped(_)) => Status::Skipped(why),
                    _ => Status::Passed,
                };
            }
        }
        for c in &mut out.cases {
            if let Status::Failed(f) = &mut c.status {
                f.sort_by_key(|x| x.rank);
            }
        }
        out.ranks.sort_unstable();
        out
    }

    /// A multi-line description of the failures (at most `max_cases` cases, and at most
    /// `max_ranks` messages per case).
    pub fn failure_details(&self, max_cases: usize, max_ranks: usize) -> String {
        let mut s = String::new();
        for c in self.failures().take(max_cases) {
            if let Status::Failed(fs) = &c.status {
                s.push_str(&format!("FAILED {} ({} rank(s))\n", c.name, fs.len()));
                for f in fs.iter().take(max_ranks) {
                    s.push_str(&format!("    rank {}: {}\n", f.rank, f.message));
                }
                if fs.len() > max_ranks {
                    s.push_str(&format!("    ... and {} more rank(s)\n", fs.len() - max_ranks));
                }
            }
        }
        if self.failed() > max_cases {
            s.push_str(&format!("... and {} more failed case(s)\n", self.failed() - max_cases));
        }
        s
    }

    /// The slowest cases, longest first, as `(name, elapsed)`.
    pub fn slowest(&self, k: usize) -> Vec<(&str, Duration)> {
        let mut v: Vec<_> = self.cases.iter().map(|c| (c.name.as_str(), c.elapsed)).collect();
        v.sort_by_key(|c| std::cmp::Reverse(c.1));
        v.truncate(k);
        v
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "oxccl conformance on `{}`, world size {}: {} cases, {} passed, {} failed, {} skipped in {:.2}s",
            self.backend,
            self.world_size,
            self.total(),
            self.passed(),
            self.failed(),
            self.skipped(),
            self.elapsed.as_secs_f64()
        )?;
        f.write_str(&self.failure_details(usize::MAX, usize::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(name: &str, status: Status) -> CaseReport {
        CaseReport { name: name.into(), status, elapsed: Duration::ZERO }
    }

    #[test]
    fn merge_combines_failures_and_detects_disagreement() {
        let mut a = Report::new("local", 2, 0);
        a.cases = vec![case("x", Status::Passed), case("y", Status::Skipped("n".into()))];
        let mut b = Report::new("local", 2, 1);
        b.cases = vec![
            case("x", Status::Failed(vec![Failure { rank: 1, message: "bad".into() }])),
            case("y", Status::Skipped("n".into())),
        ];
        let m = Report::merge([a.clone(), b]);
        assert_eq!((m.passed(), m.failed(), m.skipped()), (0, 1, 1));
        assert!(m.to_string().contains("rank 1: bad"));

        let mut c = Report::new("local", 2, 1);
        c.cases = vec![case("x", Status::Passed)];
        let m = Report::merge([a, c]);
        assert!(m.failures().any(|c| c.name == "suite/consistency"));
    }
}
