//! The host side of a GPU communicator: a host communicator over the same ranks (the `cpu`
//! backend in a launched job, `local` in tests) that carries what NCCL cannot:
//!
//! - **Fingerprint checks.** NCCL cannot tell that two ranks called different collectives (it
//!   hangs or corrupts). With the check on, every rank exchanges the fingerprint of each
//!   collective before enqueuing it (an all_gather of 24 bytes per rank) and a difference is
//!   [`Error::Mismatch`] naming both sides.
//! - **Envelopes for point-to-point.** NCCL matches sends to receives by order alone and needs
//!   the receive count in advance; oxccl's `recv` takes any message up to the buffer's length
//!   and reports its count, and `probe` looks ahead. Each send first posts an envelope (tag,
//!   dtype, count) on the host communicator; a receive reads the next envelope from its peer,
//!   checks the tag (messages between two ranks are received in the order they were sent, as
//!   NCCL delivers them) and receives exactly that count.
//! - **Liveness.** While a GPU operation is waited on, the host communicator's view of the
//!   peers (a closed connection, a dead process) turns a hang into [`Error::PeerLost`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::backend::{Backend, CallOptions, Completion, Op, P2p, RawBuf, RawBufMut};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::sync::relock;

/// The host tag of envelopes (user tags travel inside them).
const ENVELOPE_TAG: u32 = 0x0cc1_0001;
/// A tag nothing is ever sent on: probing it reports a peer that is gone.
const LIVENESS_TAG: u32 = 0x0cc1_0002;
/// The host tag of pulls: a receiver waiting for messages a sender has not issued yet.
const PULL_TAG: u32 = 0x0cc1_0003;

/// Runs `op` on the host communicator `comm` and waits for it, with `timeout` as deadline.
///
/// # Safety
/// `op`'s buffers are valid until this returns.
///
/// # Errors
/// The operation's error.
pub(crate) unsafe fn run_blocking(comm: &dyn Backend, op: Op, timeout: Duration) -> Result<Completion> {
    // SAFETY: forwarded from this function's contract.
    unsafe { run_forced(comm, op, timeout, Algorithm::Auto) }
}

/// [`run_blocking`] with `algorithm` forced.
///
/// # Safety
/// As [`run_blocking`].
///
/// # Errors
/// The operation's error.
unsafe fn run_forced(comm: &dyn Backend, op: Op, timeout: Duration, algorithm: Algorithm) -> Result<Completion> {
    let opts = CallOptions { timeout: Some(timeout), algorithm, ..CallOptions::default() };
    // SAFETY: forwarded from this function's contract; `run_blocking` returns after completion.
    unsafe { comm.run_blocking(&op, &opts) }
}

/// What a send announces to its receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Envelope {
    /// The user's tag.
    pub(crate) tag: u32,
    /// The element type.
    pub(crate) dtype: DType,
    /// The element count.
    pub(crate) count: usize,
}

/// What travels on the envelope tag, in the order its sender made them: a message's
/// envelope, or the mark that the sender issued its messages so far as one NCCL group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// A message's envelope.
    Message(Envelope),
    /// The messages announced before this mark (and after the previous one) were issued in
    /// one group: a receiver takes all of them in one group of its own.
    Flushed,
}

/// The first word of a [`Notice::Flushed`] (no tag is this large).
const FLUSHED: u64 = u64::MAX;

impl Notice {
    fn encode(&self) -> [u64; 3] {
        match self {
            Notice::Message(e) => [u64::from(e.tag), e.dtype as u64, e.count as u64],
            Notice::Flushed => [FLUSHED, 0, 0],
        }
    }

    fn decode(w: [u64; 3], peer: usize) -> Result<Notice> {
        if w == [FLUSHED, 0, 0] {
            return Ok(Notice::Flushed);
        }
        let bad = || Error::Internal(format!("rank {peer} sent a malformed point-to-point envelope {w:?}"));
        let tag = u32::try_from(w[0]).map_err(|_| bad())?;
        let dtype = u8::try_from(w[1]).ok().and_then(DType::from_tag).ok_or_else(bad)?;
        let count = usize::try_from(w[2]).map_err(|_| bad())?;
        Ok(Notice::Message(Envelope { tag, dtype, count }))
    }
}

