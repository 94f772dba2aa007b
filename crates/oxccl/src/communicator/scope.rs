//! The async mirror of the API: every operation of [`Communicator`] started inside a
//! [`Scope`], returning a [`Work`] that keeps its buffers borrowed until it completes.

use super::work::{Scope, Work};
use super::Batch;
#[cfg(doc)]
use super::Communicator;
use super::{raw, recv_any_result, Buffer, BufferMut};
use crate::backend::{Completion, MessageInfo, Mode, Op, P2p, RawBufMut};
use crate::error::Result;
use crate::reduce_op::ReduceOp;

/// Async forms: each starts the operation and returns its [`Work`]; `wait()` hands the
/// output buffer back once it is safe to read.
impl<'scope, 'env> Scope<'scope, 'env> {
    fn start<R: 'scope>(&self, op: Op, finish: impl FnOnce(Completion) -> R + 'scope) -> Result<Work<'scope, R>> {
        // SAFETY: every buffer in `op` is borrowed for 'scope, and the scope waits for every
        // operation it tracks before 'scope ends, whatever happens to the Work.
        let w = unsafe { self.comm.submit(op, Mode::Async, move |c| Ok(finish(c)))? };
        self.track(w.pending());
        Ok(w)
    }

    /// Starts the operation `build` makes of `buf`'s raw form; `wait()` hands `buf` back.
    fn start_out<B: BufferMut + ?Sized + 'scope>(
        &self,
        buf: &'scope mut B,
        build: impl FnOnce(RawBufMut) -> Result<Op>,
    ) -> Result<Work<'scope, &'scope mut B>> {
        let (o, back) = lend(buf);
        // SAFETY: `back` is called only by the finisher, after the operation completed.
        self.start(build(o)?, move |_| unsafe { back.take() })
    }

    /// As [`start_out`](Self::start_out) for a buffer only the root passes.
    fn start_opt_out<B: BufferMut + ?Sized + 'scope>(
        &self,
        buf: Option<&'scope mut B>,
        build: impl FnOnce(Option<RawBufMut>) -> Result<Op>,
    ) -> Result<Work<'scope, Option<&'scope mut B>>> {
        let lent = buf.map(lend);
        let o = lent.as_ref().map(|(o, _)| *o);
        // SAFETY: as in `start_out`.
        self.start(build(o)?, move |_| lent.map(|(_, back)| unsafe { back.take() }))
    }

    /// Async [`Communicator::all_reduce`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_reduce<B: BufferMut + ?Sized + 'scope>(
        &self,
        buf: &'scope mut B,
        op: ReduceOp,
    ) -> Result<Work<'scope, &'scope mut B>> {
        self.start_out(buf, |o| self.comm.op_all_reduce(o.as_const(), o, op))
    }

    /// Async [`Communicator::all_reduce_into`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_reduce_into<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized + 'scope>(
        &self,
        input: &'scope I,
        output: &'scope mut O,
        op: ReduceOp,
    ) -> Result<Work<'scope, &'scope mut O>> {
        self.start_out(output, |o| self.comm.op_all_reduce(raw(input), o, op))
    }

    /// Async [`Communicator::reduce`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn reduce<B: BufferMut + ?Sized + 'scope>(
        &self,
        buf: &'scope mut B,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<'scope, &'scope mut B>> {
        self.start_out(buf, |o| self.comm.op_reduce(o.as_const(), Some(o), op, root))
    }

    /// Async [`Communicator::broadcast`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn broadcast<B: BufferMut + ?Sized + 'scope>(
        &self,
        buf: &'scope mut B,
        root: usize,
    ) -> Result<Work<'scope, &'scope mut B>> {
        self.start_out(buf, |o| self.comm.op_broadcast(Some(o.as_const()), o, root))
    }

    /// Async [`Communicator::all_gather`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_gather<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized + 'scope>(
        &self,
        input: &'scope I,
        output: &'scope mut O,
    ) -> Result<Work<'scope, &'scope mut O>> {
        self.start_out(output, |o| self.comm.op_all_gather(raw(input), o))
    }

    /// Async [`Communicator::reduce_scatter`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn reduce_scatter<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized + 'scope>(
        &self,
        input: &'scope I,
        output: &'scope mut O,
        op: ReduceOp,
    ) -> Result<Work<'scope, &'scope mut O>> {
        self.start_out(output, |o| self.comm.op_reduce_scatter(raw(input), o, op))
    }

    /// Async [`Communicator::all_to_all`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_to_all<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized + 'scope>(
        &self,
        input: &'scope I,
        output: &'scope mut O,
    ) -> Result<Work<'scope, &'scope mut O>> {
        self.start_out(output, |o| self.comm.op_all_to_all(raw(input), o))
    }

    /// Async [`Communicator::reduce_into`]; `wait()` returns the output (`None` off the root).
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn reduce_into<B: BufferMut + ?Sized + 'scope>(
        &self,
        input: &'scope B,
        output: Option<&'scope mut B>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<'scope, Option<&'scope mut B>>> {
        self.start_opt_out(output, |o| self.comm.op_reduce(raw(input), o, op, root))
    }

    /// Async [`Communicator::broadcast_into`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn broadcast_into<B: BufferMut + ?Sized + 'scope>(
        &self,
        input: Option<&'scope B>,
        output: &'scope mut B,
        root: usize,
    ) -> Result<Work<'scope, &'scope mut B>> {
        self.start_out(output, |o| self.comm.op_broadcast(input.map(|i| raw(i)), o, root))
    }

    /// Async [`Communicator::all_gather_in_place`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_gather_in_place<B: BufferMut + ?Sized + 'scope>(
        &self,
        buf: &'scope mut B,
    ) -> Result<Work<'scope, &'scope mut B>> {
        self.start_out(buf, |o| self.comm.op_all_gather_in_place(o))
    }

    /// Async [`Communicator::all_gather_v`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_gather_v<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized + 'scope>(
        &self,
        input: &'scope I,
        output: &'scope mut O,
        counts: &[usize],
    ) -> Result<Work<'scope, &'scope mut O>> {
        self.start_out(output, |o| self.comm.op_all_gather_v(raw(input), o, counts))
    }

    /// Async [`Communicator::reduce_scatter_in_place`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn reduce_scatter_in_place<B: BufferMut + ?Sized + 'scope>(
        &self,
        buf: &'scope mut B,
        op: ReduceOp,
    ) -> Result<Work<'scope, &'scope mut B>> {
        self.start_out(buf, |o| self.comm.op_reduce_scatter_in_place(o, op))
    }

    /// Async [`Communicator::all_to_all_in_place`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_to_all_in_place<B: BufferMut + ?Sized + 'scope>(
        &self,
        buf: &'scope mut B,
    ) -> Result<Work<'scope, &'scope mut B>> {
        self.start_out(buf, |o| self.comm.op_all_to_all(o.as_const(), o))
    }

    /// Async [`Communicator::all_to_all_v`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn all_to_all_v<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized + 'scope>(
        &self,
        input: &'scope I,
        send_counts: &[usize],
        output: &'scope mut O,
        recv_counts: &[usize],
    ) -> Result<Work<'scope, &'scope mut O>> {
        self.start_out(output, |o| self.comm.op_all_to_all_v(raw(input), send_counts, o, recv_counts))
    }

    /// Async [`Communicator::gather`]; `wait()` returns the output (`None` off the root).
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn gather<B: BufferMut + ?Sized + 'scope>(
        &self,
        input: &'scope B,
        output: Option<&'scope mut B>,
        root: usize,
    ) -> Result<Work<'scope, Option<&'scope mut B>>> {
        self.start_opt_out(output, |o| self.comm.op_gather(raw(input), o, root))
    }

    /// Async [`Communicator::scatter`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn scatter<B: BufferMut + ?Sized + 'scope>(
        &self,
        input: Option<&'scope B>,
        output: &'scope mut B,
        root: usize,
    ) -> Result<Work<'scope, &'scope mut B>> {
        self.start_out(output, |o| self.comm.op_scatter(input.map(|i| raw(i)), o, root))
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
    pub fn send<B: Buffer + ?Sized>(&self, buf: &'scope B, peer: usize, tag: u32) -> Result<Work<'scope, ()>> {
        self.comm.p2p_peer("send", peer)?;
        self.start(Op::Batch(vec![P2p::Send { buf: raw(buf), peer, tag }]), |_| ())
    }

    /// Async [`Communicator::recv`]: `wait()` returns the buffer and the element count received.
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn recv<B: BufferMut + ?Sized + 'scope>(
        &self,
        buf: &'scope mut B,
        peer: usize,
        tag: u32,
    ) -> Result<Work<'scope, (&'scope mut B, usize)>> {
        self.comm.p2p_peer("recv", peer)?;
        let (o, back) = lend(buf);
        self.start(Op::Batch(vec![P2p::Recv { buf: o, peer, tag }]), move |c| {
            // SAFETY: the finisher runs after the operation completed.
            (unsafe { back.take() }, c.received.first().copied().unwrap_or(0))
        })
    }

    /// Async [`Communicator::recv_any`]: `wait()` returns the buffer and who sent what came.
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`Work::wait`].
    pub fn recv_any<B: BufferMut + ?Sized + 'scope>(
        &self,
        buf: &'scope mut B,
        tag: u32,
    ) -> Result<Work<'scope, (&'scope mut B, MessageInfo)>> {
        let (o, back) = lend(buf);
        let dtype = o.dtype;
        let op = Op::Batch(vec![P2p::RecvAny { buf: o, tag }]);
        // SAFETY: as in `start`: the buffer is borrowed for 'scope, which the scope outlasts.
        let w = unsafe {
            self.comm.submit(op, Mode::Async, move |c| {
                let info = recv_any_result(&c, tag, dtype)?;
                // SAFETY: the finisher runs after the operation completed.
                Ok((back.take(), info))
            })?
        };
        self.track(w.pending());
        Ok(w)
    }

    /// Async [`Communicator::run_batch`]: `wait()` returns the receive counts.
    ///
    /// # Errors
    /// Communication errors from [`Work::wait`].
    pub fn run_batch(&self, batch: Batch<'scope>) -> Result<Work<'scope, Vec<usize>>> {
        self.start(Op::Batch(batch.ops), |c| c.received)
    }
}

