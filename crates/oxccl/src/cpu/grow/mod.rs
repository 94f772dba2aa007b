//! Growing a communicator: newcomers (a replacement for a dead rank, or extra capacity) join
//! the members of an existing one, and all get a new communicator with the members first, in
//! their order (`ncclCommGrow`'s shape).
//!
//! The members and the newcomers meet through the rendezvous store that made the world (a
//! newcomer knows nothing else of the job), as a new world of their own: its transport is new,
//! and the members' old communicator stays usable. See `protocol.rs` for the keys and records,
//! `tests.rs` for the protocol and thread worlds that grow.
//!
//! - members: [`Lineage::grow`] (from the cpu engine): the members agree on the number of
//!   newcomers (the same on all, with the fault-tolerant agreement), write the admissions of
//!   the next tickets, and build the new world.
//! - newcomers: [`join`]: take a ticket, wait for its admission, build the new world.

pub(crate) mod protocol;

#[cfg(test)]
mod tests;

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::protocol::Admission;
use crate::bootstrap::env::lost_peer_key;
use crate::bootstrap::store::StoreClient;
use crate::error::{Error, Result};
use crate::sync::relock;

/// How long rank 0's `agree` waits for the store to say how many newcomers wait.
const WAITING_PATIENCE: Duration = Duration::from_millis(500);

/// The store operations growing needs (the rendezvous store, or an in-process one).
pub(crate) trait Board: Send + Sync {
    /// Adds `delta` to the counter at `key` (0 when absent); its new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// Sets `key`.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// `key`'s value, waiting up to `timeout` for it to be set.
    fn get_wait(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
}

impl Board for StoreClient {
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        StoreClient::add(self, key, delta)
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        StoreClient::set(self, key, value)
    }
    fn get_wait(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        StoreClient::get_wait(self, key, timeout)
    }
}

/// A [`Board`] inside one process (worlds of threads, tests).
#[derive(Debug, Default)]
pub(crate) struct MemoryBoard {
    map: Mutex<std::collections::HashMap<String, Vec<u8>>>,
    changed: std::sync::Condvar,
}

impl Board for MemoryBoard {
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut map = relock(&self.map);
        let old = map.get(key).and_then(|v| v.as_slice().try_into().ok()).map_or(0, i64::from_le_bytes);
        let new = old + delta;
        map.insert(key.to_string(), new.to_le_bytes().to_vec());
        self.changed.notify_all();
        Ok(new)
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        relock(&self.map).insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }
    fn get_wait(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut map = relock(&self.map);
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(Error::Store(format!("timed out after {timeout:?} waiting for key {key}")));
            }
            map = self.changed.wait_timeout(map, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
    }
}

/// Builds rank `rank` of a world of `size` meeting under a store prefix (a collective over
/// that world): `setup.rs`'s world building, handed down so that the engine need not name it
/// (`B` is the cpu engine's communicator; generic so that this file names no engine).
pub(crate) type Builder<B> = dyn Fn(usize, usize, &str) -> Result<B> + Send + Sync;

/// A world made through a store, and what this process knows of the grows since: shared by
/// every communicator of the lineage in this process (the world, and those shrunk or grown
/// from it; splits have none).
pub(crate) struct Lineage<B> {
    board: Arc<dyn Board>,
    /// The world's store prefix.
    prefix: String,
    build: Arc<Builder<B>>,
    /// (grows seen, tickets admitted): the same on every member.
    state: Mutex<(u64, u64)>,
    /// Set once the store could not be read for `waiting`: later agreements do not ask.
    store_lost: AtomicBool,
    /// Under `oxccl run`: this process's launcher slot, to which it reports the first peer
    /// it lost (the launcher then blames that peer, not this rank: see `report_lost`).
    slot: Option<usize>,
    /// Whether the report was made.
    reported: AtomicBool,
    /// Resources that must live as long as any communicator of the lineage (the store that
    /// rank 0 hosts).
    _keep: Vec<Box<dyn Any + Send + Sync>>,
}

impl<B> std::fmt::Debug for Lineage<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lineage").field("prefix", &self.prefix).field("state", &*relock(&self.state)).finish()
    }
}

impl<B> Lineage<B> {
    /// The lineage of a world made under `prefix` through `board`, which `build` makes
    /// again; `keep` lives as long as it.
    pub(crate) fn new(
        board: Arc<dyn Board>,
        prefix: &str,
        build: Box<Builder<B>>,
        keep: Vec<Box<dyn Any + Send + Sync>>,
    ) -> Self {
        Lineage {
            board,
            prefix: prefix.to_string(),
            build: Arc::from(build),
            state: Mutex::new((0, 0)),
            store_lost: AtomicBool::new(false),
            slot: None,
            reported: AtomicBool::new(false),
            _keep: keep,
        }
    }

    /// Reports lost peers to the launcher as slot `slot` (`oxccl run` reads them).
    pub(crate) fn reporting_as(mut self, slot: usize) -> Self {
        self.slot = Some(slot);
        self
    }

