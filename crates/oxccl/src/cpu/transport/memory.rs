//! The in-memory transport of the `local` backend: every rank is a thread of one process,
//! frames are moved through per-endpoint mailboxes guarded by a mutex and a condition variable.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::{Channel, Header, Received, Transport, TransportError};
use crate::error::Error;

/// The shared state of an in-memory world: one mailbox per endpoint.
#[derive(Debug)]
pub struct MemoryHub {
    endpoints: Vec<Mailbox>,
}

#[derive(Debug, Default)]
struct Mailbox {
    state: Mutex<MailboxState>,
    arrived: Condvar,
}

#[derive(Debug, Default)]
struct MailboxState {
    comms: HashMap<u64, CommBox>,
}

#[derive(Debug, Default)]
struct CommBox {
    /// Frames by source, in arrival order.
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

impl MemoryHub {
    /// A hub for `n` endpoints; take each endpoint with [`MemoryHub::endpoint`].
    pub fn new(n: usize) -> Arc<MemoryHub> {
        Arc::new(MemoryHub { endpoints: (0..n).map(|_| Mailbox::default()).collect() })
    }

    /// The transport of endpoint `rank`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `rank` is not below the hub's size.
    pub fn endpoint(self: &Arc<Self>, rank: usize) -> Result<MemoryTransport, Error> {
        if rank >= self.endpoints.len() {
            return Err(Error::invalid(format!("endpoint {rank} of a hub of {}", self.endpoints.len())));
        }
        Ok(MemoryTransport { hub: Arc::clone(self), rank })
    }
}

/// One endpoint of a [`MemoryHub`].
#[derive(Debug)]
pub struct MemoryTransport {
    hub: Arc<MemoryHub>,
    rank: usize,
}

fn lock(mb: &Mailbox) -> MutexGuard<'_, MailboxState> {
    // A panic while holding this lock cannot leave the queues half-updated (every update is
    // a single push/pop/insert), so a poisoned lock is still consistent.
    mb.state.lock().unwrap_or_else(|p| p.into_inner())
}

impl MemoryTransport {
    fn mailbox(&self, rank: usize) -> Result<&Mailbox, TransportError> {
        self.hub.endpoints.get(rank).ok_or_else(|| {
            TransportError::Other(Error::invalid(format!(
                "rank {rank} is not in this world of {}",
                self.hub.endpoints.len()
            )))
        })
    }

    /// Checks the failure states of `cb` for a wait on `peer`, then finds the first frame
    /// from `peer` on `channel`.
    fn find(cb: &CommBox, peer: usize, channel: Channel) -> Result<Option<usize>, TransportError> {
        if let Some(reason) = &cb.aborted {
            return Err(TransportError::Aborted(reason.clone()));
        }
        if let Some((p, e)) = &cb.failed {
            return Err(TransportError::PeerFailed { peer: *p, error: e.clone() });
        }
        let pos = cb.queues.get(&peer).and_then(|q| q.iter().position(|f| f.header.channel == channel));
        if pos.is_none() && cb.closed.contains(&peer) {
            return Err(TransportError::PeerLost {
                peer,
                detail: "its communicator was closed or its thread ended".into(),
            });
        }
        Ok(pos)
    }
}

impl Transport for MemoryTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.hub.endpoints.len()
    }

    fn send(&self, peer: usize, header: &Header, payload: &[u8], _deadline: Instant) -> Result<(), TransportError> {
        let mb = self.mailbox(peer)?;
        {
            // Refuse to send on a communicator this endpoint has aborted.
            let me = lock(self.mailbox(self.rank)?);
            if let Some(reason) = me.comms.get(&header.comm_id).and_then(|c| c.aborted.clone()) {
                return Err(TransportError::Aborted(reason));
            }
        }
        let frame = Frame { header: *header, payload: payload.to_vec() };
        let mut st = lock(mb);
        let cb = st.comms.entry(header.comm_id).or_default();
        cb.queues.entry(self.rank).or_default().push_back(frame);
        drop(st);
        mb.arrived.notify_all();
        Ok(())
    }

    fn recv(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, TransportError> {
        let mb = self.mailbox(self.rank)?;
        self.mailbox(peer)?;
        let mut st = lock(mb);
        loop {
            let cb = st.comms.entry(comm_id).or_default();
            if let Some(pos) = Self::find(cb, peer, channel)? {
                let q = cb.queues.get_mut(&peer);
                if let Some(frame) = q.and_then(|q| q.remove(pos)) {
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
            st = mb.arrived.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn probe(&self, peer: usize, comm_id: u64, channel: Channel) -> Result<Option<Received>, TransportError> {
        let mb = self.mailbox(self.rank)?;
        self.mailbox(peer)?;
        let mut st = lock(mb);
        let cb = st.comms.entry(comm_id).or_default();
        let pos = Self::find(cb, peer, channel)?;
        Ok(pos.and_then(|p| {
            cb.queues.get(&peer).and_then(|q| q.get(p)).map(|f| Received { header: f.header, len: f.payload.len() })
        }))
    }

    fn abort(&self, comm_id: u64, reason: &str) {
        if let Ok(mb) = self.mailbox(self.rank) {
            let mut st = lock(mb);
            let cb = st.comms.entry(comm_id).or_default();
            if cb.aborted.is_none() {
                cb.aborted = Some(reason.to_string());
            }
            drop(st);
            mb.arrived.notify_all();
        }
    }

    fn notify_failure(&self, comm_id: u64, peers: &[usize], error: &Error) {
        for &p in peers {
            if p == self.rank {
                continue;
            }
            if let Ok(mb) = self.mailbox(p) {
                let mut st = lock(mb);
                let cb = st.comms.entry(comm_id).or_default();
                if cb.failed.is_none() {
                    cb.failed = Some((self.rank, error.clone()));
                }
                drop(st);
                mb.arrived.notify_all();
            }
        }
    }

    fn release(&self, comm_id: u64, peers: &[usize]) {
        if let Ok(mb) = self.mailbox(self.rank) {
            lock(mb).comms.remove(&comm_id);
        }
        for &p in peers {
            if p == self.rank {
                continue;
            }
            if let Ok(mb) = self.mailbox(p) {
                let mut st = lock(mb);
                st.comms.entry(comm_id).or_default().closed.insert(self.rank);
                drop(st);
                mb.arrived.notify_all();
            }
        }
    }
}
