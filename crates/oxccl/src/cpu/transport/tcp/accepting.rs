//! The accepting side of connection setup, run by the progress thread without blocking:
//! [`ServerHandshake`] is the server's half of the handshake as a state machine without
//! I/O (bytes in, bytes out), and [`Accepting`] drives one on a non-blocking socket.
//!
//! The server sends the job-secret challenge, reads the client's answer and sends its
//! verdict ([`auth::Challenge`]), then reads the identity message (`handshake`). Only what
//! the current step needs is read: the client sends nothing more until it has the server's
//! answer, so no byte of the connection's frames is ever taken by the handshake. A client
//! that stays silent is dropped at its deadline, and a client cannot make the server
//! allocate: each step reads into a buffer of its fixed size.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::handshake::{AUTH_CONTEXT, HELLO_LEN};
use crate::bootstrap::auth::{Challenge, Secret, ANSWER_LEN};

/// Where a server handshake stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Waiting for the client's answer to the challenge.
    Answer,
    /// Waiting for the identity message.
    Hello,
    /// Over (the identity was handed out, or the client refused).
    Done,
}

/// What the server does after [`ServerHandshake::receive`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Send the bytes (maybe none), then wait for more.
    Send(Vec<u8>),
    /// The identity message arrived: decide, answer, and the handshake is over.
    Hello(Box<[u8; HELLO_LEN]>),
    /// Send the bytes (maybe none) and close: why.
    Refuse(Vec<u8>, String),
}

/// The server's half of a connection's handshake, without I/O (see the module docs).
#[derive(Debug)]
pub(super) struct ServerHandshake {
    challenge: Challenge,
    step: Step,
    got: Vec<u8>,
}

impl ServerHandshake {
    /// A handshake and its first message (the challenge).
    ///
    /// # Errors
    /// When the system's random source fails.
    pub(super) fn start() -> io::Result<(ServerHandshake, Vec<u8>)> {
        let challenge = Challenge::new().map_err(|e| io::Error::other(e.to_string()))?;
        let first = challenge.bytes().to_vec();
        Ok((ServerHandshake { challenge, step: Step::Answer, got: Vec::with_capacity(ANSWER_LEN) }, first))
    }

    /// How many more bytes the current step needs (zero once it is over).
    pub(super) fn wants(&self) -> usize {
        match self.step {
            Step::Answer => ANSWER_LEN - self.got.len(),
            Step::Hello => HELLO_LEN - self.got.len(),
            Step::Done => 0,
        }
    }

    /// Takes `bytes` (at most [`ServerHandshake::wants`] of them are used: the rest would
    /// belong to no step) and says what to do.
    pub(super) fn receive(&mut self, bytes: &[u8], secret: &Secret) -> Outcome {
        let take = bytes.len().min(self.wants());
        self.got.extend_from_slice(&bytes[..take]);
        if self.wants() > 0 || self.step == Step::Done {
            return Outcome::Send(Vec::new());
        }
        let got = std::mem::take(&mut self.got);
        match self.step {
            Step::Answer => match self.challenge.answer(secret, AUTH_CONTEXT, &got) {
                Ok(verdict) => {
                    self.step = Step::Hello;
                    self.got.reserve(HELLO_LEN);
                    Outcome::Send(verdict.to_vec())
                }
                Err((e, say)) => {
                    self.step = Step::Done;
                    Outcome::Refuse(say.into_iter().collect(), e.to_string())
                }
            },
            Step::Hello => {
                self.step = Step::Done;
                let mut hello = Box::new([0u8; HELLO_LEN]);
                hello.copy_from_slice(&got);
                Outcome::Hello(hello)
            }
            Step::Done => Outcome::Send(Vec::new()),
        }
    }
}

/// An accepted socket in its handshake, driven by the progress thread.
pub(super) struct Accepting {
    pub(super) sock: TcpStream,
    pub(super) from: SocketAddr,
    pub(super) deadline: Instant,
    hs: ServerHandshake,
}

/// What [`Accepting::readable`] found.
pub(super) enum Read {
    /// Nothing decisive yet: wait for more bytes.
    Pending,
    /// The identity message, to decide on.
    Hello(Box<[u8; HELLO_LEN]>),
    /// The handshake failed (the socket should be closed): why.
    Failed(String),
}

