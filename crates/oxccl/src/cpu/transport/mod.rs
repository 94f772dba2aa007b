//! Transports: how bytes move between ranks, under the algorithms.
//!
//! A transport delivers ordered, reliable, framed messages between the ranks of one job.
//! Messages are multiplexed by communicator id (so sub-communicators reuse the parent's
//! connections, as MPI's context ids do) and by [`Channel`] (collective traffic never
//! matches point-to-point traffic). Within one (communicator, channel, source) messages
//! arrive in the order they were sent.

pub mod frame;
pub mod mailbox;
pub mod memory;
pub mod routed;
pub mod shm;
pub mod tcp;

use std::time::Instant;

use crate::error::Error;
use crate::fingerprint::Fingerprint;

/// Which stream of messages a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Collective traffic: received strictly in order.
    Collective,
    /// Point-to-point traffic with a tag: received in order per tag.
    PointToPoint(u32),
}

/// Where a wait, or a failure, sits in the life of a communicator: its internal setup, then
/// its collectives in sequence order. A peer's failure notice names the first stage that
/// peer will not complete; it ends the waits at that stage or later, while waits at earlier
/// stages go on (the peer finished them, and what they wait for is on its way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Internal setup, before the first collective. A failure at this stage (setup failed,
    /// or the communicator was aborted) ends every wait, point-to-point ones included.
    Setup,
    /// The collective with this sequence number.
    Collective(u64),
}

impl Stage {
    /// The sequence number that stands for [`Stage::Setup`] in fingerprints and notices.
    pub const SETUP_SEQ: u64 = u64::MAX;

    /// The stage of the collective whose fingerprint carries `seq`.
    pub fn of_seq(seq: u64) -> Stage {
        if seq == Stage::SETUP_SEQ {
            Stage::Setup
        } else {
            Stage::Collective(seq)
        }
    }

    /// The sequence number that encodes this stage (the inverse of [`Stage::of_seq`]).
    pub fn seq(self) -> u64 {
        match self {
            Stage::Setup => Stage::SETUP_SEQ,
            Stage::Collective(s) => s,
        }
    }
}

/// The header of every frame. Every field is checked by the receiver before use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The communicator the frame belongs to.
    pub comm_id: u64,
    /// The stream within that communicator.
    pub channel: Channel,
    /// What the sender is running.
    pub fingerprint: Fingerprint,
}

/// A frame that arrived: its header and payload length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The frame's header.
    pub header: Header,
    /// Payload length in bytes.
    pub len: usize,
}

/// Why a transport operation failed. Ranks are transport ranks; the algorithm layer
/// translates them and adds the operation's context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// The deadline passed while waiting on `peer`.
    Timeout {
        /// The transport rank waited on.
        peer: usize,
    },
    /// `peer` is gone.
    PeerLost {
        /// The transport rank lost.
        peer: usize,
        /// What was observed.
        detail: String,
    },
    /// This rank aborted the communicator.
    Aborted(String),
    /// `peer` failed this communicator and told us why.
    PeerFailed {
        /// The transport rank that failed.
        peer: usize,
        /// Its error.
        error: Error,
    },
    /// Anything else (I/O, a malformed frame).
    Other(Error),
}

/// How a transport reaches a peer, slowest last (the cost model prices each kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LinkKind {
    /// The in-process transport of the `local` backend.
    Memory,
    /// Shared-memory rings between the processes of one host.
    Shm,
    /// TCP.
    Tcp,
}

/// The frames of one [`Transport::exchange`]: what goes out, where what comes in lands, and
/// what becomes of each frame that arrived.
pub trait Pieces {
    /// How many frames go out.
    fn outgoing(&self) -> usize;
    /// The payload of outgoing frame `i`.
    fn out(&self, i: usize) -> &[u8];
    /// Outgoing frame `i` was written.
    fn sent(&mut self, i: usize);
    /// How many frames come in.
    fn incoming(&self) -> usize;
    /// Where incoming frame `i` lands: its expected length exactly.
    fn slot(&mut self, i: usize) -> &mut [u8];
    /// Runs `sleep`, a wait of the transport for the next incoming frame (for accounting).
    fn wait_for_incoming(&mut self, sleep: &mut dyn FnMut()) {
        sleep();
    }
    /// Incoming frame `i` arrived into its slot (`got.len` bytes, the frame's own length,
    /// which may differ from the slot's): check it and take it.
    ///
    /// # Errors
    /// When the frame is not what was expected, or taking it fails.
    fn arrived(&mut self, i: usize, got: Received) -> Result<(), Error>;
}

