//! The side channel of the `mpi` backend: small fixed-size messages between the ranks of one
//! communicator that make MPI's failures look like oxccl's.
//!
//! One MPI communicator carries everything: collectives (which never match point-to-point
//! traffic), user messages (MPI tag `1 + tag mod MPI_TAG_UB`), and side messages with tag 0
//! ([`SIDE_TAG`]). A side message is [`WORDS`] `u64` words ([`Msg`]), the first of which is
//! its kind. Side messages are sent with `MPI_Isend` from an [`Outbox`], which keeps each
//! buffer until its request completes, and always received by probing ([`recv`]:
//! `MPI_Iprobe` + `MPI_Recv`) into a per-peer stash of the engine, from which operations
//! [`take`] (or [`peek`] at) the message they wait for. Side messages from one peer arrive
//! in the order sent:
//!
//! * `FP`: the fingerprint of the sender's next collective (sequence number, op, dtype,
//!   count, root, reduce op, algorithm; colour and key for `split`). Before posting a
//!   collective, each rank waits for every peer's fingerprint and compares: any difference
//!   ends the call on *every* rank with [`Error::Mismatch`] naming the first differing rank,
//!   without running the mismatched collective (MPI would hang or mix the data). A rank that
//!   times out here knows which peer it waited for. Cost: one 80-byte message to and from
//!   every peer per collective; [`MpiConfig::fingerprint`](super::MpiConfig) switches it off
//!   (then mismatches are undefined behaviour as in plain MPI, and timeouts of
//!   non-rooted collectives name no peer).
//! * `HDR`: the dtype and count of a user message, sent ahead of it; the receiver checks
//!   them before posting `MPI_Irecv` (a different dtype or a longer message is a
//!   [`Error::Mismatch`], not a truncation error), and
//!   [`Shared::probe`](super::state::Shared::probe) reads them.
//! * `ABORT` / `FAIL`: this rank aborted or failed; the peer poisons its communicator
//!   ([`Error::Aborted`]) at once, which ends its waits.
//! * `REVOKE`: the sender revoked the communicator (ULFM: it calls `MPIX_Comm_revoke` right
//!   after); the peer poisons its communicator with [`Error::Revoked`] naming the sender and
//!   its reason. It may arrive after MPI's revoke, and then cannot be received: the peer
//!   reports MPI's revoke instead (see `ulfm/mod.rs`).
//! * `LEFT`: the sender dropped its communicator. It is the last message from that peer, so
//!   a rank waiting for that peer's fingerprint or header reads `LEFT` instead and reports
//!   [`Error::PeerLost`]. (A dead *process* is MPI's business: `mpirun` ends the job.) A
//!   dropped communicator is freed only once every peer's `LEFT` has arrived (see
//!   `graveyard.rs`).
//!
//! Word layouts (`words[0]` is the kind; unused words are 0):
//!
//! ```text
//! FP     seq, op, dtype, count, root + 1 (0: none), reduce op + 1 (0: none), algorithm,
//!        colour (u64::MAX: none), key          (the last two: split only)
//! HDR    tag, dtype, count, seq
//! ABORT  the reason, UTF-8, at most 72 bytes (cut on a character boundary), zero-padded
//! FAIL   as ABORT: the error's text
//! REVOKE the revoking rank, then the reason, UTF-8, at most 64 bytes, zero-padded
//! LEFT   nothing
//! ```
//!
//! Tags (op, dtype, reduce op, algorithm) are the enums' wire tags; a message whose tags do
//! not decode is malformed (an internal error of the receiving call), never a panic.

use std::collections::VecDeque;
use std::ffi::c_int;

use mpi::ffi;

use super::check::check;
use super::comm::Comm;
use crate::algorithm::Algorithm;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::reduce_op::ReduceOp;

/// MPI tag of side messages.
const SIDE_TAG: c_int = 0;
/// Words in every side message.
pub(super) const WORDS: usize = 10;
/// One side message.
pub(super) type Msg = [u64; WORDS];

const FP: u64 = 1;
const HDR: u64 = 2;
const ABORT: u64 = 3;
const FAIL: u64 = 4;
const LEFT: u64 = 5;
const REVOKE: u64 = 6;

/// The `LEFT` message.
pub(super) const LEFT_MSG: Msg = [LEFT, 0, 0, 0, 0, 0, 0, 0, 0, 0];

