//! The agreement protocol over a transport: one thread per communicator that moves its
//! messages, started by the communicator's first agreement and ended when it is dropped.
//!
//! The thread, not the caller, reads the messages, because a rank must go on answering for
//! an agreement after its call returned: a coordinator that took over after a commit asks
//! every rank, those that decided included (`protocol.rs`), and a rank that left would
//! otherwise hold it until its deadline, while that rank's next collective waits for it.
//!
//! The messages travel on a communicator id of their own (derived from the communicator's),
//! so a communicator that failed or was revoked can still agree: its own id's failure state
//! does not touch them. The thread listens to every live rank for whatever arrives, without
//! connecting to any (`Transport::recv_any_arrived`), and connects only to the ranks its
//! agreements wait for (`Transport::reach`), so that one that is gone without ever having
//! connected is found. Agreements are numbered in the order this rank calls them (every rank
//! calls them in the same order, as collectives); messages for one not yet called wait.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::protocol::{Agreement as Machine, Contribution, Decision, Msg};
use super::wire;
use crate::algorithm::Algorithm;
use crate::cpu::transport::{Channel, Header, Transport, TransportError};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::op_kind::OpKind;
use crate::sync::relock;

/// How long the thread waits for a message, while an agreement is under way, before it
/// looks again at whom it waits for.
const SLICE: Duration = Duration::from_millis(20);
/// How long it waits while it only answers for agreements already decided (a new agreement,
/// or the communicator's end, wakes it sooner).
const IDLE_SLICE: Duration = Duration::from_millis(100);
/// How long a send of one small message may take before its peer counts as gone.
const SEND_PATIENCE: Duration = Duration::from_secs(10);

