//! The agreement protocol as a state machine without I/O: messages and failure notices go
//! in, messages to send and, once, a decision come out. The driver (`driver.rs`) moves the
//! messages over a transport; the tests move them through a simulator that reorders them
//! and kills ranks at random points.
//!
//! # The protocol
//!
//! Each rank contributes a [`Contribution`] (a word AND-ed over the survivors, a word OR-ed)
//! and knows some ranks dead. The failure detector is perfect: a rank found dead is dead (a
//! process gone, or a peer this rank will never hear from again: the transports lose such a
//! peer for good). The coordinator is the lowest rank a rank does not know dead; the
//! coordinator's rank is the round's number, so rounds grow as coordinators die.
//!
//! 1. Every rank sends the coordinator a [`Msg::Report`]: its contribution, the ranks it
//!    knows dead, and the highest-round proposal it acknowledged, if any.
//! 2. With a report from every rank it does not know dead, the coordinator proposes
//!    ([`Msg::Propose`]) the highest-round proposal reported, else a fresh one: the AND and OR
//!    of the reporters' contributions and the union of the dead sets (whose complement is
//!    exactly the reporters).
//! 3. Every rank acknowledges ([`Msg::Ack`]) the proposal of its current coordinator.
//! 4. With every live rank's acknowledgement, the coordinator sends [`Msg::Commit`] and
//!    decides; a rank decides on a commit.
//!
//! A commit follows the acknowledgement of every live rank, so every survivor holds the
//! committed proposal, and a later coordinator (who waits for every survivor's report) adopts
//! it: decisions are uniform even when the coordinator dies halfway through its commits.
//!
//! A rank that decided leaves the call, but keeps answering for that agreement
//! ([`Agreement::serve`]): a coordinator that took over after a commit waits for reports
//! from every rank it does not know dead, those that decided and left included. So a
//! coordinator that took over from another first asks every rank ([`Msg::Request`]), and a
//! rank that decided answers with its decision ([`Msg::Decided`]), which ends the round: it is
//! the committed value. A request or a report also tells its receiver that every rank below
//! the sender's round is dead (the sender knows it, and it knows only the truth).
//!
//! Costs: 4(n − 1) messages without failures (report, propose, ack, commit per rank), two
//! round trips from the coordinator; each coordinator change adds at most 5(n − 1).

use std::collections::BTreeSet;

/// What one rank brings to an agreement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Contribution {
    /// AND-ed over the contributors.
    pub(crate) and: u64,
    /// OR-ed over the contributors.
    pub(crate) or: u64,
}

/// What every survivor decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The AND of the contributions of every rank not in `dead`.
    pub(crate) and: u64,
    /// Their OR.
    pub(crate) or: u64,
    /// The ranks found dead, in order.
    pub(crate) dead: Vec<usize>,
}

/// The protocol's messages. The round of a message is its coordinator's rank: the sender's
/// for `Request`, `Propose` and `Commit`, the receiver's for `Report` and `Ack`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    /// To the coordinator: what this rank brings and knows.
    Report {
        /// Its contribution.
        contribution: Contribution,
        /// The ranks it knows dead.
        dead: Vec<usize>,
        /// The highest-round proposal it acknowledged: (round, proposal).
        acked: Option<(usize, Decision)>,
    },
    /// From a coordinator that took over: report to me (or tell me what you decided).
    Request,
    /// From the coordinator: acknowledge this.
    Propose(Decision),
    /// To the coordinator: its proposal is held here.
    Ack,
    /// From the coordinator: decide this.
    Commit(Decision),
    /// From a rank that decided, to a rank that asked it for a report.
    Decided(Decision),
}

/// Where a rank is in the protocol.
#[derive(Debug, Clone)]
enum Phase {
    /// Reported to `coordinator` (another rank); waiting for its proposal or commit.
    Follower,
    /// The coordinator, collecting reports.
    Collecting,
    /// The coordinator, having proposed; collecting acknowledgements.
    Proposed(Decision),
    /// Decided.
    Decided(Decision),
}

