//! [`Ctx`]: the context of one running collective. It translates communicator ranks to
//! transport ranks, stamps every frame with the collective's fingerprint, checks every frame
//! it receives against it, and keeps the operation's clock. Messages cut into pieces and
//! two-way exchanges are built on it in [`pipeline`](super::pipeline).

use std::ops::Range;
use std::time::{Duration, Instant};

use super::hosts::HostGroups;
use crate::backend::peer_waits::PeerWaits;
use crate::cpu::transport::{Channel, Header, Received, Stage, Transport, TransportError};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::reduce_op::ReduceOp;

/// How long a receive waits on its peer before it looks at what the others sent
/// ([`Ctx::recv`]).
pub(super) const LOOK_ELSEWHERE: Duration = Duration::from_millis(50);

/// The context of one running collective: who we are, who the peers are, what we run.
pub struct Ctx<'a> {
    pub(crate) transport: &'a dyn Transport,
    pub(crate) comm_id: u64,
    /// Communicator rank -> transport rank.
    pub(crate) ranks: &'a [usize],
    pub(crate) rank: usize,
    pub(crate) fp: Fingerprint,
    /// When the operation started and when its waits give up.
    pub(crate) clock: Clock,
    /// The communicator's shared-memory collectives, which keep the tally of collective
    /// frames (so a frame nobody takes is found at their next step).
    pub(crate) tally: Option<&'a dyn FrameTally>,
    /// Where waits for peers are added up, when the profiler asks (`None`: no clock read).
    pub(crate) waits: Option<&'a PeerWaits>,
    /// This rank's groups by host, when the communicator spans hosts alike (where the
    /// hierarchical algorithms run).
    pub(crate) hosts: Option<&'a HostGroups>,
    /// The shared-memory collectives of this rank's host (its ranks in `hosts.local`), when
    /// the communicator spans hosts and this host could set them up: the hierarchical
    /// algorithms run their phases inside the host on them.
    pub(crate) host_native: Option<&'a dyn HostPhases>,
}

/// The start and deadline of one operation, read from the clock at the first need: an
/// operation whose waits all end at once (the shared-memory collectives on a quiet host)
/// never reads the clock. Transport-based algorithms need it at their first send.
pub(crate) struct Clock {
    timeout: Duration,
    times: std::cell::OnceCell<(Instant, Instant)>,
    /// When the next receive that is still waiting looks at the other peers
    /// ([`LOOK_ELSEWHERE`] after the start, then after each look); `None` until the first
    /// receive asks.
    look: std::cell::Cell<Option<Instant>>,
}

impl Clock {
    /// A clock whose deadline is `timeout` after its start.
    pub(crate) fn new(timeout: Duration) -> Clock {
        Clock { timeout, times: std::cell::OnceCell::new(), look: std::cell::Cell::new(None) }
    }

    fn times(&self) -> (Instant, Instant) {
        *self.times.get_or_init(|| {
            let now = Instant::now();
            (now, now.checked_add(self.timeout).unwrap_or(now + Duration::from_secs(86_400 * 365)))
        })
    }

    /// When the operation started (its first look at the clock).
    pub(crate) fn started(&self) -> Instant {
        self.times().0
    }

    /// When its waits give up.
    pub(crate) fn deadline(&self) -> Instant {
        self.times().1
    }

    /// A clock with this one's start and deadline (read now if they were not yet), for a
    /// part of the operation run in a context of its own.
    pub(crate) fn fork(&self) -> Clock {
        self.times();
        Clock { timeout: self.timeout, times: self.times.clone(), look: self.look.clone() }
    }

    /// Until when a receive waits on its peer before it looks at the others:
    /// [`LOOK_ELSEWHERE`] after the operation's start, or after the last look
    /// ([`Clock::looked`]); at most the deadline. No clock read: a receive per frame would
    /// otherwise read it once more (a quarter of the clock reads of a stream of small
    /// frames). A receive that starts past this time looks at the others once after its
    /// first look at its peer.
    fn look_until(&self) -> Instant {
        let (started, deadline) = self.times();
        self.look.get().unwrap_or(started + LOOK_ELSEWHERE).min(deadline)
    }

