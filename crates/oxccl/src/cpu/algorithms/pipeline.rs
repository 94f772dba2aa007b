//! Pipelining over links between processes: a large message to or from a peer over TCP or
//! the shared-memory rings travels as a run of chunk frames ([`CHUNK`] bytes, the last
//! shorter), so the receiver takes each piece (copies it in place, or reduces it) while the
//! next ones are still on their way, and the links' receive buffers stay small and reused
//! instead of a fresh allocation (and its page faults) the size of the message.
//!
//! Whether a message is cut depends only on the link it travels, which both ends see alike,
//! so sender and receiver agree on the pieces without telling each other; a message of
//! another length than the receiver expects shows as a piece of the wrong length (a
//! [`Mismatch`](crate::Error::Mismatch)). The in-process transport moves a message in one
//! frame.
//!
//! [`Ctx::exchange`] runs the two directions of a `send_recv` together. Where the transport
//! drives a cut exchange itself ([`Transport::exchange`](crate::cpu::transport::Transport::exchange):
//! TCP, both peers over it), it writes the pieces and reads the incoming ones straight into
//! their places on the caller's thread (the [`Pieces`] here say where, and check and reduce
//! each piece). Otherwise up to [`AHEAD`] pieces go out before the first piece is awaited,
//! and one more after each piece taken, so both directions and the reductions overlap
//! without a thread of their own. Sends never wait for the peer's receives (the links'
//! threads drain every connection), so no order of calls can deadlock here.
//!
//! Measurements: docs/performance.md.

use std::ops::Range;

use super::{Ctx, Kernel};
use crate::cpu::transport::{LinkKind, Pieces, Received, Stage};
use crate::error::Result;

/// Bytes per frame of a message cut into pieces.
pub const CHUNK: usize = 1 << 20;
/// Pieces sent ahead of the first one awaited.
pub const AHEAD: usize = 2;

/// The byte ranges a message of `len` bytes travels as: one frame, or pieces of `chunk`
/// bytes (the last shorter). An empty message is one empty frame.
pub fn pieces(len: usize, chunk: Option<usize>) -> impl Iterator<Item = Range<usize>> {
    let step = chunk.filter(|&c| c > 0 && len > c).unwrap_or(len.max(1));
    (0..len.max(1)).step_by(step).map(move |s| s.min(len)..(s + step).min(len))
}

/// Where the pieces a rank receives go.
pub enum Sink<'b> {
    /// In place, at their offsets.
    Into(&'b mut [u8]),
    /// Combined into `acc` at their offsets, each received into `tmp` first (at least as
    /// long as a piece from that peer: [`Ctx::scratch_len`]).
    Reduce {
        /// The partial results.
        acc: &'b mut [u8],
        /// What `acc` starts from, when not its own contents (as long as `acc`): each piece
        /// becomes `base (op) piece` in `acc`.
        base: Option<&'b [u8]>,
        /// How values combine.
        k: &'b Kernel,
        /// Where a piece lands before it is combined.
        tmp: &'b mut [u8],
    },
}

impl Sink<'_> {
    fn len(&self) -> usize {
        match self {
            Sink::Into(b) => b.len(),
            Sink::Reduce { acc, .. } => acc.len(),
        }
    }

    /// Receives the piece `r` from `from`, and takes it.
    fn take(&mut self, ctx: &Ctx<'_>, from: usize, r: Range<usize>, total: usize) -> Result<()> {
        match self {
            Sink::Into(b) => ctx.recv_piece(from, &mut b[r.clone()], r.start, total),
            Sink::Reduce { acc, base, k, tmp } => {
                let slot = piece_of(tmp, r.len())?;
                ctx.recv_piece(from, slot, r.start, total)?;
                k.combine_from(&mut acc[r.clone()], base_of(*base, &r)?, slot)
            }
        }
    }
}