/// A GPU communicator's host communicator and what it keeps for point-to-point.
pub(crate) struct HostSide {
    comm: Arc<dyn Backend>,
    /// Whether collectives are fingerprint-checked.
    check: bool,
    /// Notices received ahead of their receive (by `peek`), per peer, in order.
    early: Mutex<Vec<VecDeque<Notice>>>,
    /// Per peer: the pull handshake's state (see [`Marks`]).
    marks: Mutex<Vec<Marks>>,
}

/// One peer's side of the pull handshake. A pull carries how many [`Notice::Flushed`] marks
/// its sender had received from the peer it pulls; the peer answers it only if it has sent
/// no mark since. A pull that crossed a mark on the wire (the receiver waited, the sender
/// flushed, the pull arrived after) asks for nothing: answering it at the sender's *next*
/// buffered send would issue that send in a group of its own ahead of the sender's next
/// receive, the deadlock `GRACE` in the engine's `progress.rs` exists to avoid.
#[derive(Debug, Clone, Copy, Default)]
struct Marks {
    /// Marks received from the peer.
    seen: u64,
    /// Marks sent to the peer.
    sent: u64,
    /// This rank pulled the peer since the peer's last mark.
    pulled: bool,
    /// The peer pulled this rank since this rank's last mark to it (a pull not yet answered).
    asked: bool,
}

impl HostSide {
    /// The host side over `comm` (same ranks as the GPU communicator), checking
    /// fingerprints when `check`.
    pub(crate) fn new(comm: Arc<dyn Backend>, check: bool) -> HostSide {
        let n = comm.world_size();
        HostSide {
            comm,
            check,
            early: Mutex::new(vec![VecDeque::new(); n]),
            marks: Mutex::new(vec![Marks::default(); n]),
        }
    }

    /// The host communicator.
    pub(crate) fn comm(&self) -> &Arc<dyn Backend> {
        &self.comm
    }

    /// Whether collectives are fingerprint-checked.
    pub(crate) fn checks(&self) -> bool {
        self.check
    }

    /// Runs `op` on the host communicator and waits for it.
    ///
    /// # Safety
    /// `op`'s buffers are valid until this returns.
    unsafe fn run(&self, op: Op, timeout: Duration) -> Result<Completion> {
        // SAFETY: forwarded from this function's contract.
        unsafe { run_blocking(self.comm.as_ref(), op, timeout) }
    }

    /// Exchanges `fp` with every rank (when checking is on) and fails with
    /// [`Error::Mismatch`] naming the first rank whose fingerprint differs.
    ///
    /// # Errors
    /// `Mismatch`; the host communicator's errors (a lost peer, a timeout).
    pub(crate) fn check_collective(&self, fp: &Fingerprint, timeout: Duration) -> Result<()> {
        if !self.check {
            return Ok(());
        }
        let n = self.comm.world_size();
        let mine = fp.to_bytes();
        let mut all = vec![0u8; n * Fingerprint::BYTES];
        let op = Op::AllGather {
            input: RawBuf { ptr: mine.as_ptr(), count: mine.len(), dtype: DType::U8, device: Device::Cpu },
            output: RawBufMut { ptr: all.as_mut_ptr(), count: all.len(), dtype: DType::U8, device: Device::Cpu },
        };
        // The shared-memory collectives where the host backend has them (a wait there names
        // the lowest rank missing); otherwise Bruck, whatever the cost model prefers: lg n
        // rounds at any world size, and a rank's first wait is on the next rank, so the peer
        // a timeout names does not depend on a tuning profile.
        let forced = match self.comm.algorithm_for(OpKind::AllGather, mine.len(), &CallOptions::default()) {
            Ok(Some(Algorithm::SharedMemory) | None) | Err(_) => Algorithm::Auto,
            Ok(Some(_)) => Algorithm::Bruck,
        };
        // SAFETY: both buffers are locals that outlive the blocking call.
        unsafe { run_forced(self.comm.as_ref(), op, timeout, forced)? };
        for (peer, theirs) in all.chunks_exact(Fingerprint::BYTES).enumerate() {
            let theirs = Fingerprint::from_bytes(theirs)
                .map_err(|e| Error::Internal(format!("rank {peer} sent a bad fingerprint: {e}")))?;
            if theirs != *fp {
                return Err(Error::Mismatch { peer, ours: *fp, theirs });
            }
        }
        Ok(())
    }

    /// Posts the envelopes of `sends` (peer and envelope) to their receivers.
    ///
    /// # Errors
    /// The host communicator's errors.
    pub(crate) fn announce(&self, sends: &[(usize, Envelope)], timeout: Duration) -> Result<()> {
        let notices: Vec<(usize, Notice)> = sends.iter().map(|&(p, e)| (p, Notice::Message(e))).collect();
        self.post(&notices, timeout)
    }