/// One rank's side of one agreement.
#[derive(Debug, Clone)]
pub(crate) struct Agreement {
    me: usize,
    n: usize,
    mine: Contribution,
    /// Ranks this rank knows dead.
    dead: BTreeSet<usize>,
    /// The lowest rank not known dead.
    coordinator: usize,
    /// Whether this rank followed another coordinator before (as coordinator it must then
    /// ask for reports: some rank may have decided and left).
    followed: bool,
    /// The highest-round proposal this rank acknowledged.
    acked: Option<(usize, Decision)>,
    /// As coordinator: the reports received, per rank.
    reports: Vec<Option<Report>>,
    /// As coordinator: the acknowledgements received, per rank.
    acks: Vec<bool>,
    phase: Phase,
    /// Messages to send: (destination, message).
    out: Vec<(usize, Msg)>,
}

/// A report as the coordinator keeps it.
#[derive(Debug, Clone)]
struct Report {
    contribution: Contribution,
    acked: Option<(usize, Decision)>,
}

impl Agreement {
    /// Rank `me` of `n`, contributing `mine`, knowing `dead` dead. Call [`Agreement::start`]
    /// next.
    pub(crate) fn new(me: usize, n: usize, mine: Contribution, dead: impl IntoIterator<Item = usize>) -> Agreement {
        let dead: BTreeSet<usize> = dead.into_iter().filter(|&d| d < n && d != me).collect();
        Agreement {
            me,
            n,
            mine,
            dead,
            coordinator: me,
            followed: false,
            acked: None,
            reports: vec![None; n],
            acks: vec![false; n],
            phase: Phase::Follower,
            out: Vec::new(),
        }
    }

    /// Begins: reports to the coordinator, or begins collecting as the coordinator.
    pub(crate) fn start(&mut self) {
        self.coordinator = self.lowest_live();
        self.begin_round();
        // Alone, or every report already in: nothing to wait for.
        self.progress();
    }

    /// The messages to send since the last call, in order: (destination, message).
    pub(crate) fn take_out(&mut self) -> Vec<(usize, Msg)> {
        std::mem::take(&mut self.out)
    }

    /// The decision, once made.
    pub(crate) fn decision(&self) -> Option<&Decision> {
        match &self.phase {
            Phase::Decided(d) => Some(d),
            _ => None,
        }
    }

    /// The ranks whose messages, or death, this rank waits for now (empty once decided): the
    /// coordinator, or as coordinator every rank it has not heard from in this phase.
    pub(crate) fn waiting_on(&self) -> Vec<usize> {
        match &self.phase {
            Phase::Decided(_) => Vec::new(),
            Phase::Follower => vec![self.coordinator],
            Phase::Collecting => self.live_others().filter(|&r| self.reports[r].is_none()).collect(),
            Phase::Proposed(_) => self.live_others().filter(|&r| !self.acks[r]).collect(),
        }
    }

    /// `peer` is dead (the transport lost it).
    pub(crate) fn on_dead(&mut self, peer: usize) {
        if peer >= self.n || peer == self.me || !self.dead.insert(peer) {
            return;
        }
        self.progress();
    }

    /// A message from `from` arrived.
    pub(crate) fn on_message(&mut self, from: usize, msg: Msg) {
        if from >= self.n || from == self.me || self.dead.contains(&from) {
            // Frames a rank sent before this rank found it dead: it can take no part.
            return;
        }
        if let Phase::Decided(d) = &self.phase {
            self.serve(from, &msg, d.clone());
            return;
        }
        match msg {
            Msg::Report { contribution, dead, acked } => {
                if from < self.me {
                    // A live rank below this one would report to itself or lower.
                    return;
                }
                // `from` reports to this rank: every rank below this one is dead.
                self.learn_below(self.me);
                self.learn(dead);
                self.reports[from] = Some(Report { contribution, acked });
            }
            Msg::Request => {
                // The report goes out as this rank makes `from` its coordinator (or went
                // out already: it follows `from`).
                self.learn_below(from);
            }
            Msg::Propose(p) => {
                self.learn_below(from);
                if self.coordinator == from {
                    self.learn(p.dead.iter().copied());
                    self.acked = Some((from, p));
                    self.out.push((from, Msg::Ack));
                }
            }
            Msg::Ack => {
                if matches!(self.phase, Phase::Proposed(_)) {
                    self.acks[from] = true;
                }
            }
            Msg::Commit(d) | Msg::Decided(d) => {
                // A commit comes from the coordinator; a decision from a rank this one
                // reported to (or asked): either is the committed value. A coordinator
                // told so commits it to the ranks that follow it.
                if self.coordinator == self.me {
                    let others: Vec<usize> = self.live_others().collect();
                    self.out.extend(others.into_iter().map(|r| (r, Msg::Commit(d.clone()))));
                }
                self.decide(d);
                return;
            }
        }
        self.progress();
    }

