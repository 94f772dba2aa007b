//! The receive side shared by every transport: frames that have arrived at this endpoint,
//! queued per (communicator, source) in arrival order, with the failure state that ends
//! waits early (local abort, a peer's failure notice, a peer that is gone).
//!
//! Transports differ only in how frames get here: the in-memory transport delivers straight
//! from the sender's thread, TCP from one reader thread per connection, shared memory from
//! its progress thread.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::{Channel, Header, Received, TransportError};
use crate::error::Error;

/// Frames that arrived at one endpoint, and the state that ends waits on them.
#[derive(Debug, Default)]
pub struct Mailbox {
    state: Mutex<State>,
    arrived: Condvar,
}

#[derive(Debug, Default)]
struct State {
    comms: HashMap<u64, CommBox>,
    /// Communicators this endpoint released: late notices and frames for them are dropped
    /// instead of re-creating their state (which would leak one entry per communicator).
    released: HashSet<u64>,
    /// Sources whose connection is gone for every communicator, with what was observed.
    lost: HashMap<usize, String>,
}

#[derive(Debug, Default)]
struct CommBox {
    queues: HashMap<usize, VecDeque<Frame>>,
    /// Sources that released this communicator.
    closed: HashSet<usize>,
    /// First failure reported by a peer.
    failed: Option<(usize, Error)>,
    /// Set by a local abort.
    aborted: Option<String>,
}

#[derive(Debug)]
struct Frame {
    header: Header,
    payload: Vec<u8>,
}

impl Mailbox {
    /// An empty mailbox.
    pub fn new() -> Mailbox {
        Mailbox::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update under this lock is a single push/pop/insert, so the state behind a
        // poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.arrived.notify_all();
    }

    /// Queues a frame from `src`.
    pub fn deliver(&self, src: usize, header: Header, payload: Vec<u8>) {
        self.update(|st| {
            if st.released.contains(&header.comm_id) {
                return;
            }
            let cb = st.comms.entry(header.comm_id).or_default();
            cb.queues.entry(src).or_default().push_back(Frame { header, payload });
        });
    }

    /// `src` released `comm_id`: waits on it with nothing queued end with `PeerLost`.
    pub fn close(&self, comm_id: u64, src: usize) {
        self.update(|st| {
            if st.released.contains(&comm_id) {
                return;
            }
            st.comms.entry(comm_id).or_default().closed.insert(src);
        });
    }

    /// `src` failed `comm_id` with `error`: waits on `comm_id` end with `PeerFailed`.
    pub fn fail(&self, comm_id: u64, src: usize, error: Error) {
        self.update(|st| {
            if st.released.contains(&comm_id) {
                return;
            }
            let cb = st.comms.entry(comm_id).or_default();
            if cb.failed.is_none() {
                cb.failed = Some((src, error));
            }
        });
    }

    /// `src` is gone for every communicator (its connection broke, its process died).
    pub fn lose(&self, src: usize, detail: &str) {
        self.update(|st| {
            st.lost.entry(src).or_insert_with(|| detail.to_string());
        });
    }

    /// A local abort of `comm_id`: every wait on it ends with `Aborted`, now and later.
    pub fn abort(&self, comm_id: u64, reason: &str) {
        self.update(|st| {
            let cb = st.comms.entry(comm_id).or_default();
            if cb.aborted.is_none() {
                cb.aborted = Some(reason.to_string());
            }
        });
    }

    /// Whether `comm_id` was aborted locally (and why).
    pub fn aborted(&self, comm_id: u64) -> Option<String> {
        self.lock().comms.get(&comm_id).and_then(|c| c.aborted.clone())
    }

    /// Forgets `comm_id` (this endpoint released it).
    pub fn forget(&self, comm_id: u64) {
        let mut st = self.lock();
        st.comms.remove(&comm_id);
        st.released.insert(comm_id);
    }

    /// Checks the failure states for a wait on `peer`, then finds the first frame from
    /// `peer` on `channel`.
    fn find(st: &mut State, comm_id: u64, peer: usize, channel: Channel) -> Result<Option<usize>, TransportError> {
        let lost = st.lost.get(&peer).cloned();
        let cb = st.comms.entry(comm_id).or_default();
        if let Some(reason) = &cb.aborted {
            return Err(TransportError::Aborted(reason.clone()));
        }
        // Frames that arrived before a failure notice are still delivered: a peer that
        // finished this operation and then failed a later one must not break this one.
        let pos = cb.queues.get(&peer).and_then(|q| q.iter().position(|f| f.header.channel == channel));
        if pos.is_none() {
            if let Some((p, e)) = &cb.failed {
                return Err(TransportError::PeerFailed { peer: *p, error: e.clone() });
            }
            if let Some(detail) = lost {
                return Err(TransportError::PeerLost { peer, detail });
            }
            if cb.closed.contains(&peer) {
                return Err(TransportError::PeerLost {
                    peer,
                    detail: "it closed this communicator (dropped it, or its process ended)".into(),
                });
            }
        }
        Ok(pos)
    }

    /// Takes the next frame on `(comm_id, channel)` from `peer`, waiting until `deadline`;
    /// copies the payload into `buf` when it fits.
    ///
    /// # Errors
    /// `Timeout` at the deadline; `Aborted`, `PeerFailed`, `PeerLost` as the state says.
    pub fn recv(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, TransportError> {
        let mut st = self.lock();
        loop {
            if let Some(pos) = Self::find(&mut st, comm_id, peer, channel)? {
                let frame =
                    st.comms.get_mut(&comm_id).and_then(|c| c.queues.get_mut(&peer)).and_then(|q| q.remove(pos));
                if let Some(frame) = frame {
                    let len = frame.payload.len();
                    if len <= buf.len() {
                        buf[..len].copy_from_slice(&frame.payload);
                    }
                    return Ok(Received { header: frame.header, len });
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::Timeout { peer });
            }
            st = self.arrived.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The next frame on `(comm_id, channel)` from `peer`, if any, left queued.
    ///
    /// # Errors
    /// As [`Mailbox::recv`], without waiting.
    pub fn probe(&self, peer: usize, comm_id: u64, channel: Channel) -> Result<Option<Received>, TransportError> {
        let mut st = self.lock();
        let pos = Self::find(&mut st, comm_id, peer, channel)?;
        Ok(pos.and_then(|p| {
            st.comms
                .get(&comm_id)
                .and_then(|c| c.queues.get(&peer))
                .and_then(|q| q.get(p))
                .map(|f| Received { header: f.header, len: f.payload.len() })
        }))
    }
}
