//! Point-to-point on NCCL: envelopes, the queue of batches not yet issued, and issuing them
//! together.
//!
//! NCCL matches a send with the receive that peer posts in the same order, needs the
//! receive's exact count, and runs calls on one stream in order, so a receive queued before
//! the send it depends on (rank 0 `irecv(1); send(1)`, rank 1 the same) would hang both
//! streams. oxccl's `recv` takes any message up to the buffer's length and asynchronous
//! sends and receives may come in any order, so:
//!
//! - every send posts an envelope (tag, dtype, count) on the host side when it is submitted;
//! - asynchronous batches wait in a queue; a blocking batch, a collective, a split, a probe
//!   or a wait on a queued batch flushes the queue: each receive takes its peer's next
//!   envelope (messages between two ranks arrive in the order sent) and everything queued
//!   is issued as **one** NCCL group, which cannot deadlock against itself.
//!
//! The group runs on the communicator's own stream, after the work queued on every caller
//! stream the batches name; a batch asked to run *on* a caller's stream makes that stream
//! wait for the group's completion event instead, so later work there still sees the data.
//!
//! A receive whose envelope names another tag fails with `InvalidArgument` and leaves the
//! message for the next receive; a message longer than the buffer is received into a
//! temporary (so the sender's calls still match) and reported as `InvalidArgument`.

use std::sync::Arc;
use std::time::Instant;

use super::issue::Transfer;
use super::pending::{DeviceTemp, Issued, Ticket};
use super::stage::Staged;
use super::Inner;
use crate::backend::{P2p, StreamOrder};
use crate::error::{Error, Result};
use crate::xccl::host_side::Envelope;

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
}

/// A batch whose receives know their counts.
struct Settled {
    ticket: Arc<Ticket>,
    order: Option<StreamOrder>,
    transfers: Vec<Transfer>,
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
            P2p::Recv { .. } => None,
        })
        .collect()
}

impl Inner {
    /// Settles the receives of one batch: takes each one's envelope and checks it.
    fn settle(self: &Arc<Self>, q: Queued) -> std::result::Result<Settled, (Arc<Ticket>, Error)> {
        let mut taken: Vec<(usize, Envelope)> = Vec::new();
        let mut transfers = Vec::with_capacity(q.ops.len());
        let mut received = Vec::new();
        let mut elems = Vec::new();
        let mut temps = Vec::new();
        let mut error = None;
        for p in &q.ops {
            match *p {
                P2p::Send { buf, peer, .. } => {
                    transfers.push(Transfer::Send { ptr: buf.ptr, count: buf.count, dtype: buf.dtype, peer })
                }
                P2p::Recv { buf, peer, tag } => {
                    let left = q.deadline.saturating_duration_since(Instant::now());
                    let env = match self.host.next_envelope(peer, left) {
                        Ok(e) => e,
                        Err(e) => {
                            self.put_back(taken);
                            return Err((q.ticket, e));
                        }
                    };
                    if env.tag != tag || env.dtype != buf.dtype {
                        self.host.unread(peer, env);
                        self.put_back(taken);
                        let what = if env.tag != tag {
                            format!("has tag {} but this receive asks for tag {tag}", env.tag)
                        } else {
                            format!("holds {} but this receive's buffer is {}", env.dtype, buf.dtype)
                        };
                        return Err((
                            q.ticket,
                            Error::invalid(format!(
                                "the next message from rank {peer} {what}; the {} backend delivers the messages \
                                 between two ranks in the order they were sent",
                                self.name
                            )),
                        ));
                    }
                    taken.push((peer, env));
                    if env.count > buf.count {
                        let ptr = match self.temp(env.count * env.dtype.size()) {
                            Ok(t) => t,
                            Err(e) => {
                                self.put_back(taken);
                                return Err((q.ticket, e));
                            }
                        };
                        transfers.push(Transfer::Recv {
                            ptr: ptr.ptr as *mut u8,
                            count: env.count,
                            dtype: env.dtype,
                            peer,
                        });
                        temps.push(ptr);
                        error.get_or_insert_with(|| {
                            Error::invalid(format!(
                                "rank {peer} sent {} elements with tag {tag}, more than the receive buffer's {}",
                                env.count, buf.count
                            ))
                        });
                        received.push(0);
                        elems.push((0, buf.dtype.size()));
                    } else {
                        transfers.push(Transfer::Recv { ptr: buf.ptr, count: env.count, dtype: env.dtype, peer });
                        received.push(env.count);
                        elems.push((env.count, buf.dtype.size()));
                    }
                }
            }
        }
        Ok(Settled { ticket: q.ticket, order: q.order, transfers, received, elems, temps, error, staged: q.staged })
    }

    /// Gives envelopes back to the front of their peers' queues (latest first, so the order
    /// is kept).
    fn put_back(&self, taken: Vec<(usize, Envelope)>) {
        for (peer, env) in taken.into_iter().rev() {
            self.host.unread(peer, env);
        }
    }

    /// Issues everything queued as one group (see the module documentation). Batches that
    /// cannot be settled get their error; the others are issued.
    ///
    /// # Errors
    /// The communicator is poisoned; issuing the group failed (also given to every batch).
    pub(crate) fn flush(self: &Arc<Self>, queue: &mut Vec<Queued>) -> Result<()> {
        if queue.is_empty() {
            return Ok(());
        }
        let mut settled = Vec::new();
        for q in queue.drain(..) {
            match self.settle(q) {
                Ok(s) => settled.push(s),
                Err((ticket, e)) => ticket.set(Err(e)),
            }
        }
        if settled.is_empty() {
            return Ok(());
        }
        let transfers: Vec<Transfer> = settled.iter().flat_map(|s| s.transfers.iter().copied()).collect();
        let deadline = Instant::now() + self.timeout;
        let orders: Vec<Option<StreamOrder>> = settled.iter().map(|s| s.order).collect();
        let mut after = |stream| {
            settled.iter().filter_map(|s| s.staged.as_ref().map(|st| (st, &s.elems))).try_for_each(|(st, elems)| {
                // SAFETY: the staged batch's host ranges stay valid until completion.
                unsafe { st.copy_out(self, stream, elems) }
            })
        };
        // SAFETY: every pointer is a buffer of a submitted batch (valid until its Pending
        // reports completion, the submitter's contract) or a temporary kept with its batch.
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
}