/// Ordered, reliable, framed point-to-point messages between the ranks of a job.
pub trait Transport: Send + Sync + 'static {
    /// This endpoint's rank among the transport's ranks.
    fn rank(&self) -> usize;

    /// How this endpoint reaches transport rank `peer` (the in-process kind unless the
    /// transport says otherwise).
    fn link_kind(&self, _peer: usize) -> LinkKind {
        LinkKind::Memory
    }

    /// The host of transport rank `peer`, numbered in order of first appearance among the
    /// transport's ranks (ranks of one host share memory; 0 for every rank of a transport
    /// inside one host).
    fn host_of(&self, _peer: usize) -> usize {
        0
    }

    /// Sends one frame to `peer`. May return before the peer received it, but the frame
    /// will be delivered unless the peer or the communicator fails.
    ///
    /// # Errors
    /// [`TransportError`] when the communicator is aborted or the peer is gone.
    fn send(&self, peer: usize, header: &Header, payload: &[u8], deadline: Instant) -> Result<(), TransportError>;

    /// Receives the next frame on `(comm_id, channel)` from `peer`. The payload is copied
    /// into `buf` when it fits (`len <= buf.len()`); a longer frame is consumed and dropped,
    /// and the caller sees its length. `at` is the stage of the collective the wait belongs
    /// to (`None` for point-to-point traffic): it decides which failure notices end it.
    ///
    /// # Errors
    /// [`TransportError::Timeout`] at `deadline`; the others as their names say.
    fn recv(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, TransportError>;

    /// Receives the next frame on `(comm_id, channel)` from whichever of `peers` sent one
    /// first (a receive from any source), as [`Transport::recv`] receives it, and returns
    /// its source. Sources are looked at from `peers[first]` on (a caller that rotates
    /// `first` serves every sender in turn); frames from one source keep their order.
    ///
    /// # Errors
    /// `Timeout` at `deadline`; `Aborted`; `PeerFailed` or `PeerLost` when any of `peers`
    /// failed or is gone and nothing is queued (the message may have been coming from it).
    fn recv_any(
        &self,
        peers: &[usize],
        first: usize,
        comm_id: u64,
        channel: Channel,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<(usize, Received), TransportError>;

    /// Makes sure transport rank `peer` can be reached: a transport that connects on demand
    /// connects now, so a peer that is gone is found although it never sent anything. The
    /// default has nothing to do (its peers are always reachable).
    ///
    /// # Errors
    /// `PeerLost` when the peer is gone; `Timeout` at `deadline`.
    fn reach(&self, _peer: usize, _deadline: Instant) -> Result<(), TransportError> {
        Ok(())
    }

    /// [`Transport::recv_any`] without connecting to anyone: the next frame that arrived, or
    /// arrives, from any of `peers`, for a listener that answers whoever writes to it (a
    /// peer that is gone still ends the wait, when this endpoint knows it). The default is
    /// `recv_any`.
    ///
    /// # Errors
    /// As `recv_any`.
    #[allow(clippy::too_many_arguments)]
    fn recv_any_arrived(
        &self,
        peers: &[usize],
        first: usize,
        comm_id: u64,
        channel: Channel,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<(usize, Received), TransportError> {
        self.recv_any(peers, first, comm_id, channel, buf, deadline)
    }

    /// The next frame on `(comm_id, channel)` from `peer` if it is already here, taken as
    /// [`Transport::recv`] takes it; `None`, having waited for nothing and read no clock,
    /// when it is not (it may still be in a link on its way: `recv` looks there). The
    /// default finds nothing.
    ///
    /// # Errors
    /// As for `recv`, except `Timeout`; a failure may also be left to the `recv` that
    /// follows, which reports it (the transports here look without their mailbox's lock
    /// while it holds no frame at all).
    fn try_recv(
        &self,
        _peer: usize,
        _comm_id: u64,
        _channel: Channel,
        _at: Option<Stage>,
        _buf: &mut [u8],
    ) -> Result<Option<Received>, TransportError> {
        Ok(None)
    }

    /// Sends `pieces`' outgoing frames to `to` while receiving its incoming frames from
    /// `from` (each on `header`'s communicator and channel, `at` as for `recv`), both in
    /// order, driving both directions on the caller's thread; `Ok(false)`, having done
    /// nothing, where this transport does not (the caller then sends and receives frame by
    /// frame).
    ///
    /// # Errors
    /// As `send` and `recv`; what [`Pieces::arrived`] returns, as [`TransportError::Other`].
    fn exchange(
        &self,
        _to: usize,
        _from: usize,
        _header: &Header,
        _at: Option<Stage>,
        _pieces: &mut dyn Pieces,
        _deadline: Instant,
    ) -> Result<bool, TransportError> {
        Ok(false)
    }

    /// The next frame on `(comm_id, channel)` from `peer`, if one has arrived, left queued.
    ///
    /// # Errors
    /// As for `recv`, when the communicator failed or the peer is gone with nothing queued.
    fn probe(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
    ) -> Result<Option<Received>, TransportError>;

    /// The peer a receive on `comm_id` at this endpoint is blocked on now, if any.
    fn waiting_on(&self, _comm_id: u64) -> Option<usize> {
        None
    }

    /// Wakes every wait on `comm_id` at this endpoint with [`TransportError::Aborted`],
    /// now and from now on.
    fn abort(&self, comm_id: u64, reason: &str);

    /// Tells `peers` that `comm_id` failed at this endpoint with `error` at stage `at`, so
    /// their waits on it from that stage on (and their waits on this endpoint) end with
    /// [`TransportError::PeerFailed`]. Best effort.
    fn notify_failure(&self, comm_id: u64, peers: &[usize], at: Stage, error: &Error);

    /// This endpoint is done with `comm_id`: its state is freed, and peers still waiting on
    /// this endpoint for it (with nothing queued) get [`TransportError::PeerLost`].
    fn release(&self, comm_id: u64, peers: &[usize]);
}
