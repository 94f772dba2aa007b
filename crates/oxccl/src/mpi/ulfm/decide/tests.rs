//! The agreement logic against a simulated ULFM: threads as ranks, one shared table of word
//! agreements (each the AND of the ranks that contributed, handed out once every live rank
//! has), ranks that die at a chosen call, and failures that each rank learns some calls late.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex};

use super::*;

#[derive(Default)]
struct WorldState {
    alive: BTreeSet<usize>,
    /// Call number → the AND so far and who contributed.
    calls: BTreeMap<u64, (u32, BTreeSet<usize>)>,
    /// Dead rank → the call it died at.
    died_at: BTreeMap<usize, u64>,
}

struct World {
    state: Mutex<WorldState>,
    changed: Condvar,
}

struct Rank {
    world: Arc<World>,
    me: usize,
    calls: u64,
    dies_at: Option<u64>,
    /// How many calls after a death this rank learns of it.
    lag: u64,
}

impl Agreer for Rank {
    fn and(&mut self, word: u32) -> Result<u32> {
        let k = self.calls;
        self.calls += 1;
        let mut st = self.world.state.lock().unwrap();
        if self.dies_at == Some(k) {
            st.alive.remove(&self.me);
            st.died_at.insert(self.me, k);
            self.world.changed.notify_all();
            return Err(Error::Internal("died".into()));
        }
        let e = st.calls.entry(k).or_insert((u32::MAX, BTreeSet::new()));
        e.0 &= word;
        e.1.insert(self.me);
        self.world.changed.notify_all();
        loop {
            let (v, who) = &st.calls[&k];
            if st.alive.is_subset(who) {
                return Ok(*v);
            }
            st = self.world.changed.wait(st).unwrap();
        }
    }

    fn known_failed(&mut self) -> Result<BTreeSet<usize>> {
        let st = self.world.state.lock().unwrap();
        Ok(st.died_at.iter().filter(|(_, &at)| at + self.lag <= self.calls).map(|(&r, _)| r).collect())
    }
}

