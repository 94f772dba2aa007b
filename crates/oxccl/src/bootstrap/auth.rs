//! The job secret and the handshake that proves knowledge of it without sending it.
//!
//! Every connection (to the store, between TCP transport endpoints) starts with a mutual
//! challenge-response: each side sends a fresh random nonce and answers the other's with
//! HMAC-SHA256(key, role ‖ context ‖ nonces). The secret never crosses the wire, a recorded
//! handshake cannot be replayed (fresh nonces), and a proof for one context (the store, a
//! transport) is useless for another.
//!
//! ```text
//! server -> client  "OXAUTH1\0" nonce_s[32]
//! client -> server  "OXAUTH1\0" nonce_c[32] mac("client", ctx, nonce_s, nonce_c)[32]
//! server -> client  1 mac("server", ctx, nonce_c, nonce_s)[32]     (or 0: refused)
//! ```

use std::fmt;
use std::io::{Read, Write};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::Error;

type HmacSha256 = Hmac<Sha256>;

const MAGIC: [u8; 8] = *b"OXAUTH1\0";
const NONCE: usize = 32;
const MAC: usize = 32;

/// The environment variable that carries the job secret.
pub const SECRET_ENV: &str = crate::config::registry::SECRET.name;

/// A job's shared secret (the key derived from `OXCCL_SECRET`). Its `Debug` form hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: [u8; 32],
    text: String,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret from its text form (any non-empty string; launchers generate 64 hex digits).
    ///
    /// # Errors
    /// [`Error::Config`] for an empty string.
    pub fn from_text(text: &str) -> Result<Secret, Error> {
        if text.is_empty() {
            return Err(Error::Config(format!("{SECRET_ENV} is empty; set it to the job's secret or unset it")));
        }
        let mut h = Sha256::new();
        h.update(b"oxccl-secret-v1\0");
        h.update(text.as_bytes());
        Ok(Secret { key: h.finalize().into(), text: text.to_string() })
    }

    /// A new random secret (256 bits from the operating system).
    ///
    /// # Errors
    /// [`Error::Io`] when the system's random source fails.
    pub fn generate() -> Result<Secret, Error> {
        let mut raw = [0u8; 32];
        getrandom::getrandom(&mut raw).map_err(|e| Error::Io {
            context: "generating the job secret".into(),
            kind: std::io::ErrorKind::Other,
            message: e.to_string(),
        })?;
        let text: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Secret::from_text(&text)
    }

    /// The secret in `OXCCL_SECRET`, if set (read by the configuration registry's rules:
    /// an empty variable is unset).
    ///
    /// # Errors
    /// [`Error::Config`] when the value cannot be used.
    pub fn from_env() -> Result<Option<Secret>, Error> {
        match crate::config::registry::SECRET.from_env()? {
            Some(v) => Secret::from_text(&v).map(Some),
            None => Ok(None),
        }
    }

    /// The text form, to hand to child processes in `OXCCL_SECRET`.
    pub fn text(&self) -> &str {
        &self.text
    }

    fn mac(&self, role: &[u8], context: &[u8], first: &[u8], second: &[u8]) -> HmacSha256 {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!());
        m.update(role);
        m.update(&(context.len() as u64).to_le_bytes());
        m.update(context);
        m.update(first);
        m.update(second);
        m
    }
}

/// Why a handshake failed.
#[derive(Debug)]
pub enum AuthError {
    /// Reading or writing the connection failed (includes timeouts).
    Io(std::io::Error),
    /// The other side does not speak this protocol.
    Protocol(String),
    /// The client's proof was wrong: it does not know this job's secret.
    ClientRefused,
    /// The server refused our proof: our secret is not the job's.
    RefusedByServer,
    /// The server's proof was wrong: it does not know this job's secret.
    ServerUnproven,
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::Io(e) => write!(f, "connection failed during authentication: {e}"),
            AuthError::Protocol(m) => write!(f, "not an oxccl peer: {m}"),
            AuthError::ClientRefused => {
                write!(f, "the client failed to prove it knows the job secret ({SECRET_ENV})")
            }
            AuthError::RefusedByServer => write!(
                f,
                "the server refused our proof: this process's {SECRET_ENV} differs from the job's \
                 (set the same {SECRET_ENV} for every rank, or let the launcher set it)"
            ),
            AuthError::ServerUnproven => write!(
                f,
                "the server could not prove it knows the job secret: it belongs to another job or is an impostor"
            ),
        }
    }
}

