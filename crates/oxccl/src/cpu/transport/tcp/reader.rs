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
///
/// With `in_background` (the callers read their sockets themselves first: the
/// [`TcpOptions::poll_for`](super::TcpOptions::poll_for) of an uncrowded host, or the
/// [`TcpOptions::yield_for`](super::TcpOptions::yield_for) of a crowded one), the thread
/// runs as `SCHED_BATCH`: woken by bytes, it does not preempt the rank's running thread,
/// and runs once that thread sleeps (in a wait that outlasted its poll) or at its next
/// time slice. Ranks bound to one CPU each otherwise paid two context switches whenever
/// a peer's frame came between two operations, when the reader is armed: 2 ranks over
/// loopback TCP, 8-byte recursive-doubling all_reduce 10-12 µs, against 4.1-4.3 as batch.
/// On a crowded host the frames of the next round come while the rank still finishes
/// this one: 4 ranks on 2 CPUs, 8-byte recursive doubling 58 µs with readers of the normal
/// class, 28 as batch; 8 ranks, all_gather 161 -> 105.
pub(super) fn spawn_reader(
    me: usize,
    conn: Arc<Conn>,
    mailbox: Arc<Mailbox>,
    max_frame: usize,
    closing: Arc<AtomicBool>,
    in_background: bool,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("oxccl-tcp{me}<{}", conn.peer)).spawn(move || {
        if in_background {
            run_in_background();
        }
        read_until_the_end(me, &conn, &mailbox, max_frame, &closing);
    })
}

/// Makes the calling thread `SCHED_BATCH` (see [`spawn_reader`]); where the kernel refuses,
/// it stays as it was.
pub(super) fn run_in_background() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call (a
    // non-real-time policy takes priority 0).
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if r != 0 {
        tracing::debug!("the TCP reader thread stays in the normal scheduling class: {}", io::Error::last_os_error());
    }
}

/// The reader thread's loop (see [`spawn_reader`]).
fn read_until_the_end(me: usize, conn: &Conn, mailbox: &Mailbox, max_frame: usize, closing: &AtomicBool) {
    loop {
        conn.readiness.wait(LOOK_EVERY);
        let mut incoming = crate::sync::relock(&conn.incoming);
        if incoming.ended {
            return;
        }
        let mut lanes = LaneSockets::new(&conn.lanes);
        let r = incoming.pump(&mut Socket(&conn.sock), &mut lanes, conn.peer, mailbox, max_frame, None, Wait::Forever);
        if let Err(end) = r {
            report_end(me, conn, end, mailbox, closing.load(Ordering::Acquire));
            return;
        }
        drop(incoming);
        // Pairs with the callers' count (see `Conn::pollers`): the last caller to stop
        // re-arms too, so whichever of us looks last leaves the reader armed.
        if conn.pollers.load(Ordering::SeqCst) == 0 {
            conn.readiness.arm();
        }
    }
}