    /// A receive looked at the other peers now: the next look is [`LOOK_ELSEWHERE`] later.
    fn looked(&self) {
        self.look.set(Some(Instant::now() + LOOK_ELSEWHERE));
    }
}

impl Ctx<'_> {
    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks in the communicator.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    pub(super) fn header(&self) -> Header {
        Header { comm_id: self.comm_id, channel: Channel::Collective, fingerprint: self.fp }
    }

    pub(super) fn transport_rank(&self, peer: usize) -> Result<usize> {
        self.ranks.get(peer).copied().ok_or_else(|| {
            Error::invalid(format!("algorithm addressed rank {peer} in a communicator of {}", self.ranks.len()))
        })
    }

    /// Counts a frame sent to `peer`.
    pub(super) fn count_sent(&self, peer: usize) {
        if let Some(tally) = self.tally {
            tally.count_sent(peer);
        }
    }

    /// Sends one frame of `data` to `peer`.
    pub(super) fn send_frame(&self, peer: usize, data: &[u8]) -> Result<()> {
        let t = self.transport_rank(peer)?;
        self.transport.send(t, &self.header(), data, self.clock.deadline()).map_err(|e| self.map_err(e))?;
        self.count_sent(peer);
        Ok(())
    }

    /// Receives the piece at byte `offset` of a `total`-byte message from `peer` into
    /// `buf` (its exact length), checking the frame's fingerprint and length.
    ///
    /// A wait that lasts until [`LOOK_ELSEWHERE`] into the operation, and every
    /// [`LOOK_ELSEWHERE`] after that, looks at what the other peers sent meanwhile:
    /// where they run another collective, `peer` may never send to us (a binomial tree's
    /// root waits on rank 1, which runs a ring all_gather and sends to rank 2), and only a
    /// frame from someone else shows the mismatch before the deadline.
    pub(super) fn recv_piece(&self, peer: usize, buf: &mut [u8], offset: usize, total: usize) -> Result<()> {
        let t = self.transport_rank(peer)?;
        let at = Some(Stage::of_seq(self.fp.seq));
        // A frame already here needs no deadline, and so no clock read (in a stream of
        // frames, the one after this one is usually here by the time this one is taken).
        let here =
            self.transport.try_recv(t, self.comm_id, Channel::Collective, at, buf).map_err(|e| self.map_err(e))?;
        if let Some(got) = here {
            return self.check_piece(peer, got, buf.len(), offset, total);
        }
        let deadline = self.clock.deadline();
        let got = self.waiting_on(peer, || loop {
            let until = self.clock.look_until();
            match self.transport.recv(t, self.comm_id, Channel::Collective, at, buf, until) {
                Err(TransportError::Timeout { .. }) if until < deadline => {
                    self.clock.looked();
                    if let Some(e) = self.mismatch_elsewhere(peer) {
                        return Err(e);
                    }
                }
                r => return r.map_err(|e| self.map_err(e)),
            }
        })?;
        self.check_piece(peer, got, buf.len(), offset, total)
    }

    /// A frame of this collective's sequence number, from a peer other than `waited`, whose
    /// fingerprint is not ours: that peer runs another collective. (A frame of a later one
    /// is no sign: a rank that only sends, as in a reduce, runs ahead.)
    fn mismatch_elsewhere(&self, waited: usize) -> Option<Error> {
        let at = Some(Stage::of_seq(self.fp.seq));
        (0..self.ranks.len()).filter(|&p| p != waited && p != self.rank).find_map(|p| {
            match self.transport.probe(self.ranks[p], self.comm_id, Channel::Collective, at) {
                Ok(Some(got)) if got.header.fingerprint.seq == self.fp.seq && got.header.fingerprint != self.fp => {
                    Some(Error::Mismatch { peer: p, ours: self.fp, theirs: got.header.fingerprint })
                }
                _ => None,
            }
        })
    }

    /// Runs `wait`, a wait on `peer`, counting its time for the profiler when it is on.
    pub(super) fn waiting_on<T>(&self, peer: usize, wait: impl FnOnce() -> T) -> T {
        let t0 = self.waits.map(|_| PeerWaits::start());
        let r = wait();
        if let (Some(w), Some(t0)) = (self.waits, t0) {
            w.add_since(peer, t0);
        }
        r
    }

    /// Checks a frame that arrived from `peer` as the piece at byte `offset` of a
    /// `total`-byte message, expected to be `want` bytes long, and counts it taken.
    pub(super) fn check_piece(
        &self,
        peer: usize,
        got: Received,
        want: usize,
        offset: usize,
        total: usize,
    ) -> Result<()> {
        if let Some(tally) = self.tally {
            tally.count_taken(peer);
        }
        if got.header.fingerprint != self.fp {
            return Err(Error::Mismatch { peer, ours: self.fp, theirs: got.header.fingerprint });
        }
        if got.len != want {
            // The whole messages' counts: the peer's is at least what it has sent so far
            // (exactly that when this frame came short).
            let es = self.fp.dtype.size().max(1) as u64;
            let mut ours = self.fp;
            let mut theirs = self.fp;
            ours.count = total as u64 / es;
            theirs.count = (offset + got.len) as u64 / es;
            return Err(Error::Mismatch { peer, ours, theirs });
        }
        Ok(())
    }

    /// Turns a transport error into the user-facing error of this collective.
    pub(crate) fn map_err(&self, e: TransportError) -> Error {
        map_transport_error(e, self.ranks, self.rank, self.fp, self.clock.started())
    }
}

