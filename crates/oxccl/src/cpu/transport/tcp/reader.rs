//! The receiving side of a connection: a reader thread per connection ([`spawn_reader`])
//! decodes frames ([`pump`]) into the rank's mailbox, checking every field before use, and
//! loses the peer when the stream ends.

use std::io::{self, BufReader, Read};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::connection::Conn;
use crate::cpu::transport::frame::{self, FrameKind, HEADER_LEN, MAX_NOTICE_LEN};
use crate::cpu::transport::mailbox::Mailbox;

/// Most a reader allocates for a payload before its bytes arrive.
pub(super) const PREALLOC: usize = 64 << 20;
const READ_BUFFER: usize = 64 * 1024;

/// How a reader's stream ended.
#[derive(Debug)]
pub(super) enum End {
    /// EOF at a frame boundary.
    Closed,
    /// EOF inside a frame.
    Truncated,
    /// A read failed.
    Failed(io::Error),
    /// The peer sent something that is not a valid frame (the text says what).
    Malformed(String),
}

/// Fills `head`; `Ok(false)` at EOF before its first byte.
fn read_header(r: &mut impl Read, head: &mut [u8; HEADER_LEN]) -> io::Result<bool> {
    let mut n = 0;
    while n < HEADER_LEN {
        match r.read(&mut head[n..]) {
            Ok(0) if n == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads a payload of `len` bytes (already checked against the limit) into `buf` (empty; a
/// reused buffer keeps its capacity), growing it as the bytes arrive: a length field alone
/// costs at most [`PREALLOC`] bytes. The bytes are read into uninitialised capacity, never
/// zeroed first.
pub(super) fn read_payload(r: &mut impl Read, len: usize, mut buf: Vec<u8>) -> io::Result<Vec<u8>> {
    buf.reserve(len.min(PREALLOC));
    let got = r.take(len as u64).read_to_end(&mut buf)?;
    if got < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(buf)
}

/// Decodes frames from `r` into `mailbox` (as coming from `src`) until the stream ends.
pub(super) fn pump(r: &mut impl Read, src: usize, mailbox: &Mailbox, max_frame: usize) -> End {
    let mut head = [0u8; HEADER_LEN];
    loop {
        match read_header(r, &mut head) {
            Ok(true) => {}
            Ok(false) => return End::Closed,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return End::Truncated,
            Err(e) => return End::Failed(e),
        }
        let f = match frame::decode_header(&head, max_frame) {
            Ok(f) => f,
            Err(e) => return End::Malformed(format!("a malformed frame ({})", e.0)),
        };
        match f.kind {
            FrameKind::Release if f.payload_len != 0 => {
                return End::Malformed(format!("a release notice with a {}-byte payload", f.payload_len));
            }
            FrameKind::Failure if f.payload_len > MAX_NOTICE_LEN => {
                return End::Malformed(format!(
                    "a failure notice of {} bytes (at most {MAX_NOTICE_LEN})",
                    f.payload_len
                ));
            }
            _ => {}
        }
        let payload = match read_payload(r, f.payload_len, mailbox.spare_buffer(f.payload_len)) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return End::Truncated,
            Err(e) => return End::Failed(e),
        };
        if let Err(e) = mailbox.accept(src, f, payload) {
            return End::Malformed(format!("a failure notice that cannot be decoded ({})", e.0));
        }
    }
}

pub(super) fn spawn_reader(
    me: usize,
    conn: Arc<Conn>,
    mailbox: Arc<Mailbox>,
    max_frame: usize,
    closing: Arc<AtomicBool>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("oxccl-tcp{me}<{}", conn.peer)).spawn(move || {
        let peer = conn.peer;
        let end = pump(&mut BufReader::with_capacity(READ_BUFFER, &conn.sock), peer, &mailbox, max_frame);
        if matches!(end, End::Malformed(_)) {
            let _ = conn.sock.shutdown(Shutdown::Both);
        }
        let detail = if closing.load(Ordering::Acquire) {
            format!("rank {me} shut its TCP connections down")
        } else {
            match end {
                End::Closed => format!(
                    "the TCP connection to rank {peer} closed (its process ended, or it shut its connections down)"
                ),
                End::Truncated => format!("the TCP connection to rank {peer} closed in the middle of a frame"),
                End::Failed(e) => format!("reading from rank {peer} over TCP failed: {e}"),
                End::Malformed(m) => format!("rank {peer} sent {m}; the connection was closed"),
            }
        };
        let detail = conn.gone.get_or_init(|| detail);
        mailbox.lose(peer, detail);
    })
}
