//! The store's data and the waits parked on it: a plain struct, without I/O or locks (the
//! event loop owns it, tests drive it directly).
//!
//! A wait whose keys are not all present is parked: it counts its distinct missing keys and
//! is indexed under each of its keys. A key that appears decrements the count of every wait
//! indexed under it, a key deleted increments it back, so a wait is answered (its response
//! queued for [`take_ready`](Store::take_ready)) the moment all its keys are present at
//! once, without scanning the other waits. Deadlines sit in a heap; [`expire`](Store::expire)
//! answers the waits whose time is up with the keys still missing.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::protocol::{Request, Response};

/// Whom a parked wait's answer goes to (the event loop's token of the connection).
pub(crate) type Owner = u64;

/// A parked wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct WaitId(u64);

/// What became of a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Answered at once.
    Answer(Response),
    /// A wait that is parked until its keys are present or its deadline passes; its answer
    /// will come out of [`Store::take_ready`].
    Parked(WaitId),
}

struct Parked {
    owner: Owner,
    /// As requested (order and duplicates kept, for the list of missing keys).
    keys: Vec<String>,
    /// Distinct keys absent now.
    missing: usize,
}

/// The key-value map and the parked waits.
#[derive(Default)]
pub(crate) struct Store {
    map: HashMap<String, Vec<u8>>,
    waits: HashMap<WaitId, Parked>,
    /// The waits under each of their keys (present or not).
    by_key: HashMap<String, HashSet<WaitId>>,
    /// Deadlines of parked waits; an entry whose wait is gone is skipped when it comes up.
    deadlines: BinaryHeap<Reverse<(Instant, WaitId)>>,
    /// Answers to parked waits, not yet taken.
    ready: Vec<(Owner, Response)>,
    next: u64,
}

impl Store {
    /// An empty store.
    pub(crate) fn new() -> Store {
        Store::default()
    }

    /// Carries out `req` from `owner` at `now` (when a wait's timeout starts).
    pub(crate) fn apply(&mut self, owner: Owner, req: Request, now: Instant) -> Outcome {
        let response = match req {
            Request::Set { key, value } => {
                self.insert(key, value);
                Response::Done
            }
            Request::Get { key } => Response::Value(self.map.get(&key).cloned()),
            Request::Add { key, delta } => self.add(key, delta),
            Request::CompareSet { key, expected, new } => {
                let matches = match (&expected, self.map.get(&key)) {
                    (None, None) => true,
                    (Some(e), Some(cur)) => e == cur,
                    _ => false,
                };
                if matches {
                    self.insert(key, new.clone());
                    Response::Bytes(new)
                } else {
                    Response::Bytes(self.map.get(&key).cloned().unwrap_or_default())
                }
            }
            Request::Delete { key } => {
                let existed = self.map.remove(&key).is_some();
                if existed {
                    self.changed(&key, false);
                }
                Response::Bool(existed)
            }
            Request::Wait { keys, timeout_ms } => return self.park(owner, keys, timeout_ms, now),
        };
        Outcome::Answer(response)
    }

