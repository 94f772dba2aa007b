//! The store's wire format: length-prefixed frames carrying one request or one response.
//!
//! ```text
//! frame     = len:u32le body[len]              len <= MAX_FRAME
//! request   = op:u8 fields
//!   1 set          key value
//!   2 get          key
//!   3 wait         n:u32le key[n] timeout_ms:u64le      n <= MAX_WAIT_KEYS
//!   4 add          key delta:i64le
//!   5 compare_set  key has_expected:u8 [expected] new
//!   6 delete       key
//! response  = tag:u8 fields
//!   1 done
//!   2 value        present:u8 [value]
//!   3 int          i64le
//!   4 bytes        value
//!   5 bool         u8 (0 or 1)
//!   6 missing      n:u32le key[n]                       (a wait that timed out)
//!   7 error        message
//! key       = len:u32le utf8[len]                 len <= MAX_KEY_LEN
//! value     = len:u32le bytes[len]                len <= MAX_VALUE_LEN
//! message   = len:u32le utf8[len]                 len <= MAX_MESSAGE_LEN
//! ```
//!
//! Decoding works on a complete body in memory and checks every length against its limit
//! and against the bytes left before using it; a body with bytes after its last field is
//! malformed too. Every failure is a [`ProtocolError`] value, never a panic.

use std::fmt;
use std::io::{self, Read};

/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 4 * 1024;
/// Longest value, in bytes.
pub const MAX_VALUE_LEN: usize = 64 * 1024 * 1024;
/// Most keys in one wait request (the client splits longer lists).
pub const MAX_WAIT_KEYS: usize = 1024;
/// Longest error message in a response (longer ones are cut when encoded).
pub(crate) const MAX_MESSAGE_LEN: usize = 16 * 1024;
/// Longest frame body: a compare-and-set carrying two maximal values is the largest message.
pub(crate) const MAX_FRAME: usize = 2 * MAX_VALUE_LEN + 2 * MAX_KEY_LEN + 64;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_WAIT: u8 = 3;
const OP_ADD: u8 = 4;
const OP_COMPARE_SET: u8 = 5;
const OP_DELETE: u8 = 6;

const TAG_DONE: u8 = 1;
const TAG_VALUE: u8 = 2;
const TAG_INT: u8 = 3;
const TAG_BYTES: u8 = 4;
const TAG_BOOL: u8 = 5;
const TAG_MISSING: u8 = 6;
const TAG_ERROR: u8 = 7;

/// A malformed or oversized message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProtocolError(pub(crate) String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtocolError {}

fn malformed(msg: impl Into<String>) -> ProtocolError {
    ProtocolError(msg.into())
}

/// One request from a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// Store `value` under `key`.
    Set { key: String, value: Vec<u8> },
    /// The value under `key`, if any.
    Get { key: String },
    /// Answer once every key exists, or after `timeout_ms` with the missing ones.
    Wait { keys: Vec<String>, timeout_ms: u64 },
    /// Add `delta` to the decimal integer under `key` (missing = 0).
    Add { key: String, delta: i64 },
    /// Set `key` to `new` if its value equals `expected` (`None`: the key is absent).
    CompareSet { key: String, expected: Option<Vec<u8>>, new: Vec<u8> },
    /// Remove `key`.
    Delete { key: String },
}

/// One response from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Response {
    /// The request succeeded and returns nothing (set, wait).
    Done,
    /// The answer to get.
    Value(Option<Vec<u8>>),
    /// The answer to add.
    Int(i64),
    /// The answer to compare_set: the value after the operation.
    Bytes(Vec<u8>),
    /// The answer to delete: whether the key existed.
    Bool(bool),
    /// A wait timed out; these keys were still missing.
    Missing(Vec<String>),
    /// The request failed; the message says why.
    Error(String),
}

/// Why reading a frame failed.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The connection failed (includes read timeouts).
    Io(io::Error),
    /// The connection ended in the middle of a frame.
    Truncated { expected: usize, got: usize },
    /// The length field exceeds [`MAX_FRAME`]; the body was not read.
    TooLarge(u64),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "{e}"),
            FrameError::Truncated { expected, got } => {
                write!(f, "connection closed in the middle of a frame ({got} of {expected} bytes)")
            }
            FrameError::TooLarge(n) => write!(f, "frame length {n} exceeds the limit of {MAX_FRAME} bytes"),
        }
    }
}

