//! Point-to-point on NCCL: envelopes, the queue of batches not yet issued, early messages,
//! and issuing everything queued together.
//!
//! NCCL matches a send with the receive that peer posts in the same order, needs the
//! receive's exact count, and runs calls on one stream in order, so a receive queued before
//! the send it depends on (rank 0 `irecv(1); send(1)`, rank 1 the same) would hang both
//! streams. oxccl's `recv` takes any message up to the buffer's length, matches by tag, and
//! asynchronous sends and receives may come in any order, so:
//!
//! - every send posts an envelope (tag, dtype, count) on the host side when it is submitted;
//! - asynchronous batches wait in a queue; a blocking batch, a collective, a split, a probe
//!   or a wait on a queued batch flushes the queue, and everything queued is issued as
//!   **one** NCCL group, which cannot deadlock against itself;
//! - a receive takes its peer's envelopes in order (the order NCCL delivers in) until one
//!   has its tag; messages with other tags it passes are received into device temporaries
//!   (the *stash*, per peer) in the same group, and a later receive or probe for their tag
//!   finds them there (a device-to-device copy after the group). This is how MPI buffers
//!   unexpected messages, here on the device.
//!
//! The group runs on the communicator's own stream, after the work queued on every caller
//! stream the batches name; a batch asked to run *on* a caller's stream makes that stream
//! wait for the group's completion event instead, so later work there still sees the data.
//!
//! A message whose dtype differs from the receive's, or that is longer than the buffer, is
//! a `Mismatch` for that receive (and poisons the communicator, as on the host backends);
//! the message is still received (into a temporary, dropped) so the sender's calls match. Every send of a batch is issued whatever happens to
//! its receives: its envelope is already out.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::issue::Transfer;
use super::pending::{DeviceTemp, Issued, Ticket};
use super::stage::Staged;
use super::{Inner, Order};
use crate::backend::{MessageInfo, P2p, StreamOrder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::xccl::host_side::Envelope;
use crate::xccl::runtime::{CopyKind, RawStream};

/// A batch waiting to be issued.
pub(crate) struct Queued {
    /// The sends and receives.
    pub(crate) ops: Vec<P2p>,
    /// Where its issue lands.
    pub(crate) ticket: Arc<Ticket>,
    /// Its deadline (for the envelopes it waits for).
    pub(crate) deadline: Instant,
    /// How it is ordered with the caller's stream.
    pub(crate) order: Option<StreamOrder>,
    /// Its host buffers' device copies (`OXCCL_GPU_HOST_BUFFERS=stage`).
    pub(crate) staged: Option<Staged>,
    /// Its number among this rank's batches.
    pub(crate) seq: u64,
}

/// A message received ahead of the receive that wants it. Its device memory is a raw
/// address (not a [`DeviceTemp`], which would keep the engine alive from inside itself):
/// the consuming receive turns it into one; the engine frees what is left when dropped.
pub(crate) struct Stashed {
    tag: u32,
    dtype: DType,
    count: usize,
    /// Device memory holding the message (at least one byte).
    pub(crate) ptr: u64,
}

/// The stash: early messages per peer, oldest first.
pub(crate) type Stash = Vec<VecDeque<Stashed>>;

/// A copy from a stashed message into a receive buffer, after the group.
#[derive(Clone, Copy)]
struct Copy {
    dst: *mut u8,
    src: u64,
    bytes: usize,
}

/// A batch whose receives know their counts.
struct Settled {
    ticket: Arc<Ticket>,
    order: Option<StreamOrder>,
    transfers: Vec<Transfer>,
    copies: Vec<Copy>,
    received: Vec<usize>,
    /// (count, element size) of each receive, for copying staged messages back.
    elems: Vec<(usize, usize)>,
    temps: Vec<DeviceTemp>,
    error: Option<Error>,
    staged: Option<Staged>,
}

/// The envelopes of a batch's sends, to post before anything else happens.
pub(crate) fn envelopes(ops: &[P2p]) -> Vec<(usize, Envelope)> {
    ops.iter()
        .filter_map(|p| match p {
            P2p::Send { buf, peer, tag } => Some((*peer, Envelope { tag: *tag, dtype: buf.dtype, count: buf.count })),
            P2p::Recv { .. } | P2p::RecvAny { .. } => None,
        })
        .collect()
}

/// [`Error::Mismatch`] when a message of `count` elements of `theirs` cannot land in this
/// receive (`dtype`, `capacity` elements, batch number `seq`): another dtype, or too long.
fn unfit(peer: usize, seq: u64, theirs: DType, count: usize, dtype: DType, capacity: usize) -> Option<Error> {
    (theirs != dtype || count > capacity).then(|| Error::Mismatch {
        peer,
        ours: Fingerprint::of_p2p(OpKind::Recv, seq, dtype, capacity),
        theirs: Fingerprint::of_p2p(OpKind::Send, seq, theirs, count),
    })
}

impl Inner {
    /// Receives `env` from `peer` into a new stash entry (its transfer joins `transfers`).
    fn stash_next(&self, stash: &mut Stash, transfers: &mut Vec<Transfer>, peer: usize, env: Envelope) -> Result<()> {
        let ptr = self.rt.alloc(self.device, (env.count * env.dtype.size()).max(1))?;
        transfers.push(Transfer::Recv { ptr: ptr as *mut u8, count: env.count, dtype: env.dtype, peer });
        if let Some(q) = stash.get_mut(peer) {
            q.push_back(Stashed { tag: env.tag, dtype: env.dtype, count: env.count, ptr });
        }
        Ok(())
    }

    /// Settles the receives of one batch (see the module documentation).
    fn settle(self: &Arc<Self>, stash: &mut Stash, q: Queued) -> Settled {
        let mut s = Settled {
            ticket: q.ticket,
            order: q.order,
            transfers: Vec::with_capacity(q.ops.len()),
            copies: Vec::new(),
            received: Vec::new(),
            elems: Vec::new(),
            temps: Vec::new(),
            error: None,
            staged: q.staged,
        };
        for p in &q.ops {
            let (buf, peer, tag) = match *p {
                P2p::Send { buf, peer, .. } => {
                    s.transfers.push(Transfer::Send { ptr: buf.ptr, count: buf.count, dtype: buf.dtype, peer });
                    continue;
                }
                P2p::Recv { buf, peer, tag } => (buf, peer, tag),
                P2p::RecvAny { .. } => {
                    s.error.get_or_insert_with(|| Error::Internal("a receive from any source reached NCCL".into()));
                    s.received.push(0);
                    s.elems.push((0, 1));
                    continue;
                }
            };
            let mut got = 0;
            if s.error.is_none() {
                match self.receive(stash, &mut s, (peer, tag, q.seq), buf.ptr, buf.count, buf.dtype, q.deadline) {
                    Ok(n) => got = n,
                    Err(e) => s.error = Some(e),
                }
            }
            s.received.push(got);
            s.elems.push((got, buf.dtype.size()));
        }
        s
    }

    /// One receive: from the stash, or from the next envelopes (stashing those with other
    /// tags). Returns the element count received.
    #[allow(clippy::too_many_arguments)]
    fn receive(
        self: &Arc<Self>,
        stash: &mut Stash,
        s: &mut Settled,
        (peer, tag, seq): (usize, u32, u64),
        ptr: *mut u8,
        capacity: usize,
        dtype: DType,
        deadline: Instant,
    ) -> Result<usize> {
        let q = stash.get_mut(peer).ok_or_else(|| Error::Internal(format!("no stash for rank {peer}")))?;
        if let Some(at) = q.iter().position(|m| m.tag == tag) {
            let m = q.remove(at).ok_or_else(|| Error::Internal("a stashed message vanished".into()))?;
            // The message is consumed either way; its memory lives until this batch is done.
            s.temps.push(DeviceTemp { inner: Arc::clone(self), ptr: m.ptr });
            if let Some(e) = unfit(peer, seq, m.dtype, m.count, dtype, capacity) {
                return Err(e);
            }
            s.copies.push(Copy { dst: ptr, src: m.ptr, bytes: m.count * dtype.size() });
            return Ok(m.count);
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let env = self.host.next_envelope(peer, left)?;
            if env.tag != tag {
                self.stash_next(stash, &mut s.transfers, peer, env)?;
                continue;
            }
            if let Some(e) = unfit(peer, seq, env.dtype, env.count, dtype, capacity) {
                // Received and dropped, so the sender's calls still match.
                let t = self.temp((env.count * env.dtype.size()).max(1))?;
                s.transfers.push(Transfer::Recv { ptr: t.ptr as *mut u8, count: env.count, dtype: env.dtype, peer });
                s.temps.push(t);
                return Err(e);
            }
            s.transfers.push(Transfer::Recv { ptr, count: env.count, dtype, peer });
            return Ok(env.count);
        }
    }

    /// Issues everything queued as one group (see the module documentation).
    ///
    /// # Errors
    /// Issuing the group failed (also given to every batch); the communicator is poisoned.
    pub(crate) fn flush(self: &Arc<Self>, order: &mut Order) -> Result<()> {
        if order.queue.is_empty() {
            return Ok(());
        }
        let queue = std::mem::take(&mut order.queue);
        let settled: Vec<Settled> = queue.into_iter().map(|q| self.settle(&mut order.stash, q)).collect();
        self.issue_settled(settled)
    }

    /// Issues settled batches as one group, with their stash copies and staged copies after
    /// it, and hands each its issue.
    fn issue_settled(self: &Arc<Self>, settled: Vec<Settled>) -> Result<()> {
        let transfers: Vec<Transfer> = settled.iter().flat_map(|s| s.transfers.iter().copied()).collect();
        let orders: Vec<Option<StreamOrder>> = settled.iter().map(|s| s.order).collect();
        let deadline = Instant::now() + self.timeout;
        let mut after = |stream: RawStream| -> Result<()> {
            for c in settled.iter().flat_map(|s| s.copies.iter()).filter(|c| c.bytes > 0) {
                // SAFETY: from a stashed message (device memory kept with the batch) into a
                // receive buffer (device memory valid until the batch completes: the
                // submitter's contract), `bytes` within both (checked by `unfit`).
                unsafe { self.rt.copy_async(c.dst as u64, c.src, c.bytes, CopyKind::DeviceToDevice, stream)? };
            }
            settled.iter().filter_map(|s| s.staged.as_ref().map(|st| (st, &s.elems))).try_for_each(|(st, elems)| {
                // SAFETY: the staged batch's host ranges stay valid until completion.
                unsafe { st.copy_out(self, stream, elems) }
            })
        };
        // SAFETY: every pointer is a buffer of a submitted batch (valid until its Pending
        // reports completion, the submitter's contract), a temporary kept with its batch, or
        // a stash entry (freed only after a later batch that copies it out completes, or
        // with the engine).
        let event = unsafe { self.issue_group(&transfers, &orders, deadline, &mut after) };
        match event {
            Ok(event) => {
                for s in settled {
                    let mut temps = s.temps;
                    temps.extend(s.staged.map(|st| st.temps).unwrap_or_default());
                    s.ticket.set(Ok(Issued { event: Arc::clone(&event), received: s.received, temps, error: s.error }));
                }
                Ok(())
            }
            Err(e) => {
                for s in &settled {
                    s.ticket.set(Err(e.clone()));
                }
                Err(e)
            }
        }
    }

    /// The first message from `peer` with `tag` not yet received, if it has arrived: in the
    /// stash, or among the envelopes that arrived (those with other tags before it are
    /// received into the stash on the way).
    ///
    /// # Errors
    /// The host side's errors; issuing a stash receive failed.
    pub(crate) fn probe_message(self: &Arc<Self>, peer: usize, tag: u32) -> Result<Option<MessageInfo>> {
        let mut order = super::relock(&self.order);
        self.flush(&mut order)?;
        loop {
            let q = order.stash.get(peer).ok_or_else(|| Error::invalid(format!("rank {peer} is out of range")))?;
            if let Some(m) = q.iter().find(|m| m.tag == tag) {
                return Ok(Some(MessageInfo { source: peer, tag, dtype: m.dtype, count: m.count }));
            }
            let Some(env) = self.host.peek(peer, self.timeout)? else { return Ok(None) };
            if env.tag == tag {
                return Ok(Some(MessageInfo { source: peer, tag, dtype: env.dtype, count: env.count }));
            }
            let env = self.host.next_envelope(peer, self.timeout)?;
            let mut transfers = Vec::new();
            self.stash_next(&mut order.stash, &mut transfers, peer, env)?;
            // SAFETY: the one receive lands in a fresh stash entry, freed only after a later
            // batch copies it out or with the engine.
            unsafe { self.issue_group(&transfers, &[None], Instant::now() + self.timeout, &mut |_| Ok(()))? };
        }
    }
}
