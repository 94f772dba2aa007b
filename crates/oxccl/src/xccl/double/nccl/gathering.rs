//! How the ranks of the double meet to form a communicator: those of
//! `ncclCommInitRankConfig` with one unique id, a parent's ranks calling `ncclCommSplit` or
//! `ncclCommShrink`, or a parent's ranks and new ones calling `ncclCommGrow`; what the ranks
//! of one communicator then share ([`Net`]) and each one's place ([`Member`]).

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_int;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::sync::relock;
use crate::xccl::double::world::World;
use crate::xccl::library::types::NcclResult;

/// `NCCL_SPLIT_NOCOLOR`: the color of ranks that get no communicator from a split.
pub(crate) const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// The kinds of communicators made from a parent; each kind is numbered in every rank's call
/// order (a rank's n-th split meets the others' n-th split).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Child {
    /// `ncclCommSplit`.
    Split,
    /// `ncclCommShrink`.
    Shrink,
    /// `ncclCommGrow`.
    Grow,
}

/// What the ranks of one communicator share.
#[derive(Debug)]
pub(super) struct Net {
    /// Where collectives and messages meet.
    pub(super) world: World,
    /// The splits, shrinks and grows in progress, by kind and index.
    children: Mutex<HashMap<(Child, u64), Arc<Gathering>>>,
    /// The rank that aborted the communicator (or died) first.
    aborted_by: Mutex<Option<usize>>,
}

impl Net {
    /// A communicator of `n` ranks.
    pub(super) fn new(n: usize) -> Net {
        Net { world: World::new(n), children: Mutex::new(HashMap::new()), aborted_by: Mutex::new(None) }
    }

    /// Aborts the communicator on behalf of `rank`: every wait of every rank ends, now and
    /// later, splits, shrinks and grows in progress included.
    pub(super) fn abort(&self, rank: usize, why: &str) {
        relock(&self.aborted_by).get_or_insert(rank);
        self.world.abort(why);
        let children: Vec<Arc<Gathering>> = relock(&self.children).values().cloned().collect();
        for g in children {
            g.abort(why);
        }
    }

    /// Slot `slot` arrives (with `color` and `key`) at the gathering of child `child` of this
    /// communicator, made for `n` slots and `terms` (what every rank must pass alike: a
    /// shrink's sorted exclusion list) by its first arrival. The gathering, and whether this
    /// arrival completed it. `who` names the caller in messages (`ncclCommShrink: rank 2`).
    ///
    /// # Errors
    /// `ncclInvalidUsage` (with the last error set) when the arrival disagrees with the first
    /// one about `n` or `terms` (the gathering is then aborted: the others' waits end), or
    /// its slot is out of range or taken.
    pub(super) fn meet(
        &self,
        child: (Child, u64),
        n: usize,
        terms: &[c_int],
        (slot, color, key): (usize, c_int, c_int),
        who: &str,
    ) -> Result<(Arc<Gathering>, bool), NcclResult> {
        let mut children = relock(&self.children);
        let g = Arc::clone(children.entry(child).or_insert_with(|| Gathering::with_terms(n, terms.to_vec())));
        if g.n != n || g.terms != terms {
            let why = format!(
                "{who} asks for {n} ranks with {terms:?}, an earlier rank asked for {} with {:?}",
                g.n, g.terms
            );
            children.remove(&child);
            drop(children);
            g.abort(&why);
            return Err(super::status::fail(NcclResult::INVALID_USAGE, why));
        }
        let complete = match g.arrive(slot, color, key) {
            Ok(complete) => complete,
            Err(why) => return Err(super::status::fail(NcclResult::INVALID_USAGE, format!("{who}: {why}"))),
        };
        if complete {
            children.remove(&child);
        }
        drop(children);
        if let Some(why) = self.world.aborted() {
            g.abort(&why);
        }
        Ok((g, complete))
    }

    /// What an operation of `rank` that failed because of an abort reports: a peer's abort
    /// is `ncclRemoteError`, the rank's own `ncclSystemError`; `None` when not aborted.
    pub(super) fn abort_code(&self, rank: usize) -> Option<NcclResult> {
        relock(&self.aborted_by).map(|by| if by == rank { NcclResult::SYSTEM_ERROR } else { NcclResult::REMOTE_ERROR })
    }
}

/// One rank's place in a communicator.
#[derive(Debug, Clone)]
pub(super) struct Member {
    /// The ranks' shared state.
    pub(super) net: Arc<Net>,
    /// This rank.
    pub(super) rank: usize,
    /// How many ranks.
    pub(super) nranks: usize,
}