/// Reads one frame body. `Ok(None)`: the connection closed cleanly between frames.
///
/// The body buffer grows as bytes arrive, so a length field alone never makes the reader
/// allocate more than it has received (plus a small first chunk).
pub(crate) fn read_frame<R: Read>(r: &mut R) -> Result<Option<Vec<u8>>, FrameError> {
    let mut header = [0u8; 4];
    let mut filled = 0;
    while filled < header.len() {
        match r.read(&mut header[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Truncated { expected: header.len(), got: filled }),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u32::from_le_bytes(header);
    if len as u64 > MAX_FRAME as u64 {
        return Err(FrameError::TooLarge(len.into()));
    }
    let len = len as usize;
    let mut body = Vec::with_capacity(len.min(64 * 1024));
    r.take(len as u64).read_to_end(&mut body).map_err(FrameError::Io)?;
    if body.len() < len {
        return Err(FrameError::Truncated { expected: len + 4, got: body.len() + 4 });
    }
    Ok(Some(body))
}

/// The first frame in `buf`, without I/O (for an event loop that collects bytes as they
/// arrive): `Ok(Some(body))` when it is complete (it spans `4 + body.len()` bytes of `buf`),
/// `Ok(None)` when more bytes are needed. The length field is checked against [`MAX_FRAME`]
/// as soon as it is complete, before anything is allocated or read for the body.
///
/// # Errors
/// [`FrameError::TooLarge`] for a length field over the limit.
pub(crate) fn complete_frame(buf: &[u8]) -> Result<Option<&[u8]>, FrameError> {
    let Some(header) = buf.first_chunk::<4>() else { return Ok(None) };
    let len = u32::from_le_bytes(*header);
    if len as u64 > MAX_FRAME as u64 {
        return Err(FrameError::TooLarge(len.into()));
    }
    Ok(buf.get(4..4 + len as usize))
}

/// What [`FrameError::Truncated`] says of `buf`, the bytes of an incomplete frame left when
/// the connection ended.
pub(crate) fn truncated(buf: &[u8]) -> FrameError {
    let expected = match buf.first_chunk::<4>() {
        Some(h) => u32::from_le_bytes(*h) as usize + 4,
        None => 4,
    };
    FrameError::Truncated { expected, got: buf.len() }
}

/// Builds a frame: reserves the length prefix, fills it in at the end.
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn new(first: u8) -> Writer {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&[0; 4]);
        buf.push(first);
        Writer { buf }
    }

    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn len(&mut self, n: usize, limit: usize, what: &str) -> Result<(), ProtocolError> {
        if n > limit {
            return Err(malformed(format!("{what} is {n} bytes; the limit is {limit}")));
        }
        // limit < 4 GiB for every field, so this cannot truncate.
        self.u32(n as u32);
        Ok(())
    }

    fn bytes(&mut self, b: &[u8], limit: usize, what: &str) -> Result<(), ProtocolError> {
        self.len(b.len(), limit, what)?;
        self.buf.extend_from_slice(b);
        Ok(())
    }

    fn key(&mut self, k: &str) -> Result<(), ProtocolError> {
        self.bytes(k.as_bytes(), MAX_KEY_LEN, "the key")
    }

    fn value(&mut self, v: &[u8]) -> Result<(), ProtocolError> {
        self.bytes(v, MAX_VALUE_LEN, "the value")
    }

    fn keys(&mut self, keys: &[String]) -> Result<(), ProtocolError> {
        if keys.len() > MAX_WAIT_KEYS {
            return Err(malformed(format!("{} keys in one message; the limit is {MAX_WAIT_KEYS}", keys.len())));
        }
        self.u32(keys.len() as u32);
        for k in keys {
            self.key(k)?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Vec<u8>, ProtocolError> {
        let body = self.buf.len() - 4;
        if body > MAX_FRAME {
            return Err(malformed(format!("message of {body} bytes exceeds the frame limit of {MAX_FRAME}")));
        }
        self.buf[..4].copy_from_slice(&(body as u32).to_le_bytes());
        Ok(self.buf)
    }
}

/// Reads fields from a frame body, checking every length before use.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    fn left(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ProtocolError> {
        let left = self.left();
        let out = self
            .pos
            .checked_add(n)
            .and_then(|end| self.buf.get(self.pos..end))
            .ok_or_else(|| malformed(format!("truncated {what}: needs {n} bytes, {left} left")))?;
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ProtocolError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8, ProtocolError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn flag(&mut self, what: &str) -> Result<bool, ProtocolError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(malformed(format!("{what} is {v}; expected 0 or 1"))),
        }
    }

    fn u32(&mut self, what: &str) -> Result<u32, ProtocolError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, ProtocolError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &str) -> Result<i64, ProtocolError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    fn bytes(&mut self, limit: usize, what: &str) -> Result<&'a [u8], ProtocolError> {
        let n = self.u32(what)? as usize;
        if n > limit {
            return Err(malformed(format!("{what} length {n} exceeds the limit of {limit}")));
        }
        self.take(n, what)
    }

    fn text(&mut self, limit: usize, what: &str) -> Result<String, ProtocolError> {
        let b = self.bytes(limit, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| malformed(format!("{what} is not UTF-8")))
    }

    fn key(&mut self) -> Result<String, ProtocolError> {
        self.text(MAX_KEY_LEN, "key")
    }

    fn value(&mut self) -> Result<Vec<u8>, ProtocolError> {
        Ok(self.bytes(MAX_VALUE_LEN, "value")?.to_vec())
    }

    fn keys(&mut self) -> Result<Vec<String>, ProtocolError> {
        let n = self.u32("key count")? as usize;
        if n > MAX_WAIT_KEYS {
            return Err(malformed(format!("key count {n} exceeds the limit of {MAX_WAIT_KEYS}")));
        }
        // Each key needs at least its 4-byte length: a count the body cannot hold is refused
        // before anything is allocated for it.
        if n > self.left() / 4 {
            return Err(malformed(format!("key count {n} does not fit in the {} bytes left", self.left())));
        }
        let mut keys = Vec::with_capacity(n);
        for _ in 0..n {
            keys.push(self.key()?);
        }
        Ok(keys)
    }

    fn finish<T>(self, v: T) -> Result<T, ProtocolError> {
        match self.left() {
            0 => Ok(v),
            n => Err(malformed(format!("{n} unexpected bytes after the message"))),
        }
    }
}