/// A buffer lent to an async operation: the raw description the operation uses, and the
/// way back to the buffer once it has completed.
fn lend<'scope, B: BufferMut + ?Sized>(buf: &'scope mut B) -> (RawBufMut, Lent<'scope, B>) {
    let ptr: *mut B = buf;
    // SAFETY: `ptr` comes from an exclusive borrow held for 'scope; the description is
    // derived from it here, and `Lent::take` recreates the borrow only after the operation
    // that uses the description has completed, so the two are never used at once.
    let raw = unsafe { (*ptr).as_raw_mut() };
    (raw, Lent { ptr, _borrow: std::marker::PhantomData })
}

/// The exclusive borrow of a buffer whose memory an operation in flight is using.
struct Lent<'scope, B: ?Sized> {
    ptr: *mut B,
    _borrow: std::marker::PhantomData<&'scope mut B>,
}

impl<'scope, B: ?Sized> Lent<'scope, B> {
    /// The buffer again.
    ///
    /// # Safety
    /// The operation using the buffer's memory has completed.
    unsafe fn take(self) -> &'scope mut B {
        // SAFETY: `ptr` came from a `&'scope mut B` (see `lend`) that nothing else used since;
        // the caller guarantees the operation is done with the memory.
        unsafe { &mut *self.ptr }
    }
}