    /// Tells each of `peers` that the messages announced to it so far were issued.
    ///
    /// # Errors
    /// The host communicator's errors.
    pub(crate) fn announce_flushed(&self, peers: &[usize], timeout: Duration) -> Result<()> {
        {
            let mut marks = relock(&self.marks);
            for &p in peers {
                if let Some(m) = marks.get_mut(p) {
                    m.sent += 1;
                    m.asked = false;
                }
            }
        }
        let notices: Vec<(usize, Notice)> = peers.iter().map(|&p| (p, Notice::Flushed)).collect();
        self.post(&notices, timeout)
    }

    /// Sends `notices` to their peers.
    fn post(&self, notices: &[(usize, Notice)], timeout: Duration) -> Result<()> {
        if notices.is_empty() {
            return Ok(());
        }
        let words: Vec<[u64; 3]> = notices.iter().map(|(_, n)| n.encode()).collect();
        let ops = notices
            .iter()
            .zip(&words)
            .map(|(&(peer, _), w)| P2p::Send {
                buf: RawBuf { ptr: w.as_ptr().cast(), count: 3, dtype: DType::U64, device: Device::Cpu },
                peer,
                tag: ENVELOPE_TAG,
            })
            .collect();
        // SAFETY: `words` outlives the blocking call.
        unsafe { self.run(Op::Batch(ops), timeout) }.map(drop)
    }

    /// The next notice from `peer` (one that `peek` took in early, or the next to arrive).
    ///
    /// # Errors
    /// The host communicator's errors (a lost peer, a timeout); a malformed envelope.
    pub(crate) fn next_notice(&self, peer: usize, timeout: Duration) -> Result<Notice> {
        if let Some(e) = relock(&self.early).get_mut(peer).and_then(VecDeque::pop_front) {
            return Ok(e);
        }
        self.receive_notice(peer, timeout)
    }

    fn receive_notice(&self, peer: usize, timeout: Duration) -> Result<Notice> {
        let mut w = [0u64; 3];
        let op = Op::Batch(vec![P2p::Recv {
            buf: RawBufMut { ptr: w.as_mut_ptr().cast(), count: 3, dtype: DType::U64, device: Device::Cpu },
            peer,
            tag: ENVELOPE_TAG,
        }]);
        // SAFETY: `w` outlives the blocking call.
        let done = unsafe { self.run(op, timeout)? };
        if done.received.first() != Some(&3) {
            return Err(Error::Internal(format!("rank {peer} sent a truncated point-to-point envelope")));
        }
        let notice = Notice::decode(w, peer)?;
        if notice == Notice::Flushed {
            if let Some(m) = relock(&self.marks).get_mut(peer) {
                m.seen += 1;
                m.pulled = false;
            }
        }
        Ok(notice)
    }

    /// Asks `peer` to issue the messages it announced (a receiver about to wait for them),
    /// at most once until its next [`Notice::Flushed`] arrives: a sender whose thread is
    /// busy elsewhere issues them when asked (see the engine's `progress.rs`).
    ///
    /// # Errors
    /// The host communicator's errors.
    pub(crate) fn pull(&self, peer: usize, timeout: Duration) -> Result<()> {
        let seen = {
            let mut marks = relock(&self.marks);
            match marks.get_mut(peer) {
                Some(m) if !m.pulled => {
                    m.pulled = true;
                    m.seen
                }
                _ => return Ok(()),
            }
        };
        let word = [seen];
        let op = Op::Batch(vec![P2p::Send {
            buf: RawBuf { ptr: word.as_ptr().cast(), count: 1, dtype: DType::U64, device: Device::Cpu },
            peer,
            tag: PULL_TAG,
        }]);
        // SAFETY: `word` outlives the blocking call.
        unsafe { self.run(op, timeout) }.map(drop)
    }