impl Request {
    /// The request as a complete frame (length prefix included).
    ///
    /// Errors: a key, value or key list over its limit.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        let w = match self {
            Request::Set { key, value } => {
                let mut w = Writer::new(OP_SET);
                w.key(key)?;
                w.value(value)?;
                w
            }
            Request::Get { key } => {
                let mut w = Writer::new(OP_GET);
                w.key(key)?;
                w
            }
            Request::Wait { keys, timeout_ms } => {
                let mut w = Writer::new(OP_WAIT);
                w.keys(keys)?;
                w.u64(*timeout_ms);
                w
            }
            Request::Add { key, delta } => {
                let mut w = Writer::new(OP_ADD);
                w.key(key)?;
                w.i64(*delta);
                w
            }
            Request::CompareSet { key, expected, new } => {
                let mut w = Writer::new(OP_COMPARE_SET);
                w.key(key)?;
                match expected {
                    Some(e) => {
                        w.u8(1);
                        w.value(e)?;
                    }
                    None => w.u8(0),
                }
                w.value(new)?;
                w
            }
            Request::Delete { key } => {
                let mut w = Writer::new(OP_DELETE);
                w.key(key)?;
                w
            }
        };
        w.finish()
    }

    /// Decodes a frame body (without its length prefix).
    ///
    /// Errors: anything malformed (unknown operation, a length over its limit or past the
    /// end, bad UTF-8 in a key, trailing bytes).
    pub(crate) fn decode(body: &[u8]) -> Result<Request, ProtocolError> {
        let mut r = Reader::new(body);
        let req = match r.u8("operation")? {
            OP_SET => Request::Set { key: r.key()?, value: r.value()? },
            OP_GET => Request::Get { key: r.key()? },
            OP_WAIT => Request::Wait { keys: r.keys()?, timeout_ms: r.u64("timeout")? },
            OP_ADD => Request::Add { key: r.key()?, delta: r.i64("delta")? },
            OP_COMPARE_SET => {
                let key = r.key()?;
                let expected = if r.flag("expected-value flag")? { Some(r.value()?) } else { None };
                Request::CompareSet { key, expected, new: r.value()? }
            }
            OP_DELETE => Request::Delete { key: r.key()? },
            op => return Err(malformed(format!("unknown operation {op}"))),
        };
        r.finish(req)
    }
}