/// Ranks meeting to form communicators: those of `ncclCommInitRankConfig` with one id
/// (everyone color 0, key its rank), a parent's ranks calling `ncclCommSplit`, those of a
/// shrink or a grow (color 0, slot and key the new rank). Once all `n` have arrived, each
/// color's ranks, ordered by (key, slot), form one communicator.
#[derive(Debug)]
pub(super) struct Gathering {
    /// How many ranks are expected.
    pub(super) n: usize,
    /// What every rank must pass alike besides `n` (a shrink's exclusion list).
    terms: Vec<c_int>,
    /// Who has arrived, and the outcome.
    st: Mutex<GatherState>,
    /// Signals completion or abort.
    cv: Condvar,
}

/// The state of a [`Gathering`].
#[derive(Debug)]
pub(super) struct GatherState {
    /// Each slot's (color, key), once arrived.
    arrived: Vec<Option<(c_int, c_int)>>,
    /// Each slot's place, once everyone arrived (`None` for [`NCCL_SPLIT_NOCOLOR`]).
    members: Option<Vec<Option<Member>>>,
    /// Set when a rank aborted before completion.
    aborted: Option<String>,
}

/// Where a slot of a gathering stands.
#[derive(Debug)]
pub(super) enum Poll {
    /// Everyone arrived: the slot's place.
    Ready(Option<Member>),
    /// Waiting for others.
    Pending,
    /// Aborted, with the reason.
    Aborted(String),
}

impl Gathering {
    /// A gathering of `n` ranks.
    pub(super) fn new(n: usize) -> Arc<Gathering> {
        Gathering::with_terms(n, Vec::new())
    }

    /// A gathering of `n` ranks that all pass `terms`.
    fn with_terms(n: usize, terms: Vec<c_int>) -> Arc<Gathering> {
        Arc::new(Gathering {
            n,
            terms,
            st: Mutex::new(GatherState { arrived: vec![None; n], members: None, aborted: None }),
            cv: Condvar::new(),
        })
    }

    /// Slot `slot` arrives with `color` and `key`; returns whether the gathering is complete.
    ///
    /// # Errors
    /// The slot is out of range or has already arrived.
    pub(super) fn arrive(&self, slot: usize, color: c_int, key: c_int) -> Result<bool, String> {
        let mut st = relock(&self.st);
        match st.arrived.get(slot) {
            None => return Err(format!("rank {slot} is out of range for {} ranks", self.n)),
            Some(Some(_)) => return Err(format!("rank {slot} has already joined")),
            Some(None) => {}
        }
        st.arrived[slot] = Some((color, key));
        if st.arrived.iter().all(Option::is_some) {
            let mut colors: BTreeMap<c_int, Vec<(c_int, usize)>> = BTreeMap::new();
            for (s, &(color, key)) in st.arrived.iter().flatten().enumerate() {
                if color != NCCL_SPLIT_NOCOLOR {
                    colors.entry(color).or_default().push((key, s));
                }
            }
            let mut members = vec![None; self.n];
            for mut ranks in colors.into_values() {
                ranks.sort_unstable();
                let net = Arc::new(Net::new(ranks.len()));
                for (rank, &(_, s)) in ranks.iter().enumerate() {
                    members[s] = Some(Member { net: Arc::clone(&net), rank, nranks: ranks.len() });
                }
            }
            st.members = Some(members);
            self.cv.notify_all();
            return Ok(true);
        }
        Ok(false)
    }

    /// Where `slot` stands.
    pub(super) fn poll(&self, slot: usize) -> Poll {
        Self::poll_state(&relock(&self.st), slot)
    }

    /// Where `slot` stands, in `st`.
    fn poll_state(st: &GatherState, slot: usize) -> Poll {
        if let Some(members) = &st.members {
            return Poll::Ready(members.get(slot).cloned().flatten());
        }
        match &st.aborted {
            Some(why) => Poll::Aborted(why.clone()),
            None => Poll::Pending,
        }
    }

    /// Waits until `slot` is no longer pending, or `limit` has passed (then pending).
    pub(super) fn wait(&self, slot: usize, limit: Duration) -> Poll {
        let deadline = Instant::now() + limit;
        let mut st = relock(&self.st);
        loop {
            match Self::poll_state(&st, slot) {
                Poll::Pending => {}
                other => return other,
            }
            let now = Instant::now();
            if now >= deadline {
                return Poll::Pending;
            }
            st = match self.cv.wait_timeout(st, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Ends the gathering unsuccessfully, unless it is complete.
    pub(super) fn abort(&self, why: &str) {
        let mut st = relock(&self.st);
        if st.members.is_none() {
            st.aborted.get_or_insert_with(|| why.to_string());
        }
        drop(st);
        self.cv.notify_all();
    }
}