impl std::error::Error for AuthError {}

impl From<std::io::Error> for AuthError {
    fn from(e: std::io::Error) -> Self {
        AuthError::Io(e)
    }
}

fn nonce() -> Result<[u8; NONCE], AuthError> {
    let mut n = [0u8; NONCE];
    getrandom::getrandom(&mut n).map_err(|e| AuthError::Io(std::io::Error::other(e.to_string())))?;
    Ok(n)
}

/// The server's first message (the challenge) in bytes.
pub const CHALLENGE_LEN: usize = MAGIC.len() + NONCE;
/// The client's answer in bytes.
pub const ANSWER_LEN: usize = MAGIC.len() + NONCE + MAC;
/// The server's verdict in bytes (a refusal is its first byte alone).
pub const VERDICT_LEN: usize = 1 + MAC;

/// The server side of the handshake without I/O, for event loops that cannot block: send
/// [`Challenge::bytes`], read [`ANSWER_LEN`] bytes, give them to [`Challenge::answer`] and
/// send what it returns. [`accept`] is the same over a blocking stream.
#[derive(Debug)]
pub struct Challenge {
    ns: [u8; NONCE],
}

impl Challenge {
    /// A fresh challenge (a new nonce).
    ///
    /// # Errors
    /// [`AuthError::Io`] when the system's random source fails.
    pub fn new() -> Result<Challenge, AuthError> {
        Ok(Challenge { ns: nonce()? })
    }

    /// The message that opens the handshake.
    pub fn bytes(&self) -> [u8; CHALLENGE_LEN] {
        let mut hello = [0u8; CHALLENGE_LEN];
        hello[..MAGIC.len()].copy_from_slice(&MAGIC);
        hello[MAGIC.len()..].copy_from_slice(&self.ns);
        hello
    }

    /// Checks the client's `answer` ([`ANSWER_LEN`] bytes): `Ok` with the verdict to send
    /// (the server's own proof), or the error and what to send first, if anything (a refused
    /// client is told so with one zero byte).
    ///
    /// # Errors
    /// [`AuthError::Protocol`] for a wrong magic or length, [`AuthError::ClientRefused`] for a
    /// wrong proof.
    pub fn answer(
        &self,
        secret: &Secret,
        context: &[u8],
        answer: &[u8],
    ) -> Result<[u8; VERDICT_LEN], (AuthError, Option<u8>)> {
        if answer.len() != ANSWER_LEN || answer[..MAGIC.len()] != MAGIC {
            return Err((AuthError::Protocol("bad handshake magic".into()), None));
        }
        let nc = &answer[MAGIC.len()..MAGIC.len() + NONCE];
        let proof = &answer[MAGIC.len() + NONCE..];
        if secret.mac(b"client", context, &self.ns, nc).verify_slice(proof).is_err() {
            return Err((AuthError::ClientRefused, Some(0)));
        }
        let mut reply = [0u8; VERDICT_LEN];
        reply[0] = 1;
        reply[1..].copy_from_slice(&secret.mac(b"server", context, nc, &self.ns).finalize().into_bytes());
        Ok(reply)
    }
}

/// Server side of the handshake: challenges the client, checks its proof, proves itself.
///
/// # Errors
/// [`AuthError::ClientRefused`] when the client's proof is wrong (the client is told);
/// I/O and protocol errors.
pub fn accept<S: Read + Write>(stream: &mut S, secret: &Secret, context: &[u8]) -> Result<(), AuthError> {
    let challenge = Challenge::new()?;
    stream.write_all(&challenge.bytes())?;
    stream.flush()?;
    let mut answer = [0u8; ANSWER_LEN];
    stream.read_exact(&mut answer)?;
    match challenge.answer(secret, context, &answer) {
        Ok(reply) => {
            stream.write_all(&reply)?;
            stream.flush()?;
            Ok(())
        }
        Err((e, say)) => {
            if let Some(b) = say {
                let _ = stream.write_all(&[b]);
            }
            Err(e)
        }
    }
}

