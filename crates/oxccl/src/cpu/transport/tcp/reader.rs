//! The connection's reader thread ([`spawn_reader`]): it sleeps until its socket has bytes
//! ([`Readiness`](super::readiness::Readiness)), decodes what arrived into the rank's
//! mailbox ([`Incoming::pump`]), and loses the peer when the stream ends ([`report_end`],
//! which a receiving caller that finds the end uses too).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::connection::Conn;
use super::incoming::{End, LaneSockets, Socket, Wait};
use crate::cpu::transport::mailbox::Mailbox;

/// How often a sleeping reader looks at its socket even without a wake-up (a safety net; it
/// is woken whenever bytes arrive while no caller reads).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Records how `conn`'s stream ended: the connection is unusable (a malformed frame also
/// closes it), and the peer is lost for every communicator, with what was observed (or, when
/// this rank is `closing`, that it shut its connections down). Returns the detail recorded.
pub(super) fn report_end(me: usize, conn: &Conn, end: End, mailbox: &Mailbox, closing: bool) -> String {
    let peer = conn.peer;
    if matches!(end, End::Malformed(_)) {
        conn.shutdown();
    }
    let detail = if closing {
        format!("rank {me} shut its TCP connections down")
    } else {
        match end {
            End::Closed => {
                format!("the TCP connection to rank {peer} closed (its process ended, or it shut its connections down)")
            }
            End::Truncated => format!("the TCP connection to rank {peer} closed in the middle of a frame"),
            End::Failed(e) => format!("reading from rank {peer} over TCP failed: {e}"),
            End::Malformed(m) => format!("rank {peer} sent {m}; the connection was closed"),
        }
    };
    let detail = conn.gone.get_or_init(|| detail).clone();
    mailbox.lose(peer, &detail);
    // Let the reader thread see the end too, if a caller found it.
    conn.readiness.arm();
    detail
}

/// Starts `conn`'s reader thread: it reads whenever bytes arrive and no caller is reading
/// (a payload already begun is read to its end before it lets go), and ends with the stream.
pub(super) fn spawn_reader(
    me: usize,
    conn: Arc<Conn>,
    mailbox: Arc<Mailbox>,
    max_frame: usize,
    closing: Arc<AtomicBool>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("oxccl-tcp{me}<{}", conn.peer)).spawn(move || loop {
        conn.readiness.wait(LOOK_EVERY);
        let mut incoming = crate::sync::relock(&conn.incoming);
        if incoming.ended {
            return;
        }
        let mut lanes = LaneSockets::new(&conn.lanes);
        let r = incoming.pump(&mut Socket(&conn.sock), &mut lanes, conn.peer, &mailbox, max_frame, None, Wait::Forever);
        if let Err(end) = r {
            report_end(me, &conn, end, &mailbox, closing.load(Ordering::Acquire));
            return;
        }
        drop(incoming);
        // Pairs with the callers' count (see `Conn::pollers`): the last caller to stop
        // re-arms too, so whichever of us looks last leaves the reader armed.
        if conn.pollers.load(Ordering::SeqCst) == 0 {
            conn.readiness.arm();
        }
    })
}
