//! The pipelined exchange over TCP, driven by the caller ([`TcpLinks::drive_exchange`], the
//! [`Link::exchange`](crate::cpu::transport::routed::Link::exchange) of TCP): one thread
//! writes its frames to `to` and reads the frames from `from`, neither direction waiting on
//! the other. Outgoing frames are written from the caller's memory, as much as the socket
//! takes at a time; incoming payloads land straight in their slots (a piece of the
//! destination, or the scratch a reduction reads), with no progress thread waking and no copy
//! through the mailbox. When neither direction can move, the caller sleeps in `poll` on the
//! two sockets, in slices, so failures reported by other ranks, aborts and the deadline are
//! seen.
//!
//! For the exchange the caller holds `to`'s writer (other senders to `to` wait for it) and
//! `from`'s incoming side, and keeps `from`'s connection disarmed; it lets each go as soon
//! as its direction is done. Frames from `from` that belong to something else go to the
//! mailbox as they come. It cannot deadlock with its peer: each frame it still has to write
//! is one the peer still has to read, and the peer reads while it has frames to receive.
//! Whatever ends the exchange leaves both streams in step: a payload begun into a slot moves
//! into a buffer of the connection's own (the rest will go to the mailbox), and a frame left
//! half-written closes the connection.

use std::os::fd::AsRawFd;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use super::connection::Conn;
use super::connection::WriteState;
use super::incoming::{Incoming, Wait};
use super::links::TcpLinks;
use super::writer::Sending;
use super::{poll_fds, remaining};
use crate::cpu::transport::frame::{self, FrameKind};
use crate::cpu::transport::routed::{Link, Polled, Want};
use crate::cpu::transport::{Header, Pieces, Stage, TransportError};

/// How long an exchange stopped by an abort or a revoke may take to finish the frame it was
/// writing (64 MiB takes tens of milliseconds over loopback) before it closes the connection.
const FINISH_FOR: Duration = Duration::from_secs(2);

/// Longest sleep in `poll` between looks at the mailbox's failure states.
const SLICE: Duration = Duration::from_millis(10);

/// Where an exchange stands.
#[derive(Default)]
struct Progress {
    /// Outgoing frames written.
    sent: usize,
    /// How far the next outgoing frame has gone, once begun.
    writing: Option<Sending>,
    /// Incoming frames taken.
    taken: usize,
}

/// Sleeps until a lane of `to` that the frame being written (`out`) still writes can take
/// bytes, or a lane `from`'s incoming side waits on (`inn`) has bytes, or `for_` passes.
/// Errors show when the sockets are next used.
fn sleep_on(to: &Conn, from: &Conn, out: Option<&Sending>, inn: Option<&Incoming>, for_: Duration) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(to.lane_count() + from.lane_count());
    if let Some(s) = out {
        let lanes = (0..to.lane_count()).filter(|&j| s.pending(j));
        fds.extend(lanes.map(|j| libc::pollfd { fd: to.lane(j).as_raw_fd(), events: libc::POLLOUT, revents: 0 }));
    }
    if let Some(inc) = inn {
        for j in (0..from.lane_count()).filter(|&j| inc.awaits(j)) {
            let fd = from.lane(j).as_raw_fd();
            match fds.iter_mut().find(|p| p.fd == fd) {
                Some(p) => p.events |= libc::POLLIN,
                None => fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 }),
            }
        }
    }
    let _ = poll_fds(&mut fds, for_);
}