impl Accepting {
    /// Starts the handshake on `sock` (made non-blocking here) by sending the challenge.
    ///
    /// # Errors
    /// When the socket cannot be set up or the challenge cannot be sent.
    pub(super) fn start(sock: TcpStream, from: SocketAddr, deadline: Instant) -> io::Result<Accepting> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        let (hs, first) = ServerHandshake::start()?;
        send_small(&sock, &first)?;
        Ok(Accepting { sock, from, deadline, hs })
    }

    /// Reads what the handshake's current step needs and acts on it.
    pub(super) fn readable(&mut self, secret: &Secret) -> Read {
        loop {
            let mut buf = [0u8; 64];
            let want = self.hs.wants().min(buf.len());
            if want == 0 {
                return Read::Pending;
            }
            // SAFETY: `recv` writes at most `want` (at most `buf.len()`) bytes into `buf`, which we
            // hold exclusively; the descriptor is open while `self.sock` lives.
            let r = unsafe { libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr().cast(), want, libc::MSG_DONTWAIT) };
            if r == 0 {
                return Read::Failed("the client closed the connection during the handshake".into());
            }
            if r < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Read::Pending,
                    io::ErrorKind::Interrupted => continue,
                    _ => Read::Failed(format!("the handshake failed: {e}")),
                };
            }
            match self.hs.receive(&buf[..r as usize], secret) {
                Outcome::Send(out) => {
                    if let Err(e) = send_small(&self.sock, &out) {
                        return Read::Failed(format!("the handshake failed: {e}"));
                    }
                }
                Outcome::Hello(h) => return Read::Hello(h),
                Outcome::Refuse(out, why) => {
                    let _ = send_small(&self.sock, &out);
                    return Read::Failed(why);
                }
            }
        }
    }

    /// Sends the server's answer to the identity message.
    ///
    /// # Errors
    /// When the socket does not take it at once.
    pub(super) fn answer(&self, reply: &[u8]) -> io::Result<()> {
        send_small(&self.sock, reply)
    }
}

/// Sends a handshake message of a few dozen bytes on a non-blocking socket: a fresh
/// connection's send buffer (kilobytes) takes it whole, so a partial send is an error here
/// rather than a state to resume.
fn send_small(sock: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    let mut at = 0;
    while at < bytes.len() {
        // SAFETY: the pointer and length describe `bytes[at..]`, borrowed for the call and only
        // read by the kernel; the descriptor is open while `sock` lives.
        let r = unsafe {
            libc::send(
                sock.as_raw_fd(),
                bytes[at..].as_ptr().cast(),
                bytes.len() - at,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        at += r as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::auth::{self, CHALLENGE_LEN, VERDICT_LEN};
    use std::io::Write;

    /// A client's side over memory: reads what the server sent, writes its replies.
    struct Wire {
        from_server: Vec<u8>,
        to_server: Vec<u8>,
    }

    impl io::Read for Wire {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.from_server.len());
            buf[..n].copy_from_slice(&self.from_server[..n]);
            self.from_server.drain(..n);
            Ok(n)
        }
    }

    impl Write for Wire {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.to_server.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_server_handshake_runs_byte_by_byte_without_io() {
        let secret = Secret::generate().unwrap();
        let (mut hs, first) = ServerHandshake::start().unwrap();
        assert_eq!(first.len(), CHALLENGE_LEN);
        // The client's answer, computed by the real client over memory: it stops when the
        // verdict it then reads is missing.
        let mut wire = Wire { from_server: first, to_server: Vec::new() };
        assert!(auth::connect(&mut wire, &secret, AUTH_CONTEXT).is_err());
        let answer = wire.to_server.clone();
        assert_eq!(answer.len(), ANSWER_LEN);
        // One byte at a time: nothing to send until the answer is whole.
        for b in &answer[..ANSWER_LEN - 1] {
            assert_eq!(hs.receive(&[*b], &secret), Outcome::Send(Vec::new()));
        }
        let Outcome::Send(verdict) = hs.receive(&answer[ANSWER_LEN - 1..], &secret) else { panic!() };
        assert_eq!((verdict.len(), verdict[0]), (VERDICT_LEN, 1));
        assert_eq!(hs.wants(), HELLO_LEN);
        // Extra bytes beyond the identity message are not taken.
        let mut hello = vec![7u8; HELLO_LEN];
        hello.extend_from_slice(b"frames");
        match hs.receive(&hello, &secret) {
            Outcome::Hello(h) => assert_eq!(h.as_slice(), &[7u8; HELLO_LEN][..]),
            other => panic!("{other:?}"),
        }
        assert_eq!(hs.wants(), 0);
    }

    #[test]
    fn a_wrong_proof_is_refused_and_told() {
        let (mut hs, first) = ServerHandshake::start().unwrap();
        let mut wire = Wire { from_server: first, to_server: Vec::new() };
        let _ = auth::connect(&mut wire, &Secret::from_text("wrong").unwrap(), AUTH_CONTEXT);
        match hs.receive(&wire.to_server, &Secret::from_text("right").unwrap()) {
            Outcome::Refuse(say, why) => {
                assert_eq!(say, vec![0]);
                assert!(why.contains("failed to prove"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        // Garbage: refused without a word.
        let (mut hs, _) = ServerHandshake::start().unwrap();
        match hs.receive(&[0xAB; ANSWER_LEN], &Secret::from_text("right").unwrap()) {
            Outcome::Refuse(say, why) => assert!(say.is_empty() && why.contains("magic"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
