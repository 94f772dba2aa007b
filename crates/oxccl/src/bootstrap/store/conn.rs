//! One store connection's protocol as a state machine without I/O: the event loop hands it
//! the bytes that arrived ([`received`](Conn::received)), takes [`Event`]s out of it
//! (authenticated, refused, a request to carry out, closed), answers each request with
//! [`respond`](Conn::respond), and writes what [`unsent`](Conn::unsent) holds.
//!
//! ```text
//! Auth ── answer checked ──> Open ── malformed, truncated or end of input ──> Closing
//!   └──── refused, hung up ───────────────────────────────────────────────────┘
//! ```
//!
//! Bounds: the loop reads only while [`wants_read`](Conn::wants_read), which is false once a
//! complete frame waits that cannot be carried out yet, so the input holds at most that
//! frame and what the loop's last turn read; a frame's length is checked against
//! `MAX_FRAME` before its body is collected, and the buffer grows only as bytes arrive. Requests are carried out one at a time and in order: none while one is
//! unanswered (a parked wait) or while more than [`OUTPUT_PAUSE`] bytes are unsent, so the
//! output holds at most that plus one response.

use std::io;
use std::net::SocketAddr;

use super::protocol::{complete_frame, truncated, Request, Response};
use super::AUTH_CONTEXT;
use crate::bootstrap::auth::{AuthError, Challenge, Secret, ANSWER_LEN};

/// Unsent output past which a connection's further requests wait (and its input is not
/// read) until the client has taken some of its responses.
pub(crate) const OUTPUT_PAUSE: usize = 1 << 20;
/// A buffer larger than this is freed, not kept, once empty (after a large value).
const KEEP_CAPACITY: usize = 64 * 1024;

/// What happened on a connection.
#[derive(Debug)]
pub(crate) enum Event {
    /// The client proved it knows the secret; its requests follow.
    Authenticated,
    /// The client failed the handshake (or hung up during it); the connection closes once
    /// the refusal byte, if any, is sent.
    Refused(AuthError),
    /// A request to carry out and [`respond`](Conn::respond) to; no further request comes
    /// before that.
    Request(Request),
    /// The connection closes once its output is sent: the client left between frames
    /// (`None`), or with the line to log (a malformed or truncated frame).
    Closed(Option<String>),
}

enum Phase {
    Auth(Challenge),
    Open,
    Closing,
}

/// One connection's state.
pub(crate) struct Conn {
    peer: SocketAddr,
    phase: Phase,
    /// Received bytes; those before `consumed` are done with.
    input: Vec<u8>,
    consumed: usize,
    /// Bytes to send; those before `sent` are sent.
    output: Vec<u8>,
    sent: usize,
    /// A request was handed out and is not answered yet.
    answering: bool,
    /// The client will send nothing more.
    read_closed: bool,
}

impl Conn {
    /// A new connection from `peer`, whose first output is `challenge`'s message.
    pub(crate) fn new(peer: SocketAddr, challenge: Challenge) -> Conn {
        Conn {
            peer,
            output: challenge.bytes().to_vec(),
            phase: Phase::Auth(challenge),
            input: Vec::new(),
            consumed: 0,
            sent: 0,
            answering: false,
            read_closed: false,
        }
    }

    /// The client's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Whether the handshake is still going on.
    pub(crate) fn authenticating(&self) -> bool {
        matches!(self.phase, Phase::Auth(_))
    }

    /// Whether the loop should read: the connection is open for input and holds no
    /// complete frame it cannot carry out yet.
    pub(crate) fn wants_read(&self) -> bool {
        match self.phase {
            Phase::Closing => false,
            _ if self.read_closed => false,
            Phase::Auth(_) => true,
            Phase::Open => {
                !(self.answering || self.unsent().len() >= OUTPUT_PAUSE)
                    || !matches!(complete_frame(&self.input[self.consumed..]), Ok(Some(_)) | Err(_))
            }
        }
    }