fn null_req() -> ffi::MPI_Request {
    // SAFETY: reading the rsmpi shim's constant.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

struct Req(ffi::MPI_Request);
// SAFETY: request handles may be tested from any thread under the thread level granted.
unsafe impl Send for Req {}

/// Sends in flight, each with the buffer MPI reads from: side messages, and the buffered
/// copies of user messages. A buffer is dropped once its request has completed.
#[derive(Default)]
pub(super) struct Outbox(Vec<(Vec<u64>, Req)>);

impl Outbox {
    /// Sends `msg` to `peer` on `comm` (non-blocking; the outbox keeps the buffer).
    pub(super) fn send(&mut self, comm: Comm, peer: usize, msg: Msg) -> Result<()> {
        let b = msg.to_vec();
        let mut req = null_req();
        let dest = c_int::try_from(peer).map_err(|_| Error::Internal("peer out of range".into()))?;
        // SAFETY: the boxed message stays in the outbox until the request completes.
        let rc = unsafe {
            ffi::MPI_Isend(b.as_ptr().cast(), WORDS as c_int, ffi::RSMPI_UINT64_T, dest, SIDE_TAG, comm.0, &mut req)
        };
        check(rc, "MPI_Isend (side channel)")?;
        self.0.push((b, Req(req)));
        Ok(())
    }

    /// Keeps `buf` until the send request `req`, which reads from it, completes.
    pub(super) fn push(&mut self, buf: Vec<u64>, req: ffi::MPI_Request) {
        self.0.push((buf, Req(req)));
    }

    /// Drops the sends that have completed (and those MPI reports an error for).
    pub(super) fn flush(&mut self) {
        self.0.retain_mut(|(_, r)| {
            let mut flag: c_int = 0;
            // SAFETY: MPI_Status is plain data; `r` is an active send request of this process.
            let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let rc = unsafe { ffi::MPI_Test(&mut r.0, &mut flag, &mut status) };
            rc == 0 && flag == 0
        });
    }

    /// Whether every send has completed.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Receives one side message that has arrived on `comm`: the sender's rank and the message;
/// `None` when none has arrived.
pub(super) fn recv(comm: Comm) -> Result<Option<(c_int, Msg)>> {
    // `rc` is never MPI_SUCCESS here, so `check` gives the error.
    recv_raw(comm).or_else(|(rc, what)| check(rc, what).map(|()| None))
}

/// [`recv`] that reports a failure as MPI's return code and the call that failed.
pub(super) fn recv_raw(comm: Comm) -> std::result::Result<Option<(c_int, Msg)>, (c_int, &'static str)> {
    let mut flag: c_int = 0;
    // SAFETY: MPI_Status is plain data.
    let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
    // SAFETY: probing a communicator this process still owns.
    let rc = unsafe { ffi::MPI_Iprobe(ffi::RSMPI_ANY_SOURCE, SIDE_TAG, comm.0, &mut flag, &mut status) };
    if rc != 0 {
        return Err((rc, "MPI_Iprobe"));
    }
    if flag == 0 {
        return Ok(None);
    }
    let src = status.MPI_SOURCE;
    let mut m: Msg = [0; WORDS];
    // SAFETY: the probed message is WORDS u64 values from `src` (every side message is).
    let rc = unsafe {
        ffi::MPI_Recv(m.as_mut_ptr().cast(), WORDS as c_int, ffi::RSMPI_UINT64_T, src, SIDE_TAG, comm.0, &mut status)
    };
    if rc != 0 {
        return Err((rc, "MPI_Recv (side channel)"));
    }
    Ok(Some((src, m)))
}

fn text_words(kind: u64, text: &str) -> Msg {
    text_words_from(kind, 1, text)
}

/// A message of `kind` whose text starts at word `first`.
fn text_words_from(kind: u64, first: usize, text: &str) -> Msg {
    let mut m = [0u64; WORDS];
    m[0] = kind;
    let mut bytes = [0u8; (WORDS - 1) * 8];
    let bytes = &mut bytes[..(WORDS - first) * 8];
    let mut end = text.len().min(bytes.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    bytes[..end].copy_from_slice(&text.as_bytes()[..end]);
    for (i, c) in bytes.chunks(8).enumerate() {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        m[i + first] = u64::from_le_bytes(w);
    }
    m
}

fn words_text(m: &Msg) -> String {
    words_text_from(m, 1)
}

fn words_text_from(m: &Msg, first: usize) -> String {
    let bytes: Vec<u8> = m[first..].iter().flat_map(|w| w.to_le_bytes()).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The `ABORT` (for [`Error::Aborted`], its reason) or `FAIL` (any other error, its text)
/// notice that tells the peers about `e`.
pub(super) fn notice_msg(e: &Error) -> Msg {
    let (kind, text) = match e {
        Error::Aborted { reason } => (ABORT, reason.clone()),
        e => (FAIL, e.to_string()),
    };
    text_words(kind, &text)
}

/// The `REVOKE` notice of `rank` revoking the communicator because of `reason`.
pub(super) fn revoke_msg(rank: usize, reason: &str) -> Msg {
    let mut m = text_words_from(REVOKE, 2, reason);
    m[1] = rank as u64;
    m
}

/// The error an `ABORT`, `FAIL` or `REVOKE` notice from rank `src` poisons the communicator
/// with; `None` for every other kind.
pub(super) fn decode_notice(src: usize, m: &Msg) -> Option<Error> {
    match m[0] {
        REVOKE => {
            let rank = usize::try_from(m[1]).unwrap_or(src);
            Some(Error::Revoked { rank, reason: words_text_from(m, 2) })
        }
        ABORT | FAIL => {
            let what = if m[0] == ABORT { "aborted the communicator" } else { "failed" };
            let reason = format!("rank {src} {what}: {}", words_text(m));
            Some(Error::Aborted { reason })
        }
        _ => None,
    }
}

/// The `FP` message for `fp`; `x0` and `x1` are the last two words.
pub(super) fn fp_msg(fp: &Fingerprint, x0: u64, x1: u64) -> Msg {
    [
        FP,
        fp.seq,
        fp.op as u64,
        fp.dtype as u64,
        fp.count,
        fp.root.map_or(0, |r| u64::from(r) + 1),
        fp.reduce.map_or(0, |r| r as u64 + 1),
        fp.algorithm as u64,
        x0,
        x1,
    ]
}

/// The `FP` message of a split: the fingerprint with the sender's colour and key.
pub(super) fn split_msg(fp: &Fingerprint, color: Option<u32>, key: i64) -> Msg {
    fp_msg(fp, color.map_or(u64::MAX, u64::from), key as u64)
}

/// The colour and key of a split's `FP` message.
pub(super) fn split_entry(m: &Msg) -> (Option<u32>, i64) {
    (u32::try_from(m[8]).ok(), m[9] as i64)
}

fn tag8(x: u64) -> Option<u8> {
    u8::try_from(x).ok()
}

/// The fingerprint of an `FP` message; `None` when a tag does not decode.
pub(super) fn decode_fp(m: &Msg) -> Option<Fingerprint> {
    Some(Fingerprint {
        seq: m[1],
        op: OpKind::from_tag(tag8(m[2])?)?,
        dtype: DType::from_tag(tag8(m[3])?)?,
        count: m[4],
        root: if m[5] == 0 { None } else { Some(u32::try_from(m[5] - 1).ok()?) },
        reduce: if m[6] == 0 { None } else { Some(ReduceOp::from_tag(tag8(m[6] - 1)?)?) },
        algorithm: Algorithm::from_tag(tag8(m[7])?)?,
    })
}

/// Whether `m` is an `FP` message.
pub(super) fn is_fp(m: &Msg) -> bool {
    m[0] == FP
}

/// The `HDR` message announcing a user message of `count` elements of `dtype` with `tag`,
/// sent by the operation with sequence number `seq`.
pub(super) fn hdr_msg(tag: u32, dtype: DType, count: usize, seq: u64) -> Msg {
    [HDR, u64::from(tag), dtype as u64, count as u64, seq, 0, 0, 0, 0, 0]
}

/// Whether `m` is the `HDR` message of a user message with `tag`.
pub(super) fn is_hdr(m: &Msg, tag: u32) -> bool {
    m[0] == HDR && m[1] == u64::from(tag)
}

/// What an `HDR` message announces.
pub(super) struct Header {
    /// `None` when the tag does not decode.
    pub(super) dtype: Option<DType>,
    /// Elements, as sent.
    pub(super) count: u64,
}

/// The dtype and count of an `HDR` message.
pub(super) fn decode_hdr(m: &Msg) -> Header {
    Header { dtype: tag8(m[2]).and_then(DType::from_tag), count: m[3] }
}

/// Whether `m` is a `LEFT` message.
pub(super) fn is_left(m: &Msg) -> bool {
    m[0] == LEFT
}

/// Whether the peer's `LEFT` is in `q`.
pub(super) fn has_left(q: &VecDeque<Msg>) -> bool {
    q.iter().any(is_left)
}

/// Removes and returns the first message of `q` that `want` accepts; `Err` when the peer's
/// `LEFT` comes first (it sent nothing more).
pub(super) fn take(q: &mut VecDeque<Msg>, want: impl Fn(&Msg) -> bool) -> std::result::Result<Option<Msg>, ()> {
    for i in 0..q.len() {
        if want(&q[i]) {
            return Ok(q.remove(i));
        }
        if is_left(&q[i]) {
            return Err(());
        }
    }
    Ok(None)
}

/// [`take`] without removing the message.
pub(super) fn peek(q: &VecDeque<Msg>, want: impl Fn(&Msg) -> bool) -> std::result::Result<Option<Msg>, ()> {
    for m in q {
        if want(m) {
            return Ok(Some(*m));
        }
        if is_left(m) {
            return Err(());
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_round_trip() {
        let fp = Fingerprint {
            seq: 7,
            op: OpKind::Reduce,
            dtype: DType::BF16,
            count: 12345,
            root: Some(3),
            reduce: Some(ReduceOp::Avg),
            algorithm: Algorithm::BinomialTree,
        };
        assert_eq!(decode_fp(&fp_msg(&fp, 1, 2)), Some(fp));
        let none = Fingerprint { root: None, reduce: None, ..fp };
        assert_eq!(decode_fp(&fp_msg(&none, 0, 0)), Some(none));
        let mut bad = fp_msg(&fp, 0, 0);
        bad[2] = 200;
        assert_eq!(decode_fp(&bad), None);
    }

    #[test]
    fn notice_text_round_trips_and_truncates_on_char_boundaries() {
        assert_eq!(words_text(&text_words(ABORT, "stop now")), "stop now");
        let long = "é".repeat(100);
        let t = words_text(&text_words(FAIL, &long));
        assert!(t.len() <= 72 && t.chars().all(|c| c == 'é'), "{t}");
    }

    #[test]
    fn take_stops_at_left() {
        let mut q: VecDeque<Msg> = VecDeque::new();
        q.push_back([HDR, 5, 0, 0, 0, 0, 0, 0, 0, 0]);
        q.push_back([FP, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        q.push_back([LEFT, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(take(&mut q, |m| m[0] == FP).unwrap().map(|m| m[0]), Some(FP));
        assert!(take(&mut q, |m| m[0] == FP).is_err());
        assert_eq!(peek(&q, |m| m[0] == HDR && m[1] == 5).unwrap().map(|m| m[1]), Some(5));
        assert!(peek(&q, |m| m[0] == HDR && m[1] == 6).is_err());
    }

    #[test]
    fn headers_notices_and_split_entries_round_trip() {
        let h = hdr_msg(9, DType::F16, 33, 4);
        assert!(is_hdr(&h, 9) && !is_hdr(&h, 8) && !is_fp(&h));
        let d = decode_hdr(&h);
        assert_eq!((d.dtype, d.count), (Some(DType::F16), 33));
        let mut bad = h;
        bad[2] = 300;
        assert_eq!(decode_hdr(&bad).dtype, None);

        let abort = notice_msg(&Error::Aborted { reason: "stop".into() });
        assert!(matches!(decode_notice(2, &abort),
            Some(Error::Aborted { reason }) if reason == "rank 2 aborted the communicator: stop"));
        let fail = notice_msg(&Error::Internal("boom".into()));
        assert!(matches!(decode_notice(1, &fail),
            Some(Error::Aborted { reason }) if reason.starts_with("rank 1 failed: ") && reason.contains("boom")));
        assert!(decode_notice(0, &h).is_none() && decode_notice(0, &LEFT_MSG).is_none());
        let revoke = revoke_msg(3, &"x".repeat(100));
        assert!(matches!(decode_notice(3, &revoke),
            Some(Error::Revoked { rank: 3, reason }) if reason == "x".repeat(64)));
        assert!(matches!(decode_notice(1, &revoke_msg(2, "step 7 failed")),
            Some(Error::Revoked { rank: 2, reason }) if reason == "step 7 failed"));

        let fp = Fingerprint::of_split(1, Algorithm::Auto);
        let m = split_msg(&fp, Some(7), -3);
        assert!(is_fp(&m));
        assert_eq!(decode_fp(&m), Some(fp));
        assert_eq!(split_entry(&m), (Some(7), -3));
        assert_eq!(split_entry(&split_msg(&fp, None, i64::MAX)), (None, i64::MAX));

        let mut q: VecDeque<Msg> = VecDeque::new();
        q.push_back(h);
        assert!(!has_left(&q));
        q.push_back(LEFT_MSG);
        assert!(has_left(&q));
    }
}
