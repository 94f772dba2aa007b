//! The in-memory transport of the `local` backend: every rank is a thread of one process,
//! and a send delivers the frame straight into the receiver's [`Mailbox`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::mailbox::Mailbox;
use super::{Channel, Header, Received, Stage, Transport, TransportError};
use crate::error::Error;

/// The shared state of an in-memory world: one mailbox per endpoint.
#[derive(Debug)]
pub struct MemoryHub {
    endpoints: Vec<Mailbox>,
    /// Endpoints killed ([`MemoryHub::kill`]): their sends go nowhere.
    killed: Vec<AtomicBool>,
    /// For tests ([`MemoryHub::mute_after_agreement_sends`]): a rank, and how many more
    /// agreement messages it sends before the rest are dropped.
    #[cfg(test)]
    mute_plan: std::sync::Mutex<Option<(usize, usize)>>,
    /// How long a receiver looks for its frame, spinning and then yielding, before it sleeps
    /// (see [`Mailbox::recv_polling`]).
    poll_for: Duration,
    yield_for: Duration,
}

impl MemoryHub {
    /// A hub for `n` endpoints (take each with [`MemoryHub::endpoint`]) whose receivers
    /// look for their frame for up to `poll_for`, then for up to `yield_for` yielding their
    /// CPU between looks, before they sleep: where every rank's thread has a CPU, a frame
    /// comes within microseconds, and each sleep costs two thread wake-ups (see
    /// [`Mailbox::recv_polling`]); where the threads outnumber the CPUs, no spin, and a
    /// yield lets a sender run.
    pub fn polling(n: usize, poll_for: Duration, yield_for: Duration) -> Arc<MemoryHub> {
        Arc::new(MemoryHub {
            endpoints: (0..n).map(|_| Mailbox::new()).collect(),
            killed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            #[cfg(test)]
            mute_plan: std::sync::Mutex::new(None),
            poll_for,
            yield_for,
        })
    }

    /// Kills endpoint `rank` as a SIGKILL kills a process: from now on its sends go nowhere,
    /// and every other endpoint loses it (frames it sent before stay queued, as bytes in a
    /// socket outlive their sender). For tests of what survivors do.
    #[cfg(test)]
    pub fn kill(&self, rank: usize) {
        let Some(k) = self.killed.get(rank) else { return };
        k.store(true, Ordering::Release);
        for (r, mb) in self.endpoints.iter().enumerate() {
            if r != rank {
                mb.lose(rank, &format!("rank {rank} was killed"));
            }
        }
    }

    /// Makes endpoint `rank` drop every agreement message after its next `sends` ones, as
    /// if those never left it (it goes on otherwise; a test kills it later with
    /// [`MemoryHub::kill`]). For tests that stop a coordinator halfway through its commits.
    #[cfg(test)]
    pub fn mute_after_agreement_sends(&self, rank: usize, sends: usize) {
        *crate::sync::relock(&self.mute_plan) = Some((rank, sends));
    }

    /// Whether [`MemoryHub::mute_after_agreement_sends`] drops this message of `rank`.
    #[cfg(test)]
    fn muted(&self, rank: usize, header: &Header) -> bool {
        if header.fingerprint.op != crate::op_kind::OpKind::Agree {
            return false;
        }
        match crate::sync::relock(&self.mute_plan).as_mut() {
            Some((r, 0)) => *r == rank,
            Some((r, left)) if *r == rank => {
                *left -= 1;
                false
            }
            _ => false,
        }
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

impl MemoryTransport {
    /// Whether this endpoint was killed: it tells nobody anything any more.
    fn killed(&self) -> bool {
        self.hub.killed.get(self.rank).is_some_and(|k| k.load(Ordering::Acquire))
    }

    fn mailbox(&self, rank: usize) -> Result<&Mailbox, TransportError> {
        self.hub.endpoints.get(rank).ok_or_else(|| {
            TransportError::Other(Error::invalid(format!(
                "rank {rank} is not in this world of {}",
                self.hub.endpoints.len()
            )))
        })
    }
}

impl Transport for MemoryTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn send(&self, peer: usize, header: &Header, payload: &[u8], _deadline: Instant) -> Result<(), TransportError> {
        #[cfg(test)]
        if self.hub.muted(self.rank, header) {
            return Ok(());
        }
        if self.killed() {
            return Err(TransportError::Aborted(format!("rank {} was killed", self.rank)));
        }
        if let Some(reason) = self.mailbox(self.rank)?.aborted(header.comm_id) {
            return Err(TransportError::Aborted(reason));
        }
        self.mailbox(peer)?.deliver(self.rank, *header, payload.to_vec());
        Ok(())
    }

    fn try_recv(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
        buf: &mut [u8],
    ) -> Result<Option<Received>, TransportError> {
        self.mailbox(peer)?;
        self.mailbox(self.rank)?.try_recv_queued(peer, comm_id, channel, at, buf)
    }

    fn recv(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, TransportError> {
        self.mailbox(peer)?;
        self.mailbox(self.rank)?.recv_polling(
            peer,
            comm_id,
            channel,
            at,
            buf,
            deadline,
            self.hub.poll_for,
            self.hub.yield_for,
        )
    }

    fn recv_any(
        &self,
        peers: &[usize],
        first: usize,
        comm_id: u64,
        channel: Channel,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<(usize, Received), TransportError> {
        for &p in peers {
            self.mailbox(p)?;
        }
        self.mailbox(self.rank)?.recv_any(self.rank, peers, first, comm_id, channel, buf, deadline)
    }

    fn probe(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
    ) -> Result<Option<Received>, TransportError> {
        self.mailbox(peer)?;
        self.mailbox(self.rank)?.probe(peer, comm_id, channel, at)
    }

    fn abort(&self, comm_id: u64, reason: &str) {
        if let Ok(mb) = self.mailbox(self.rank) {
            mb.abort(comm_id, reason);
        }
    }

    fn waiting_on(&self, comm_id: u64) -> Option<usize> {
        self.mailbox(self.rank).ok()?.waiting_on(comm_id)
    }

    fn notify_failure(&self, comm_id: u64, peers: &[usize], at: Stage, error: &Error) {
        if self.killed() {
            return;
        }
        for &p in peers.iter().filter(|&&p| p != self.rank) {
            if let Ok(mb) = self.mailbox(p) {
                mb.fail(comm_id, self.rank, at, error.clone());
            }
        }
    }

    fn release(&self, comm_id: u64, peers: &[usize]) {
        if let Ok(mb) = self.mailbox(self.rank) {
            mb.forget(comm_id);
        }
        if self.killed() {
            return;
        }
        for &p in peers.iter().filter(|&&p| p != self.rank) {
            if let Ok(mb) = self.mailbox(p) {
                mb.close(comm_id, self.rank);
            }
        }
    }
}