    /// Takes every pull `peer` sent that has arrived; whether `peer` waits for this rank's
    /// next mark to it (a pull since the last one, now or before: see [`Marks`]).
    ///
    /// # Errors
    /// The host communicator's errors; a malformed pull.
    pub(crate) fn take_pulls(&self, peer: usize, timeout: Duration) -> Result<bool> {
        while self.comm.probe(peer, PULL_TAG)?.is_some() {
            let mut word = [0u64; 1];
            let op = Op::Batch(vec![P2p::Recv {
                buf: RawBufMut { ptr: word.as_mut_ptr().cast(), count: 1, dtype: DType::U64, device: Device::Cpu },
                peer,
                tag: PULL_TAG,
            }]);
            // SAFETY: `word` outlives the blocking call.
            let done = unsafe { self.run(op, timeout)? };
            if done.received.first() != Some(&1) {
                return Err(Error::Internal(format!("rank {peer} sent a malformed pull")));
            }
            if let Some(m) = relock(&self.marks).get_mut(peer) {
                if word[0] > m.sent {
                    return Err(Error::Internal(format!(
                        "rank {peer} pulled after {} marks, more than the {} sent to it",
                        word[0], m.sent
                    )));
                }
                m.asked |= word[0] == m.sent;
            }
        }
        Ok(relock(&self.marks).get(peer).is_some_and(|m| m.asked))
    }

    /// The `k`-th notice (from 0) not yet taken from `peer`, if it has arrived (without
    /// taking it).
    ///
    /// # Errors
    /// The host communicator's errors.
    pub(crate) fn peek(&self, peer: usize, k: usize, timeout: Duration) -> Result<Option<Notice>> {
        loop {
            let have = relock(&self.early).get(peer).map_or(0, VecDeque::len);
            if have > k {
                return Ok(relock(&self.early).get(peer).and_then(|q| q.get(k).copied()));
            }
            if self.comm.probe(peer, ENVELOPE_TAG)?.is_none() {
                return Ok(None);
            }
            let e = self.receive_notice(peer, timeout)?;
            if let Some(q) = relock(&self.early).get_mut(peer) {
                q.push_back(e);
            }
        }
    }

