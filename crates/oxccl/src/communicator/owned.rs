//! Async operations on owned buffers: the operation takes its buffers (boxed, so their memory
//! stays put) and [`OwnedWork::wait`] gives them back. Nothing is borrowed, so the handle may
//! outlive any scope and move to another thread (when the buffers can): what bindings to
//! garbage-collected languages need (oxccl's Python package keeps the exporting objects alive
//! inside the buffers it hands over, and completes torch futures from a helper thread).
//! Dropping the handle waits for the operation; leaking it leaks the buffers, so memory in
//! use is never freed.
//!
//! ```
//! use oxccl::{local, ReduceOp};
//! local::run(2, |comm| {
//!     let w = comm.start_all_reduce(vec![1.0f32; 4], ReduceOp::Sum)?;
//!     let busy: f32 = (0..100).map(|i| i as f32).sum(); // overlaps with communication
//!     let v = w.wait()?;
//!     assert_eq!(v, vec![2.0; 4]);
//!     Ok::<f32, oxccl::Error>(busy)
//! })
//! .unwrap();
//! ```

use std::time::Duration;

use super::work::Work;
use super::{recv_any_result, Buffer, BufferMut, Communicator};
use crate::backend::{Completion, MessageInfo, Mode, Op, P2p};
use crate::error::Result;
use crate::reduce_op::ReduceOp;

/// The handle of an operation on owned buffers `K` ([`Communicator::start_all_reduce`] and
/// the other `start_*`): [`wait`](Self::wait) returns the buffers. Dropping it waits.
#[must_use = "an async operation's errors are only seen through wait()"]
pub struct OwnedWork<K> {
    work: Work<'static, K>,
}

// SAFETY: a `Work` holds the backend's `Arc<dyn Pending>` (`Send + Sync`) and its finisher;
// the finisher of every `OwnedWork` is the closure of `start_owned`, which owns nothing but
// the `Box<K>` of buffers, so the handle may move to another thread when `K` may.
unsafe impl<K: Send> Send for OwnedWork<K> {}

impl<K> OwnedWork<K> {
    /// Waits for completion and returns the buffers.
    ///
    /// # Errors
    /// The operation's error ([`Error::Timeout`](crate::Error::Timeout),
    /// [`Error::Mismatch`](crate::Error::Mismatch), ...); the buffers are then dropped.
    pub fn wait(self) -> Result<K> {
        self.work.wait()
    }

    /// Waits up to `timeout`; `Ok(true)` once the operation has completed.
    ///
    /// # Errors
    /// The operation's error, when it completed with one.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<bool> {
        self.work.wait_timeout(timeout)
    }

    /// Whether the operation has completed (successfully or not). Never blocks.
    pub fn is_completed(&self) -> bool {
        self.work.is_completed()
    }
}

