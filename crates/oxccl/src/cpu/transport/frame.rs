//! The wire format of transport frames (TCP and shared-memory rings): a fixed 56-byte
//! little-endian header followed by the payload. Every field is checked when decoding: the
//! magic and version, each tag against its enum, reserved bytes, and the payload length
//! against a limit, so a malformed or hostile frame is an error, never a panic or a huge
//! allocation.
//!
//! ```text
//! off size field
//!   0   4  magic "OXCF"
//!   4   1  version (1)
//!   5   1  kind: 0 data, 1 failure notice, 2 release notice
//!   6   1  channel: 0 collective, 1 point-to-point
//!   7   1  op kind tag
//!   8   4  point-to-point tag (0 for collectives)
//!  12   8  communicator id
//!  20   8  sequence number
//!  28   8  element count
//!  36   4  root (0xFFFF_FFFF: none)
//!  40   1  dtype tag
//!  41   1  reduce op tag (0xFF: none)
//!  42   1  algorithm tag
//!  43   5  reserved, zero
//!  48   8  payload length in bytes
//! ```

use std::fmt;
use std::time::Duration;

use super::{Channel, Header};
use crate::algorithm::Algorithm;
use crate::dtype::DType;
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::op_kind::OpKind;
use crate::reduce_op::ReduceOp;

/// Size of an encoded header.
pub const HEADER_LEN: usize = 56;
const MAGIC: [u8; 4] = *b"OXCF";
const VERSION: u8 = 1;
const NONE_U32: u32 = u32::MAX;
const NONE_U8: u8 = u8::MAX;
/// Largest encoded error notice accepted.
pub const MAX_NOTICE_LEN: usize = 64 * 1024;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// Data of a collective or point-to-point message.
    Data = 0,
    /// The sender failed this communicator; the payload is an encoded error ([`encode_error`]).
    Failure = 1,
    /// The sender released this communicator.
    Release = 2,
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the frame carries.
    pub kind: FrameKind,
    /// Communicator, channel and fingerprint.
    pub header: Header,
    /// Payload length in bytes (checked against the decoder's limit).
    pub payload_len: usize,
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError(pub String);

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed frame: {}", self.0)
    }
}

impl From<FrameError> for Error {
    fn from(e: FrameError) -> Error {
        Error::Io {
            context: "decoding a frame from a peer".into(),
            kind: std::io::ErrorKind::InvalidData,
            message: e.0,
        }
    }
}

fn bad(msg: impl Into<String>) -> FrameError {
    FrameError(msg.into())
}

/// Encodes a header.
pub fn encode_header(kind: FrameKind, h: &Header, payload_len: usize) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    let fp = &h.fingerprint;
    b[0..4].copy_from_slice(&MAGIC);
    b[4] = VERSION;
    b[5] = kind as u8;
    let (ch, tag) = match h.channel {
        Channel::Collective => (0u8, 0u32),
        Channel::PointToPoint(t) => (1, t),
    };
    b[6] = ch;
    b[7] = fp.op as u8;
    b[8..12].copy_from_slice(&tag.to_le_bytes());
    b[12..20].copy_from_slice(&h.comm_id.to_le_bytes());
    b[20..28].copy_from_slice(&fp.seq.to_le_bytes());
    b[28..36].copy_from_slice(&fp.count.to_le_bytes());
    b[36..40].copy_from_slice(&fp.root.unwrap_or(NONE_U32).to_le_bytes());
    b[40] = fp.dtype as u8;
    b[41] = fp.reduce.map_or(NONE_U8, |r| r as u8);
    b[42] = fp.algorithm as u8;
    b[48..56].copy_from_slice(&(payload_len as u64).to_le_bytes());
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Decodes and checks a header; `max_payload` bounds the payload length.
///
/// # Errors
/// [`FrameError`] naming the first field that is wrong.
pub fn decode_header(b: &[u8], max_payload: usize) -> Result<FrameHeader, FrameError> {
    if b.len() < HEADER_LEN {
        return Err(bad(format!("{} bytes, a header has {HEADER_LEN}", b.len())));
    }
    if b[0..4] != MAGIC {
        return Err(bad("bad magic (not an oxccl peer, or the stream lost sync)"));
    }
    if b[4] != VERSION {
        return Err(bad(format!("version {} (this oxccl speaks {VERSION})", b[4])));
    }
    let kind = match b[5] {
        0 => FrameKind::Data,
        1 => FrameKind::Failure,
        2 => FrameKind::Release,
        k => return Err(bad(format!("unknown frame kind {k}"))),
    };
    let tag = u32_at(b, 8);
    let channel = match b[6] {
        0 if tag == 0 => Channel::Collective,
        0 => return Err(bad("collective frame with a tag")),
        1 => Channel::PointToPoint(tag),
        c => return Err(bad(format!("unknown channel {c}"))),
    };
    let op = OpKind::from_tag(b[7]).ok_or_else(|| bad(format!("unknown op tag {}", b[7])))?;
    let dtype = DType::from_tag(b[40]).ok_or_else(|| bad(format!("unknown dtype tag {}", b[40])))?;
    let reduce = match b[41] {
        NONE_U8 => None,
        t => Some(ReduceOp::from_tag(t).ok_or_else(|| bad(format!("unknown reduce op tag {t}")))?),
    };
    let algorithm = Algorithm::from_tag(b[42]).ok_or_else(|| bad(format!("unknown algorithm tag {}", b[42])))?;
    if b[43..48].iter().any(|&x| x != 0) {
        return Err(bad("reserved bytes are not zero"));
    }
    let root = match u32_at(b, 36) {
        NONE_U32 => None,
        r => Some(r),
    };
    let len = u64_at(b, 48);
    let payload_len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= max_payload)
        .ok_or_else(|| bad(format!("payload of {len} bytes exceeds the limit of {max_payload} (OXCCL_MAX_FRAME)")))?;
    let fingerprint = Fingerprint { seq: u64_at(b, 20), op, dtype, count: u64_at(b, 28), root, reduce, algorithm };
    Ok(FrameHeader { kind, header: Header { comm_id: u64_at(b, 12), channel, fingerprint }, payload_len })
}