    fn add(&mut self, key: String, delta: i64) -> Response {
        let current = match self.map.get(&key) {
            None => 0,
            Some(v) => match std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()) {
                Some(n) => n,
                None => {
                    return Response::Error(format!(
                        "add on key `{key}`: its value is not a decimal integer (it was set with set or \
                         compare_set); use a separate key for counters"
                    ))
                }
            },
        };
        let Some(new) = current.checked_add(delta) else {
            return Response::Error(format!("add on key `{key}`: {current} + {delta} overflows a 64-bit integer"));
        };
        self.insert(key, new.to_string().into_bytes());
        Response::Int(new)
    }

    fn insert(&mut self, key: String, value: Vec<u8>) {
        match self.map.entry(key) {
            Entry::Occupied(mut e) => {
                e.insert(value);
            }
            Entry::Vacant(e) => {
                let key = e.into_key();
                self.changed(&key, true);
                self.map.insert(key, value);
            }
        }
    }

    /// `key` appeared (`true`) or disappeared: the waits under it count one key less or more
    /// missing; those with none missing are answered.
    fn changed(&mut self, key: &str, appeared: bool) {
        let Some(ids) = self.by_key.get(key) else { return };
        let mut done = Vec::new();
        for id in ids {
            if let Some(w) = self.waits.get_mut(id) {
                if appeared {
                    w.missing = w.missing.saturating_sub(1);
                    if w.missing == 0 {
                        done.push(*id);
                    }
                } else {
                    w.missing += 1;
                }
            }
        }
        for id in done {
            if let Some(w) = self.unpark(id) {
                self.ready.push((w.owner, Response::Done));
            }
        }
    }

    fn park(&mut self, owner: Owner, keys: Vec<String>, timeout_ms: u64, now: Instant) -> Outcome {
        let mut seen = HashSet::new();
        let missing = keys.iter().filter(|k| !self.map.contains_key(k.as_str()) && seen.insert(k.as_str())).count();
        if missing == 0 {
            return Outcome::Answer(Response::Done);
        }
        // None: a deadline too far away to represent; wait without one.
        let deadline = now.checked_add(Duration::from_millis(timeout_ms));
        if deadline.is_some_and(|d| d <= now) {
            return Outcome::Answer(Response::Missing(self.missing_of(&keys)));
        }
        let id = WaitId(self.next);
        self.next += 1;
        for k in &keys {
            self.by_key.entry(k.clone()).or_default().insert(id);
        }
        if let Some(d) = deadline {
            // Entries of waits answered early stay until they come up; rebuild the heap when
            // they outnumber the live ones, so that it stays proportional to the waits.
            if self.deadlines.len() >= 64 + 2 * self.waits.len() {
                let waits = &self.waits;
                self.deadlines.retain(|Reverse((_, id))| waits.contains_key(id));
            }
            self.deadlines.push(Reverse((d, id)));
        }
        self.waits.insert(id, Parked { owner, keys, missing });
        Outcome::Parked(id)
    }

    fn missing_of(&self, keys: &[String]) -> Vec<String> {
        keys.iter().filter(|k| !self.map.contains_key(k.as_str())).cloned().collect()
    }

    /// Removes a parked wait and its index entries.
    fn unpark(&mut self, id: WaitId) -> Option<Parked> {
        let w = self.waits.remove(&id)?;
        for k in &w.keys {
            if let Some(set) = self.by_key.get_mut(k) {
                set.remove(&id);
                if set.is_empty() {
                    self.by_key.remove(k);
                }
            }
        }
        Some(w)
    }

    /// Answers the waits whose deadline is `now` or earlier with the keys still missing.
    pub(crate) fn expire(&mut self, now: Instant) {
        while let Some(&Reverse((d, id))) = self.deadlines.peek() {
            if d > now {
                break;
            }
            self.deadlines.pop();
            if let Some(w) = self.unpark(id) {
                let missing = self.missing_of(&w.keys);
                self.ready.push((w.owner, Response::Missing(missing)));
            }
        }
    }

    /// The earliest deadline of a parked wait.
    pub(crate) fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((d, id))) = self.deadlines.peek() {
            if self.waits.contains_key(&id) {
                return Some(d);
            }
            self.deadlines.pop();
        }
        None
    }

    /// The answers to parked waits since the last call, each with the connection it is for.
    pub(crate) fn take_ready(&mut self) -> Vec<(Owner, Response)> {
        std::mem::take(&mut self.ready)
    }

    /// Forgets a parked wait without answering it (its connection is gone).
    pub(crate) fn cancel(&mut self, id: WaitId) {
        self.unpark(id);
    }

    /// Forgets every parked wait; returns their owners, to be told the store is stopping.
    pub(crate) fn stop(&mut self) -> Vec<Owner> {
        self.by_key.clear();
        self.deadlines.clear();
        self.ready.clear();
        self.waits.drain().map(|(_, w)| w.owner).collect()
    }

    /// How many waits are parked.
    #[cfg(test)]
    pub(crate) fn parked(&self) -> usize {
        self.waits.len()
    }

    /// How many index entries and heap entries the store holds (tests check they shrink).
    #[cfg(test)]
    fn bookkeeping(&self) -> (usize, usize) {
        (self.by_key.values().map(HashSet::len).sum(), self.deadlines.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(k: &str) -> Request {
        Request::Set { key: k.into(), value: k.as_bytes().to_vec() }
    }

    fn wait(keys: &[&str], timeout_ms: u64) -> Request {
        Request::Wait { keys: keys.iter().map(|k| k.to_string()).collect(), timeout_ms }
    }

    fn answer(s: &mut Store, req: Request) -> Response {
        match s.apply(0, req, Instant::now()) {
            Outcome::Answer(r) => r,
            Outcome::Parked(id) => panic!("parked as {id:?}"),
        }
    }

    #[test]
    fn requests_are_answered_at_once() {
        let mut s = Store::new();
        assert_eq!(answer(&mut s, Request::Get { key: "k".into() }), Response::Value(None));
        assert_eq!(answer(&mut s, set("k")), Response::Done);
        assert_eq!(answer(&mut s, Request::Get { key: "k".into() }), Response::Value(Some(b"k".to_vec())));
        assert_eq!(answer(&mut s, Request::Add { key: "n".into(), delta: 2 }), Response::Int(2));
        assert!(
            matches!(answer(&mut s, Request::Add { key: "k".into(), delta: 1 }), Response::Error(m) if m.contains("decimal"))
        );
        let cs = |e: Option<&[u8]>| Request::CompareSet {
            key: "c".into(),
            expected: e.map(<[u8]>::to_vec),
            new: b"x".to_vec(),
        };
        assert_eq!(answer(&mut s, cs(Some(b"y"))), Response::Bytes(vec![]));
        assert_eq!(answer(&mut s, cs(None)), Response::Bytes(b"x".to_vec()));
        assert_eq!(answer(&mut s, Request::Delete { key: "c".into() }), Response::Bool(true));
        assert_eq!(answer(&mut s, Request::Delete { key: "c".into() }), Response::Bool(false));
        assert_eq!(answer(&mut s, wait(&[], 0)), Response::Done);
        assert_eq!(answer(&mut s, wait(&["k", "n", "k"], 0)), Response::Done);
        assert_eq!(answer(&mut s, wait(&["k", "x", "y"], 0)), Response::Missing(vec!["x".into(), "y".into()]));
        assert!(s.take_ready().is_empty());
    }

    #[test]
    fn a_wait_is_answered_when_its_last_key_appears() {
        let mut s = Store::new();
        let now = Instant::now();
        let Outcome::Parked(_) = s.apply(7, wait(&["a", "b", "a"], 60_000), now) else { panic!() };
        let Outcome::Parked(_) = s.apply(8, wait(&["b"], 60_000), now) else { panic!() };
        assert_eq!(s.parked(), 2);
        s.apply(1, set("a"), now);
        assert!(s.take_ready().is_empty(), "b is still missing");
        s.apply(1, set("a"), now); // overwriting a present key changes no count
        assert!(s.take_ready().is_empty());
        s.apply(1, Request::Add { key: "b".into(), delta: 1 }, now);
        let mut ready = s.take_ready();
        ready.sort_by_key(|r| r.0);
        assert_eq!(ready, vec![(7, Response::Done), (8, Response::Done)]);
        assert_eq!(s.parked(), 0);
        assert_eq!(s.bookkeeping().0, 0, "the index is empty again");
    }

    #[test]
    fn a_deleted_key_is_missing_again() {
        let mut s = Store::new();
        let now = Instant::now();
        s.apply(1, set("a"), now);
        let Outcome::Parked(_) = s.apply(7, wait(&["a", "b"], 60_000), now) else { panic!() };
        s.apply(1, Request::Delete { key: "a".into() }, now);
        s.apply(1, set("b"), now);
        assert!(s.take_ready().is_empty(), "a was deleted: not all keys are present");
        s.apply(1, Request::CompareSet { key: "a".into(), expected: None, new: vec![] }, now);
        assert_eq!(s.take_ready(), vec![(7, Response::Done)]);
    }

    #[test]
    fn waits_time_out_with_the_keys_still_missing() {
        let mut s = Store::new();
        let t0 = Instant::now();
        let Outcome::Parked(_) = s.apply(7, wait(&["a", "b", "c"], 100), t0) else { panic!() };
        let Outcome::Parked(_) = s.apply(8, wait(&["b"], 300), t0) else { panic!() };
        let Outcome::Parked(_) = s.apply(9, wait(&["z"], u64::MAX), t0) else { panic!() };
        s.apply(1, set("b"), t0);
        assert_eq!(s.take_ready(), vec![(8, Response::Done)]);
        assert_eq!(s.next_deadline(), Some(t0 + Duration::from_millis(100)));
        s.expire(t0 + Duration::from_millis(99));
        assert!(s.take_ready().is_empty());
        s.expire(t0 + Duration::from_millis(100));
        assert_eq!(s.take_ready(), vec![(7, Response::Missing(vec!["a".into(), "c".into()]))]);
        // 8's entry is stale and skipped; 9's is ages away.
        assert!(s.next_deadline().unwrap() > t0 + Duration::from_secs(1 << 40));
        assert_eq!(s.parked(), 1);
        assert_eq!(s.stop(), vec![9]);
        assert_eq!(s.parked(), 0);
    }

    #[test]
    fn cancelled_and_early_waits_leave_no_bookkeeping_behind() {
        let mut s = Store::new();
        let now = Instant::now();
        for i in 0..1000u64 {
            let key = format!("k{i}");
            let Outcome::Parked(id) = s.apply(i, wait(&[&key, "shared"], 3_600_000), now) else { panic!() };
            if i % 2 == 0 {
                s.cancel(id);
            } else {
                s.apply(0, set(&key), now);
            }
        }
        assert_eq!(s.parked(), 500);
        s.apply(0, set("shared"), now);
        assert_eq!(s.take_ready().len(), 500);
        let (index, heap) = s.bookkeeping();
        assert_eq!(index, 0);
        assert!(heap <= 64 + 2 * 1000, "{heap}");
        assert_eq!(s.next_deadline(), None, "every stale deadline is dropped");
        assert_eq!(s.bookkeeping().1, 0);
    }
}
