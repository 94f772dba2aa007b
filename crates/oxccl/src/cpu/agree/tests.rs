//! The agreement protocol in a simulator: messages delivered in random orders (in order per
//! pair of ranks, as the transports deliver), ranks killed at random points (losing a random
//! suffix of what they had sent), deaths found only by ranks that wait on the dead (and now
//! and then by others, as a transport that lost a peer for every communicator). After every
//! run: every survivor decided, every rank that decided (survivor or not) decided the same,
//! the dead set holds only ranks that died, and the AND and OR are those of exactly the
//! ranks outside it.

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::protocol::{Agreement, Contribution, Decision, Msg};
use crate::cpu::splitmix64;

#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

#[derive(Clone)]
struct Sim {
    n: usize,
    ranks: Vec<Agreement>,
    alive: Vec<bool>,
    mine: Vec<Contribution>,
    /// In flight, per (from, to).
    wires: HashMap<(usize, usize), VecDeque<Msg>>,
    /// Deaths each rank was told of.
    told: Vec<BTreeSet<usize>>,
    rng: Rng,
    /// Messages sent, for the cost checks.
    sent: usize,
}

/// One run's outcome, for the invariants.
struct Outcome {
    decisions: Vec<Option<Decision>>,
    alive: Vec<bool>,
    mine: Vec<Contribution>,
    sent: usize,
    /// What each rank waited for at the end, and the deaths it was told of (for failures).
    waits: Vec<(Vec<usize>, Vec<usize>)>,
}

impl Sim {
    /// `n` ranks; `dead_at_start` are dead before the agreement begins (each survivor knows
    /// each of them dead with even odds).
    fn new(n: usize, seed: u64, dead_at_start: &[usize]) -> Sim {
        let mut rng = Rng(seed);
        let mine: Vec<Contribution> =
            (0..n).map(|_| Contribution { and: rng.next() | rng.next(), or: 1 << rng.below(64) }).collect();
        let mut told = vec![BTreeSet::new(); n];
        let ranks = (0..n)
            .map(|r| {
                let known: Vec<usize> = dead_at_start.iter().copied().filter(|_| rng.chance(50)).collect();
                told[r].extend(known.iter().copied());
                Agreement::new(r, n, mine[r], known)
            })
            .collect();
        let mut alive = vec![true; n];
        for &d in dead_at_start {
            alive[d] = false;
        }
        Sim { n, ranks, alive, mine, wires: HashMap::new(), told, rng, sent: 0 }
    }

    fn flush(&mut self, r: usize) {
        for (to, m) in self.ranks[r].take_out() {
            assert_ne!(to, r, "rank {r} sent to itself: {m:?}");
            self.sent += 1;
            self.wires.entry((r, to)).or_default().push_back(m);
        }
    }

    fn kill(&mut self, r: usize) {
        self.alive[r] = false;
        // What it had sent but not yet delivered: a random prefix still arrives.
        for to in 0..self.n {
            if let Some(q) = self.wires.get_mut(&(r, to)) {
                let keep = self.rng.below(q.len() + 1);
                q.truncate(keep);
            }
        }
    }

    /// Every event that can happen now: a delivery (from, to) or a death found (who, dead).
    fn events(&mut self) -> Vec<Event> {
        let mut ev = Vec::new();
        for (&(from, to), q) in &self.wires {
            if !q.is_empty() {
                ev.push(Event::Deliver(from, to));
            }
        }
        for r in (0..self.n).filter(|&r| self.alive[r]) {
            let waits = self.ranks[r].waiting_on();
            for d in (0..self.n).filter(|&d| !self.alive[d] && !self.told[r].contains(&d)) {
                // Found once nothing it sent is left on the way (the transports report a
                // lost peer when nothing from it is queued); by a rank waiting on it, or now
                // and then by another.
                let drained = self.wires.get(&(d, r)).is_none_or(VecDeque::is_empty);
                if drained && (waits.contains(&d) || self.rng.chance(10)) {
                    ev.push(Event::Found(r, d));
                }
            }
        }
        ev.sort_unstable();
        ev
    }

    fn apply(&mut self, e: Event) {
        match e {
            Event::Deliver(from, to) => {
                let m = self.wires.get_mut(&(from, to)).and_then(VecDeque::pop_front).expect("a queued message");
                if self.alive[to] {
                    self.ranks[to].on_message(from, m);
                    self.flush(to);
                }
            }
            Event::Found(r, d) => {
                self.told[r].insert(d);
                self.ranks[r].on_dead(d);
                self.flush(r);
            }
        }
    }