impl TcpLinks {
    /// The exchange described in the module documentation.
    ///
    /// # Errors
    /// As [`Link::send_frame`](crate::cpu::transport::routed::Link::send_frame) and
    /// [`Mailbox::recv`](crate::cpu::transport::mailbox::Mailbox::recv); what
    /// `pieces.arrived` returns, as [`TransportError::Other`].
    pub(super) fn drive_exchange(
        &self,
        to: usize,
        from: usize,
        header: &Header,
        at: Option<Stage>,
        pieces: &mut dyn Pieces,
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let cto = Arc::clone(self.connect(to, deadline)?);
        let cfrom = Arc::clone(self.connect(from, deadline)?);
        for i in 0..pieces.outgoing() {
            self.check_frame_len(to, pieces.out(i).len())?;
        }
        let mut writer = Some(self.writer_of(&cto)?);
        self.start_polling(from);
        let mut incoming = Some(crate::sync::relock(&cfrom.incoming));
        let mut at_now = Progress::default();
        self.shared.mailbox.begin_wait(header.comm_id, from);
        let r = self.drive(&cto, &mut writer, &cfrom, &mut incoming, header, at, pieces, deadline, &mut at_now);
        self.shared.mailbox.end_wait(header.comm_id, from);
        if let Some(mut inc) = incoming.take() {
            if inc.reading_direct() {
                inc.abandon_direct(pieces.slot(at_now.taken), &self.shared.mailbox);
            }
            drop(inc);
            self.stop_polling(from);
        }
        if let Some(mut w) = writer.take() {
            // Stopped in the middle of a frame by an abort or a revoke, not by the socket or
            // the deadline: finish the frame, so that the stream stays in step and the live
            // peer does not read a truncated frame as this rank's death (its progress thread
            // takes the frame, for a communicator that is going away). A frame that cannot be
            // finished soon closes the connection, as a timeout does.
            let finishable = !matches!(r, Err(TransportError::Timeout { .. }));
            let finished = finishable
                && w.mid_frame
                && at_now.writing.is_some_and(|mut s| {
                    let payload = pieces.out(at_now.sent);
                    let head = frame::encode_header(FrameKind::Data, header, payload.len());
                    w.finish_frame(&cto, &head, payload, &mut s, Instant::now() + FINISH_FOR)
                });
            if w.mid_frame && !finished {
                drop(w);
                self.break_conn(
                    &cto,
                    format!("an exchange with rank {to} stopped in the middle of a frame; the connection was closed"),
                );
            }
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn drive(
        &self,
        cto: &Conn,
        writer: &mut Option<MutexGuard<'_, WriteState>>,
        cfrom: &Conn,
        incoming: &mut Option<MutexGuard<'_, Incoming>>,
        header: &Header,
        at: Option<Stage>,
        pieces: &mut dyn Pieces,
        deadline: Instant,
        p: &mut Progress,
    ) -> Result<(), TransportError> {
        let (to, from) = (cto.peer, cfrom.peer);
        let (n_out, n_in) = (pieces.outgoing(), pieces.incoming());
        loop {
            let mut moved = false;
            // Out: as much as the socket takes now.
            while let Some(w) = writer.as_mut().filter(|_| p.sent < n_out) {
                let payload = pieces.out(p.sent);
                let head = frame::encode_header(FrameKind::Data, header, payload.len());
                let sending = p.writing.get_or_insert_with(|| Sending::new(payload.len(), cto));
                let before = *sending;
                match w.write_now(cto, &head, payload, sending) {
                    Ok(true) => {
                        pieces.sent(p.sent);
                        p.sent += 1;
                        p.writing = None;
                        moved = true;
                    }
                    Ok(false) => {
                        moved |= *sending != before;
                        break;
                    }
                    Err(e) => {
                        *writer = None;
                        let detail = self.break_conn(cto, format!("sending to rank {to} over TCP failed: {e}"));
                        return Err(TransportError::PeerLost { peer: to, detail });
                    }
                }
            }
            if p.sent == n_out && writer.is_some() {
                // Other senders to `to` may go on.
                *writer = None;
            }
            // In: what has arrived.
            while let Some(inc) = incoming.as_mut().filter(|_| p.taken < n_in) {
                let mut want = Want {
                    peer: from,
                    comm_id: header.comm_id,
                    channel: header.channel,
                    at,
                    buf: pieces.slot(p.taken),
                    deadline,
                };
                match self.read_for(cfrom, inc, &mut want, Wait::Now)? {
                    Polled::Took(got) => {
                        pieces.arrived(p.taken, got).map_err(TransportError::Other)?;
                        p.taken += 1;
                        moved = true;
                    }
                    Polled::Moved => moved = true,
                    Polled::Nothing => break,
                }
            }
            if p.taken == n_in && incoming.is_some() {
                // The progress thread takes over what comes next.
                *incoming = None;
                self.stop_polling(from);
            }
            if p.sent == n_out && p.taken == n_in {
                return Ok(());
            }
            if moved {
                continue;
            }
            if let Some(reason) = self.shared.mailbox.aborted(header.comm_id) {
                return Err(TransportError::Aborted(reason));
            }
            let left = remaining(deadline);
            if left.is_zero() {
                return Err(TransportError::Timeout { peer: if p.taken < n_in { from } else { to } });
            }
            let out = writer.as_ref().map(|_| p.writing.unwrap_or_else(|| Sending::new(0, cto)));
            let inn = incoming.as_ref().map(|g| &**g);
            let waiting_in = inn.is_some();
            let mut sleep = || sleep_on(cto, cfrom, out.as_ref(), inn, left.min(SLICE));
            if waiting_in {
                pieces.wait_for_incoming(&mut sleep);
            } else {
                sleep();
            }
        }
    }
}
