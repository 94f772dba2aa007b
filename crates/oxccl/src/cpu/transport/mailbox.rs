//! The receive side shared by every transport: frames that have arrived at this endpoint,
//! queued per (communicator, source) in arrival order, with the failure state that ends
//! waits early (local abort, a peer's failure notice, a peer that is gone).
//!
//! Transports differ only in how frames get here: the in-memory transport delivers straight
//! from the sender's thread, TCP from one reader thread per connection, shared memory from
//! its progress thread or from the receiving caller, which reads the rings itself while it
//! waits.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::frame::{decode_error, FrameError, FrameHeader, FrameKind};
use super::{Channel, Header, Received, Stage, TransportError};
use crate::error::Error;

/// Frames that arrived at one endpoint, and the state that ends waits on them.
#[derive(Debug, Default)]
pub struct Mailbox {
    state: Mutex<State>,
    arrived: Condvar,
    /// Whether any communicator was aborted here: until then, senders skip the lock.
    any_aborted: AtomicBool,
    /// Counts the updates (frames, notices, aborts, lost peers), so that a receiver that
    /// polls ([`Mailbox::recv_polling`]) takes the lock only when something changed.
    updates: AtomicU64,
    /// Frames queued, for every communicator and source (written under the lock), so that
    /// [`Mailbox::try_recv_queued`] finds an empty mailbox without the lock.
    queued: AtomicUsize,
    /// Payload buffers given back once their frame was copied out, for the links to fill
    /// again ([`Mailbox::spare_buffer`]): a fresh allocation per large frame costs its page
    /// faults every time.
    spare: Mutex<Vec<Vec<u8>>>,
}

/// Payload buffers the mailbox keeps for reuse, at most.
const SPARES: usize = 8;
/// The capacities of the payload buffers it keeps. Smaller ones come from the allocator's
/// per-thread cache; from 1 KiB on, a buffer that one thread (a link's reader) allocates and
/// another (the caller) frees goes through the allocator's shared bins, and often comes back
/// as fresh pages to fault in and zero (measurements: docs/performance.md). Larger ones
/// would hold too much memory idle.
const SPARE_CAPACITY: std::ops::RangeInclusive<usize> = (1 << 10)..=(4 << 20);

/// Hashes the mailbox's keys, communicator ids and ranks, with one multiplication: every
/// frame looks up its communicator and its source twice (delivered, then taken), and the
/// standard hasher (SipHash, built to resist chosen keys) took 13% of a receiver's time in
/// a stream of 8-byte frames. The keys come from this job's own ranks, which the job's
/// secret admitted.
#[derive(Debug, Default, Clone, Copy)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        // A multiplication by an odd constant (2^64 over the golden ratio) spreads the
        // bits into the high ones, which the table's control bytes use, and keeps distinct
        // low bits distinct.
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

type Keyed<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;
type KeySet<K> = HashSet<K, BuildHasherDefault<KeyHasher>>;

#[derive(Debug, Default)]
struct State {
    comms: Keyed<u64, CommBox>,
    /// Communicators this endpoint released: late notices and frames for them are dropped
    /// instead of re-creating their state (which would leak one entry per communicator).
    released: KeySet<u64>,
    /// Sources whose connection is gone for every communicator, with what was observed.
    lost: Keyed<usize, String>,
    /// Threads blocked in `recv` (so updates wake nobody, without a system call, when
    /// nobody waits).
    waiting: usize,
    /// What each of them waits for: (communicator, source).
    waits: Vec<(u64, usize)>,
}

#[derive(Debug, Default)]
struct CommBox {
    queues: Keyed<usize, VecDeque<Frame>>,
    /// Sources that released this communicator.
    closed: KeySet<usize>,
    /// Failures reported by peers (the first per peer), in arrival order, with the first
    /// stage each peer will not complete.
    failed: Vec<Failed>,
    /// Set by a local abort.
    aborted: Option<String>,
}

