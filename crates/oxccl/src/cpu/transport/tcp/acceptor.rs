//! The accepting side of connection setup: [`Acceptor`] takes the lower peers' connections
//! on a thread of its own and runs each one's handshake on a thread of its own, so that a
//! silent or hostile client cannot hold the others up.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::handshake::{serve, Ident};
use super::remaining;
use crate::bootstrap::auth::Secret;
use crate::error::{Error, Result};

/// Longest wait for a client's handshake messages once its connection is accepted.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const ACCEPT_POLL: Duration = Duration::from_millis(2);
const MAX_REJECTIONS_KEPT: usize = 8;

/// A connection being accepted (its handshake runs on `thread`).
struct Handshake {
    id: u64,
    sock: TcpStream,
    thread: JoinHandle<()>,
}

/// What a handshake thread reports.
struct Arrival {
    id: u64,
    from: SocketAddr,
    /// The client's rank, the connection's lane, the connection.
    result: std::result::Result<(usize, usize, TcpStream), String>,
}

/// Accepts the lower peers' connections on a thread while the rank dials the higher ones.
/// Dropping it stops accepting and closes every connection it did not hand out.
pub(super) struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Handshake>>>,
    rx: mpsc::Receiver<Arrival>,
    claimed: HashSet<u64>,
}

impl Acceptor {
    pub(super) fn start(
        listener: TcpListener,
        secret: &Secret,
        me: Ident,
        expected: HashSet<usize>,
        deadline: Instant,
    ) -> Result<Acceptor> {
        listener.set_nonblocking(true).map_err(|e| Error::io("preparing the TCP transport's listening socket", &e))?;
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let secret = Arc::new(secret.clone());
        let expected = Arc::new(expected);
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-tcp{}-acc", me.me))
            .spawn(move || accept_loop(&listener, &secret, me, &expected, deadline, &tx, &flag))
            .map_err(|e| Error::io("starting the TCP transport's accept thread", &e))?;
        Ok(Acceptor { stop, thread: Some(thread), rx, claimed: HashSet::new() })
    }

    /// Waits until every rank in `expected` has opened its `lanes` connections; each
    /// rank's connections in lane order.
    pub(super) fn collect(
        &mut self,
        me: usize,
        expected: &HashSet<usize>,
        lanes: usize,
        addr: SocketAddr,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Vec<(usize, Vec<TcpStream>)>> {
        let mut got: HashMap<(usize, usize), TcpStream> = HashMap::new();
        let mut refused: Vec<String> = Vec::new();
        let mut refused_count = 0usize;
        while got.len() < expected.len() * lanes {
            let left = remaining(deadline);
            let arrival = if left.is_zero() {
                None
            } else {
                match self.rx.recv_timeout(left) {
                    Ok(a) => Some(a),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(Error::Internal("the TCP accept thread ended early".into()));
                    }
                }
            };
            let Some(Arrival { id, from, result }) = arrival else {
                let mut missing: Vec<usize> =
                    expected.iter().copied().filter(|&p| (0..lanes).any(|l| !got.contains_key(&(p, l)))).collect();
                missing.sort_unstable();
                let mut message = format!("rank(s) {missing:?} did not connect within {timeout:?}");
                if refused_count > 0 {
                    message.push_str(&format!(
                        "; {refused_count} connection(s) were refused: {}{}",
                        refused.join("; "),
                        if refused_count > refused.len() { "; ..." } else { "" }
                    ));
                }
                return Err(Error::Io {
                    context: format!("waiting for TCP connections to rank {me} (listening on {addr})"),
                    kind: io::ErrorKind::TimedOut,
                    message,
                });
            };
            let problem = match result {
                Ok((peer, lane, stream)) if !got.contains_key(&(peer, lane)) => {
                    self.claimed.insert(id);
                    got.insert((peer, lane), stream);
                    None
                }
                Ok((peer, lane, _)) => Some(format!("a second connection {lane} claiming to be rank {peer}")),
                Err(why) => Some(why),
            };
            if let Some(p) = problem {
                refused_count += 1;
                if refused.len() < MAX_REJECTIONS_KEPT {
                    refused.push(format!("from {from}: {p}"));
                }
            }
        }
        let mut peers: Vec<usize> = expected.iter().copied().collect();
        peers.sort_unstable();
        Ok(peers.into_iter().map(|p| (p, (0..lanes).filter_map(|l| got.remove(&(p, l))).collect())).collect())
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let pending = self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default();
        // Connections still in their handshake were not handed out: close them, which also
        // ends their threads promptly.
        for h in pending.iter().filter(|h| !self.claimed.contains(&h.id)) {
            let _ = h.sock.shutdown(Shutdown::Both);
        }
        for h in pending {
            let _ = h.thread.join();
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    secret: &Arc<Secret>,
    me: Ident,
    expected: &Arc<HashSet<usize>>,
    deadline: Instant,
    tx: &mpsc::Sender<Arrival>,
    stop: &AtomicBool,
) -> Vec<Handshake> {
    let mut pending: Vec<Handshake> = Vec::new();
    let mut next_id = 0u64;
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((sock, from)) => {
                next_id += 1;
                let id = next_id;
                match start_handshake(id, sock, from, secret, me, expected, deadline, tx) {
                    Ok(h) => pending.push(h),
                    Err(why) => {
                        let _ = tx.send(Arrival { id, from, result: Err(why) });
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // WouldBlock: nothing to accept yet; anything else (out of descriptors, a
            // connection reset before it was accepted) is worth another try.
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
        pending.retain(|h| !h.thread.is_finished());
    }
    pending
}

#[allow(clippy::too_many_arguments)]
fn start_handshake(
    id: u64,
    mut sock: TcpStream,
    from: SocketAddr,
    secret: &Arc<Secret>,
    me: Ident,
    expected: &Arc<HashSet<usize>>,
    deadline: Instant,
    tx: &mpsc::Sender<Arrival>,
) -> std::result::Result<Handshake, String> {
    let limit = remaining(deadline).min(HANDSHAKE_TIMEOUT).max(Duration::from_millis(1));
    let prepared = sock
        .set_nonblocking(false)
        .and_then(|()| sock.set_read_timeout(Some(limit)))
        .and_then(|()| sock.set_write_timeout(Some(limit)))
        .and_then(|()| sock.set_nodelay(true))
        .and_then(|()| sock.try_clone());
    let clone = prepared.map_err(|e| format!("could not prepare the connection: {e}"))?;
    let (secret, expected, tx) = (Arc::clone(secret), Arc::clone(expected), tx.clone());
    let thread = std::thread::Builder::new()
        .name(format!("oxccl-tcp{}-hs", me.me))
        .spawn(move || {
            let result = serve(&mut sock, &secret, &me, &expected).map(|(peer, lane)| (peer, lane, sock));
            let _ = tx.send(Arrival { id, from, result });
        })
        .map_err(|e| format!("could not start a handshake thread: {e}"))?;
    Ok(Handshake { id, sock: clone, thread })
}