/// Bytes of an encoded fingerprint ([`Fingerprint::to_bytes`]).
pub const FP_LEN: usize = Fingerprint::BYTES;

/// Decodes [`Fingerprint::to_bytes`].
///
/// # Errors
/// [`FrameError`] for a truncated encoding or an unknown tag.
pub fn decode_fp(b: &[u8]) -> Result<Fingerprint, FrameError> {
    Fingerprint::from_bytes(b).map_err(bad)
}

/// Encodes an error for a failure notice. Mismatches, timeouts and lost peers keep their
/// structure; other errors travel as their message.
pub fn encode_error(e: &Error) -> Vec<u8> {
    let mut out = Vec::new();
    match e {
        Error::Mismatch { peer, ours, theirs } => {
            out.push(0);
            out.extend_from_slice(&(*peer as u64).to_le_bytes());
            out.extend_from_slice(&ours.to_bytes());
            out.extend_from_slice(&theirs.to_bytes());
        }
        Error::Timeout { op, seq, peer, waited } => {
            out.push(1);
            out.push(*op as u8);
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&peer.map_or(u64::MAX, |p| p as u64).to_le_bytes());
            out.extend_from_slice(&(waited.as_millis().min(u128::from(u64::MAX)) as u64).to_le_bytes());
        }
        Error::PeerLost { rank, detail } => {
            out.push(2);
            out.extend_from_slice(&(*rank as u64).to_le_bytes());
            out.extend_from_slice(detail.as_bytes());
        }
        Error::Aborted { reason } => {
            out.push(3);
            out.extend_from_slice(reason.as_bytes());
        }
        Error::Revoked { rank, reason } => {
            out.push(4);
            out.extend_from_slice(&(*rank as u64).to_le_bytes());
            out.extend_from_slice(reason.as_bytes());
        }
        other => {
            out.push(3);
            out.extend_from_slice(other.to_string().as_bytes());
        }
    }
    out.truncate(MAX_NOTICE_LEN);
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Decodes a failure notice.
///
/// # Errors
/// [`FrameError`] for an unknown tag or a truncated notice.
pub fn decode_error(b: &[u8]) -> Result<Error, FrameError> {
    let (&tag, rest) = b.split_first().ok_or_else(|| bad("empty failure notice"))?;
    let need = |n: usize| if rest.len() >= n { Ok(()) } else { Err(bad("truncated failure notice")) };
    match tag {
        0 => {
            need(8 + 2 * FP_LEN)?;
            let peer = usize::try_from(u64_at(rest, 0)).map_err(|_| bad("peer out of range"))?;
            let ours = decode_fp(&rest[8..])?;
            let theirs = decode_fp(&rest[8 + FP_LEN..])?;
            Ok(Error::Mismatch { peer, ours, theirs })
        }
        1 => {
            need(25)?;
            let op = OpKind::from_tag(rest[0]).ok_or_else(|| bad("unknown op tag in a notice"))?;
            let peer = match u64_at(rest, 9) {
                u64::MAX => None,
                p => Some(usize::try_from(p).map_err(|_| bad("peer out of range"))?),
            };
            Ok(Error::Timeout { op, seq: u64_at(rest, 1), peer, waited: Duration::from_millis(u64_at(rest, 17)) })
        }
        2 => {
            need(8)?;
            let rank = usize::try_from(u64_at(rest, 0)).map_err(|_| bad("rank out of range"))?;
            Ok(Error::PeerLost { rank, detail: text(&rest[8..]) })
        }
        3 => Ok(Error::Aborted { reason: text(rest) }),
        4 => {
            need(8)?;
            let rank = usize::try_from(u64_at(rest, 0)).map_err(|_| bad("rank out of range"))?;
            Ok(Error::Revoked { rank, reason: text(&rest[8..]) })
        }
        t => Err(bad(format!("unknown failure notice tag {t}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            comm_id: 0xDEAD_BEEF_1234,
            channel: Channel::PointToPoint(77),
            fingerprint: Fingerprint {
                seq: 9,
                op: OpKind::Reduce,
                dtype: DType::BF16,
                count: 1 << 40,
                root: Some(3),
                reduce: Some(ReduceOp::Max),
                algorithm: Algorithm::BinomialTree,
            },
        }
    }

    #[test]
    fn headers_round_trip() {
        let h = header();
        let b = encode_header(FrameKind::Data, &h, 4096);
        assert_eq!(decode_header(&b, 4096), Ok(FrameHeader { kind: FrameKind::Data, header: h, payload_len: 4096 }));
        let mut c = h;
        c.channel = Channel::Collective;
        c.fingerprint.root = None;
        c.fingerprint.reduce = None;
        let b = encode_header(FrameKind::Release, &c, 0);
        assert_eq!(decode_header(&b, 0).map(|f| f.header), Ok(c));
    }

    #[test]
    fn every_bad_field_is_refused() {
        let good = encode_header(FrameKind::Data, &header(), 10);
        let cases: &[(usize, u8, &str)] = &[
            (0, b'X', "magic"),
            (4, 2, "version"),
            (5, 9, "kind"),
            (6, 7, "channel"),
            (7, 200, "op"),
            (40, 99, "dtype"),
            (41, 17, "reduce"),
            (42, 77, "algorithm"),
            (45, 1, "reserved"),
        ];
        for &(at, v, what) in cases {
            let mut b = good;
            b[at] = v;
            assert!(decode_header(&b, 10).is_err(), "{what} accepted");
        }
        assert!(decode_header(&good, 9).unwrap_err().0.contains("limit"));
        assert!(decode_header(&good[..20], 10).is_err());
        let mut b = good;
        b[6] = 0; // collective with a tag
        assert!(decode_header(&b, 10).is_err());
    }

    #[test]
    fn notices_round_trip() {
        let fp = header().fingerprint;
        let mut other = fp;
        other.op = OpKind::AllGather;
        for e in [
            Error::Mismatch { peer: 5, ours: fp, theirs: other },
            Error::Timeout { op: OpKind::Barrier, seq: 3, peer: Some(2), waited: Duration::from_millis(1500) },
            Error::Timeout { op: OpKind::Barrier, seq: 3, peer: None, waited: Duration::from_millis(1) },
            Error::PeerLost { rank: 1, detail: "gone".into() },
            Error::Aborted { reason: "bye".into() },
            Error::Revoked { rank: 3, reason: "straggler".into() },
        ] {
            assert_eq!(decode_error(&encode_error(&e)), Ok(e));
        }
        assert!(decode_error(&[]).is_err());
        assert!(decode_error(&[0, 1, 2]).is_err());
        assert!(decode_error(&[9]).is_err());
        assert!(decode_error(&[4, 1, 2]).is_err(), "a revoke notice without its rank");
    }
}

/// Property tests: the decoders take any bytes without panicking, valid frames and notices
/// round-trip, and no header is accepted whose payload length exceeds the limit. The
/// strategies are shared with the transports' tests.
#[cfg(test)]
pub(crate) mod fuzz {
    use proptest::prelude::*;

    use super::*;

    /// Any fingerprint that survives encoding (a root of `u32::MAX` means "none" on the wire).
    pub(crate) fn fingerprint() -> impl Strategy<Value = Fingerprint> {
        (
            any::<u64>(),
            prop::sample::select(OpKind::ALL.to_vec()),
            prop::sample::select(DType::ALL.to_vec()),
            any::<u64>(),
            prop::option::of(0..u32::MAX),
            prop::option::of(prop::sample::select(ReduceOp::ALL.to_vec())),
            prop::sample::select(Algorithm::ALL.to_vec()),
        )
            .prop_map(|(seq, op, dtype, count, root, reduce, algorithm)| Fingerprint {
                seq,
                op,
                dtype,
                count,
                root,
                reduce,
                algorithm,
            })
    }

    /// Any header.
    pub(crate) fn header() -> impl Strategy<Value = Header> {
        let channel = prop_oneof![Just(Channel::Collective), any::<u32>().prop_map(Channel::PointToPoint)];
        (any::<u64>(), channel, fingerprint()).prop_map(|(comm_id, channel, fingerprint)| Header {
            comm_id,
            channel,
            fingerprint,
        })
    }

    /// Any frame kind.
    pub(crate) fn kind() -> impl Strategy<Value = FrameKind> {
        prop::sample::select(vec![FrameKind::Data, FrameKind::Failure, FrameKind::Release])
    }

    /// Any error that a failure notice carries with its structure (short texts, whole
    /// milliseconds: what survives encoding).
    pub(crate) fn notice() -> impl Strategy<Value = Error> {
        let peer = 0..usize::MAX;
        prop_oneof![
            (peer.clone(), fingerprint(), fingerprint()).prop_map(|(peer, ours, theirs)| Error::Mismatch {
                peer,
                ours,
                theirs
            }),
            (prop::sample::select(OpKind::ALL.to_vec()), any::<u64>(), prop::option::of(peer.clone()), any::<u64>())
                .prop_map(|(op, seq, peer, ms)| Error::Timeout { op, seq, peer, waited: Duration::from_millis(ms) }),
            (peer.clone(), ".{0,40}").prop_map(|(rank, detail)| Error::PeerLost { rank, detail }),
            ".{0,40}".prop_map(|reason| Error::Aborted { reason }),
            (peer, ".{0,40}").prop_map(|(rank, reason)| Error::Revoked { rank, reason }),
        ]
    }

    /// An encoded header with some of its bytes replaced: mostly almost-valid input.
    fn mangled_header() -> impl Strategy<Value = Vec<u8>> {
        (kind(), header(), any::<u64>(), prop::collection::vec((0..HEADER_LEN, any::<u8>()), 0..4)).prop_map(
            |(k, h, len, edits)| {
                let mut b = encode_header(k, &h, 0).to_vec();
                b[48..56].copy_from_slice(&len.to_le_bytes());
                for (at, v) in edits {
                    b[at] = v;
                }
                b
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn random_bytes_never_panic_the_header_decoder(
            b in prop::collection::vec(any::<u8>(), 0..2 * HEADER_LEN),
            max in any::<usize>(),
        ) {
            if let Ok(f) = decode_header(&b, max) {
                prop_assert!(f.payload_len <= max);
            }
        }

        #[test]
        fn mangled_headers_never_exceed_the_limit(b in mangled_header(), max in 0usize..(1 << 20), cut in 0..=HEADER_LEN) {
            match decode_header(&b, max) {
                Ok(f) => prop_assert!(f.payload_len <= max),
                Err(e) => prop_assert!(!e.0.is_empty()),
            }
            prop_assert!(decode_header(&b[..cut], max).is_err() || cut == HEADER_LEN);
        }

        #[test]
        fn valid_headers_round_trip(k in kind(), h in header(), len in any::<u32>(), slack in 0usize..16) {
            let len = len as usize;
            let b = encode_header(k, &h, len);
            prop_assert_eq!(decode_header(&b, len + slack), Ok(FrameHeader { kind: k, header: h, payload_len: len }));
            if len > 0 {
                let refused = decode_header(&b, len - 1);
                prop_assert!(refused.is_err());
            }
            for cut in 0..HEADER_LEN {
                prop_assert!(decode_header(&b[..cut], usize::MAX).is_err());
            }
        }

        #[test]
        fn random_bytes_never_panic_the_notice_decoder(
            tag in 0u8..6,
            rest in prop::collection::vec(any::<u8>(), 0..120),
        ) {
            let mut b = vec![tag];
            b.extend_from_slice(&rest);
            let _ = decode_error(&b);
            let _ = decode_error(&rest);
        }

        #[test]
        fn notices_round_trip_and_truncations_are_refused_or_shorter(e in notice()) {
            let b = encode_error(&e);
            prop_assert!(b.len() <= MAX_NOTICE_LEN);
            prop_assert_eq!(decode_error(&b), Ok(e.clone()));
            for cut in 0..b.len() {
                // A cut notice is refused, or (cut in its free-text tail) decodes to the same kind.
                if let Ok(d) = decode_error(&b[..cut]) {
                    prop_assert_eq!(std::mem::discriminant(&d), std::mem::discriminant(&e));
                }
            }
        }

        #[test]
        fn other_errors_travel_as_their_message(m in ".{0,40}") {
            for e in [Error::invalid(m.clone()), Error::Store(m.clone()), Error::Config(m.clone())] {
                prop_assert_eq!(decode_error(&encode_error(&e)), Ok(Error::Aborted { reason: e.to_string() }));
            }
        }
    }

    #[test]
    fn long_notices_are_cut_to_the_limit() {
        let e = Error::Aborted { reason: "x".repeat(2 * MAX_NOTICE_LEN) };
        let b = encode_error(&e);
        assert_eq!(b.len(), MAX_NOTICE_LEN);
        assert!(matches!(decode_error(&b), Ok(Error::Aborted { reason }) if reason.len() == MAX_NOTICE_LEN - 1));
    }
}