/// The agreements of one communicator at one rank.
pub(crate) struct Agreements {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct Shared {
    transport: Arc<dyn Transport>,
    /// The id the messages travel on.
    comm_id: u64,
    /// Communicator rank -> transport rank.
    ranks: Arc<[usize]>,
    rank: usize,
    /// For the thread's name.
    name: &'static str,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// The number of the next agreement this rank calls.
    next: u64,
    /// Agreements under way, and the last one decided (answering for it).
    machines: BTreeMap<u64, Machine>,
    /// Messages for agreements this rank has not called yet: (number, from, message).
    early: Vec<(u64, usize, Msg)>,
    /// Communicator ranks found dead.
    dead: BTreeSet<usize>,
    /// Batches of messages the thread took from the machines and is sending: a caller whose
    /// agreement decided returns only once none is, so that a coordinator's commits are out
    /// before its rank goes on (and perhaps drops the communicator).
    sending: usize,
    /// The thread is to end.
    closing: bool,
}

impl Agreements {
    /// The agreements of communicator rank `rank` of `ranks` over `transport`, on `comm_id`.
    pub(crate) fn new(
        name: &'static str,
        transport: Arc<dyn Transport>,
        comm_id: u64,
        ranks: Arc<[usize]>,
        rank: usize,
    ) -> Agreements {
        let shared = Arc::new(Shared {
            transport,
            comm_id,
            ranks,
            rank,
            name,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        Agreements { shared, thread: Mutex::new(None) }
    }

    /// The ranks found dead so far (by any agreement, or told by [`Agreements::found_dead`]).
    pub(crate) fn dead(&self) -> BTreeSet<usize> {
        relock(&self.shared.state).dead.clone()
    }

    /// Runs the next agreement with this rank's `contribution`, until every survivor decided
    /// or `deadline`; returns its number (the same on every rank) and the decision.
    ///
    /// # Errors
    /// [`Error::Timeout`] at the deadline (the agreement goes on in the background, and may
    /// still decide for the others); the thread could not be started.
    pub(crate) fn agree(&self, contribution: Contribution, deadline: Instant) -> Result<(u64, Decision)> {
        self.ensure_thread()?;
        let started = Instant::now();
        let sh = &self.shared;
        let mut st = relock(&sh.state);
        let number = st.next;
        st.next += 1;
        let mut m = Machine::new(sh.rank, sh.ranks.len(), contribution, st.dead.iter().copied());
        m.start();
        let early: Vec<(usize, Msg)> = {
            let (mine, later): (Vec<_>, Vec<_>) =
                std::mem::take(&mut st.early).into_iter().partition(|e| e.0 == number);
            st.early = later;
            mine.into_iter().map(|(_, f, msg)| (f, msg)).collect()
        };
        for (from, msg) in early {
            m.on_message(from, msg);
        }
        st.machines.insert(number, m);
        let out = sh.take_out(&mut st);
        sh.prune(&mut st);
        drop(st);
        sh.send_all(out);
        sh.changed.notify_all();
        let mut st = relock(&sh.state);
        loop {
            if let Some(d) = st.machines.get(&number).and_then(|m| m.decision()).filter(|_| st.sending == 0) {
                tracing::debug!(
                    "rank {}: agreement {number} decided after {:?}: dead {:?}",
                    sh.rank,
                    started.elapsed(),
                    d.dead
                );
                return Ok((number, d.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                let waiting = st.machines.get(&number).map(Machine::waiting_on).unwrap_or_default();
                return Err(Error::Timeout {
                    op: OpKind::Agree,
                    seq: number,
                    peer: waiting.first().copied(),
                    waited: now.duration_since(started),
                });
            }
            st = sh.changed.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn ensure_thread(&self) -> Result<()> {
        let mut t = relock(&self.thread);
        if t.is_some() {
            return Ok(());
        }
        let sh = Arc::clone(&self.shared);
        let handle = std::thread::Builder::new()
            .name(format!("oxccl-{}-agree-r{}", sh.name, sh.rank))
            .spawn(move || sh.run())
            .map_err(|e| Error::io("starting the communicator's agreement thread", &e))?;
        *t = Some(handle);
        Ok(())
    }
}

impl Drop for Agreements {
    fn drop(&mut self) {
        relock(&self.shared.state).closing = true;
        self.shared.changed.notify_all();
        // Ends the thread's wait on the transport at once.
        self.shared.transport.abort(self.shared.comm_id, "the communicator was dropped");
        if let Some(t) = relock(&self.thread).take() {
            let _ = t.join();
        }
        let peers: Vec<usize> = self.shared.ranks.iter().copied().filter(|&t| t != self.shared.me()).collect();
        self.shared.transport.release(self.shared.comm_id, &peers);
    }
}

impl Shared {
    fn me(&self) -> usize {
        self.ranks[self.rank]
    }

    fn header(&self, number: u64) -> Header {
        Header {
            comm_id: self.comm_id,
            channel: Channel::Collective,
            fingerprint: Fingerprint {
                seq: number,
                op: OpKind::Agree,
                dtype: DType::U8,
                count: 0,
                root: None,
                reduce: None,
                algorithm: Algorithm::Auto,
            },
        }
    }

    fn mark_dead(&self, st: &mut State, peer: usize) {
        if peer == self.rank || peer >= self.ranks.len() || !st.dead.insert(peer) {
            return;
        }
        tracing::debug!("rank {}: the agreements count rank {peer} dead", self.rank);
        for m in st.machines.values_mut() {
            m.on_dead(peer);
        }
    }

    /// Every machine's messages to send, with their agreement numbers.
    fn take_out(&self, st: &mut State) -> Vec<(u64, usize, Msg)> {
        let mut out = Vec::new();
        for (&k, m) in &mut st.machines {
            out.extend(m.take_out().into_iter().map(|(to, msg)| (k, to, msg)));
        }
        out
    }

    /// Forgets the decided agreements before the last decided one: every survivor finished
    /// them (the last one's coordinator heard from every survivor).
    fn prune(&self, st: &mut State) {
        let Some(last) = st.machines.iter().rev().find(|(_, m)| m.decision().is_some()).map(|(&k, _)| k) else {
            return;
        };
        st.machines.retain(|&k, m| k >= last || m.decision().is_none());
    }

    /// Sends `out`; a peer that cannot be reached is dead.
    fn send_all(&self, out: Vec<(u64, usize, Msg)>) {
        let mut lost = Vec::new();
        for (k, to, msg) in out {
            let Some(&t) = self.ranks.get(to) else { continue };
            let payload = wire::encode(k, &msg);
            match self.transport.send(t, &self.header(k), &payload, Instant::now() + SEND_PATIENCE) {
                Ok(()) => {}
                Err(TransportError::Aborted(_)) => return,
                Err(e) => {
                    tracing::debug!("rank {}: agreement {k}: a message to rank {to} failed: {e:?}", self.rank);
                    lost.push(to);
                }
            }
        }
        if !lost.is_empty() {
            let mut st = self.lock();
            for p in lost {
                self.mark_dead(&mut st, p);
            }
            let out = self.take_out(&mut st);
            drop(st);
            if !out.is_empty() {
                self.send_all(out);
            }
            self.changed.notify_all();
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        relock(&self.state)
    }

    /// The thread: takes every message that arrives, finds the ranks its agreements wait for
    /// gone, sends what the machines say.
    fn run(&self) {
        let n = self.ranks.len();
        let mut buf = vec![0u8; 64 + 12 * n];
        let mut first = 0usize;
        loop {
            let (listen, watch, busy) = {
                let st = self.lock();
                if st.closing {
                    return;
                }
                let busy = st.machines.values().any(|m| m.decision().is_none());
                let live = |r: &usize| *r != self.rank && !st.dead.contains(r);
                let listen: Vec<usize> = (0..n).filter(live).collect();
                let watch: BTreeSet<usize> =
                    st.machines.values().flat_map(Machine::waiting_on).filter(|r| live(r)).collect();
                (listen, watch, busy)
            };
            let slice = Instant::now() + if busy { SLICE } else { IDLE_SLICE };
            let mut gone = Vec::new();
            for &p in &watch {
                match self.transport.reach(self.ranks[p], slice) {
                    Ok(()) | Err(TransportError::Timeout { .. }) => {}
                    Err(TransportError::Aborted(_)) => return,
                    Err(_) => gone.push(p),
                }
            }
            if listen.is_empty() {
                // Alone: nothing can arrive; wait for the end.
                let st = self.lock();
                if !st.closing {
                    drop(self.changed.wait_timeout(st, SLICE));
                }
                continue;
            }
            let transport_peers: Vec<usize> = listen.iter().map(|&r| self.ranks[r]).collect();
            first = first.wrapping_add(1);
            let got = self.transport.recv_any_arrived(
                &transport_peers,
                first % transport_peers.len(),
                self.comm_id,
                Channel::Collective,
                &mut buf,
                slice,
            );
            let mut st = self.lock();
            match got {
                Ok((src, r)) => {
                    let from = self.ranks.iter().position(|&t| t == src);
                    match (from, r.len <= buf.len()) {
                        (Some(from), true) => match wire::decode(&buf[..r.len], n) {
                            Ok((k, msg)) => self.deliver(&mut st, k, from, msg),
                            Err(e) => {
                                tracing::warn!(
                                    "rank {}: a malformed agreement message from rank {from} ({e}); it counts as failed",
                                    self.rank
                                );
                                gone.push(from);
                            }
                        },
                        (Some(from), false) => {
                            tracing::warn!(
                                "rank {}: an agreement message of {} bytes from rank {from}; it counts as failed",
                                self.rank,
                                r.len
                            );
                            gone.push(from);
                        }
                        (None, _) => {}
                    }
                }
                Err(TransportError::Timeout { .. }) => {}
                Err(TransportError::Aborted(_)) => return,
                Err(TransportError::PeerLost { peer, .. } | TransportError::PeerFailed { peer, .. }) => {
                    if let Some(r) = self.ranks.iter().position(|&t| t == peer) {
                        gone.push(r);
                    }
                }
                Err(TransportError::Other(e)) => {
                    tracing::warn!("rank {}: the agreement thread's receive failed: {e}", self.rank);
                    drop(st);
                    std::thread::sleep(SLICE);
                    continue;
                }
            }
            for p in gone {
                self.mark_dead(&mut st, p);
            }
            let out = self.take_out(&mut st);
            self.prune(&mut st);
            if out.is_empty() {
                drop(st);
                self.changed.notify_all();
                continue;
            }
            st.sending += 1;
            drop(st);
            self.send_all(out);
            self.lock().sending -= 1;
            self.changed.notify_all();
        }
    }

    fn deliver(&self, st: &mut State, k: u64, from: usize, msg: Msg) {
        if let Some(m) = st.machines.get_mut(&k) {
            m.on_message(from, msg);
        } else if k >= st.next {
            st.early.push((k, from, msg));
        }
        // Otherwise an agreement forgotten: every survivor finished it.
    }
}