#[derive(Debug)]
struct Failed {
    src: usize,
    at: Stage,
    error: Error,
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
        crate::sync::relock(&self.state)
    }

    /// Applies `f` and wakes the waiters, if there are any (a waiter counts itself and
    /// re-checks the state under the same lock before it sleeps, so none is missed).
    fn update(&self, f: impl FnOnce(&mut State)) {
        let wake = {
            let mut st = self.lock();
            f(&mut st);
            // Only under the lock: a plain store suffices (no read-modify-write).
            self.updates.store(self.updates.load(Ordering::Relaxed) + 1, Ordering::Release);
            st.waiting > 0
        };
        if wake {
            self.arrived.notify_all();
        }
    }

    /// Takes in one frame that arrived from `src` over a link, by kind: data is queued
    /// ([`Mailbox::deliver`]), a failure notice decoded and recorded ([`Mailbox::fail`], its
    /// stage in the fingerprint's sequence number), a release notice recorded
    /// ([`Mailbox::close`]).
    ///
    /// # Errors
    /// [`FrameError`] for a failure notice that cannot be decoded (nothing is recorded; the
    /// link decides what to do with a peer that sends one).
    pub fn accept(&self, src: usize, frame: FrameHeader, payload: Vec<u8>) -> Result<(), FrameError> {
        let comm_id = frame.header.comm_id;
        match frame.kind {
            FrameKind::Data => self.deliver(src, frame.header, payload),
            FrameKind::Failure => {
                self.fail(comm_id, src, Stage::of_seq(frame.header.fingerprint.seq), decode_error(&payload)?)
            }
            FrameKind::Release => self.close(comm_id, src),
        }
        Ok(())
    }

    /// Queues a frame from `src`.
    pub fn deliver(&self, src: usize, header: Header, payload: Vec<u8>) {
        self.update(|st| {
            if st.released.contains(&header.comm_id) {
                return;
            }
            let cb = st.comms.entry(header.comm_id).or_default();
            cb.queues.entry(src).or_default().push_back(Frame { header, payload });
            self.count_queued(|q| q + 1);
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

    /// `src` failed `comm_id` with `error` at stage `at`: waits on `src`, and collective
    /// waits at stage `at` or later, end with `PeerFailed` (see [`Mailbox::recv`]).
    pub fn fail(&self, comm_id: u64, src: usize, at: Stage, error: Error) {
        self.update(|st| {
            if st.released.contains(&comm_id) {
                return;
            }
            let cb = st.comms.entry(comm_id).or_default();
            if !cb.failed.iter().any(|f| f.src == src) {
                cb.failed.push(Failed { src, at, error });
            }
        });
    }

    /// The failure `src` reported for `comm_id`, waiting for its notice until `until`. A peer
    /// that fails tells the others why and then usually exits: a send to it that finds the
    /// connection closed should report the cause it announced, not the closed connection,
    /// and the notice may still be on its way in (a write can find the connection broken
    /// before the reader has taken in what arrived ahead of the close).
    pub fn failure_from(&self, comm_id: u64, src: usize, until: Instant) -> Option<Error> {
        let mut st = self.lock();
        loop {
            let found = st.comms.get(&comm_id).and_then(|c| c.failed.iter().find(|f| f.src == src));
            if let Some(f) = found {
                return Some(f.error.clone());
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            st.waiting += 1;
            st = self.arrived.wait_timeout(st, until - now).unwrap_or_else(|p| p.into_inner()).0;
            st.waiting -= 1;
        }
    }

    /// `src` is gone for every communicator (its connection broke, its process died).
    pub fn lose(&self, src: usize, detail: &str) {
        self.update(|st| {
            st.lost.entry(src).or_insert_with(|| detail.to_string());
        });
    }

    /// A local abort of `comm_id`: every wait on it ends with `Aborted`, now and later.
    pub fn abort(&self, comm_id: u64, reason: &str) {
        self.any_aborted.store(true, Ordering::Release);
        self.update(|st| {
            let cb = st.comms.entry(comm_id).or_default();
            if cb.aborted.is_none() {
                cb.aborted = Some(reason.to_string());
            }
        });
    }

    /// Whether `comm_id` was aborted locally (and why).
    pub fn aborted(&self, comm_id: u64) -> Option<String> {
        if !self.any_aborted.load(Ordering::Acquire) {
            return None;
        }
        self.lock().comms.get(&comm_id).and_then(|c| c.aborted.clone())
    }

    /// Forgets `comm_id` (this endpoint released it).
    pub fn forget(&self, comm_id: u64) {
        let mut st = self.lock();
        if let Some(cb) = st.comms.remove(&comm_id) {
            let dropped: usize = cb.queues.values().map(VecDeque::len).sum();
            self.count_queued(|q| q.saturating_sub(dropped));
        }
        st.released.insert(comm_id);
    }

    /// Checks the failure states for a wait on `peer` at stage `at` (`None`: point-to-point),
    /// then finds the first frame from `peer` on `channel`.
    ///
    /// A frame that arrived is delivered whatever failed since: a peer that finished this
    /// operation and then failed a later one must not break this one. With nothing queued,
    /// the wait ends on a failure notice from `peer` itself (it will send nothing more), or
    /// from any peer that failed at this collective's stage or before it (the collective
    /// cannot complete). A notice for a later stage does not end it: that peer completed
    /// this stage, and what this wait expects from `peer` may still be on its way (frames
    /// from different peers race each other).
    fn find(
        st: &mut State,
        comm_id: u64,
        peer: usize,
        channel: Channel,
        at: Option<Stage>,
    ) -> Result<Option<usize>, TransportError> {
        let lost = st.lost.get(&peer).cloned();
        let cb = st.comms.entry(comm_id).or_default();
        if let Some(reason) = &cb.aborted {
            return Err(TransportError::Aborted(reason.clone()));
        }
        let pos = cb.queues.get(&peer).and_then(|q| q.iter().position(|f| f.header.channel == channel));
        if pos.is_none() {
            let ends_wait = |f: &&Failed| f.src == peer || f.at == Stage::Setup || at.is_some_and(|w| f.at <= w);
            if let Some(f) = cb.failed.iter().find(ends_wait) {
                return Err(TransportError::PeerFailed { peer: f.src, error: f.error.clone() });
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
    /// copies the payload into `buf` when it fits. `at` is the stage of the collective the
    /// wait belongs to (`None` for point-to-point traffic).
    ///
    /// # Errors
    /// `Timeout` at the deadline; `Aborted`, `PeerFailed`, `PeerLost` as the state says.
    pub fn recv(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, TransportError> {
        let mut st = self.lock();
        loop {
            if let Some(frame) = self.take(&mut st, comm_id, peer, channel, at)? {
                // The frame is ours now: copy it out without holding up deliveries.
                drop(st);
                return Ok(self.copy_out(frame, buf));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::Timeout { peer });
            }
            st.waiting += 1;
            st.waits.push((comm_id, peer));
            st = self.arrived.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
            st.waiting -= 1;
            if let Some(i) = st.waits.iter().position(|w| *w == (comm_id, peer)) {
                st.waits.swap_remove(i);
            }
        }
    }

    /// Takes the next frame on `(comm_id, channel)` from any of `peers` (point-to-point
    /// traffic), waiting until `deadline`; copies the payload into `buf` when it fits.
    /// Returns the source with the frame. Sources are looked at from `peers[first]` on, so
    /// that a caller that rotates `first` serves every sender in turn; frames from one
    /// source are taken in order.
    ///
    /// With nothing queued from any of them the wait ends on: a local abort; a failure
    /// notice from any of them, or a setup-stage one (the message may have been coming from
    /// the rank that failed, as `MPI_ANY_SOURCE` receives fail under ULFM); a source that is
    /// gone; every source other than this endpoint having closed the communicator.
    ///
    /// # Errors
    /// `Timeout` at the deadline (naming `peers[first]`); the others as [`Mailbox::recv`].
    #[allow(clippy::too_many_arguments)]
    pub fn recv_any(
        &self,
        me: usize,
        peers: &[usize],
        first: usize,
        comm_id: u64,
        channel: Channel,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<(usize, Received), TransportError> {
        let Some(&named) = peers.get(first % peers.len().max(1)) else {
            return Err(TransportError::Other(Error::invalid("a receive from any source with no sources")));
        };
        let mut st = self.lock();
        loop {
            if let Some((src, frame)) = self.take_any(&mut st, me, peers, first, comm_id, channel)? {
                drop(st);
                return Ok((src, self.copy_out(frame, buf)));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::Timeout { peer: named });
            }
            st.waiting += 1;
            st = self.arrived.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
            st.waiting -= 1;
        }
    }

    /// The frame [`Mailbox::recv_any`] takes now, if any, with its source; the failure that
    /// ends its wait when none is queued.
    fn take_any(
        &self,
        st: &mut State,
        me: usize,
        peers: &[usize],
        first: usize,
        comm_id: u64,
        channel: Channel,
    ) -> Result<Option<(usize, Frame)>, TransportError> {
        let n = peers.len();
        let lost = peers.iter().find_map(|p| st.lost.get(p).map(|d| (*p, d.clone())));
        let cb = st.comms.entry(comm_id).or_default();
        if let Some(reason) = &cb.aborted {
            return Err(TransportError::Aborted(reason.clone()));
        }
        for src in (0..n).map(|i| peers[(first + i) % n]) {
            let Some(q) = cb.queues.get_mut(&src) else { continue };
            if let Some(frame) = q.iter().position(|f| f.header.channel == channel).and_then(|pos| q.remove(pos)) {
                self.count_queued(|q| q.saturating_sub(1));
                return Ok(Some((src, frame)));
            }
        }
        if let Some(f) = cb.failed.iter().find(|f| f.at == Stage::Setup || peers.contains(&f.src)) {
            return Err(TransportError::PeerFailed { peer: f.src, error: f.error.clone() });
        }
        if let Some((peer, detail)) = lost {
            return Err(TransportError::PeerLost { peer, detail });
        }
        let mut others = peers.iter().copied().filter(|&p| p != me);
        let some_other = others.clone().next();
        if let (Some(peer), true) = (some_other, others.all(|p| cb.closed.contains(&p))) {
            return Err(TransportError::PeerLost {
                peer,
                detail: "every rank that could send closed this communicator (dropped it, or its process ended)".into(),
            });
        }
        Ok(None)
    }

    /// Records a wait on `peer` for `comm_id` that does not go through [`Mailbox::recv`] (a
    /// caller sleeping on a socket), for [`Mailbox::waiting_on`]; [`Mailbox::end_wait`]
    /// removes it.
    pub fn begin_wait(&self, comm_id: u64, peer: usize) {
        self.lock().waits.push((comm_id, peer));
    }

    /// Ends a [`Mailbox::begin_wait`].
    pub fn end_wait(&self, comm_id: u64, peer: usize) {
        let mut st = self.lock();
        if let Some(i) = st.waits.iter().position(|w| *w == (comm_id, peer)) {
            st.waits.swap_remove(i);
        }
    }

    /// The source a `recv` on `comm_id` is blocked on now, if any (for the flight
    /// recorder's dump of a hang).
    pub fn waiting_on(&self, comm_id: u64) -> Option<usize> {
        self.lock().waits.iter().find(|w| w.0 == comm_id).map(|w| w.1)
    }

    /// [`Mailbox::recv`], after looking for the frame without sleeping for up to `poll_for`,
    /// then for up to `yield_for` with a `sched_yield` between looks (each look after the
    /// first only when the mailbox changed): where the sender is a running thread of this
    /// process, its frame usually comes within a microsecond or two, and sleeping on the
    /// condition variable would add two thread wake-ups to every message (measurements:
    /// docs/performance.md); where the threads outnumber the CPUs, a yield lets the sender
    /// run at once.
    ///
    /// # Errors
    /// As [`Mailbox::recv`].
    #[allow(clippy::too_many_arguments)]
    pub fn recv_polling(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
        buf: &mut [u8],
        deadline: Instant,
        poll_for: Duration,
        yield_for: Duration,
    ) -> Result<Received, TransportError> {
        let start = Instant::now();
        let (spin_until, until) = (start + poll_for, start + poll_for + yield_for);
        let mut seen = None;
        let mut looks = 0u32;
        let mut yielding = poll_for.is_zero();
        while !(poll_for + yield_for).is_zero() {
            let now = self.updates.load(Ordering::Acquire);
            if seen != Some(now) {
                seen = Some(now);
                if let Some(r) = self.try_recv(peer, comm_id, channel, at, buf)? {
                    return Ok(r);
                }
            }
            if yielding {
                std::thread::yield_now();
                let t = Instant::now();
                if t >= until || t >= deadline {
                    break;
                }
                continue;
            }
            // A clock read costs about as much as a look: look 64 times per read.
            looks = looks.wrapping_add(1);
            if looks.is_multiple_of(64) {
                let t = Instant::now();
                if t >= until || t >= deadline {
                    break;
                }
                yielding = t >= spin_until;
            }
            std::hint::spin_loop();
        }
        self.recv(peer, comm_id, channel, at, buf, deadline)
    }

    /// [`Mailbox::recv`] without waiting: `None` when the frame has not arrived.
    ///
    /// # Errors
    /// As [`Mailbox::recv`], except `Timeout`.
    pub fn try_recv(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
        buf: &mut [u8],
    ) -> Result<Option<Received>, TransportError> {
        let frame = self.take(&mut self.lock(), comm_id, peer, channel, at)?;
        Ok(frame.map(|f| self.copy_out(f, buf)))
    }

    /// Changes the count of queued frames by `f`; called with the lock held (every writer
    /// holds it, so a plain store suffices).
    fn count_queued(&self, f: impl FnOnce(usize) -> usize) {
        self.queued.store(f(self.queued.load(Ordering::Relaxed)), Ordering::Relaxed);
    }

    /// Whether no frame at all is queued here (any communicator, any source). For the
    /// frames of one link's peers, exact where the caller holds that link's incoming side
    /// (which every delivery of them holds); else a hint.
    pub fn nothing_queued(&self) -> bool {
        self.queued.load(Ordering::Relaxed) == 0
    }

    /// [`Mailbox::try_recv`] that answers `None` without the lock while no frame at all is
    /// queued here, whatever failed meanwhile (the caller's [`Mailbox::recv`] then reports
    /// it): a receive that looks before it waits costs one load when its frame has not
    /// arrived.
    ///
    /// # Errors
    /// As [`Mailbox::try_recv`], where some frame is queued.
    pub fn try_recv_queued(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
        buf: &mut [u8],
    ) -> Result<Option<Received>, TransportError> {
        if self.nothing_queued() {
            return Ok(None);
        }
        self.try_recv(peer, comm_id, channel, at, buf)
    }

    /// Removes the frame [`Mailbox::find`] finds from its queue.
    fn take(
        &self,
        st: &mut State,
        comm_id: u64,
        peer: usize,
        channel: Channel,
        at: Option<Stage>,
    ) -> Result<Option<Frame>, TransportError> {
        let Some(pos) = Self::find(st, comm_id, peer, channel, at)? else { return Ok(None) };
        let frame = st.comms.get_mut(&comm_id).and_then(|c| c.queues.get_mut(&peer)).and_then(|q| q.remove(pos));
        if frame.is_some() {
            self.count_queued(|q| q.saturating_sub(1));
        }
        Ok(frame)
    }

    /// Copies a taken frame's payload into `buf` when it fits (the length says whether it
    /// did), and keeps its buffer for reuse.
    fn copy_out(&self, frame: Frame, buf: &mut [u8]) -> Received {
        let len = frame.payload.len();
        if len <= buf.len() {
            buf[..len].copy_from_slice(&frame.payload);
        }
        if SPARE_CAPACITY.contains(&frame.payload.capacity()) {
            let mut spare = crate::sync::relock(&self.spare);
            if spare.len() < SPARES {
                spare.push(frame.payload);
            }
        }
        Received { header: frame.header, len }
    }

    /// An empty buffer to read a `len`-byte payload into: for a payload large enough to be
    /// kept afterwards, one given back by an earlier frame (its capacity kept); else a new
    /// one (small frames never take the pool's lock).
    pub fn spare_buffer(&self, len: usize) -> Vec<u8> {
        if len < *SPARE_CAPACITY.start() {
            return Vec::new();
        }
        let mut b = crate::sync::relock(&self.spare).pop().unwrap_or_default();
        b.clear();
        b
    }

    /// The next frame on `(comm_id, channel)` from `peer`, if any, left queued.
    ///
    /// # Errors
    /// As [`Mailbox::recv`], without waiting.
    pub fn probe(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
    ) -> Result<Option<Received>, TransportError> {
        let mut st = self.lock();
        let pos = Self::find(&mut st, comm_id, peer, channel, at)?;
        Ok(pos.and_then(|p| {
            st.comms
                .get(&comm_id)
                .and_then(|c| c.queues.get(&peer))
                .and_then(|q| q.get(p))
                .map(|f| Received { header: f.header, len: f.payload.len() })
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::op_kind::OpKind;

    const COMM: u64 = 7;

    fn header(seq: u64) -> Header {
        let fingerprint = Fingerprint {
            seq,
            op: OpKind::Barrier,
            dtype: crate::DType::U8,
            count: 0,
            root: None,
            reduce: None,
            algorithm: crate::Algorithm::Auto,
        };
        Header { comm_id: COMM, channel: Channel::Collective, fingerprint }
    }

    fn failed_by(r: Result<Option<Received>, TransportError>) -> Option<usize> {
        match r {
            Err(TransportError::PeerFailed { peer, .. }) => Some(peer),
            Ok(_) => None,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }

    fn p2p(tag: u32, seq: u64) -> Header {
        Header { channel: Channel::PointToPoint(tag), ..header(seq) }
    }

    /// `recv_any` over ranks 0..4 (this endpoint is 0), from `first`, within 20 ms.
    fn any(mb: &Mailbox, first: usize, tag: u32) -> Result<(usize, u64), TransportError> {
        let deadline = Instant::now() + Duration::from_millis(20);
        let mut buf = [0u8; 4];
        let (src, got) = mb.recv_any(0, &[0, 1, 2, 3], first, COMM, Channel::PointToPoint(tag), &mut buf, deadline)?;
        Ok((src, got.header.fingerprint.seq))
    }

    #[test]
    fn a_receive_from_any_source_serves_senders_in_turn_and_each_in_order() {
        let mb = Mailbox::new();
        for seq in 0..2 {
            for src in [1, 3] {
                mb.deliver(src, p2p(5, 10 * src as u64 + seq), vec![1]);
            }
        }
        mb.deliver(2, p2p(6, 99), vec![1]);
        // From rank 2 on: rank 2's frame has another tag, so rank 3 comes first.
        assert_eq!(any(&mb, 2, 5).unwrap(), (3, 30));
        assert_eq!(any(&mb, 1, 5).unwrap(), (1, 10));
        assert_eq!(any(&mb, 3, 5).unwrap(), (3, 31));
        assert_eq!(any(&mb, 0, 5).unwrap(), (1, 11));
        assert!(matches!(any(&mb, 0, 5), Err(TransportError::Timeout { peer: 0 })));
        assert_eq!(any(&mb, 0, 6).unwrap(), (2, 99));
        assert_eq!(mb.queued.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_receive_from_any_source_wakes_for_a_frame_from_another_thread() {
        let mb = std::sync::Arc::new(Mailbox::new());
        let sender = {
            let mb = std::sync::Arc::clone(&mb);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                mb.deliver(2, p2p(5, 7), vec![9]);
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 1];
        let (src, got) = mb.recv_any(0, &[0, 1, 2], 0, COMM, Channel::PointToPoint(5), &mut buf, deadline).unwrap();
        sender.join().unwrap();
        assert_eq!((src, got.len, buf), (2, 1, [9]));
    }

    #[test]
    fn a_receive_from_any_source_ends_when_any_sender_fails_or_is_lost() {
        // A frame already queued is still taken; then the failure ends the wait.
        let mb = Mailbox::new();
        mb.deliver(1, p2p(5, 0), vec![1]);
        mb.fail(COMM, 3, Stage::Collective(8), Error::invalid("rank 3 broke"));
        assert_eq!(any(&mb, 0, 5).unwrap(), (1, 0));
        assert!(matches!(any(&mb, 0, 5), Err(TransportError::PeerFailed { peer: 3, .. })));
        let mb = Mailbox::new();
        mb.lose(2, "connection reset");
        assert!(matches!(any(&mb, 0, 5), Err(TransportError::PeerLost { peer: 2, .. })));
        let mb = Mailbox::new();
        mb.abort(COMM, "stop");
        assert!(matches!(any(&mb, 0, 5), Err(TransportError::Aborted(_))));
    }

    #[test]
    fn a_receive_from_any_source_waits_while_one_sender_remains() {
        let mb = Mailbox::new();
        mb.close(COMM, 1);
        mb.close(COMM, 2);
        // Rank 3 may still send.
        assert!(matches!(any(&mb, 0, 5), Err(TransportError::Timeout { .. })));
        mb.close(COMM, 3);
        // Only this endpoint is left (it cannot send while it waits).
        assert!(matches!(any(&mb, 0, 5), Err(TransportError::PeerLost { .. })));
    }

    #[test]
    fn a_notice_ends_waits_at_its_stage_and_later_and_waits_on_its_sender() {
        let mb = Mailbox::new();
        mb.fail(COMM, 2, Stage::Collective(3), Error::invalid("rank 2 broke"));
        let at = |s| Some(Stage::Collective(s));
        // Waits on rank 1 before stage 3 go on: rank 2 completed them.
        assert_eq!(failed_by(mb.probe(1, COMM, Channel::Collective, Some(Stage::Setup))), None);
        assert_eq!(failed_by(mb.probe(1, COMM, Channel::Collective, at(2))), None);
        assert_eq!(failed_by(mb.probe(1, COMM, Channel::PointToPoint(4), None)), None);
        // From stage 3 on the collective cannot complete; rank 2 itself sends nothing more.
        assert_eq!(failed_by(mb.probe(1, COMM, Channel::Collective, at(3))), Some(2));
        assert_eq!(failed_by(mb.probe(1, COMM, Channel::Collective, at(9))), Some(2));
        assert_eq!(failed_by(mb.probe(2, COMM, Channel::Collective, at(0))), Some(2));
        assert_eq!(failed_by(mb.probe(2, COMM, Channel::PointToPoint(4), None)), Some(2));
        // Other communicators are untouched.
        assert_eq!(failed_by(mb.probe(2, COMM + 1, Channel::Collective, at(5))), None);
    }

    #[test]
    fn a_quick_look_counts_the_frames_queued_for_every_communicator() {
        let mb = Mailbox::new();
        let mut buf = [0u8; 2];
        let quick = |mb: &Mailbox, buf: &mut [u8], src, comm| {
            mb.try_recv_queued(src, comm, Channel::Collective, Some(Stage::Setup), buf)
        };
        assert!(quick(&mb, &mut buf, 1, COMM).unwrap().is_none());
        mb.deliver(1, header(0), vec![1, 2]);
        mb.deliver(2, header(1), vec![3, 4]);
        let mut other = header(0);
        other.comm_id = COMM + 1;
        mb.deliver(1, other, vec![5, 6]);
        assert_eq!(mb.queued.load(Ordering::Relaxed), 3);
        // Each frame is found where it is, once, in order per source.
        assert_eq!(quick(&mb, &mut buf, 2, COMM).unwrap().map(|r| (r.len, buf)), Some((2, [3, 4])));
        assert!(quick(&mb, &mut buf, 2, COMM).unwrap().is_none());
        assert_eq!(quick(&mb, &mut buf, 1, COMM).unwrap().map(|r| (r.len, buf)), Some((2, [1, 2])));
        assert_eq!(mb.queued.load(Ordering::Relaxed), 1);
        // A released communicator's frames no longer count: the look is quick again.
        mb.forget(COMM + 1);
        assert_eq!(mb.queued.load(Ordering::Relaxed), 0);
        // With nothing queued, even an aborted communicator's failure is left to `recv`...
        mb.abort(COMM, "stop");
        assert!(quick(&mb, &mut buf, 1, COMM).unwrap().is_none());
        let far = Instant::now() + Duration::from_secs(10);
        let waited = mb.recv(1, COMM, Channel::Collective, Some(Stage::Setup), &mut buf, far);
        assert!(matches!(waited, Err(TransportError::Aborted(_))), "{waited:?}");
        // ...and with a frame queued elsewhere, the look reports it as `try_recv` does.
        mb.deliver(2, header(2), vec![7]);
        assert!(matches!(quick(&mb, &mut buf, 1, COMM), Err(TransportError::Aborted(_))));
    }

    #[test]
    fn a_polling_receive_takes_frames_that_come_during_and_after_its_poll() {
        let mb = Mailbox::new();
        let far = Instant::now() + Duration::from_secs(10);
        let long = Duration::from_secs(10);
        let recv = |buf: &mut [u8], poll: Duration| {
            mb.recv_polling(1, COMM, Channel::Collective, Some(Stage::Setup), buf, far, poll, Duration::ZERO)
        };
        // Within the poll (10 s of it), spinning or yielding: taken by a look, not a sleep.
        for (poll, yields) in [(long, Duration::ZERO), (Duration::ZERO, long), (Duration::from_micros(10), long)] {
            std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(20));
                    mb.deliver(1, header(0), vec![1, 2, 3]);
                });
                let mut buf = [0u8; 3];
                let t = Instant::now();
                let got =
                    mb.recv_polling(1, COMM, Channel::Collective, Some(Stage::Setup), &mut buf, far, poll, yields);
                assert_eq!((got.unwrap().len, buf), (3, [1, 2, 3]));
                assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            });
        }
        std::thread::scope(|s| {
            // After a short poll: the sleeping receive takes it.
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                mb.deliver(1, header(0), vec![4]);
            });
            let mut buf = [0u8; 1];
            let got = recv(&mut buf, Duration::from_micros(10)).unwrap();
            assert_eq!((got.len, buf), (1, [4]));
        });
        // An abort during the poll, spinning or yielding, ends it with the abort.
        for (poll, yields) in [(long, Duration::ZERO), (Duration::ZERO, long)] {
            let mb = Mailbox::new();
            std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(20));
                    mb.abort(COMM, "stop");
                });
                let r =
                    mb.recv_polling(1, COMM, Channel::Collective, Some(Stage::Setup), &mut [0u8; 1], far, poll, yields);
                assert!(matches!(r, Err(TransportError::Aborted(ref why)) if why == "stop"), "{r:?}");
            });
        }
    }

    #[test]
    fn a_setup_stage_notice_ends_every_wait() {
        // Aborts and failed setups are sent at `Stage::Setup`.
        let mb = Mailbox::new();
        mb.fail(COMM, 0, Stage::Setup, Error::invalid("aborted"));
        assert_eq!(failed_by(mb.probe(1, COMM, Channel::Collective, Some(Stage::Setup))), Some(0));
        assert_eq!(failed_by(mb.probe(1, COMM, Channel::PointToPoint(0), None)), Some(0));
    }

    #[test]
    fn a_frame_racing_a_later_stage_notice_is_still_received() {
        // The split-after-error race: rank 0 finished the setup barrier, failed the next
        // collective and told rank 1, whose last setup frame (from rank 3) was still on its way.
        let mb = std::sync::Arc::new(Mailbox::new());
        mb.fail(COMM, 0, Stage::Collective(0), Error::invalid("mismatch in collective 0"));
        let late = std::sync::Arc::clone(&mb);
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            late.deliver(3, header(Stage::SETUP_SEQ), vec![1, 2, 3]);
        });
        let mut buf = [0u8; 3];
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = mb.recv(3, COMM, Channel::Collective, Some(Stage::Setup), &mut buf, deadline);
        assert_eq!(got.map(|g| g.len), Ok(3));
        assert_eq!(buf, [1, 2, 3]);
        sender.join().unwrap();
        // The next wait, at the failed stage, ends at once.
        let r = mb.recv(3, COMM, Channel::Collective, Some(Stage::Collective(0)), &mut buf, deadline);
        assert!(matches!(r, Err(TransportError::PeerFailed { peer: 0, .. })), "{r:?}");
    }

    #[test]
    fn queued_frames_beat_failures_and_released_communicators_stay_forgotten() {
        let mb = Mailbox::new();
        mb.deliver(1, header(4), vec![9]);
        mb.fail(COMM, 1, Stage::Collective(5), Error::invalid("later"));
        let mut buf = [0u8; 1];
        let deadline = Instant::now() + Duration::from_secs(5);
        let got = mb.recv(1, COMM, Channel::Collective, Some(Stage::Collective(4)), &mut buf, deadline);
        assert_eq!(got.map(|g| g.header.fingerprint.seq), Ok(4));
        assert_eq!(failed_by(mb.probe(1, COMM, Channel::Collective, Some(Stage::Collective(4)))), Some(1));
        mb.forget(COMM);
        mb.fail(COMM, 1, Stage::Setup, Error::invalid("late notice"));
        mb.deliver(1, header(6), vec![1]);
        assert_eq!(failed_by(mb.probe(1, COMM, Channel::Collective, Some(Stage::Collective(6)))), None);
    }
}
