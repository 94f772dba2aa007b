//! The async mirror of the API: every operation of [`Communicator`] started inside a
//! [`Scope`], returning a [`Work`] that keeps its buffers borrowed until it completes.

use super::work::{Scope, Work};
use super::Batch;
#[cfg(doc)]
use super::Communicator;
use super::{raw, raw_mut, rebuild};
use crate::backend::{Completion, Mode, Op, P2p, RawBufMut};
use crate::dtype::Element;
use crate::error::Result;
use crate::reduce_op::ReduceOp;

/// Async forms: each starts the operation and returns its [`Work`]; `wait()` hands the
/// output buffer back once it is safe to read.
impl<'scope, 'env> Scope<'scope, 'env> {
    fn start<R: 'scope>(&self, op: Op, finish: impl FnOnce(Completion) -> R + 'scope) -> Result<Work<'scope, R>> {
        // SAFETY: every buffer in `op` is borrowed for 'scope, and the scope waits for every
        // operation it tracks before 'scope ends, whatever happens to the Work.
        let w = unsafe { self.comm.submit(op, Mode::Async, finish)? };
        self.track(w.pending());
        Ok(w)
    }

    /// Starts the operation `build` makes of `buf`'s raw form; `wait()` hands `buf` back.
    fn start_out<T: Element>(
        &self,
        buf: &'scope mut [T],
        build: impl FnOnce(RawBufMut) -> Result<Op>,
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        let o = raw_mut(buf);
        // SAFETY: `o` comes from a borrow held for 'scope and the finisher runs only after
        // the operation completed.
        self.start(build(o)?, move |_| unsafe { rebuild(o) })
    }

    /// Async [`Communicator::all_reduce`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_reduce<T: Element>(&self, buf: &'scope mut [T], op: ReduceOp) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(buf, |o| self.comm.op_all_reduce(o.as_const(), o, op))
    }

    /// Async [`Communicator::all_reduce_into`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_reduce_into<T: Element>(
        &self,
        input: &'scope [T],
        output: &'scope mut [T],
        op: ReduceOp,
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(output, |o| self.comm.op_all_reduce(raw(input), o, op))
    }

    /// Async [`Communicator::reduce`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn reduce<T: Element>(
        &self,
        buf: &'scope mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(buf, |o| self.comm.op_reduce(o.as_const(), Some(o), op, root))
    }

    /// Async [`Communicator::broadcast`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn broadcast<T: Element>(&self, buf: &'scope mut [T], root: usize) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(buf, |o| self.comm.op_broadcast(Some(o.as_const()), o, root))
    }

    /// Async [`Communicator::all_gather`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_gather<T: Element>(
        &self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(output, |o| self.comm.op_all_gather(raw(input), o))
    }

    /// Async [`Communicator::reduce_scatter`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn reduce_scatter<T: Element>(
        &self,
        input: &'scope [T],
        output: &'scope mut [T],
        op: ReduceOp,
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(output, |o| self.comm.op_reduce_scatter(raw(input), o, op))
    }

    /// Async [`Communicator::all_to_all`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_to_all<T: Element>(
        &self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(output, |o| self.comm.op_all_to_all(raw(input), o))
    }

    /// Async [`Communicator::reduce_into`]; `wait()` returns the output (`None` off the root).
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn reduce_into<T: Element>(
        &self,
        input: &'scope [T],
        output: Option<&'scope mut [T]>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<'scope, Option<&'scope mut [T]>>> {
        let o = output.map(raw_mut);
        // SAFETY: as in `start_out`: a borrow held for 'scope, rebuilt after completion.
        self.start(self.comm.op_reduce(raw(input), o, op, root)?, move |_| o.map(|o| unsafe { rebuild(o) }))
    }

    /// Async [`Communicator::broadcast_into`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn broadcast_into<T: Element>(
        &self,
        input: Option<&'scope [T]>,
        output: &'scope mut [T],
        root: usize,
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(output, |o| self.comm.op_broadcast(input.map(raw), o, root))
    }

    /// Async [`Communicator::all_gather_in_place`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_gather_in_place<T: Element>(&self, buf: &'scope mut [T]) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(buf, |o| self.comm.op_all_gather_in_place(o))
    }

    /// Async [`Communicator::all_gather_v`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_gather_v<T: Element>(
        &self,
        input: &'scope [T],
        output: &'scope mut [T],
        counts: &[usize],
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(output, |o| self.comm.op_all_gather_v(raw(input), o, counts))
    }

    /// Async [`Communicator::reduce_scatter_in_place`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &'scope mut [T],
        op: ReduceOp,
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(buf, |o| self.comm.op_reduce_scatter_in_place(o, op))
    }

    /// Async [`Communicator::all_to_all_in_place`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_to_all_in_place<T: Element>(&self, buf: &'scope mut [T]) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(buf, |o| self.comm.op_all_to_all(o.as_const(), o))
    }

    /// Async [`Communicator::all_to_all_v`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_to_all_v<T: Element>(
        &self,
        input: &'scope [T],
        send_counts: &[usize],
        output: &'scope mut [T],
        recv_counts: &[usize],
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(output, |o| self.comm.op_all_to_all_v(raw(input), send_counts, o, recv_counts))
    }

    /// Async [`Communicator::gather`]; `wait()` returns the output (`None` off the root).
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn gather<T: Element>(
        &self,
        input: &'scope [T],
        output: Option<&'scope mut [T]>,
        root: usize,
    ) -> Result<Work<'scope, Option<&'scope mut [T]>>> {
        let o = output.map(raw_mut);
        // SAFETY: as in `start_out`: a borrow held for 'scope, rebuilt after completion.
        self.start(self.comm.op_gather(raw(input), o, root)?, move |_| o.map(|o| unsafe { rebuild(o) }))
    }

    /// Async [`Communicator::scatter`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn scatter<T: Element>(
        &self,
        input: Option<&'scope [T]>,
        output: &'scope mut [T],
        root: usize,
    ) -> Result<Work<'scope, &'scope mut [T]>> {
        self.start_out(output, |o| self.comm.op_scatter(input.map(raw), o, root))
    }

    /// Async [`Communicator::barrier`].
    ///
    /// # Errors
    /// Communication errors from [`Work::wait`].
    pub fn barrier(&self) -> Result<Work<'scope, ()>> {
        self.start(Op::Barrier, |_| ())
    }

    /// Async [`Communicator::send`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn send<T: Element>(&self, buf: &'scope [T], peer: usize, tag: u32) -> Result<Work<'scope, ()>> {
        self.comm.p2p_peer("send", peer)?;
        self.start(Op::Batch(vec![P2p::Send { buf: raw(buf), peer, tag }]), |_| ())
    }

    /// Async [`Communicator::recv`]: `wait()` returns the buffer and the element count received.
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn recv<T: Element>(
        &self,
        buf: &'scope mut [T],
        peer: usize,
        tag: u32,
    ) -> Result<Work<'scope, (&'scope mut [T], usize)>> {
        self.comm.p2p_peer("recv", peer)?;
        let o = raw_mut(buf);
        self.start(Op::Batch(vec![P2p::Recv { buf: o, peer, tag }]), move |c| {
            // SAFETY: as in `start_out`: a borrow held for 'scope, rebuilt after completion.
            (unsafe { rebuild(o) }, c.received.first().copied().unwrap_or(0))
        })
    }

    /// Async [`Communicator::run_batch`]: `wait()` returns the receive counts.
    ///
    /// # Errors
    /// Communication errors from [`Work::wait`].
    pub fn run_batch(&self, batch: Batch<'scope>) -> Result<Work<'scope, Vec<usize>>> {
        self.start(Op::Batch(batch.ops), |c| c.received)
    }
}