    /// Runs to the end, killing the ranks of `kills` (rank, at step), then the invariants.
    fn run(mut self, kills: &[(usize, usize)]) -> Outcome {
        for r in 0..self.n {
            if !self.alive[r] {
                continue;
            }
            self.ranks[r].start();
            self.flush(r);
        }
        let mut step = 0;
        loop {
            for &(r, at) in kills {
                if at == step && self.alive[r] {
                    self.kill(r);
                }
            }
            let ev = self.events();
            if ev.is_empty() {
                if kills.iter().any(|&(r, at)| at > step && self.alive[r]) {
                    step += 1;
                    continue;
                }
                break;
            }
            let pick = ev[self.rng.below(ev.len())];
            self.apply(pick);
            step += 1;
            assert!(step < 1_000_000, "no end in sight");
        }
        Outcome {
            decisions: self.ranks.iter().map(|a| a.decision().cloned()).collect(),
            waits: (0..self.n).map(|r| (self.ranks[r].waiting_on(), self.told[r].iter().copied().collect())).collect(),
            alive: self.alive,
            mine: self.mine,
            sent: self.sent,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Deliver(usize, usize),
    Found(usize, usize),
}

impl Outcome {
    /// The invariants; `what` says which run failed.
    fn check(&self, what: &str) {
        let n = self.alive.len();
        for r in (0..n).filter(|&r| self.alive[r]) {
            assert!(
                self.decisions[r].is_some(),
                "{what}: survivor {r} did not decide: {:?}; alive {:?}; (waiting on, told dead) {:?}",
                self.decisions,
                self.alive,
                self.waits
            );
        }
        let decided: Vec<(usize, &Decision)> =
            self.decisions.iter().enumerate().filter_map(|(r, d)| d.as_ref().map(|d| (r, d))).collect();
        let Some(&(_, first)) = decided.first() else { return };
        for &(r, d) in &decided {
            assert_eq!(d, first, "{what}: rank {r} decided otherwise than rank {}", decided[0].0);
        }
        for &d in &first.dead {
            assert!(!self.alive[d], "{what}: live rank {d} agreed dead");
        }
        let (and, or) = (0..n)
            .filter(|r| !first.dead.contains(r))
            .fold((u64::MAX, 0), |(a, o), r| (a & self.mine[r].and, o | self.mine[r].or));
        assert_eq!(
            (first.and, first.or),
            (and, or),
            "{what}: not the contributions of the ranks outside {:?}",
            first.dead
        );
    }
}

#[test]
fn without_failures_every_rank_decides_the_and_of_all() {
    for n in 1..=9 {
        for seed in 0..20 {
            let out = Sim::new(n, seed, &[]).run(&[]);
            out.check(&format!("n={n} seed={seed}"));
            let d = out.decisions[0].as_ref().expect("decided");
            assert!(d.dead.is_empty());
            // Report, propose, ack, commit.
            assert_eq!(out.sent, 4 * (n - 1), "n={n}");
        }
    }
}

#[test]
fn ranks_dead_before_the_call_are_agreed_dead_by_every_survivor() {
    for seed in 0..300 {
        let mut rng = Rng(seed ^ 0xdead);
        let n = 2 + rng.below(7);
        let dead: Vec<usize> = (0..n).filter(|_| rng.chance(30)).take(n - 1).collect();
        let out = Sim::new(n, seed, &dead).run(&[]);
        let what = format!("n={n} seed={seed} dead={dead:?}");
        out.check(&what);
        let survivor = (0..n).find(|&r| out.alive[r]).expect("a survivor");
        let agreed = &out.decisions[survivor].as_ref().expect("decided").dead;
        assert_eq!(agreed, &dead, "{what}: the coordinator waits for, so finds, every dead rank");
    }
}

#[test]
fn ranks_killed_at_random_points_leave_survivors_agreeing() {
    // Rank 0 (the first coordinator) included; one, two or n − 1 ranks; at any step.
    for seed in 0..3000 {
        let mut rng = Rng(seed ^ 0x5eed);
        let n = 2 + rng.below(8);
        let victims = match rng.below(4) {
            0 => n - 1,
            1 => 2.min(n - 1),
            _ => 1,
        };
        let mut kills = Vec::new();
        let mut pool: Vec<usize> = (0..n).collect();
        for _ in 0..victims {
            let r = pool.swap_remove(rng.below(pool.len()));
            kills.push((r, rng.below(6 * n)));
        }
        let dead_at_start: Vec<usize> = if rng.chance(20) && pool.len() > 1 { vec![pool[0]] } else { Vec::new() };
        let out = Sim::new(n, seed, &dead_at_start).run(&kills);
        out.check(&format!("n={n} seed={seed} kills={kills:?} dead_at_start={dead_at_start:?}"));
    }
}

#[test]
fn coordinators_killed_one_after_another_while_committing() {
    // The lowest ranks die in turn, each a few steps into its own round, so commits are
    // half delivered and later coordinators must ask the ranks that decided and left.
    for seed in 0..1000 {
        let mut rng = Rng(seed ^ 0xc0);
        let n = 3 + rng.below(6);
        let victims = 1 + rng.below(n - 1);
        let kills: Vec<(usize, usize)> = (0..victims).map(|r| (r, 3 * n + r * (2 + rng.below(2 * n)))).collect();
        let out = Sim::new(n, seed, &[]).run(&kills);
        out.check(&format!("n={n} seed={seed} kills={kills:?}"));
    }
}

#[test]
fn a_late_coordinator_learns_the_decision_from_a_rank_that_left() {
    // Rank 0 commits to rank 1 only, then dies: rank 1 decided; rank 2 takes over and must
    // not decide anything else.
    let n = 3;
    let mut a: Vec<Agreement> =
        (0..n).map(|r| Agreement::new(r, n, Contribution { and: 0b111 ^ (1 << r), or: 1 << r }, [])).collect();
    let mut wires: Vec<(usize, usize, Msg)> = Vec::new();
    for (r, ag) in a.iter_mut().enumerate() {
        ag.start();
        wires.extend(ag.take_out().into_iter().map(|(to, m)| (r, to, m)));
    }
    // Deliver everything except rank 0's commit to rank 2.
    while let Some(i) = wires.iter().position(|(f, t, m)| !(*f == 0 && *t == 2 && matches!(m, Msg::Commit(_)))) {
        let (from, to, m) = wires.remove(i);
        a[to].on_message(from, m);
        wires.extend(a[to].take_out().into_iter().map(|(t, m)| (to, t, m)));
    }
    let decided = a[1].decision().cloned().expect("rank 1 decided");
    assert!(a[2].decision().is_none());
    // Rank 0 dies with its commit to rank 2 lost; rank 2 finds it.
    a[2].on_dead(0);
    let out = a[2].take_out();
    // Rank 2 follows rank 1 now, which decided: it reports, rank 1 answers.
    assert_eq!(out.len(), 1);
    assert!(matches!(out[0], (1, Msg::Report { .. })), "{out:?}");
    a[1].on_message(2, out[0].1.clone());
    let answer = a[1].take_out();
    assert_eq!(answer, vec![(2, Msg::Decided(decided.clone()))]);
    a[2].on_message(1, answer[0].1.clone());
    assert_eq!(a[2].decision(), Some(&decided));
    assert_eq!((decided.and, decided.or), (0, 0b111));
}

/// Every interleaving of a small world: each order of deliveries and of deaths found,
/// with no death or one (any rank, at any point, losing any part of what it had sent).
/// Returns the runs explored.
fn explore(sim: &Sim, kills_left: usize, runs: &mut usize) {
    let mut moves: Vec<Sim> = Vec::new();
    for (&(from, to), q) in &sim.wires {
        if !q.is_empty() {
            let mut next = sim.clone();
            next.apply(Event::Deliver(from, to));
            moves.push(next);
        }
    }
    for r in (0..sim.n).filter(|&r| sim.alive[r]) {
        for d in (0..sim.n).filter(|&d| !sim.alive[d] && !sim.told[r].contains(&d)) {
            if sim.wires.get(&(d, r)).is_none_or(VecDeque::is_empty) {
                let mut next = sim.clone();
                next.apply(Event::Found(r, d));
                moves.push(next);
            }
        }
    }
    if kills_left > 0 {
        for r in (0..sim.n).filter(|&r| sim.alive[r]) {
            // Each part of each queue it had sent that still arrives: the choices multiply
            // only over non-empty queues, which are short here.
            let lens: Vec<(usize, usize)> =
                (0..sim.n).filter_map(|to| sim.wires.get(&(r, to)).map(|q| (to, q.len()))).collect();
            let choices: usize = lens.iter().map(|&(_, l)| l + 1).product();
            for mut c in 0..choices {
                let mut next = sim.clone();
                next.alive[r] = false;
                for &(to, l) in &lens {
                    let keep = c % (l + 1);
                    c /= l + 1;
                    next.wires.get_mut(&(r, to)).expect("queue").truncate(keep);
                }
                explore(&next, kills_left - 1, runs);
            }
        }
    }
    if moves.is_empty() {
        *runs += 1;
        let out = Outcome {
            decisions: sim.ranks.iter().map(|a| a.decision().cloned()).collect(),
            waits: (0..sim.n).map(|r| (sim.ranks[r].waiting_on(), sim.told[r].iter().copied().collect())).collect(),
            alive: sim.alive.clone(),
            mine: sim.mine.clone(),
            sent: sim.sent,
        };
        out.check(&format!("exhaustive run {runs}"));
        return;
    }
    for next in &moves {
        explore(next, kills_left, runs);
    }
}

#[test]
fn every_interleaving_of_small_worlds_with_deaths() {
    // Three ranks with one death or two (four ranks with one: too many to run in CI).
    for (n, kills) in [(3, 1), (3, 2)] {
        let mut sim = Sim::new(n, 7, &[]);
        for r in 0..n {
            sim.ranks[r].start();
            sim.flush(r);
        }
        let mut runs = 0;
        explore(&sim, kills, &mut runs);
        assert!(runs > 1000, "n={n}: only {runs} runs");
        eprintln!("n={n} deaths={kills}: {runs} interleavings");
    }
}
