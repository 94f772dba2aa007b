//! Point-to-point on NCCL: envelopes, buffered sends, the queue of batches not yet issued,
//! early messages, and issuing everything queued together.
//!
//! NCCL matches a send with the receive that peer posts in the same order, needs the
//! receive's exact count, runs calls on one stream in order, and its send completes only
//! once the peer's receive runs. oxccl's `recv` takes any message up to the buffer's length,
//! matches by tag, its sends complete without waiting for the receiver (as on every other
//! backend), and asynchronous sends and receives may come in any order. So:
//!
//! - every send posts an envelope (tag, dtype, count) on the host side when it is submitted;
//! - a batch of sends only is *buffered*: its payloads are copied to device temporaries on
//!   the copy stream (which no group holds up), the batch completes when the copies have
//!   run, and the sends wait in the queue;
//! - asynchronous batches wait in the queue; a blocking batch with receives, a collective,
//!   a split, a probe that must see receives settled, or a wait on a queued batch flushes the
//!   queue, and everything queued is issued as **one** NCCL group, which cannot deadlock
//!   against itself;
//! - a flush first tells every peer it sends to that its announced messages are now issued
//!   (a `Flushed` mark after their envelopes). A receive takes its peer's envelopes in order
//!   until one has its tag, and then every further message of that issued group, up to the
//!   mark: messages with other tags are received into device temporaries (the *stash*, per
//!   peer) in the same group, and a later receive or probe for their tag finds them there (a
//!   device-to-device copy after the group). So every group of a sender is taken whole by
//!   one group of each receiver, and no group waits for a later group of its peer, which
//!   would hold both streams. This is how MPI buffers unexpected messages, here on the
//!   device;
//! - a receive that finds nothing issued yet *pulls* the sender (`progress.rs`): a sender
//!   whose thread is busy elsewhere issues its buffered sends when asked;
//! - sends to this rank itself go straight to the stash when the queue is flushed (NCCL's
//!   send to oneself completes only with its receive in the same group).
//!
//! A group runs on the communicator's own stream, after the work queued on every caller
//! stream the batches name (buffered sends wait for their copies instead); a batch asked to
//! run *on* a caller's stream makes that stream wait for the group's completion event
//! instead, so later work there still sees the data.
//!
//! What still deadlocks is what deadlocks on NCCL itself: ranks that order their sends and
//! collectives differently (a send before an all_reduce on one rank, its receive after the
//! all_reduce on the other) hold each other's streams.
//!
//! A message whose dtype differs from the receive's, or that is longer than the buffer, is
//! a `Mismatch` for that receive (and poisons the communicator, as on the host backends);
//! the message is still received (into a temporary, dropped) so the sender's calls match.
//! Every send of a batch is issued whatever happens to its receives: its envelope is
//! already out.

use std::sync::Arc;
use std::time::Instant;

use super::issue::Transfer;
use super::state::{DeviceTemp, HostCopy, Inner, Issued, Order, PooledEvent, Queued, Staged, Stash, Stashed, Ticket};
use crate::backend::{MessageInfo, P2p, StreamOrder};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::xccl::host_side::{Envelope, Notice};
use crate::xccl::runtime::{enter, CopyKind, RawStream};

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
    buffered: bool,
    ready: Option<Arc<PooledEvent>>,
    transfers: Vec<Transfer>,
    copies: Vec<Copy>,
    received: Vec<usize>,
    /// (count, element size) of each receive, for copying staged messages back.
    elems: Vec<(usize, usize)>,
    temps: Vec<DeviceTemp>,
    error: Option<Error>,
    staged: Option<Staged>,
}