/// Client side of the handshake: answers the server's challenge and checks its proof.
///
/// # Errors
/// [`AuthError::RefusedByServer`] or [`AuthError::ServerUnproven`] when the secrets differ;
/// I/O and protocol errors.
pub fn connect<S: Read + Write>(stream: &mut S, secret: &Secret, context: &[u8]) -> Result<(), AuthError> {
    let mut hello = [0u8; MAGIC.len() + NONCE];
    stream.read_exact(&mut hello)?;
    if hello[..MAGIC.len()] != MAGIC {
        return Err(AuthError::Protocol("bad handshake magic".into()));
    }
    let ns = &hello[MAGIC.len()..];
    let nc = nonce()?;
    let mut answer = [0u8; MAGIC.len() + NONCE + MAC];
    answer[..MAGIC.len()].copy_from_slice(&MAGIC);
    answer[MAGIC.len()..MAGIC.len() + NONCE].copy_from_slice(&nc);
    answer[MAGIC.len() + NONCE..].copy_from_slice(&secret.mac(b"client", context, ns, &nc).finalize().into_bytes());
    stream.write_all(&answer)?;
    stream.flush()?;
    let mut verdict = [0u8; 1];
    stream.read_exact(&mut verdict)?;
    if verdict[0] != 1 {
        return Err(AuthError::RefusedByServer);
    }
    let mut proof = [0u8; MAC];
    stream.read_exact(&mut proof)?;
    if secret.mac(b"server", context, &nc, ns).verify_slice(&proof).is_err() {
        return Err(AuthError::ServerUnproven);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair(server: Secret, client: Secret, sctx: &'static [u8], cctx: &'static [u8]) -> (String, String) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            match accept(&mut s, &server, sctx) {
                Ok(()) => "ok".to_string(),
                Err(e) => e.to_string(),
            }
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let cr = match connect(&mut c, &client, cctx) {
            Ok(()) => "ok".to_string(),
            Err(e) => e.to_string(),
        };
        (t.join().unwrap(), cr)
    }

    #[test]
    fn same_secret_passes_both_ways() {
        let s = Secret::generate().unwrap();
        assert_eq!(pair(s.clone(), s, b"store", b"store"), ("ok".into(), "ok".into()));
    }

    #[test]
    fn wrong_secret_or_context_is_refused() {
        let (srv, cli) = pair(Secret::from_text("a").unwrap(), Secret::from_text("b").unwrap(), b"store", b"store");
        assert!(srv.contains("failed to prove"), "{srv}");
        assert!(cli.contains("refused our proof"), "{cli}");
        let s = Secret::from_text("same").unwrap();
        let (srv, _) = pair(s.clone(), s, b"store", b"tcp");
        assert!(srv.contains("failed to prove"), "{srv}");
    }

    #[test]
    fn secrets_do_not_leak_and_differ() {
        let a = Secret::generate().unwrap();
        let b = Secret::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.text().len(), 64);
        assert_eq!(format!("{a:?}"), "Secret(..)");
        assert!(Secret::from_text("").is_err());
    }

    /// A client over an in-memory stream: the challenge is read from `input`, the answer
    /// and what follows are written to `output`.
    struct Duplex<'a> {
        input: &'a [u8],
        output: Vec<u8>,
    }

    impl Read for Duplex<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Duplex<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.output.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_challenge_runs_without_io() {
        let s = Secret::generate().unwrap();
        let ch = Challenge::new().unwrap();
        // The client reads the challenge and a verdict it will get; answer first.
        let mut first = Duplex { input: &ch.bytes(), output: Vec::new() };
        let _ = connect(&mut first, &s, b"ctx"); // runs out of input after its answer
        assert_eq!(first.output.len(), ANSWER_LEN);
        let verdict = ch.answer(&s, b"ctx", &first.output).unwrap();
        let mut input = ch.bytes().to_vec();
        input.extend_from_slice(&verdict);
        // Replaying the same client with the verdict appended: it accepts the server's proof
        // only with its own nonce, so a fresh client fails, which shows the proof is bound.
        let mut again = Duplex { input: &input, output: Vec::new() };
        assert!(matches!(connect(&mut again, &s, b"ctx"), Err(AuthError::ServerUnproven)));
        // Wrong secret, wrong context, wrong length, wrong magic.
        let other = Secret::generate().unwrap();
        assert!(matches!(ch.answer(&other, b"ctx", &first.output), Err((AuthError::ClientRefused, Some(0)))));
        assert!(matches!(ch.answer(&s, b"other", &first.output), Err((AuthError::ClientRefused, Some(0)))));
        assert!(matches!(ch.answer(&s, b"ctx", &first.output[1..]), Err((AuthError::Protocol(_), None))));
        let mut bad = first.output.clone();
        bad[0] ^= 1;
        assert!(matches!(ch.answer(&s, b"ctx", &bad), Err((AuthError::Protocol(_), None))));
    }
}
