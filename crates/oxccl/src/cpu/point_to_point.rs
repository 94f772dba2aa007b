//! Point-to-point send/recv, probe and batches over a [`Transport`]: tagged messages,
//! matched per (source, tag) in order, like MPI.
//!
//! Sends are eager (the transport buffers them), so a batch posts every send first and then
//! completes every receive: no order of sends and receives across ranks can deadlock.

use std::time::Instant;

use super::algorithms::map_transport_error;
use super::transport::{Channel, Header, Received, Transport, TransportError};
use crate::backend::peer_waits::PeerWaits;
use crate::backend::{Completion, MessageInfo, P2p};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::op_kind::OpKind;

/// The communicator a batch runs in.
pub struct P2pCtx<'a> {
    pub(crate) transport: &'a dyn Transport,
    pub(crate) comm_id: u64,
    pub(crate) ranks: &'a [usize],
    pub(crate) rank: usize,
    pub(crate) seq: u64,
    pub(crate) started: Instant,
    pub(crate) deadline: Instant,
    /// Where receives add the time they waited, when the profiler asks.
    pub(crate) waits: Option<&'a PeerWaits>,
}

impl P2pCtx<'_> {
    fn peer(&self, p: usize) -> Result<usize> {
        self.ranks.get(p).copied().ok_or_else(|| Error::invalid(format!("rank {p} is not in this communicator")))
    }

    /// [`P2pCtx::peer`] for a transport wait.
    fn transport_rank(&self, p: usize) -> Result<usize, TransportError> {
        self.peer(p).map_err(TransportError::Other)
    }

    /// Runs a batch: all sends, then all receives in order.
    ///
    /// # Safety
    /// The buffers in `ops` must satisfy the `Backend::submit` contract.
    ///
    /// # Errors
    /// Transport errors; [`Error::Mismatch`] when a message has another dtype than the
    /// receive buffer or does not fit in it.
    pub unsafe fn run(&self, ops: &[P2p]) -> Result<Completion> {
        let map = |e, op, dtype, count| {
            map_transport_error(e, self.ranks, self.rank, Fingerprint::of_p2p(op, self.seq, dtype, count), self.started)
        };
        for op in ops {
            if let P2p::Send { buf, peer, tag } = op {
                let data: &[u8] = if buf.count == 0 {
                    &[]
                } else {
                    // SAFETY: the submit contract keeps `buf` valid and unchanged until completion.
                    unsafe { std::slice::from_raw_parts(buf.ptr, buf.bytes()) }
                };
                let h = Header {
                    comm_id: self.comm_id,
                    channel: Channel::PointToPoint(*tag),
                    fingerprint: Fingerprint::of_p2p(OpKind::Send, self.seq, buf.dtype, buf.count),
                };
                self.transport
                    .send(self.peer(*peer)?, &h, data, self.deadline)
                    .map_err(|e| map(e, OpKind::Send, buf.dtype, buf.count))?;
            }
        }
        let (mut received, mut sources) = (Vec::new(), Vec::new());
        for op in ops {
            let (buf, peer, tag) = match *op {
                P2p::Send { .. } => continue,
                P2p::Recv { buf, peer, tag } => (buf, Some(peer), tag),
                P2p::RecvAny { buf, tag } => (buf, None, tag),
            };
            let dst: &mut [u8] = if buf.count == 0 {
                &mut []
            } else {
                // SAFETY: the submit contract gives this operation sole use of `buf`.
                unsafe { std::slice::from_raw_parts_mut(buf.ptr, buf.bytes()) }
            };
            let mapped = |e| map(e, OpKind::Recv, buf.dtype, buf.count);
            let (from, got) = match peer {
                Some(peer) => (peer, self.recv_from(peer, tag, dst).map_err(mapped)?),
                None => self.recv_any(tag, dst).map_err(mapped)?,
            };
            let theirs = got.header.fingerprint;
            let es = buf.dtype.size();
            if theirs.dtype != buf.dtype || got.len > dst.len() || got.len % es != 0 {
                return Err(Error::Mismatch {
                    peer: from,
                    ours: Fingerprint::of_p2p(OpKind::Recv, self.seq, buf.dtype, buf.count),
                    theirs,
                });
            }
            received.push(got.len / es);
            sources.push(from);
        }
        Ok(Completion { received, sources })
    }

    /// The next message from `peer` (a communicator rank) with `tag`, into `dst`.
    fn recv_from(&self, peer: usize, tag: u32, dst: &mut [u8]) -> Result<Received, TransportError> {
        let (from, channel) = (self.transport_rank(peer)?, Channel::PointToPoint(tag));
        // A message already here is taken without setting up a wait.
        if let Some(got) = self.transport.try_recv(from, self.comm_id, channel, None, dst)? {
            return Ok(got);
        }
        let t0 = self.waits.map(|_| PeerWaits::start());
        let got = self.transport.recv(from, self.comm_id, channel, None, dst, self.deadline)?;
        if let (Some(w), Some(t0)) = (self.waits, t0) {
            w.add_since(peer, t0);
        }
        Ok(got)
    }

    /// The next message with `tag` from any rank of the communicator, into `dst`, with its
    /// sender's communicator rank. The first rank looked at moves on with every operation,
    /// so that a steady sender does not starve the others.
    fn recv_any(&self, tag: u32, dst: &mut [u8]) -> Result<(usize, Received), TransportError> {
        let first = (self.seq % self.ranks.len().max(1) as u64) as usize;
        let channel = Channel::PointToPoint(tag);
        let (from, got) = self
            .transport
            .recv_any(self.ranks, first, self.comm_id, channel, dst, self.deadline)
            .map_err(|e| match e {
                // It waited on every rank: no one rank to name.
                TransportError::Timeout { .. } => TransportError::Other(Error::Timeout {
                    op: OpKind::Recv,
                    seq: self.seq,
                    peer: None,
                    waited: self.started.elapsed(),
                }),
                e => e,
            })?;
        let peer = self.ranks.iter().position(|&r| r == from).ok_or_else(|| {
            TransportError::Other(Error::Internal(format!(
                "a message from rank {from}, which is not in this communicator"
            )))
        })?;
        Ok((peer, got))
    }

    /// The first unreceived message from `peer` with `tag`, if any.
    ///
    /// # Errors
    /// Transport errors (abort, failure, lost peer with nothing queued).
    pub fn probe(&self, peer: usize, tag: u32) -> Result<Option<MessageInfo>> {
        let got =
            self.transport.probe(self.peer(peer)?, self.comm_id, Channel::PointToPoint(tag), None).map_err(|e| {
                map_transport_error(
                    e,
                    self.ranks,
                    self.rank,
                    Fingerprint::of_p2p(OpKind::Recv, self.seq, DType::U8, 0),
                    self.started,
                )
            })?;
        Ok(got.map(|r| {
            let dtype = r.header.fingerprint.dtype;
            MessageInfo { source: peer, tag, dtype, count: r.len / dtype.size() }
        }))
    }
}
