//! Grouped point-to-point operations ([`Batch`]), like NCCL group calls or torch's
//! `batch_isend_irecv`.

use std::marker::PhantomData;

#[cfg(doc)]
use super::Scope;
use super::{raw, raw_mut, Buffer, BufferMut, Communicator};
use crate::backend::{Op, P2p};
use crate::error::{Error, Result};

/// Point-to-point operations collected for [`Communicator::run_batch`] or
/// [`Scope::run_batch`]; the buffers stay borrowed for `'a`.
pub struct Batch<'a> {
    pub(super) ops: Vec<P2p>,
    pub(super) world_size: usize,
    pub(super) _borrows: PhantomData<&'a mut ()>,
}

impl<'a> Batch<'a> {
    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer < self.world_size {
            Ok(())
        } else {
            Err(Error::invalid(format!("batch: peer {peer} is out of range for a world of {}", self.world_size)))
        }
    }

    /// Adds a send of `buf` to `peer` with `tag`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a peer out of range.
    pub fn send<B: Buffer + ?Sized>(&mut self, buf: &'a B, peer: usize, tag: u32) -> Result<&mut Self> {
        self.check_peer(peer)?;
        self.ops.push(P2p::Send { buf: raw(buf), peer, tag });
        Ok(self)
    }

    /// Adds a receive from `peer` with `tag` into `buf`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a peer out of range.
    pub fn recv<B: BufferMut + ?Sized>(&mut self, buf: &'a mut B, peer: usize, tag: u32) -> Result<&mut Self> {
        self.check_peer(peer)?;
        self.ops.push(P2p::Recv { buf: raw_mut(buf), peer, tag });
        Ok(self)
    }

    /// The number of operations collected.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether no operation was collected.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl Communicator {
    /// Starts collecting point-to-point operations to issue together with
    /// [`Communicator::run_batch`] (like NCCL group calls or torch's `batch_isend_irecv`).
    pub fn batch<'a>(&self) -> Batch<'a> {
        Batch { ops: Vec::new(), world_size: self.world_size(), _borrows: PhantomData }
    }

    /// Runs a batch of sends and receives; they cannot deadlock each other whatever their
    /// order on the ranks. Returns the element count of each receive, in order.
    ///
    /// # Errors
    /// As [`Communicator::send`] and [`Communicator::recv`].
    pub fn run_batch(&self, batch: Batch<'_>) -> Result<Vec<usize>> {
        Ok(self.run(Op::Batch(batch.ops))?.received)
    }
}