    /// Bytes from the client.
    pub(crate) fn received(&mut self, bytes: &[u8]) {
        if matches!(self.phase, Phase::Closing) {
            return;
        }
        if self.consumed > 0 && (self.consumed == self.input.len() || self.consumed >= KEEP_CAPACITY) {
            self.input.drain(..self.consumed);
            self.consumed = 0;
        }
        self.input.extend_from_slice(bytes);
    }

    /// The client will send nothing more (end of input).
    pub(crate) fn end_of_input(&mut self) {
        self.read_closed = true;
    }

    /// The next thing that happened, if any. Call until `None` after new input, after a
    /// response and after output was sent.
    pub(crate) fn next_event(&mut self, secret: &Secret) -> Option<Event> {
        match &self.phase {
            Phase::Closing => None,
            Phase::Auth(challenge) => {
                let avail = &self.input[self.consumed..];
                if avail.len() < ANSWER_LEN {
                    if !self.read_closed {
                        return None;
                    }
                    self.close();
                    let e = io::Error::new(io::ErrorKind::UnexpectedEof, "the client hung up");
                    return Some(Event::Refused(AuthError::Io(e)));
                }
                match challenge.answer(secret, AUTH_CONTEXT, &avail[..ANSWER_LEN]) {
                    Ok(verdict) => {
                        self.consumed += ANSWER_LEN;
                        self.queue(&verdict);
                        self.phase = Phase::Open;
                        Some(Event::Authenticated)
                    }
                    Err((e, say)) => {
                        if let Some(b) = say {
                            self.queue(&[b]);
                        }
                        self.close();
                        Some(Event::Refused(e))
                    }
                }
            }
            Phase::Open => {
                if self.answering || self.unsent().len() >= OUTPUT_PAUSE {
                    return None;
                }
                let avail = &self.input[self.consumed..];
                match complete_frame(avail) {
                    Ok(Some(body)) => {
                        let request = Request::decode(body);
                        self.consumed += 4 + body.len();
                        match request {
                            Ok(req) => {
                                self.answering = true;
                                Some(Event::Request(req))
                            }
                            Err(e) => {
                                self.queue_response(&Response::Error(format!("malformed request: {e}")));
                                self.close();
                                Some(Event::Closed(Some(self.closed_line(&format!("malformed request: {e}")))))
                            }
                        }
                    }
                    Ok(None) if !self.read_closed => None,
                    Ok(None) if avail.is_empty() => {
                        self.close();
                        Some(Event::Closed(None))
                    }
                    Ok(None) => {
                        let e = truncated(avail);
                        self.close();
                        Some(Event::Closed(Some(self.closed_line(&e))))
                    }
                    Err(e) => {
                        self.queue_response(&Response::Error(format!("malformed frame: {e}")));
                        self.close();
                        Some(Event::Closed(Some(self.closed_line(&e))))
                    }
                }
            }
        }
    }

    /// The line logged when the connection is closed for `why`.
    pub(crate) fn closed_line(&self, why: &dyn std::fmt::Display) -> String {
        format!("oxccl store: closed {}: {why}", self.peer)
    }

    /// Answers the request handed out last (or tells a parked wait the store is stopping).
    pub(crate) fn respond(&mut self, response: &Response) {
        self.answering = false;
        self.queue_response(response);
    }

    fn queue_response(&mut self, response: &Response) {
        let frame = response.encode().unwrap_or_else(|e| {
            // Cannot happen for values the store accepted; answer with an error rather than
            // nothing (an error message is cut to fit, so this encodes).
            Response::Error(format!("cannot encode the response: {e}")).encode().unwrap_or_default()
        });
        if self.unsent().is_empty() {
            // The common case: no copy, even of a large value.
            self.output = frame;
            self.sent = 0;
        } else {
            self.queue(&frame);
        }
    }

    fn queue(&mut self, bytes: &[u8]) {
        if self.sent > 0 {
            self.output.drain(..self.sent);
            self.sent = 0;
        }
        self.output.extend_from_slice(bytes);
    }