    /// Fails when the host communicator knows a peer to be gone.
    ///
    /// # Errors
    /// [`Error::PeerLost`] (or `Aborted`) as the host communicator reports it.
    pub(crate) fn liveness(&self) -> Result<()> {
        let me = self.comm.rank();
        (0..self.comm.world_size()).filter(|&p| p != me).try_for_each(|p| self.comm.probe(p, LIVENESS_TAG).map(drop))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::config::Config;
    use crate::fingerprint::OpKind;

    const T: Duration = Duration::from_secs(10);

    fn sides(n: usize, check: bool) -> Vec<HostSide> {
        let cfg = Config::new().resolve().expect("default config");
        crate::cpu::local::world(&cfg, n)
            .expect("local world")
            .into_iter()
            .map(|b| HostSide::new(Arc::new(b), check))
            .collect()
    }

    fn fp(seq: u64, count: u64) -> Fingerprint {
        Fingerprint {
            seq,
            op: OpKind::AllReduce,
            dtype: DType::F32,
            count,
            root: None,
            reduce: Some(crate::ReduceOp::Sum),
            algorithm: Algorithm::Auto,
        }
    }

    #[test]
    fn a_differing_fingerprint_is_a_mismatch_naming_the_peer() {
        let s = sides(3, true);
        let r: Vec<Result<()>> = std::thread::scope(|sc| {
            let hs: Vec<_> = s
                .iter()
                .enumerate()
                .map(|(i, h)| sc.spawn(move || h.check_collective(&fp(0, if i == 2 { 5 } else { 4 }), T)))
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        match &r[0] {
            Err(Error::Mismatch { peer: 2, ours, theirs }) => assert_eq!((ours.count, theirs.count), (4, 5)),
            other => panic!("rank 0: {other:?}"),
        }
        assert!(matches!(&r[2], Err(Error::Mismatch { peer: 0, .. })), "{:?}", r[2]);
        // Off: nothing is exchanged, nothing is checked.
        let off = sides(2, false);
        assert!(off[0].check_collective(&fp(0, 1), T).is_ok() && !off[0].checks());
    }

    #[test]
    fn envelopes_arrive_in_order_and_probe_takes_them_in_early() {
        let s = sides(2, false);
        let e = |tag, count| Notice::Message(Envelope { tag, dtype: DType::I32, count });
        let env = |tag, count| Envelope { tag, dtype: DType::I32, count };
        s[0].announce(&[(1, env(7, 3)), (1, env(9, 0))], T).expect("announce");
        s[0].announce_flushed(&[1], T).expect("flushed");
        // Peek sees the first without consuming it; twice the same answer.
        let deadline = std::time::Instant::now() + T;
        let seen = loop {
            if let Some(x) = s[1].peek(0, 0, T).expect("peek") {
                break x;
            }
            assert!(std::time::Instant::now() < deadline, "the envelope never arrived");
            std::thread::yield_now();
        };
        assert_eq!(seen, e(7, 3));
        assert_eq!(s[1].peek(0, 0, T).expect("peek"), Some(e(7, 3)));
        // Further ahead, once they arrived.
        let third = loop {
            if let Some(x) = s[1].peek(0, 2, T).expect("peek") {
                break x;
            }
            assert!(std::time::Instant::now() < deadline, "the mark never arrived");
            std::thread::yield_now();
        };
        assert_eq!(third, Notice::Flushed);
        assert_eq!(s[1].next_notice(0, T).expect("next"), e(7, 3));
        assert_eq!(s[1].next_notice(0, T).expect("next"), e(9, 0));
        assert_eq!(s[1].next_notice(0, T).expect("next"), Notice::Flushed);
        assert!(s[1].liveness().is_ok());
        // A peer that goes away is reported.
        let mut s = s;
        drop(s.remove(0));
        assert!(matches!(s[0].liveness(), Err(Error::PeerLost { rank: 0, .. })), "{:?}", s[0].liveness());
    }

    /// Waits until a pull from `peer` has arrived at `side`.
    fn await_pull(side: &HostSide, peer: usize) {
        let deadline = std::time::Instant::now() + T;
        while side.comm.probe(peer, PULL_TAG).expect("probe").is_none() {
            assert!(std::time::Instant::now() < deadline, "the pull never arrived");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_pull_asks_for_the_next_mark_only_until_it_is_sent() {
        let s = sides(2, false);
        let env = Envelope { tag: 1, dtype: DType::I32, count: 2 };
        assert!(!s[0].take_pulls(1, T).expect("no pull yet"));
        // Rank 1 waits for rank 0's messages: rank 0 is asked, and stays asked until its mark.
        s[0].announce(&[(1, env)], T).expect("announce");
        s[1].pull(0, T).expect("pull");
        await_pull(&s[0], 1);
        assert!(s[0].take_pulls(1, T).expect("take"));
        assert!(s[0].take_pulls(1, T).expect("again"), "a pull not yet answered is still asked");
        s[0].announce_flushed(&[1], T).expect("flushed");
        assert!(!s[0].take_pulls(1, T).expect("answered"));
        assert_eq!(s[1].next_notice(0, T).expect("envelope"), Notice::Message(env));
        assert_eq!(s[1].next_notice(0, T).expect("mark"), Notice::Flushed);
    }

    #[test]
    fn a_pull_that_crossed_a_mark_asks_for_nothing() {
        // Rank 0 flushes while rank 1, not having received the mark yet, pulls: the pull
        // arrives after the mark left and must not make rank 0 issue its *next* sends alone.
        let s = sides(2, false);
        let env = Envelope { tag: 1, dtype: DType::I32, count: 2 };
        s[0].announce(&[(1, env)], T).expect("announce");
        s[0].announce_flushed(&[1], T).expect("flushed");
        s[1].pull(0, T).expect("pull before the mark is read");
        await_pull(&s[0], 1);
        s[0].announce(&[(1, env)], T).expect("the next sends");
        assert!(!s[0].take_pulls(1, T).expect("take"), "a pull that crossed the mark asked for the next group");
        // Rank 1 reads the mark; its next pull is fresh again.
        assert_eq!(s[1].next_notice(0, T).expect("envelope"), Notice::Message(env));
        assert_eq!(s[1].next_notice(0, T).expect("mark"), Notice::Flushed);
        s[1].pull(0, T).expect("pull");
        await_pull(&s[0], 1);
        assert!(s[0].take_pulls(1, T).expect("take"));
    }

    #[test]
    fn a_pull_ahead_of_the_marks_sent_is_an_error() {
        let s = sides(2, false);
        // A rank that claims more marks than were sent to it: a malformed pull.
        let word = [5u64];
        let op = Op::Batch(vec![P2p::Send {
            buf: RawBuf { ptr: word.as_ptr().cast(), count: 1, dtype: DType::U64, device: Device::Cpu },
            peer: 0,
            tag: PULL_TAG,
        }]);
        // SAFETY: `word` outlives the blocking call.
        unsafe { s[1].run(op, T) }.expect("send");
        await_pull(&s[0], 1);
        let e = s[0].take_pulls(1, T).expect_err("a pull after 5 marks of 0");
        assert!(e.to_string().contains("more than the 0 sent"), "{e}");
    }
}