/// The first `len` bytes of the scratch `tmp`, where a piece lands before it is combined.
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `tmp` is shorter (an
/// internal bug: see [`Ctx::scratch_len`]).
fn piece_of(tmp: &mut [u8], len: usize) -> Result<&mut [u8]> {
    let have = tmp.len();
    tmp.get_mut(..len)
        .ok_or_else(|| crate::error::Error::invalid(format!("a {have}-byte scratch for a {len}-byte piece")))
}

/// The part `r` of a reduction's `base`, if it has one.
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `base` is shorter than the
/// result (an internal bug).
fn base_of<'x>(base: Option<&'x [u8]>, r: &Range<usize>) -> Result<Option<&'x [u8]>> {
    base.map(|b| {
        b.get(r.clone()).ok_or_else(|| crate::error::Error::invalid(format!("a {}-byte base for bytes {r:?}", b.len())))
    })
    .transpose()
}

/// An exchange cut into pieces, as the transport drives it ([`Transport::exchange`]).
struct Plan<'p, 'c, 'b> {
    ctx: &'p Ctx<'c>,
    to: usize,
    from: usize,
    data: &'p [u8],
    out: Vec<Range<usize>>,
    ins: Vec<Range<usize>>,
    sink: &'p mut Sink<'b>,
}

impl Pieces for Plan<'_, '_, '_> {
    fn outgoing(&self) -> usize {
        self.out.len()
    }

    fn out(&self, i: usize) -> &[u8] {
        &self.data[self.out[i].clone()]
    }

    fn sent(&mut self, _: usize) {
        self.ctx.count_sent(self.to);
    }

    fn incoming(&self) -> usize {
        self.ins.len()
    }

    fn slot(&mut self, i: usize) -> &mut [u8] {
        let r = self.ins[i].clone();
        match &mut *self.sink {
            Sink::Into(b) => &mut b[r],
            // A scratch shorter than a piece gets the piece's length checked in `arrived`.
            Sink::Reduce { tmp, .. } => {
                let n = r.len().min(tmp.len());
                &mut tmp[..n]
            }
        }
    }

    fn wait_for_incoming(&mut self, sleep: &mut dyn FnMut()) {
        self.ctx.waiting_on(self.from, sleep);
    }

    fn arrived(&mut self, i: usize, got: Received) -> Result<()> {
        let r = self.ins[i].clone();
        let total = self.sink.len();
        self.ctx.check_piece(self.from, got, r.len(), r.start, total)?;
        match &mut *self.sink {
            Sink::Into(_) => Ok(()),
            Sink::Reduce { acc, base, k, tmp } => {
                k.combine_from(&mut acc[r.clone()], base_of(*base, &r)?, piece_of(tmp, r.len())?)
            }
        }
    }
}