impl Communicator {
    /// Submits `op`, built from the boxed buffers `keep` owns; `wait()` gives `keep` back.
    fn start_owned<K: 'static>(&self, keep: Box<K>, build: impl FnOnce(&mut K) -> Result<Op>) -> Result<OwnedWork<K>> {
        self.start_owned_with(keep, build, |k, _| Ok(k))
    }

    /// [`start_owned`](Self::start_owned) whose `wait()` returns what `finish` makes of the
    /// buffers and the completion.
    fn start_owned_with<K: 'static, R: 'static>(
        &self,
        keep: Box<K>,
        build: impl FnOnce(&mut K) -> Result<Op>,
        finish: impl FnOnce(K, Completion) -> Result<R> + 'static,
    ) -> Result<OwnedWork<R>> {
        let mut keep = keep;
        let op = build(&mut keep)?;
        // SAFETY: the buffers in `op` live in `keep`'s heap allocation, which the finisher
        // owns: it is moved out (and its memory may be freed) only by the finisher, which
        // runs after the operation completed; dropping the Work waits for completion before
        // the finisher is dropped; leaking the Work leaks `keep`.
        let work = unsafe { self.submit(op, Mode::Async, move |c| finish(*keep, c))? };
        Ok(OwnedWork { work })
    }

    /// Async [`all_reduce`](Self::all_reduce) on an owned buffer, handed back by
    /// [`OwnedWork::wait`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`OwnedWork::wait`].
    pub fn start_all_reduce<B: BufferMut + 'static>(&self, buf: B, op: ReduceOp) -> Result<OwnedWork<B>> {
        self.start_owned(Box::new(buf), |b| {
            let o = b.as_raw_mut();
            self.op_all_reduce(o.as_const(), o, op)
        })
    }

    /// Async [`all_reduce_into`](Self::all_reduce_into) on owned buffers, handed back by
    /// [`OwnedWork::wait`] as `(input, output)`.
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`OwnedWork::wait`].
    pub fn start_all_reduce_into<I: Buffer + 'static, O: BufferMut<Elem = I::Elem> + 'static>(
        &self,
        input: I,
        output: O,
        op: ReduceOp,
    ) -> Result<OwnedWork<(I, O)>> {
        self.start_owned(Box::new((input, output)), |(i, o)| self.op_all_reduce(i.as_raw(), o.as_raw_mut(), op))
    }

    /// Async [`broadcast`](Self::broadcast) on an owned buffer.
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`OwnedWork::wait`].
    pub fn start_broadcast<B: BufferMut + 'static>(&self, buf: B, root: usize) -> Result<OwnedWork<B>> {
        let me = self.rank();
        self.start_owned(Box::new(buf), |b| {
            let o = b.as_raw_mut();
            self.op_broadcast((me == root).then(|| o.as_const()), o, root)
        })
    }

    /// Async [`reduce`](Self::reduce) on an owned buffer (the root's becomes the result).
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`OwnedWork::wait`].
    pub fn start_reduce<B: BufferMut + 'static>(&self, buf: B, op: ReduceOp, root: usize) -> Result<OwnedWork<B>> {
        let me = self.rank();
        self.start_owned(Box::new(buf), |b| {
            let o = b.as_raw_mut();
            self.op_reduce(o.as_const(), (me == root).then_some(o), op, root)
        })
    }

    /// Async [`all_gather`](Self::all_gather) on owned buffers, handed back as `(input,
    /// output)`.
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`OwnedWork::wait`].
    pub fn start_all_gather<I: Buffer + 'static, O: BufferMut<Elem = I::Elem> + 'static>(
        &self,
        input: I,
        output: O,
    ) -> Result<OwnedWork<(I, O)>> {
        self.start_owned(Box::new((input, output)), |(i, o)| self.op_all_gather(i.as_raw(), o.as_raw_mut()))
    }

    /// Async [`reduce_scatter`](Self::reduce_scatter) on owned buffers, handed back as
    /// `(input, output)`.
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`OwnedWork::wait`].
    pub fn start_reduce_scatter<I: Buffer + 'static, O: BufferMut<Elem = I::Elem> + 'static>(
        &self,
        input: I,
        output: O,
        op: ReduceOp,
    ) -> Result<OwnedWork<(I, O)>> {
        self.start_owned(Box::new((input, output)), |(i, o)| self.op_reduce_scatter(i.as_raw(), o.as_raw_mut(), op))
    }

    /// Async [`all_to_all`](Self::all_to_all) on owned buffers, handed back as `(input,
    /// output)`.
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`OwnedWork::wait`].
    pub fn start_all_to_all<I: Buffer + 'static, O: BufferMut<Elem = I::Elem> + 'static>(
        &self,
        input: I,
        output: O,
    ) -> Result<OwnedWork<(I, O)>> {
        self.start_owned(Box::new((input, output)), |(i, o)| self.op_all_to_all(i.as_raw(), o.as_raw_mut()))
    }

    /// Async [`barrier`](Self::barrier).
    ///
    /// # Errors
    /// Communication errors from [`OwnedWork::wait`].
    pub fn start_barrier(&self) -> Result<OwnedWork<()>> {
        self.start_owned(Box::new(()), |_| Ok(Op::Barrier))
    }

    /// Async [`send`](Self::send) of an owned buffer, handed back by [`OwnedWork::wait`].
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`OwnedWork::wait`].
    pub fn start_send<B: Buffer + 'static>(&self, buf: B, peer: usize, tag: u32) -> Result<OwnedWork<B>> {
        self.p2p_peer("send", peer)?;
        self.start_owned(Box::new(buf), |b| Ok(Op::Batch(vec![P2p::Send { buf: b.as_raw(), peer, tag }])))
    }

    /// Async [`recv`](Self::recv) into an owned buffer: `wait()` hands it back with the
    /// element count received.
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`OwnedWork::wait`].
    pub fn start_recv<B: BufferMut + 'static>(&self, buf: B, peer: usize, tag: u32) -> Result<OwnedWork<(B, usize)>> {
        self.p2p_peer("recv", peer)?;
        self.start_owned_with(
            Box::new(buf),
            |b| Ok(Op::Batch(vec![P2p::Recv { buf: b.as_raw_mut(), peer, tag }])),
            |b, c| Ok((b, c.received.first().copied().unwrap_or(0))),
        )
    }

    /// Async [`recv_any`](Self::recv_any) into an owned buffer: `wait()` hands it back with
    /// who sent what came.
    ///
    /// # Errors
    /// Argument errors now; communication errors from [`OwnedWork::wait`].
    pub fn start_recv_any<B: BufferMut + 'static>(&self, buf: B, tag: u32) -> Result<OwnedWork<(B, MessageInfo)>> {
        let dtype = buf.as_raw().dtype;
        self.start_owned_with(
            Box::new(buf),
            |b| Ok(Op::Batch(vec![P2p::RecvAny { buf: b.as_raw_mut(), tag }])),
            move |b, c| Ok((b, recv_any_result(&c, tag, dtype)?)),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::{local, Error, ReduceOp};

    #[test]
    fn owned_operations_hand_their_buffers_back_with_the_results() {
        let out = local::run(3, |c| -> crate::Result<()> {
            let (r, n) = (c.rank(), c.world_size());
            // Several in flight at once, waited for out of order.
            let a = c.start_all_reduce(vec![r as i64 + 1; 5], ReduceOp::Sum)?;
            let b = c.start_all_gather(vec![r as u8; 2], vec![0u8; 2 * n])?;
            let s =
                c.start_reduce_scatter((0..3 * n).map(|i| i as f32).collect::<Vec<_>>(), vec![0f32; 3], ReduceOp::Max)?;
            let (_, gathered) = b.wait()?;
            assert_eq!(gathered, (0..n).flat_map(|q| [q as u8; 2]).collect::<Vec<_>>());
            assert_eq!(a.wait()?, vec![6i64; 5]);
            let (_, mine) = s.wait()?;
            assert_eq!(mine, (0..3).map(|i| (3 * r + i) as f32).collect::<Vec<_>>());
            let bc = c.start_broadcast([r as f64; 3], 2)?.wait()?;
            assert_eq!(bc, [2.0; 3], "an inline array is boxed, its memory stays put");
            let red = c.start_reduce(vec![1u32; 2], ReduceOp::Sum, 0)?.wait()?;
            assert_eq!(red, if r == 0 { vec![3, 3] } else { vec![1, 1] });
            let (_, sum) = c.start_all_reduce_into(vec![2i32; 2], vec![0i32; 2], ReduceOp::Prod)?.wait()?;
            assert_eq!(sum, vec![8, 8]);
            let (_, t) =
                c.start_all_to_all((0..n).map(|q| (r * 10 + q) as u32).collect::<Vec<_>>(), vec![0u32; n])?.wait()?;
            assert_eq!(t, (0..n).map(|q| (q * 10 + r) as u32).collect::<Vec<_>>());
            // A handle moves to another thread, which waits for it.
            let w = c.start_all_reduce(vec![1u64; 3], ReduceOp::Sum)?;
            let back = std::thread::spawn(move || w.wait()).join().expect("the waiting thread")?;
            assert_eq!(back, vec![n as u64; 3]);
            // A dropped handle waits for its operation.
            drop(c.start_all_reduce(vec![0u8; 16], ReduceOp::Max)?);
            // Bad arguments are refused before anything starts.
            let e = c.start_all_gather(vec![0u8; 2], vec![0u8; 5]).map(drop).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            c.barrier()
        })
        .unwrap();
        assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    }

    /// Receives posted before the matching sends (as torch's `batch_isend_irecv` posts
    /// them): each rank starts a receive from every rank and one from any source, then
    /// sends; nothing waits for anything until all are started.
    #[test]
    fn owned_receives_started_before_their_sends_complete() {
        let out = local::run(3, |c| -> crate::Result<()> {
            let (r, n) = (c.rank(), c.world_size());
            let recvs: Vec<_> = (0..n).map(|q| c.start_recv(vec![0u32; 4], q, 1)).collect::<crate::Result<_>>()?;
            let any = c.start_recv_any(vec![0i64; 2], 2)?;
            let sends: Vec<_> =
                (0..n).map(|q| c.start_send(vec![(10 * r + q) as u32; q + 1], q, 1)).collect::<crate::Result<_>>()?;
            let next = c.start_send(vec![r as i64; 2], (r + 1) % n, 2)?;
            c.start_barrier()?.wait()?;
            for (q, w) in recvs.into_iter().enumerate() {
                let (buf, count) = w.wait()?;
                assert_eq!(count, r + 1);
                assert_eq!(buf[..count], vec![(10 * q + r) as u32; r + 1][..]);
            }
            let (buf, info) = any.wait()?;
            let prev = (r + n - 1) % n;
            assert_eq!((info.source, info.tag, info.count, buf), (prev, 2, 2, vec![prev as i64; 2]));
            for w in sends {
                w.wait()?;
            }
            next.wait()?;
            let e = c.start_recv(vec![0u8; 1], n, 0).map(drop).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            c.barrier()
        })
        .unwrap();
        assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    }
}