    /// Answers `msg` from `from` once decided: a report or a request gets the decision.
    fn serve(&mut self, from: usize, msg: &Msg, d: Decision) {
        if matches!(msg, Msg::Report { .. } | Msg::Request) {
            self.out.push((from, Msg::Decided(d)));
        }
    }

    fn report(&self) -> Msg {
        Msg::Report { contribution: self.mine, dead: self.dead.iter().copied().collect(), acked: self.acked.clone() }
    }

    fn lowest_live(&self) -> usize {
        (0..self.n).find(|r| !self.dead.contains(r)).unwrap_or(self.me)
    }

    fn live_others(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.n).filter(move |&r| r != self.me && !self.dead.contains(&r))
    }

    /// Every rank below `r` is dead.
    fn learn_below(&mut self, r: usize) {
        for d in 0..r.min(self.n) {
            if d != self.me {
                self.dead.insert(d);
            }
        }
    }

    fn learn(&mut self, dead: impl IntoIterator<Item = usize>) {
        for d in dead {
            if d < self.n && d != self.me {
                self.dead.insert(d);
            }
        }
    }

    /// Starts the round of the current coordinator.
    fn begin_round(&mut self) {
        if self.coordinator == self.me {
            self.phase = Phase::Collecting;
            self.reports = vec![None; self.n];
            self.acks = vec![false; self.n];
            if self.followed {
                let others: Vec<usize> = self.live_others().collect();
                self.out.extend(others.into_iter().map(|r| (r, Msg::Request)));
            }
        } else {
            self.phase = Phase::Follower;
            self.followed = true;
            self.out.push((self.coordinator, self.report()));
        }
    }

    /// Moves on after a change: a new coordinator, all reports, all acknowledgements.
    fn progress(&mut self) {
        if matches!(self.phase, Phase::Decided(_)) {
            return;
        }
        let coordinator = self.lowest_live();
        if coordinator != self.coordinator {
            // Coordinators only grow: dead ranks stay dead.
            self.coordinator = coordinator;
            let reports = std::mem::replace(&mut self.reports, vec![None; self.n]);
            self.begin_round();
            if self.coordinator == self.me {
                // Reports sent to this rank before it knew it was the coordinator count.
                for (r, rep) in reports.into_iter().enumerate() {
                    if !self.dead.contains(&r) {
                        self.reports[r] = rep;
                    }
                }
            }
        }
        match &self.phase {
            Phase::Collecting if self.waiting_on().is_empty() => self.propose(),
            Phase::Proposed(p) if self.waiting_on().is_empty() => {
                let p = p.clone();
                let others: Vec<usize> = self.live_others().collect();
                self.out.extend(others.into_iter().map(|r| (r, Msg::Commit(p.clone()))));
                self.decide(p);
            }
            _ => {}
        }
    }

    fn propose(&mut self) {
        let reported: Vec<(usize, &Report)> =
            self.live_others().filter_map(|r| self.reports[r].as_ref().map(|rep| (r, rep))).collect();
        let adopted = reported
            .iter()
            .filter_map(|(_, rep)| rep.acked.as_ref())
            .chain(self.acked.as_ref())
            .max_by_key(|(round, _)| *round)
            .map(|(_, p)| p.clone());
        let proposal = adopted.unwrap_or_else(|| {
            let (and, or) = reported.iter().fold((self.mine.and, self.mine.or), |(a, o), (_, rep)| {
                (a & rep.contribution.and, o | rep.contribution.or)
            });
            Decision { and, or, dead: self.dead.iter().copied().collect() }
        });
        self.acked = Some((self.me, proposal.clone()));
        self.acks = vec![false; self.n];
        self.phase = Phase::Proposed(proposal.clone());
        let others: Vec<usize> = self.live_others().collect();
        self.out.extend(others.into_iter().map(|r| (r, Msg::Propose(proposal.clone()))));
        // Alone: nothing to wait for.
        self.progress();
    }

    fn decide(&mut self, d: Decision) {
        self.learn(d.dead.iter().copied());
        self.phase = Phase::Decided(d);
    }
}