/// Runs `agree` on `n` simulated ranks; `deaths[r]` is the call rank r dies at, `lags[r]`
/// how late it learns of deaths. Every rank's result (an error for the dead).
fn run(n: usize, deaths: &BTreeMap<usize, u64>, lags: &[u64]) -> Vec<Result<Decision>> {
    let world = Arc::new(World {
        state: Mutex::new(WorldState { alive: (0..n).collect(), ..WorldState::default() }),
        changed: Condvar::new(),
    });
    let threads: Vec<_> = (0..n)
        .map(|me| {
            let mut r = Rank {
                world: Arc::clone(&world),
                me,
                calls: 0,
                dies_at: deaths.get(&me).copied(),
                lag: lags.get(me).copied().unwrap_or(0),
            };
            std::thread::spawn(move || agree(&mut r, n, !(1u64 << (me % 64))))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Checks what every survivor agreed: the same decision, failed ranks really dead, every
/// survivor's flag bit cleared, a rank dead before the first call agreed failed and its bit
/// left set.
fn check(n: usize, deaths: &BTreeMap<usize, u64>, lags: &[u64]) -> Decision {
    let results = run(n, deaths, lags);
    let survivors: Vec<usize> = (0..n).filter(|r| !deaths.contains_key(r)).collect();
    let first = results[survivors[0]].as_ref().unwrap().clone();
    for &s in &survivors {
        assert_eq!(results[s].as_ref().unwrap(), &first, "rank {s}, n {n}, deaths {deaths:?}, lags {lags:?}");
        assert_eq!(first.flag & (1u64 << (s % 64)), 0, "rank {s}'s flag bit");
    }
    for r in &first.failed {
        assert!(deaths.contains_key(r), "rank {r} agreed failed but alive: {deaths:?}");
    }
    for (&r, &at) in deaths {
        if at == 0 && lags.iter().all(|&l| l == 0) {
            assert!(first.failed.contains(&r), "rank {r} died first: {first:?}");
            if r < 64 && survivors.iter().all(|s| s % 64 != r) {
                assert_ne!(first.flag & (1u64 << r), 0, "rank {r} never contributed: {first:?}");
            }
        }
    }
    first
}

#[test]
fn without_failures_one_round_and_the_and_of_every_flag() {
    for n in [1, 2, 3, 4, 5, 33] {
        let d = check(n, &BTreeMap::new(), &[]);
        assert_eq!((d.rounds, d.failed.clone()), (1, vec![]), "n {n}");
        let want = (0..n).fold(u64::MAX, |f, r| f & !(1u64 << (r % 64)));
        assert_eq!(d.flag, want, "n {n}");
    }
}

#[test]
fn a_rank_dead_before_the_call_is_agreed_failed_everywhere() {
    for n in [2, 3, 4, 5, 40] {
        for victim in [0, 1, n - 1] {
            let d = check(n, &BTreeMap::from([(victim, 0)]), &[]);
            assert_eq!(d.failed, vec![victim], "n {n}");
        }
    }
}

#[test]
fn deaths_during_the_call_and_late_knowledge_still_give_one_answer() {
    // Deaths at every call of the first two rounds (4 ranks: 1 mask word, 4 calls + 1 a round),
    // knowledge up to three calls late, one or two victims.
    for n in [3, 4, 5] {
        for at in 0..10u64 {
            for lag_seed in 0..4u64 {
                let lags: Vec<u64> = (0..n as u64).map(|r| (r + lag_seed) % 4).collect();
                check(n, &BTreeMap::from([(1, at)]), &lags);
                check(n, &BTreeMap::from([(0, at), (n - 1, at / 2)]), &lags);
            }
        }
    }
}

#[test]
fn words_and_failed_ranks_round_trip() {
    let failed: BTreeSet<usize> = [0, 5, 31, 32, 39].into_iter().collect();
    let w = alive_words(40, &failed);
    assert_eq!(w.len(), 2);
    assert_eq!(w[0], !((1 << 0) | (1 << 5) | (1 << 31)));
    assert_eq!(w[1], !((1 << 0) | (1 << 7)));
    assert_eq!(failed_of(40, &w), vec![0, 5, 31, 32, 39]);
    assert_eq!(alive_words(3, &[7].into_iter().collect()), vec![u32::MAX]);
    assert_eq!(failed_of(3, &[u32::MAX]), Vec::<usize>::new());
    assert_eq!(failed_of(2, &[]), vec![0, 1]);
}

/// One rank among ranks that passed `digests` (this rank's included): its first agreement
/// ANDs the digests, its second their complements.
struct Digests {
    digests: Vec<u32>,
    calls: usize,
}

impl Agreer for Digests {
    fn and(&mut self, word: u32) -> Result<u32> {
        self.calls += 1;
        let complement = self.calls == 2;
        Ok(self.digests.iter().fold(word, |acc, &d| acc & if complement { !d } else { d }))
    }
    fn known_failed(&mut self) -> Result<BTreeSet<usize>> {
        Ok(BTreeSet::new())
    }
}

#[test]
fn lists_are_the_same_only_when_every_digest_is() {
    let a: BTreeSet<usize> = [1, 3].into_iter().collect();
    let b: BTreeSet<usize> = [1, 2].into_iter().collect();
    let (da, db) = (list_digest(&a), list_digest(&b));
    assert_ne!(da, db);
    assert_eq!(list_digest(&a), da, "deterministic");
    assert_ne!(list_digest(&BTreeSet::new()), list_digest(&[0].into_iter().collect()));
    let same = |digests: Vec<u32>, mine: u32| same_everywhere(&mut Digests { digests, calls: 0 }, mine).unwrap();
    assert!(same(vec![da, da, da], da));
    assert!(!same(vec![da, db, da], da));
    assert!(!same(vec![da, db, da], db));
    assert!(same(vec![db], db));
}