impl Response {
    /// The response as a complete frame. An error message over the limit is cut (at a
    /// character boundary) rather than refused.
    ///
    /// Errors: a value or key list over its limit.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        let w = match self {
            Response::Done => Writer::new(TAG_DONE),
            Response::Value(v) => {
                let mut w = Writer::new(TAG_VALUE);
                match v {
                    Some(v) => {
                        w.u8(1);
                        w.value(v)?;
                    }
                    None => w.u8(0),
                }
                w
            }
            Response::Int(i) => {
                let mut w = Writer::new(TAG_INT);
                w.i64(*i);
                w
            }
            Response::Bytes(v) => {
                let mut w = Writer::new(TAG_BYTES);
                w.value(v)?;
                w
            }
            Response::Bool(b) => {
                let mut w = Writer::new(TAG_BOOL);
                w.u8(u8::from(*b));
                w
            }
            Response::Missing(keys) => {
                let mut w = Writer::new(TAG_MISSING);
                w.keys(keys)?;
                w
            }
            Response::Error(m) => {
                let mut end = m.len().min(MAX_MESSAGE_LEN);
                while !m.is_char_boundary(end) {
                    end -= 1;
                }
                let mut w = Writer::new(TAG_ERROR);
                w.bytes(&m.as_bytes()[..end], MAX_MESSAGE_LEN, "the error message")?;
                w
            }
        };
        w.finish()
    }

    /// Decodes a frame body (without its length prefix).
    ///
    /// Errors: anything malformed, as for [`Request::decode`].
    pub(crate) fn decode(body: &[u8]) -> Result<Response, ProtocolError> {
        let mut r = Reader::new(body);
        let resp = match r.u8("response tag")? {
            TAG_DONE => Response::Done,
            TAG_VALUE => Response::Value(if r.flag("value-present flag")? { Some(r.value()?) } else { None }),
            TAG_INT => Response::Int(r.i64("integer")?),
            TAG_BYTES => Response::Bytes(r.value()?),
            TAG_BOOL => Response::Bool(r.flag("boolean")?),
            TAG_MISSING => Response::Missing(r.keys()?),
            TAG_ERROR => Response::Error(r.text(MAX_MESSAGE_LEN, "error message")?),
            tag => return Err(malformed(format!("unknown response tag {tag}"))),
        };
        r.finish(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;

    fn body(frame: &[u8]) -> &[u8] {
        &frame[4..]
    }

    #[test]
    fn frames_carry_their_length() {
        let f = Request::Get { key: "k".into() }.encode().unwrap();
        assert_eq!(u32::from_le_bytes(f[..4].try_into().unwrap()) as usize, f.len() - 4);
        let mut c = Cursor::new(f.clone());
        assert_eq!(read_frame(&mut c).unwrap().unwrap(), body(&f));
        assert!(read_frame(&mut c).unwrap().is_none(), "clean end between frames");
    }

    #[test]
    fn oversized_fields_are_refused_when_encoding() {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let e = Request::Get { key: long }.encode().unwrap_err();
        assert!(e.0.contains("key") && e.0.contains("4096"), "{e}");
        let keys = vec![String::new(); MAX_WAIT_KEYS + 1];
        assert!(Request::Wait { keys, timeout_ms: 0 }.encode().is_err());
        let big = vec![0u8; MAX_VALUE_LEN + 1];
        let e = Request::Set { key: "k".into(), value: big }.encode().unwrap_err();
        assert!(e.0.contains("value"), "{e}");
        assert!(Request::Set { key: "k".into(), value: vec![0; MAX_VALUE_LEN] }.encode().is_ok());
    }

    #[test]
    fn long_error_messages_are_cut_at_a_character_boundary() {
        let m = "é".repeat(MAX_MESSAGE_LEN);
        let f = Response::Error(m).encode().unwrap();
        match Response::decode(body(&f)).unwrap() {
            Response::Error(d) => assert!(d.len() <= MAX_MESSAGE_LEN && d.chars().all(|c| c == 'é')),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_bodies_are_errors() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "truncated operation"),
            (vec![99], "unknown operation 99"),
            (vec![OP_GET, 0xff, 0xff, 0xff, 0xff], "exceeds the limit"),
            (vec![OP_GET, 5, 0, 0, 0, b'a'], "truncated key"),
            (vec![OP_GET, 1, 0, 0, 0, 0xff], "not UTF-8"),
            (vec![OP_GET, 1, 0, 0, 0, b'a', 0], "unexpected bytes"),
            (vec![OP_WAIT, 0xff, 0xff, 0, 0], "key count"),
            (vec![OP_WAIT, 200, 0, 0, 0, 0, 0], "does not fit"),
            (vec![OP_COMPARE_SET, 0, 0, 0, 0, 7], "expected 0 or 1"),
        ];
        for (b, want) in cases {
            let e = Request::decode(&b).unwrap_err();
            assert!(e.0.contains(want), "{b:?}: {e} (wanted {want})");
        }
        assert!(Response::decode(&[TAG_BOOL, 2]).is_err());
        assert!(Response::decode(&[0]).is_err());
    }

    #[test]
    fn absurd_and_truncated_frames_are_errors() {
        let mut c = Cursor::new(u32::MAX.to_le_bytes().to_vec());
        assert!(matches!(read_frame(&mut c), Err(FrameError::TooLarge(n)) if n == u32::MAX as u64));
        let mut c = Cursor::new(vec![1, 0]);
        assert!(matches!(read_frame(&mut c), Err(FrameError::Truncated { .. })));
        let mut c = Cursor::new(vec![10, 0, 0, 0, 1, 2, 3]);
        assert!(matches!(read_frame(&mut c), Err(FrameError::Truncated { expected: 14, got: 7 })));
    }

    #[test]
    fn frames_are_found_in_partial_input() {
        let f = Request::Get { key: "k".into() }.encode().unwrap();
        for n in 0..f.len() {
            assert!(complete_frame(&f[..n]).unwrap().is_none(), "{n} bytes are not a frame");
        }
        let mut two = f.clone();
        two.extend_from_slice(&f[..3]);
        assert_eq!(complete_frame(&two).unwrap().unwrap(), body(&f));
        assert!(matches!(complete_frame(&u32::MAX.to_le_bytes()), Err(FrameError::TooLarge(_))));
        let limit = (MAX_FRAME as u32).to_le_bytes();
        assert!(complete_frame(&limit).unwrap().is_none(), "the limit itself is allowed");
        assert_eq!(truncated(&[1, 0]).to_string(), "connection closed in the middle of a frame (2 of 4 bytes)");
        assert!(matches!(truncated(&[10, 0, 0, 0, 1]), FrameError::Truncated { expected: 14, got: 5 }));
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![".{0,24}", Just(String::new()), Just("k".repeat(MAX_KEY_LEN))]
    }

    fn value() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(any::<u8>(), 0..200)
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (key(), value()).prop_map(|(key, value)| Request::Set { key, value }),
            key().prop_map(|key| Request::Get { key }),
            (prop::collection::vec(key(), 0..8), any::<u64>())
                .prop_map(|(keys, timeout_ms)| Request::Wait { keys, timeout_ms }),
            (key(), any::<i64>()).prop_map(|(key, delta)| Request::Add { key, delta }),
            (key(), prop::option::of(value()), value()).prop_map(|(key, expected, new)| Request::CompareSet {
                key,
                expected,
                new
            }),
            key().prop_map(|key| Request::Delete { key }),
        ]
    }

    fn response() -> impl Strategy<Value = Response> {
        prop_oneof![
            Just(Response::Done),
            prop::option::of(value()).prop_map(Response::Value),
            any::<i64>().prop_map(Response::Int),
            value().prop_map(Response::Bytes),
            any::<bool>().prop_map(Response::Bool),
            prop::collection::vec(key(), 0..8).prop_map(Response::Missing),
            ".{0,64}".prop_map(Response::Error),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = Request::decode(&bytes);
            let _ = Response::decode(&bytes);
            let _ = read_frame(&mut Cursor::new(&bytes));
        }

        #[test]
        fn plausible_bodies_never_panic(op in 0u8..9, len in any::<u32>(), tail in prop::collection::vec(any::<u8>(), 0..64)) {
            // A valid-looking operation or tag followed by an arbitrary length field.
            let mut b = vec![op];
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&tail);
            let _ = Request::decode(&b);
            let _ = Response::decode(&b);
        }

        #[test]
        fn requests_round_trip_and_truncations_fail(req in request(), cut in any::<prop::sample::Index>()) {
            let frame = req.encode().unwrap();
            let mut c = Cursor::new(&frame);
            let b = read_frame(&mut c).unwrap().unwrap();
            prop_assert_eq!(&Request::decode(&b).unwrap(), &req);
            let n = cut.index(b.len());
            prop_assert!(Request::decode(&b[..n]).is_err());
            let m = cut.index(frame.len());
            prop_assert!(m == 0 || read_frame(&mut Cursor::new(&frame[..m])).is_err());
        }

        #[test]
        fn responses_round_trip_and_truncations_fail(resp in response(), cut in any::<prop::sample::Index>()) {
            let frame = resp.encode().unwrap();
            let b = &frame[4..];
            prop_assert_eq!(&Response::decode(b).unwrap(), &resp);
            let n = cut.index(b.len());
            prop_assert!(Response::decode(&b[..n]).is_err());
        }
    }
}