/// Turns a transport error into the user-facing error, translating transport ranks back to
/// communicator ranks and adding the operation's fingerprint and elapsed time.
pub(crate) fn map_transport_error(
    e: TransportError,
    ranks: &[usize],
    my_rank: usize,
    fp: Fingerprint,
    started: Instant,
) -> Error {
    let local = |t: usize| ranks.iter().position(|&r| r == t).unwrap_or(t);
    match e {
        TransportError::Timeout { peer } => {
            Error::Timeout { op: fp.op, seq: fp.seq, peer: Some(local(peer)), waited: started.elapsed() }
        }
        TransportError::PeerLost { peer, detail } => Error::PeerLost { rank: local(peer), detail },
        TransportError::Aborted(reason) => Error::Aborted { reason },
        TransportError::PeerFailed { peer, error } => {
            let p = local(peer);
            match error {
                // The peer found that we disagree: report the same mismatch from our side.
                Error::Mismatch { peer: q, ours, theirs } if q == my_rank => {
                    Error::Mismatch { peer: p, ours: theirs, theirs: ours }
                }
                // A revoke reaches every rank as itself (it can be shrunk).
                e @ Error::Revoked { .. } => e,
                other => Error::Aborted { reason: format!("rank {p} failed: {other}") },
            }
        }
        TransportError::Other(e) => e,
    }
}

/// The tally of collective frames that a communicator's shared-memory collectives keep (so
/// that a frame nobody takes is found at their next step). A trait, implemented by
/// `shared_memory::ShmCollectives`, so that the context does not depend on a family that
/// runs on it.
pub(crate) trait FrameTally {
    /// Counts a frame this rank sent `to` in a point-to-point collective.
    fn count_sent(&self, to: usize);
    /// Counts a frame this rank took from `from` in a point-to-point collective.
    fn count_taken(&self, from: usize);
}

/// The collectives among the ranks of one host on which the hierarchical algorithms run
/// their phases inside the host (implemented by `shared_memory::ShmCollectives`).
pub(crate) trait HostPhases {
    /// Reduce-scatter of `blocks` of `buf` (from `input` when out of place): block `i` of
    /// host rank `i` becomes the reduction of that block over the host.
    ///
    /// # Errors
    /// As the shared-memory collectives' own.
    fn reduce_scatter_blocks(
        &self,
        ctx: &Ctx,
        input: Option<&[u8]>,
        buf: &mut [u8],
        blocks: &[Range<usize>],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()>;

    /// All-gather of `blocks` of `buf`: host rank `i` contributes block `i`.
    ///
    /// # Errors
    /// As the shared-memory collectives' own.
    fn all_gather_blocks(&self, ctx: &Ctx, buf: &mut [u8], blocks: &[Range<usize>]) -> Result<()>;
}
