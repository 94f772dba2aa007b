//! Point-to-point send/recv, probe and batches over a [`Transport`]: tagged messages,
//! matched per (source, tag) in order, like MPI.
//!
//! Sends are eager (the transport buffers them), so a batch posts every send first and then
//! completes every receive: no order of sends and receives across ranks can deadlock.

use std::time::Instant;

use super::algorithms::map_transport_error;
use super::transport::{Channel, Header, Transport};
use crate::backend::peer_waits::PeerWaits;
use crate::backend::{Completion, MessageInfo, P2p};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};

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
        let mut received = Vec::new();
        for op in ops {
            if let P2p::Recv { buf, peer, tag } = op {
                let dst: &mut [u8] = if buf.count == 0 {
                    &mut []
                } else {
                    // SAFETY: the submit contract gives this operation sole use of `buf`.
                    unsafe { std::slice::from_raw_parts_mut(buf.ptr, buf.bytes()) }
                };
                let (from, channel) = (self.peer(*peer)?, Channel::PointToPoint(*tag));
                let mapped = |e| map(e, OpKind::Recv, buf.dtype, buf.count);
                // A message already here is taken without setting up a wait.
                let got = match self.transport.try_recv(from, self.comm_id, channel, None, dst).map_err(mapped)? {
                    Some(got) => got,
                    None => {
                        let t0 = self.waits.map(|_| PeerWaits::start());
                        let got = self
                            .transport
                            .recv(from, self.comm_id, channel, None, dst, self.deadline)
                            .map_err(mapped)?;
                        if let (Some(w), Some(t0)) = (self.waits, t0) {
                            w.add_since(*peer, t0);
                        }
                        got
                    }
                };
                let theirs = got.header.fingerprint;
                let es = buf.dtype.size();
                if theirs.dtype != buf.dtype || got.len > dst.len() || got.len % es != 0 {
                    return Err(Error::Mismatch {
                        peer: *peer,
                        ours: Fingerprint::of_p2p(OpKind::Recv, self.seq, buf.dtype, buf.count),
                        theirs,
                    });
                }
                received.push(got.len / es);
            }
        }
        Ok(Completion { received })
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