impl Ctx<'_> {
    /// Sends `data` to `peer` (in pieces over TCP: see the module doc).
    ///
    /// # Errors
    /// The transport's errors, with this collective's context.
    pub fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        for r in pieces(data.len(), self.chunk_for(peer)) {
            self.send_frame(peer, &data[r])?;
        }
        Ok(())
    }

    /// Receives exactly `buf.len()` bytes from `peer` (in pieces over TCP: see the module doc),
    /// checking that every frame belongs to this collective.
    ///
    /// # Errors
    /// [`Error::Mismatch`] when a frame's fingerprint or length differs from ours; the
    /// transport's errors (timeout, lost peer, abort) with this collective's context.
    pub fn recv(&self, peer: usize, buf: &mut [u8]) -> Result<()> {
        let total = buf.len();
        for r in pieces(total, self.chunk_for(peer)) {
            let start = r.start;
            self.recv_piece(peer, &mut buf[r], start, total)?;
        }
        Ok(())
    }

    /// Sends `data` to `to` and receives `buf.len()` bytes from `from`; the two proceed
    /// together (interleaved pieces over TCP: [`Ctx::exchange`]), so rings and pairwise
    /// exchanges cannot deadlock on bounded transports.
    ///
    /// # Errors
    /// As [`Ctx::send`] and [`Ctx::recv`].
    pub fn send_recv(&self, to: usize, data: &[u8], from: usize, buf: &mut [u8]) -> Result<()> {
        self.exchange(to, data, from, Sink::Into(buf))
    }

    /// Sends `data` to `to` and combines `acc.len()` bytes received from `from` into `acc`,
    /// piece by piece over TCP, each received into `tmp` first (at least
    /// [`Ctx::scratch_len`] bytes).
    ///
    /// # Errors
    /// As [`Ctx::send_recv`].
    pub fn send_recv_reduce(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        acc: &mut [u8],
        k: &Kernel,
        tmp: &mut [u8],
    ) -> Result<()> {
        self.exchange(to, data, from, Sink::Reduce { acc, base: None, k, tmp })
    }

    /// [`Ctx::send_recv_reduce`] where `acc` becomes `base (op) received` (`base`: as long as
    /// `acc`, not overlapping it): what an out-of-place reduction does at the first
    /// combination of a block, without copying `base` into `acc` first.
    ///
    /// # Errors
    /// As [`Ctx::send_recv`].
    #[allow(clippy::too_many_arguments)]
    pub fn send_recv_reduce_from(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        base: &[u8],
        acc: &mut [u8],
        k: &Kernel,
        tmp: &mut [u8],
    ) -> Result<()> {
        self.exchange(to, data, from, Sink::Reduce { acc, base: Some(base), k, tmp })
    }

    /// The piece size of messages to or from communicator rank `peer` (`None`: one frame).
    /// Pieces halve a large message's time over TCP and the shared-memory rings
    /// (docs/performance.md).
    pub(crate) fn chunk_for(&self, peer: usize) -> Option<usize> {
        let t = *self.ranks.get(peer)?;
        matches!(self.transport.link_kind(t), LinkKind::Tcp | LinkKind::Shm).then_some(CHUNK)
    }

    /// How long a scratch must be to receive a message of up to `max` bytes from `peer`
    /// through [`Sink::Reduce`]: a piece when the link cuts messages, else the message.
    pub fn scratch_len(&self, peer: usize, max: usize) -> usize {
        self.chunk_for(peer).map_or(max, |c| c.min(max))
    }

    /// Sends `data` to `to` while receiving `sink`'s length from `from` (see the module
    /// documentation for the interleaving).
    ///
    /// # Errors
    /// As [`Ctx::send`] and [`Ctx::recv`].
    pub fn exchange(&self, to: usize, data: &[u8], from: usize, mut sink: Sink<'_>) -> Result<()> {
        let total = sink.len();
        if self.chunk_for(to).is_some_and(|c| data.len() > c) || self.chunk_for(from).is_some_and(|c| total > c) {
            let (t_to, t_from) = (self.transport_rank(to)?, self.transport_rank(from)?);
            let mut plan = Plan {
                ctx: self,
                to,
                from,
                data,
                out: pieces(data.len(), self.chunk_for(to)).collect(),
                ins: pieces(total, self.chunk_for(from)).collect(),
                sink: &mut sink,
            };
            let at = Some(Stage::of_seq(self.fp.seq));
            let done = self
                .transport
                .exchange(t_to, t_from, &self.header(), at, &mut plan, self.clock.deadline())
                .map_err(|e| self.map_err(e))?;
            if done {
                return Ok(());
            }
        }
        let mut sends = pieces(data.len(), self.chunk_for(to));
        for r in sends.by_ref().take(AHEAD) {
            self.send_frame(to, &data[r])?;
        }
        for r in pieces(total, self.chunk_for(from)) {
            sink.take(self, from, r, total)?;
            if let Some(s) = sends.next() {
                self.send_frame(to, &data[s])?;
            }
        }
        for s in sends {
            self.send_frame(to, &data[s])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one piece is the expected answer
    fn pieces_cover_a_message_in_order() {
        let all = |len, chunk| pieces(len, chunk).collect::<Vec<_>>();
        assert_eq!(all(0, None), [0..0]);
        assert_eq!(all(0, Some(4)), [0..0]);
        assert_eq!(all(5, None), [0..5]);
        assert_eq!(all(4, Some(4)), [0..4]);
        assert_eq!(all(9, Some(4)), [0..4, 4..8, 8..9]);
        assert_eq!(all(8, Some(4)), [0..4, 4..8]);
        for len in [1usize, 3, 1000, 4097] {
            for chunk in [1usize, 2, 7, 4096] {
                let p = all(len, Some(chunk));
                assert_eq!(p.first().map(|r| r.start), Some(0));
                assert_eq!(p.last().map(|r| r.end), Some(len));
                assert!(p.windows(2).all(|w| w[0].end == w[1].start && w[0].len() == chunk));
            }
        }
    }
}
