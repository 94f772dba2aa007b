//! The receive side of one rank's shared-memory links ([`super::links`]): its incoming
//! rings, where each one's stream of frames is, and the moves out of them. Whoever holds
//! the rings' lock reads them: the links' progress thread, or a caller waiting for a frame.
//! [`Inbox::pump_all`] moves every complete frame into the mailbox; [`Inbox::take_direct`]
//! reads the frame a polling caller waits for straight into its buffer.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use super::futex;
use super::ring::Ring;
use crate::cpu::transport::frame::{decode_header, FrameHeader, FrameKind, HEADER_LEN};
use crate::cpu::transport::mailbox::Mailbox;
use crate::cpu::transport::routed::Want;
use crate::cpu::transport::Received;

/// The receive side of one rank's links: its incoming rings and where their frames go.
/// Whoever holds `incoming` reads: the progress thread, or a caller waiting for a frame
/// ([`Link::poll`]), which then needs no wake-up from the progress thread.
pub(super) struct Inbox {
    /// The rings from each other local rank, with where each one's stream is.
    pub(super) incoming: Mutex<Vec<Incoming>>,
    /// The largest frame accepted.
    pub(super) max_frame: usize,
    /// Where frames go.
    pub(super) mailbox: Arc<Mailbox>,
}

impl Inbox {
    /// The incoming rings, unless someone (the progress thread) is reading them.
    pub(super) fn try_rings(&self) -> Option<MutexGuard<'_, Vec<Incoming>>> {
        match self.incoming.try_lock() {
            Ok(incoming) => Some(incoming),
            // Every update of the rings' state is a whole step: still consistent.
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The frame `want` waits for, read straight from its sender's ring into `want.buf`,
    /// when it is next in that ring, whole, and nothing is queued in the mailbox (which
    /// could hold an earlier frame from the same sender: with the rings' lock held, nothing
    /// else reaches the mailbox from them, so order holds). Saves the mailbox's lock, a
    /// payload buffer and a copy per frame; anything else is left to [`Inbox::pump_all`].
    pub(super) fn take_direct(&self, incoming: &mut [Incoming], want: &mut Want<'_>) -> Option<Received> {
        let inc = incoming.iter_mut().find(|i| i.rank == want.peer)?;
        if !matches!(inc.state, Reading::Header { have: 0, .. }) || !self.mailbox.nothing_queued() {
            return None;
        }
        let ring = inc.ring;
        let mut hdr = [0u8; HEADER_LEN];
        if !ring.peek(&mut hdr) {
            return None;
        }
        // A header that does not decode is left to `pump_all`, which reports it.
        let frame = decode_header(&hdr, self.max_frame).ok()?;
        let len = frame.payload_len;
        let wanted = frame.kind == FrameKind::Data
            && frame.header.comm_id == want.comm_id
            && frame.header.channel == want.channel
            && len <= want.buf.len();
        if !wanted || ring.readable() < HEADER_LEN + len {
            return None;
        }
        ring.skip(HEADER_LEN);
        let read = ring.read(&mut want.buf[..len]);
        debug_assert_eq!(read, len, "the whole payload was readable");
        wake_space_waiters(ring);
        Some(Received { header: frame.header, len })
    }

    /// Reads every incoming ring into the mailbox and wakes senders waiting for space;
    /// returns whether anything was consumed.
    pub(super) fn pump_all(&self, incoming: &mut [Incoming]) -> bool {
        let mut progressed = false;
        for inc in incoming {
            if pump(inc, self.max_frame, &self.mailbox) {
                progressed = true;
                wake_space_waiters(inc.ring);
            }
        }
        progressed
    }
}

/// Where the progress thread is in one incoming ring's stream.
pub(super) enum Reading {
    Header {
        buf: [u8; HEADER_LEN],
        have: usize,
    },
    /// The payload so far (`buf.len()` bytes of `frame.payload_len`).
    Payload {
        frame: FrameHeader,
        buf: Vec<u8>,
    },
    /// The stream is unusable (malformed frame or dead peer).
    Dead,
}

/// One incoming ring: its sender and where its stream is.
pub(super) struct Incoming {
    pub(super) ring: Ring,
    /// The sender's local index.
    pub(super) local: usize,
    /// The sender's transport rank.
    pub(super) rank: usize,
    pub(super) state: Reading,
}

fn deliver(mailbox: &Mailbox, src: usize, frame: FrameHeader, payload: Vec<u8>) {
    if let Err(e) = mailbox.accept(src, frame, payload) {
        mailbox.lose(src, &e.to_string());
    }
}

/// Reads what `inc`'s ring holds; returns whether anything was consumed.
fn pump(inc: &mut Incoming, max_frame: usize, mailbox: &Mailbox) -> bool {
    let mut any = false;
    loop {
        let n = match &mut inc.state {
            Reading::Dead => return any,
            Reading::Header { buf, have } => {
                let n = inc.ring.read(&mut buf[*have..]);
                *have += n;
                if *have == HEADER_LEN {
                    inc.state = match decode_header(buf, max_frame) {
                        Ok(frame) => {
                            // A buffer the mailbox got back from an earlier frame: no fresh
                            // allocation (and its page faults) per frame; filled from the
                            // ring without zeroing it first.
                            let buf = mailbox.spare_buffer(frame.payload_len);
                            Reading::Payload { frame, buf }
                        }
                        Err(e) => {
                            mailbox.lose(inc.rank, &e.to_string());
                            Reading::Dead
                        }
                    };
                }
                n
            }
            Reading::Payload { frame, buf } => inc.ring.read_append(buf, frame.payload_len - buf.len()),
        };
        if let Reading::Payload { frame, buf } = &mut inc.state {
            if buf.len() == frame.payload_len {
                let (frame, payload) = (*frame, std::mem::take(buf));
                inc.state = Reading::Header { buf: [0; HEADER_LEN], have: 0 };
                deliver(mailbox, inc.rank, frame, payload);
                any = true;
                continue;
            }
        }
        if n == 0 {
            return any;
        }
        any = true;
    }
}

/// Wakes the sender of `ring` if it sleeps until the consumer makes room (after a read).
fn wake_space_waiters(ring: Ring) {
    // A plain look first: `futex::ring`'s fence costs more, and nobody sleeps as a rule.
    if ring.space_sleepers().load(Ordering::SeqCst) != 0 {
        futex::ring(ring.space_bell(), ring.space_sleepers());
    }
}