    /// Tells the launcher (through the store, key [`lost_peer_key`]) that this process
    /// lost the rank of launcher slot `peer`, once per process, on the world the launcher
    /// started (after a grow, ranks no longer match its slots: nothing is reported). Waits
    /// for the store at most 500 ms, so a failing call is not held up by a dead store.
    pub(crate) fn report_lost(&self, peer: usize) {
        let Some(me) = self.slot else { return };
        if relock(&self.state).0 != 0 || self.reported.swap(true, Ordering::AcqRel) {
            return;
        }
        let (board, key) = (Arc::clone(&self.board), lost_peer_key(me));
        let (tx, rx) = std::sync::mpsc::channel();
        let sent = std::thread::Builder::new().name("oxccl-report".into()).spawn(move || {
            let _ = tx.send(board.set(&key, peer.to_string().as_bytes()));
        });
        if sent.is_ok() {
            let _ = rx.recv_timeout(Duration::from_millis(500));
        }
    }

    /// The lineage as a newcomer in another thread sees it (same store, prefix and way of
    /// building; the state it learns from its admission).
    pub(crate) fn newcomer(&self) -> Lineage<B> {
        Lineage {
            board: Arc::clone(&self.board),
            prefix: self.prefix.clone(),
            build: Arc::clone(&self.build),
            state: Mutex::new((0, 0)),
            store_lost: AtomicBool::new(false),
            slot: None,
            reported: AtomicBool::new(false),
            _keep: Vec::new(),
        }
    }

    /// How many newcomers wait for a grow (0 when the store cannot be read within
    /// [`WAITING_PATIENCE`]: it is then not asked again, so a store that died with its host,
    /// or sits behind a dead link, costs one attempt and never holds an agreement up).
    pub(crate) fn waiting(&self) -> u64 {
        if self.store_lost.load(Ordering::Relaxed) {
            return 0;
        }
        let (board, key) = (Arc::clone(&self.board), protocol::tickets_key(&self.prefix));
        let (tx, rx) = std::sync::mpsc::channel();
        let asked = std::thread::Builder::new().name("oxccl-grow-ask".into()).spawn(move || {
            let _ = tx.send(board.add(&key, 0));
        });
        let answer = match asked {
            Ok(_) => rx.recv_timeout(WAITING_PATIENCE).map_err(|_| Error::Store("no answer in time".into())),
            Err(e) => Err(Error::io("starting a thread to ask the store", &e)),
        };
        match answer.and_then(|r| r) {
            Ok(taken) => protocol::waiting(taken, relock(&self.state).1),
            Err(e) => {
                tracing::debug!("grow: the store cannot say whether newcomers wait ({e}); not asked again");
                self.store_lost.store(true, Ordering::Relaxed);
                0
            }
        }
    }

    /// The members' side of a grow, after they agreed on `joiners`: this rank (`rank` of
    /// `members`) writes the admissions of the next `joiners` tickets and builds the new
    /// world with them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no newcomers; the store's errors; the new world's
    /// (a newcomer that does not come in time: [`Error::Store`] naming the missing rank).
    pub(crate) fn grow(&self, rank: usize, members: usize, joiners: usize) -> Result<B> {
        let (grows, admitted) = *relock(&self.state);
        let plan = protocol::plan(members, joiners, grows, admitted)?;
        // Every member writes every admission (the same bytes): one that dies meanwhile
        // leaves nothing undone.
        for (ticket, a) in &plan {
            self.board.set(&protocol::admit_key(&self.prefix, *ticket), &a.encode()).map_err(|e| {
                Error::Store(format!("grow: admitting newcomer ticket {ticket} through the store failed: {e}"))
            })?;
        }
        let next = plan[0].1;
        *relock(&self.state) = (next.grow, next.admitted);
        self.enter(rank, next)
    }

    /// Builds this rank's communicator of grown world `a` (the caller ties it to the lineage).
    fn enter(&self, rank: usize, a: Admission) -> Result<B> {
        (self.build)(rank, a.size, &protocol::world_prefix(&self.prefix, a.grow))
    }
}

/// The newcomer's side: takes a ticket at `lineage`'s store, waits up to `timeout` for the
/// members to admit it, and builds its communicator in the grown world.
///
/// # Errors
/// [`Error::Store`] when no grow admits it in time (say so: the members must call `grow`),
/// or for a malformed admission; the new world's errors.
pub(crate) fn join<B>(lineage: &Lineage<B>, timeout: Duration) -> Result<B> {
    let taken = lineage.board.add(&protocol::tickets_key(&lineage.prefix), 1)?;
    let ticket = u64::try_from(taken - 1).map_err(|_| Error::Store(format!("grow: a ticket counter of {taken}")))?;
    let raw = lineage.board.get_wait(&protocol::admit_key(&lineage.prefix, ticket), timeout).map_err(|e| {
        Error::Store(format!(
            "joining: no grow admitted this process (ticket {ticket}) within {timeout:?}: the members must call \
             grow with the number of newcomers ({e})"
        ))
    })?;
    let a = Admission::decode(&raw)?;
    *relock(&lineage.state) = (a.grow, a.admitted);
    lineage.enter(a.rank, a)
}