    /// Stops taking input; what is queued is still sent.
    fn close(&mut self) {
        self.phase = Phase::Closing;
        self.input = Vec::new();
        self.consumed = 0;
    }

    /// The bytes to send next.
    pub(crate) fn unsent(&self) -> &[u8] {
        &self.output[self.sent..]
    }

    /// `n` bytes of [`unsent`](Self::unsent) went out.
    pub(crate) fn sent(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.output.len());
        if self.sent == self.output.len() {
            if self.output.capacity() > KEEP_CAPACITY {
                self.output = Vec::new();
            } else {
                self.output.clear();
            }
            self.sent = 0;
        }
        if self.consumed == self.input.len() && self.input.capacity() > KEEP_CAPACITY {
            self.input = Vec::new();
            self.consumed = 0;
        }
    }

    /// Whether the connection is done: closing, with everything sent.
    pub(crate) fn finished(&self) -> bool {
        matches!(self.phase, Phase::Closing) && self.unsent().is_empty()
    }

    /// Bytes held for this connection (tests check that a length field allocates nothing).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.input.capacity() + self.output.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::auth;
    use crate::bootstrap::store::protocol::{read_frame, MAX_FRAME};
    use std::io::{Read, Write};

    /// The client's end of an in-memory connection: reads what the server queued.
    struct Pipe<'a> {
        conn: &'a mut Conn,
        reply: Vec<u8>,
    }

    impl Read for Pipe<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let out = self.conn.unsent();
            let n = out.len().min(buf.len());
            buf[..n].copy_from_slice(&out[..n]);
            self.conn.sent(n);
            Ok(n)
        }
    }

    impl Write for Pipe<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.reply.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn peer() -> SocketAddr {
        "10.0.0.9:1234".parse().unwrap()
    }

    /// A connection and the answer of a client with `client_secret` (not yet received).
    fn handshake(client_secret: &Secret) -> (Conn, Vec<u8>) {
        let mut conn = Conn::new(peer(), Challenge::new().unwrap());
        let mut pipe = Pipe { conn: &mut conn, reply: Vec::new() };
        let _ = auth::connect(&mut pipe, client_secret, AUTH_CONTEXT); // stops at the verdict
        let answer = pipe.reply;
        assert_eq!(answer.len(), ANSWER_LEN);
        (conn, answer)
    }

    fn open(secret: &Secret) -> Conn {
        let (mut conn, answer) = handshake(secret);
        conn.received(&answer);
        assert!(matches!(conn.next_event(secret), Some(Event::Authenticated)));
        let n = conn.unsent().len();
        conn.sent(n);
        conn
    }

    fn response(conn: &mut Conn) -> Response {
        let body = read_frame(&mut conn.unsent()).unwrap().unwrap();
        conn.sent(4 + body.len());
        Response::decode(&body).unwrap()
    }

    #[test]
    fn the_handshake_accepts_the_secret_and_refuses_others() {
        let s = Secret::generate().unwrap();
        let (mut conn, answer) = handshake(&s);
        conn.received(&answer[..10]);
        assert!(conn.next_event(&s).is_none() && conn.authenticating());
        conn.received(&answer[10..]);
        assert!(matches!(conn.next_event(&s), Some(Event::Authenticated)));
        assert_eq!(conn.unsent().len(), auth::VERDICT_LEN);
        assert_eq!(conn.unsent()[0], 1);

        let (mut conn, answer) = handshake(&Secret::generate().unwrap());
        conn.received(&answer);
        assert!(matches!(conn.next_event(&s), Some(Event::Refused(AuthError::ClientRefused))));
        assert_eq!(conn.unsent(), [0], "the client is told");
        assert!(!conn.wants_read());
        conn.sent(1);
        assert!(conn.finished());

        let mut conn = Conn::new(peer(), Challenge::new().unwrap());
        conn.received(b"hi");
        conn.end_of_input();
        assert!(matches!(conn.next_event(&s), Some(Event::Refused(AuthError::Io(_)))));
    }

    #[test]
    fn requests_come_one_at_a_time_in_order() {
        let s = Secret::generate().unwrap();
        let mut conn = open(&s);
        let mut bytes = Request::Get { key: "a".into() }.encode().unwrap();
        bytes.extend(Request::Get { key: "b".into() }.encode().unwrap());
        // Byte by byte: nothing until the first frame is complete.
        for (i, b) in bytes.iter().enumerate() {
            conn.received(&[*b]);
            if i < 9 {
                assert!(conn.next_event(&s).is_none());
            }
        }
        assert!(matches!(conn.next_event(&s), Some(Event::Request(Request::Get { key })) if key == "a"));
        assert!(conn.next_event(&s).is_none(), "the first is not answered yet");
        assert!(!conn.wants_read(), "a complete frame waits: no more input is read");
        conn.respond(&Response::Value(None));
        assert!(matches!(conn.next_event(&s), Some(Event::Request(Request::Get { key })) if key == "b"));
        conn.respond(&Response::Bool(true));
        assert_eq!(response(&mut conn), Response::Value(None));
        assert_eq!(response(&mut conn), Response::Bool(true));
        conn.end_of_input();
        assert!(matches!(conn.next_event(&s), Some(Event::Closed(None))));
        assert!(conn.finished());
    }

    #[test]
    fn a_huge_length_field_is_refused_without_allocating() {
        let s = Secret::generate().unwrap();
        let mut conn = open(&s);
        conn.received(&u32::MAX.to_le_bytes());
        let Some(Event::Closed(Some(line))) = conn.next_event(&s) else { panic!() };
        assert!(line.starts_with("oxccl store: closed 10.0.0.9:1234: frame length 4294967295"), "{line}");
        assert!(matches!(response(&mut conn), Response::Error(m) if m.contains("malformed frame")));
        assert!(conn.finished());

        // The largest allowed length: the body is collected as it arrives, nothing before.
        let mut conn = open(&s);
        conn.received(&(MAX_FRAME as u32).to_le_bytes());
        conn.received(&[2; 100]);
        assert!(conn.next_event(&s).is_none() && conn.wants_read());
        assert!(conn.held() < 4096, "{} bytes held for a 104-byte prefix", conn.held());
        conn.end_of_input();
        let Some(Event::Closed(Some(line))) = conn.next_event(&s) else { panic!() };
        assert!(line.contains(&format!("104 of {} bytes", MAX_FRAME + 4)), "{line}");
    }

    #[test]
    fn a_malformed_body_is_answered_and_closes() {
        let s = Secret::generate().unwrap();
        let mut conn = open(&s);
        conn.received(&[5, 0, 0, 0, 0xee, 1, 2, 3, 4, 9, 9]);
        let Some(Event::Closed(Some(line))) = conn.next_event(&s) else { panic!() };
        assert!(line.contains("unknown operation 238"), "{line}");
        assert!(matches!(response(&mut conn), Response::Error(m) if m.contains("malformed request")));
        assert!(conn.next_event(&s).is_none() && conn.finished());
    }

    #[test]
    fn a_client_that_does_not_read_is_paused() {
        let s = Secret::generate().unwrap();
        let mut conn = open(&s);
        let big = vec![7u8; OUTPUT_PAUSE];
        let get = Request::Get { key: "big".into() }.encode().unwrap();
        for _ in 0..3 {
            conn.received(&get);
        }
        assert!(matches!(conn.next_event(&s), Some(Event::Request(_))));
        conn.respond(&Response::Value(Some(big.clone())));
        assert!(conn.next_event(&s).is_none(), "over the pause: the next request waits");
        assert!(!conn.wants_read());
        let n = conn.unsent().len();
        conn.sent(n - 10);
        assert!(matches!(conn.next_event(&s), Some(Event::Request(_))), "taken: go on");
        conn.respond(&Response::Value(Some(big)));
        assert_eq!(conn.unsent().len(), 10 + n, "at most the pause plus one response");
    }
}
