//! Collective algorithms, written once over a [`Transport`] so that every CPU transport
//! (in-memory, shared memory, TCP) runs the same code. One folder per operation, one file
//! per algorithm; `shared_memory/` is the family that runs every collective but the `_v`
//! forms directly in a shared segment when every rank is on one host.
//!
//! Every algorithm works on byte buffers whose element boundaries it respects (block
//! boundaries come from [`block`], in elements). Reductions go through a [`Kernel`].
//! Algorithms address peers by their rank in the communicator; [`Ctx`] translates to
//! transport ranks, stamps every frame with the collective's fingerprint and checks every
//! frame it receives against it.

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod barrier;
pub mod broadcast;
pub mod gather;
pub mod halving_doubling;
pub mod hosts;
pub mod pipeline;
pub mod reduce;
pub mod reduce_scatter;
pub mod scatter;
pub mod shared_memory;

use std::ops::Range;
use std::time::{Duration, Instant};

use super::transport::{Channel, Header, Received, Stage, Transport, TransportError};
use crate::backend::peer_waits::PeerWaits;
use crate::backend::reduce as kernels;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::reduce_op::ReduceOp;

/// How long a receive waits on its peer before it looks at what the others sent
/// ([`Ctx::recv`]).
const LOOK_ELSEWHERE: Duration = Duration::from_millis(50);

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
    pub(crate) tally: Option<&'a shared_memory::ShmCollectives>,
    /// Where waits for peers are added up, when the profiler asks (`None`: no clock read).
    pub(crate) waits: Option<&'a PeerWaits>,
    /// This rank's groups by host, when the communicator spans hosts alike (where the
    /// hierarchical algorithms run).
    pub(crate) hosts: Option<&'a hosts::HostGroups>,
    /// The shared-memory collectives of this rank's host (its ranks in `hosts.local`), when
    /// the communicator spans hosts and this host could set them up: the hierarchical
    /// algorithms run their phases inside the host on them.
    pub(crate) host_native: Option<&'a shared_memory::ShmCollectives>,
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

    fn header(&self) -> Header {
        Header { comm_id: self.comm_id, channel: Channel::Collective, fingerprint: self.fp }
    }

    fn transport_rank(&self, peer: usize) -> Result<usize> {
        self.ranks.get(peer).copied().ok_or_else(|| {
            Error::invalid(format!("algorithm addressed rank {peer} in a communicator of {}", self.ranks.len()))
        })
    }

    /// Sends `data` to `peer` (in pieces over TCP: [`pipeline`]).
    ///
    /// # Errors
    /// The transport's errors, with this collective's context.
    pub fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        for r in pipeline::pieces(data.len(), self.chunk_for(peer)) {
            self.send_frame(peer, &data[r])?;
        }
        Ok(())
    }

    /// Counts a frame sent to `peer`.
    fn count_sent(&self, peer: usize) {
        if let Some(tally) = self.tally {
            tally.count_sent(peer);
        }
    }

    /// Sends one frame of `data` to `peer`.
    fn send_frame(&self, peer: usize, data: &[u8]) -> Result<()> {
        let t = self.transport_rank(peer)?;
        self.transport.send(t, &self.header(), data, self.clock.deadline()).map_err(|e| self.map_err(e))?;
        self.count_sent(peer);
        Ok(())
    }

    /// Receives exactly `buf.len()` bytes from `peer` (in pieces over TCP: [`pipeline`]),
    /// checking that every frame belongs to this collective.
    ///
    /// # Errors
    /// [`Error::Mismatch`] when a frame's fingerprint or length differs from ours; the
    /// transport's errors (timeout, lost peer, abort) with this collective's context.
    pub fn recv(&self, peer: usize, buf: &mut [u8]) -> Result<()> {
        let total = buf.len();
        for r in pipeline::pieces(total, self.chunk_for(peer)) {
            let start = r.start;
            self.recv_piece(peer, &mut buf[r], start, total)?;
        }
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
    fn recv_piece(&self, peer: usize, buf: &mut [u8], offset: usize, total: usize) -> Result<()> {
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
    fn waiting_on<T>(&self, peer: usize, wait: impl FnOnce() -> T) -> T {
        let t0 = self.waits.map(|_| PeerWaits::start());
        let r = wait();
        if let (Some(w), Some(t0)) = (self.waits, t0) {
            w.add_since(peer, t0);
        }
        r
    }

    /// Checks a frame that arrived from `peer` as the piece at byte `offset` of a
    /// `total`-byte message, expected to be `want` bytes long, and counts it taken.
    fn check_piece(&self, peer: usize, got: Received, want: usize, offset: usize, total: usize) -> Result<()> {
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

    /// Sends `data` to `to` and receives `buf.len()` bytes from `from`; the two proceed
    /// together (interleaved pieces over TCP: [`Ctx::exchange`]), so rings and pairwise
    /// exchanges cannot deadlock on bounded transports.
    ///
    /// # Errors
    /// As [`Ctx::send`] and [`Ctx::recv`].
    pub fn send_recv(&self, to: usize, data: &[u8], from: usize, buf: &mut [u8]) -> Result<()> {
        self.exchange(to, data, from, pipeline::Sink::Into(buf))
    }

    /// Sends `data` to `to` and combines `acc.len()` bytes received from `from` into `acc`,
    /// piece by piece over TCP, each received into `tmp` first (at least
    /// [`Ctx::scratch_len`] bytes).
    ///
    /// # Errors
    /// As [`Ctx::send_recv`].
    pub fn send_recv_reduce(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        acc: &mut [u8],
        k: &Kernel,
        tmp: &mut [u8],
    ) -> Result<()> {
        self.exchange(to, data, from, pipeline::Sink::Reduce { acc, base: None, k, tmp })
    }

    /// [`Ctx::send_recv_reduce`] where `acc` becomes `base (op) received` (`base`: as long as
    /// `acc`, not overlapping it): what an out-of-place reduction does at the first
    /// combination of a block, without copying `base` into `acc` first.
    ///
    /// # Errors
    /// As [`Ctx::send_recv`].
    #[allow(clippy::too_many_arguments)]
    pub fn send_recv_reduce_from(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        base: &[u8],
        acc: &mut [u8],
        k: &Kernel,
        tmp: &mut [u8],
    ) -> Result<()> {
        self.exchange(to, data, from, pipeline::Sink::Reduce { acc, base: Some(base), k, tmp })
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

/// How values are combined: a dtype and an op (`Avg` combines as `Sum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    /// Element type of the working buffers.
    pub dtype: DType,
    /// The reduction.
    pub op: ReduceOp,
}

impl Kernel {
    /// `acc = acc (op) src`, element-wise.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on length or alignment problems (internal bugs).
    pub fn combine(&self, acc: &mut [u8], src: &[u8]) -> Result<()> {
        kernels::combine(self.dtype, self.op, acc, src)
    }

    /// `acc = base (op) src` element-wise, or `acc = acc (op) src` without a `base`.
    ///
    /// # Errors
    /// As [`Kernel::combine`].
    pub fn combine_from(&self, acc: &mut [u8], base: Option<&[u8]>, src: &[u8]) -> Result<()> {
        match base {
            Some(b) => kernels::combine_into(self.dtype, self.op, acc, b, src),
            None => self.combine(acc, src),
        }
    }

    /// Bytes per element.
    pub fn elem(&self) -> usize {
        self.dtype.size()
    }
}

/// The `i`-th of `n` near-equal blocks of `count` elements: the first `count % n` blocks
/// have one element more. Blocks may be empty when `count < n`.
pub fn block(count: usize, n: usize, i: usize) -> Range<usize> {
    let base = count / n;
    let extra = count % n;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start..start + len
}

/// [`block`] in bytes for elements of `elem` bytes.
pub fn block_bytes(count: usize, n: usize, i: usize, elem: usize) -> Range<usize> {
    let r = block(count, n, i);
    r.start * elem..r.end * elem
}

/// A zeroed scratch buffer aligned for every dtype (8 bytes).
pub struct Scratch {
    words: Vec<u64>,
    len: usize,
}

impl Scratch {
    /// `len` zeroed bytes.
    pub fn new(len: usize) -> Scratch {
        Scratch { words: vec![0u64; len.div_ceil(8)], len }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }

    /// A copy of `src` in aligned memory.
    pub fn copy_of(src: &[u8]) -> Scratch {
        let mut s = Scratch::new(src.len());
        s.bytes_mut().copy_from_slice(src);
        s
    }
}

/// Two disjoint byte ranges of one buffer: the first to read, the second to write.
///
/// # Errors
/// [`Error::InvalidArgument`] when the ranges overlap or leave the buffer (internal bugs).
pub fn split_pair(buf: &mut [u8], read: Range<usize>, write: Range<usize>) -> Result<(&[u8], &mut [u8])> {
    let ok = read.end <= buf.len() && write.end <= buf.len() && (read.end <= write.start || write.end <= read.start);
    if !(ok || read.is_empty() || write.is_empty()) {
        return Err(Error::invalid(format!("overlapping blocks {read:?} and {write:?} in {} bytes", buf.len())));
    }
    if read.is_empty() {
        let w = buf.get_mut(write.clone()).ok_or_else(|| Error::invalid(format!("block {write:?} out of range")))?;
        return Ok((&[], w));
    }
    if write.is_empty() {
        let r = buf.get(read.clone()).ok_or_else(|| Error::invalid(format!("block {read:?} out of range")))?;
        return Ok((r, &mut []));
    }
    if read.start < write.start {
        let (lo, hi) = buf.split_at_mut(write.start);
        Ok((&lo[read], &mut hi[..write.len()]))
    } else {
        let (lo, hi) = buf.split_at_mut(read.start);
        Ok((&hi[..read.len()], &mut lo[write]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receiver_whose_peer_never_sends_finds_the_mismatch_from_another() {
        // Rank 0 runs a binomial-tree all_reduce and waits on rank 1; ranks 1 and 2 run a
        // ring all_gather, where rank 1 sends to rank 2 and only rank 2 sends to rank 0.
        let t0 = Instant::now();
        let out = crate::local::run(3, |comm| {
            let comm = comm.with_timeout(Duration::from_secs(20));
            if comm.rank() == 0 {
                let mut x = [1.0f32; 4];
                comm.with_algorithm(crate::Algorithm::BinomialTree).all_reduce(&mut x, ReduceOp::Sum)
            } else {
                let mut all = [0.0f32; 12];
                comm.with_algorithm(crate::Algorithm::Ring).all_gather(&[1.0f32; 4], &mut all)
            }
        })
        .unwrap();
        assert!(matches!(out[0], Err(Error::Mismatch { peer: 2, .. })), "rank 0: {:?}", out[0]);
        for (r, o) in out.iter().enumerate().skip(1) {
            assert!(matches!(o, Err(Error::Mismatch { .. } | Error::Aborted { .. })), "rank {r}: {o:?}");
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "waited {:?}: the deadline, not the mismatch", t0.elapsed());
    }

    #[test]
    fn a_peer_ahead_by_whole_operations_is_no_mismatch() {
        // A binomial-tree reduce to rank 0 on 3 ranks: rank 0 takes rank 1's buffer, then
        // waits on rank 2, which is slow, while rank 1 (which only sends) already sent its
        // buffers of the next reduces. Those frames are not this reduce's.
        let out = crate::local::run(3, |comm| -> Result<Vec<f32>> {
            let tree = comm.with_algorithm(crate::Algorithm::BinomialTree);
            let mut got = Vec::new();
            for i in 0..3 {
                if comm.rank() == 2 {
                    std::thread::sleep(LOOK_ELSEWHERE * 3);
                }
                let x = [(comm.rank() + 10 * i) as f32; 4];
                let mut y = [0.0f32; 4];
                tree.reduce_into(&x[..], (comm.rank() == 0).then_some(&mut y[..]), ReduceOp::Sum, 0)?;
                got.push(y[0]);
            }
            Ok(got)
        })
        .unwrap();
        assert_eq!(out[0].as_ref().unwrap(), &vec![3.0, 33.0, 63.0], "{out:?}");
        assert!(out.iter().all(|o| o.is_ok()), "{out:?}");
    }

    #[test]
    fn blocks_cover_exactly() {
        for count in [0usize, 1, 2, 7, 8, 13, 100] {
            for n in 1..=9 {
                let mut next = 0;
                for i in 0..n {
                    let b = block(count, n, i);
                    assert_eq!(b.start, next);
                    assert!(b.len() == count / n || b.len() == count / n + 1);
                    next = b.end;
                }
                assert_eq!(next, count);
            }
        }
    }
}