/// The envelopes of a batch's sends to other ranks (`me` sends to itself through the
/// stash, see [`Inner::flush`]), to post before anything else happens.
pub(crate) fn envelopes(ops: &[P2p], me: usize) -> Vec<(usize, Envelope)> {
    ops.iter()
        .filter_map(|p| match p {
            P2p::Send { buf, peer, tag } if *peer != me => {
                Some((*peer, Envelope { tag: *tag, dtype: buf.dtype, count: buf.count }))
            }
            P2p::Send { .. } | P2p::Recv { .. } | P2p::RecvAny { .. } => None,
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
        let (ptr, class) = self.block(env.count * env.dtype.size())?;
        transfers.push(Transfer::Recv { ptr: ptr as *mut u8, count: env.count, dtype: env.dtype, peer });
        if let Some(q) = stash.get_mut(peer) {
            q.push_back(Stashed { tag: env.tag, dtype: env.dtype, count: env.count, ptr, class });
        }
        Ok(())
    }

    /// Settles the receives of one batch (see the module documentation).
    fn settle(self: &Arc<Self>, stash: &mut Stash, q: Queued) -> Settled {
        let mut s = Settled {
            ticket: q.ticket,
            order: q.order,
            buffered: q.buffered,
            ready: q.ready,
            transfers: Vec::with_capacity(q.ops.len()),
            copies: Vec::new(),
            received: Vec::new(),
            elems: Vec::new(),
            temps: q.keep,
            error: None,
            staged: q.staged,
        };
        for p in &q.ops {
            let (buf, peer, tag) = match *p {
                // Sends to this rank went to the stash (see `flush`).
                P2p::Send { peer, .. } if peer == self.rank => continue,
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
            s.temps.push(DeviceTemp { inner: Arc::clone(self), ptr: m.ptr, class: m.class });
            if let Some(e) = unfit(peer, seq, m.dtype, m.count, dtype, capacity) {
                return Err(e);
            }
            s.copies.push(Copy { dst: ptr, src: m.ptr, bytes: m.count * dtype.size() });
            return Ok(m.count);
        }
        if peer == self.rank {
            return Err(Error::invalid(format!(
                "the {} backend has no message with tag {tag} from this rank (rank {peer}) to receive: a rank's \
                 receive from itself must follow its send",
                self.name
            )));
        }
        loop {
            let env = match self.await_notice(peer, deadline)? {
                Notice::Message(env) => env,
                Notice::Flushed => continue,
            };
            if env.tag != tag {
                self.stash_next(stash, &mut s.transfers, peer, env)?;
                continue;
            }
            let got = if let Some(e) = unfit(peer, seq, env.dtype, env.count, dtype, capacity) {
                // Received and dropped, so the sender's calls still match.
                let t = self.temp((env.count * env.dtype.size()).max(1))?;
                s.transfers.push(Transfer::Recv { ptr: t.ptr as *mut u8, count: env.count, dtype: env.dtype, peer });
                s.temps.push(t);
                Err(e)
            } else {
                s.transfers.push(Transfer::Recv { ptr, count: env.count, dtype, peer });
                Ok(env.count)
            };
            self.take_rest_of_group(stash, &mut s.transfers, peer, deadline)?;
            return got;
        }
    }

    /// Receives into the stash the messages `peer` issued in the same group as the one just
    /// taken: up to its next [`Notice::Flushed`]. The sender's group completes only when all
    /// of its messages are received; taking them in this rank's group too means no group of
    /// either waits for a later group of the other (which would deadlock their streams).
    fn take_rest_of_group(
        &self,
        stash: &mut Stash,
        transfers: &mut Vec<Transfer>,
        peer: usize,
        deadline: Instant,
    ) -> Result<()> {
        loop {
            match self.await_notice(peer, deadline)? {
                Notice::Flushed => return Ok(()),
                Notice::Message(env) => self.stash_next(stash, transfers, peer, env)?,
            }
        }
    }

    /// The next notice from `peer`; when none has arrived, `peer` is asked to issue what it
    /// announced first (its thread may be busy elsewhere: see `progress.rs`).
    fn await_notice(&self, peer: usize, deadline: Instant) -> Result<Notice> {
        if self.host.peek(peer, 0, self.timeout)?.is_none() {
            self.host.pull(peer, self.timeout)?;
        }
        self.host.next_notice(peer, deadline.saturating_duration_since(Instant::now()))
    }

    /// Buffers a batch of sends only: each payload is copied to a device temporary on the
    /// copy stream (after the caller's work), and the copies' completion is the batch's.
    /// Returns the sends rewritten to read the temporaries, the temporaries, and the issue
    /// the submitter waits for. The sends themselves join this rank's next group.
    ///
    /// # Safety
    /// Every send's buffer is device memory of its size, valid until the returned issue's
    /// event fires.
    pub(crate) unsafe fn buffer_sends(
        self: &Arc<Self>,
        ops: Vec<P2p>,
        order: Option<StreamOrder>,
    ) -> Result<(Vec<P2p>, Vec<DeviceTemp>, Issued)> {
        let caller = match order {
            Some(StreamOrder::On(s) | StreamOrder::After(s)) => RawStream(s.as_raw()),
            None => RawStream::DEFAULT,
        };
        self.follow_on(caller, self.copy_stream)?;
        let mut keep = Vec::with_capacity(ops.len());
        let mut out = Vec::with_capacity(ops.len());
        for p in ops {
            let P2p::Send { mut buf, peer, tag } = p else {
                return Err(Error::Internal("a receive reached the buffered sends".into()));
            };
            if buf.bytes() > 0 {
                let t = self.temp(buf.bytes())?;
                // SAFETY: the caller's buffer (valid until the copy ran: our contract) into
                // a fresh temporary of at least its size, on the engine's stream.
                unsafe {
                    self.rt.copy_async(
                        t.ptr,
                        buf.ptr as u64,
                        buf.bytes(),
                        CopyKind::DeviceToDevice,
                        self.copy_stream,
                    )?
                };
                buf.ptr = t.ptr as *const u8;
                keep.push(t);
            }
            out.push(P2p::Send { buf, peer, tag });
        }
        let event = self.complete_on(self.copy_stream)?;
        if let Some(StreamOrder::On(s)) = order {
            // Later work on the caller's stream may overwrite the buffers: after the copies.
            self.rt.stream_wait_event(RawStream(s.as_raw()), event.event)?;
        }
        Ok((out, keep, Issued::plain(event, Vec::new())))
    }

    /// Issues everything queued as one group (see the module documentation). Sends to this
    /// rank itself never reach NCCL (a send to oneself completes only with its receive in the
    /// same group): each is copied into the stash, where receives find it.
    ///
    /// # Errors
    /// Issuing the group failed (also given to every batch); the communicator is poisoned.
    pub(crate) fn flush(self: &Arc<Self>, order: &mut Order) -> Result<()> {
        if order.queue.is_empty() {
            return Ok(());
        }
        let queue = std::mem::take(&mut order.queue);
        // First the marks that these sends are being issued, so that every receiver takes
        // the whole group at once (see `take_rest_of_group`); before waiting for anyone's
        // envelopes, so two ranks flushing at once do not wait for each other.
        let peers = self.send_peers(queue.iter());
        let marked = self.host.announce_flushed(&peers, self.timeout).and_then(|()| {
            // Pulls these peers sent are answered by this flush.
            peers.iter().try_for_each(|&p| self.host.take_pulls(p, self.timeout).map(drop))
        });
        let mut to_self = Vec::new();
        if marked.is_ok() {
            for q in &queue {
                for p in &q.ops {
                    if let P2p::Send { buf, peer, tag } = *p {
                        if peer == self.rank {
                            let (ptr, class) = self.block(buf.bytes())?;
                            to_self.push(Copy { dst: ptr as *mut u8, src: buf.ptr as u64, bytes: buf.bytes() });
                            order.stash[peer].push_back(Stashed {
                                tag,
                                dtype: buf.dtype,
                                count: buf.count,
                                ptr,
                                class,
                            });
                        }
                    }
                }
            }
        }
        let settled: Vec<Settled> = queue.into_iter().map(|q| self.settle(&mut order.stash, q)).collect();
        if let Err(e) = marked {
            let e = self.fail(e);
            for s in &settled {
                s.ticket.set(Err(e.clone()));
            }
            return Err(e);
        }
        self.issue_settled(settled, &to_self)
    }

    /// Issues the buffered sends at the head of the queue (those before any other batch, so
    /// that messages to one peer keep their order), leaving the rest queued.
    ///
    /// # Errors
    /// As [`flush`](Self::flush).
    pub(crate) fn flush_buffered(self: &Arc<Self>, order: &mut Order) -> Result<()> {
        let n = order.queue.iter().take_while(|q| q.buffered).count();
        if n == 0 {
            return Ok(());
        }
        let rest = order.queue.split_off(n);
        let r = self.flush(order);
        order.queue.extend(rest);
        r
    }

    /// The peers the buffered sends at the head of the queue go to.
    pub(crate) fn buffered_peers(&self, order: &Order) -> Vec<usize> {
        self.send_peers(order.queue.iter().take_while(|q| q.buffered))
    }

    /// The other ranks the sends of `batches` go to, each once.
    fn send_peers<'a>(&self, batches: impl Iterator<Item = &'a Queued>) -> Vec<usize> {
        let mut peers: Vec<usize> = batches
            .flat_map(|q| q.ops.iter())
            .filter_map(|p| match p {
                P2p::Send { peer, .. } if *peer != self.rank => Some(*peer),
                _ => None,
            })
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// Issues settled batches as one group, with their stash copies and staged copies after
    /// it, and hands each its issue.
    fn issue_settled(self: &Arc<Self>, settled: Vec<Settled>, to_self: &[Copy]) -> Result<()> {
        let transfers: Vec<Transfer> = settled.iter().flat_map(|s| s.transfers.iter().copied()).collect();
        let orders: Vec<Option<StreamOrder>> = settled.iter().filter(|s| !s.buffered).map(|s| s.order).collect();
        let _cur = enter(self.rt.as_ref(), self.device)?;
        for ev in settled.iter().filter_map(|s| s.ready.as_ref()) {
            // The group reads what the copy stream wrote.
            self.rt.stream_wait_event(self.stream, ev.event)?;
        }
        let deadline = Instant::now() + self.timeout;
        let mut back: Vec<Vec<HostCopy>> = settled.iter().map(|_| Vec::new()).collect();
        let mut after = |stream: RawStream| -> Result<()> {
            for c in to_self.iter().chain(settled.iter().flat_map(|s| s.copies.iter())).filter(|c| c.bytes > 0) {
                // SAFETY: from a stashed message (device memory kept with the batch) into a
                // receive buffer (device memory valid until the batch completes: the
                // submitter's contract), `bytes` within both (checked by `unfit`).
                unsafe { self.rt.copy_async(c.dst as u64, c.src, c.bytes, CopyKind::DeviceToDevice, stream)? };
            }
            for (s, back) in settled.iter().zip(back.iter_mut()) {
                if let Some(st) = &s.staged {
                    // SAFETY: the staged batch's temporaries and pinned mirrors are kept with
                    // its issue.
                    *back = unsafe { st.copy_out(self, stream, &s.elems)? };
                }
            }
            Ok(())
        };
        // SAFETY: every pointer is a buffer of a submitted batch (valid until its Pending
        // reports completion, the submitter's contract), a temporary kept with its batch, or
        // a stash entry (freed only after a later batch that copies it out completes, or
        // with the engine).
        let event = unsafe { self.issue_group(&transfers, &orders, deadline, &mut after) };
        match event {
            Ok(event) => {
                for (s, back) in settled.into_iter().zip(back) {
                    let mut temps = s.temps;
                    let mut pinned = Vec::new();
                    if let Some(st) = s.staged {
                        temps.extend(st.temps);
                        pinned = st.pinned;
                    }
                    s.ticket.set(Ok(Issued {
                        event: Arc::clone(&event),
                        received: s.received,
                        temps,
                        error: s.error,
                        back: std::sync::Mutex::new(back),
                        pinned,
                    }));
                    // Nobody waits for a buffered send's group: its temporaries are kept
                    // until the group's event fires.
                    if Arc::strong_count(&s.ticket) == 1 {
                        if let Some(Ok(issued)) = s.ticket.get() {
                            self.retire(issued);
                        }
                    }
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

    /// The first message from `peer` with `tag` not yet received, if it was sent: in the
    /// stash, or among the envelopes `peer` announced (messages before it that `peer` has
    /// issued are received into the stash on the way, a whole group at a time).
    ///
    /// A probe issues this rank's queue only when it holds receives: buffered sends issued
    /// alone here would hold this rank's stream until their receivers come, while this
    /// rank may itself be about to take a group of theirs.
    ///
    /// # Errors
    /// The host side's errors; issuing a stash receive failed.
    pub(crate) fn probe_message(self: &Arc<Self>, peer: usize, tag: u32) -> Result<Option<MessageInfo>> {
        let mut order = crate::sync::relock(&self.order);
        order.touched = Instant::now();
        if !order.queue.iter().all(|q| q.buffered) {
            self.flush(&mut order)?;
        }
        if peer == self.rank {
            // Messages to oneself reach the stash when the queue is issued.
            self.flush(&mut order)?;
        }
        loop {
            let q = order.stash.get(peer).ok_or_else(|| Error::invalid(format!("rank {peer} is out of range")))?;
            if let Some(m) = q.iter().find(|m| m.tag == tag) {
                return Ok(Some(MessageInfo { source: peer, tag, dtype: m.dtype, count: m.count }));
            }
            if peer == self.rank {
                return Ok(None);
            }
            // The notices that arrived, up to the end of the first issued group.
            let mut head = Vec::new();
            let mut complete = false;
            let mut k = 0;
            while let Some(n) = self.host.peek(peer, k, self.timeout)? {
                k += 1;
                match n {
                    Notice::Message(env) if env.tag == tag => {
                        return Ok(Some(MessageInfo { source: peer, tag, dtype: env.dtype, count: env.count }));
                    }
                    Notice::Message(env) if !complete => head.push(env),
                    Notice::Message(_) => {}
                    Notice::Flushed => complete = true,
                }
            }
            if !complete {
                return Ok(None);
            }
            // Look past the first issued group: receive it into the stash.
            let mut transfers = Vec::new();
            while let Notice::Message(env) = self.host.next_notice(peer, self.timeout)? {
                self.stash_next(&mut order.stash, &mut transfers, peer, env)?;
            }
            // SAFETY: the receives land in fresh stash entries, freed only after a later
            // batch copies them out or with the engine.
            unsafe { self.issue_group(&transfers, &[None], Instant::now() + self.timeout, &mut |_| Ok(()))? };
        }
    }
}
