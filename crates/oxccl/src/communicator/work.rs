//! Async operations: [`Work`] handles and the [`Scope`] that makes borrowing them sound.
//!
//! An async collective writes into a user buffer while the caller goes on. Rust must then
//! guarantee that nobody touches the buffer until the operation completes, even if the
//! handle is leaked with `mem::forget`. oxccl does it the way `std::thread::scope` does:
//! async operations are started inside [`Communicator::scope`](crate::Communicator::scope),
//! the buffers stay borrowed for the whole scope, the scope waits for every operation before
//! it returns (also when the closure panics), and [`Work::wait`] hands the buffer back early.
//!
//! ```
//! use oxccl::{local, ReduceOp};
//! local::run(2, |comm| {
//!     let mut grads_a = vec![1.0f32; 1000];
//!     let mut grads_b = vec![2.0f32; 1000];
//!     comm.scope(|s| {
//!         let wa = s.all_reduce(&mut grads_a, ReduceOp::Sum)?;
//!         let wb = s.all_reduce(&mut grads_b, ReduceOp::Sum)?;
//!         let busy: f32 = (0..1000).map(|i| i as f32).sum(); // overlaps with communication
//!         let a = wa.wait()?;
//!         let b = wb.wait()?;
//!         assert_eq!((a[0], b[999]), (2.0, 4.0));
//!         Ok(busy)
//!     })
//! })
//! .unwrap();
//! ```
//!
//! The borrow checker enforces the rules. Touching a buffer while its operation is in flight
//! does not compile:
//!
//! ```compile_fail
//! # use oxccl::{local, ReduceOp};
//! # local::run(1, |comm| {
//! let mut grads = vec![1.0f32; 8];
//! comm.scope(|s| {
//!     let w = s.all_reduce(&mut grads, ReduceOp::Sum)?;
//!     grads[0] = 0.0; // error: `grads` is borrowed by the operation
//!     w.wait().map(drop)
//! })
//! # }).unwrap();
//! ```
//!
//! Nor does lending an async operation a buffer that dies before the scope ends:
//!
//! ```compile_fail
//! # use oxccl::{local, ReduceOp};
//! # local::run(1, |comm| {
//! comm.scope(|s| {
//!     let mut short_lived = vec![1.0f32; 8];
//!     s.all_reduce(&mut short_lived, ReduceOp::Sum)?; // error: does not live long enough
//!     Ok(())
//! })
//! # }).unwrap();
//! ```

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Communicator;
use crate::backend::{Backend, Completion, Mode, Op, Pending};
use crate::error::{Error, Result};

/// The handle of an operation in flight. [`Work::wait`] returns the operation's result
/// (for a borrowed buffer: the buffer itself, now safe to read). Dropping it waits.
#[must_use = "an async operation's errors are only seen through wait()"]
pub struct Work<'a, R> {
    pending: Arc<dyn Pending>,
    /// Turns the completion into the result (it may find the completion wanting).
    finish: Option<Box<dyn FnOnce(Completion) -> Result<R> + 'a>>,
    /// Whether completion was already seen (then dropping need not wait again).
    completed: bool,
}

impl<'a, R> Work<'a, R> {
    pub(crate) fn new(pending: Arc<dyn Pending>, finish: Box<dyn FnOnce(Completion) -> Result<R> + 'a>) -> Self {
        Work { pending, finish: Some(finish), completed: false }
    }

    /// Waits for completion and returns the result.
    ///
    /// # Errors
    /// The operation's error: [`Error::Timeout`], [`Error::Mismatch`], [`Error::PeerLost`],
    /// [`Error::Aborted`], ...
    pub fn wait(mut self) -> Result<R> {
        let r = self.pending.wait(None);
        self.completed = r.is_some();
        let completion = r.unwrap_or_else(|| Err(still_running()))?;
        let finish = self.finish.take().ok_or_else(still_running)?;
        finish(completion)
    }

    /// Waits up to `timeout`; `Ok(true)` when the operation has completed (call
    /// [`Work::wait`] to take its result), `Ok(false)` when it is still running.
    ///
    /// # Errors
    /// The operation's error, when it completed with one.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<bool> {
        let r = self.pending.wait(Some(timeout));
        self.completed |= r.is_some();
        match r {
            None => Ok(false),
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(e),
        }
    }

    pub(crate) fn pending(&self) -> &Arc<dyn Pending> {
        &self.pending
    }

    /// Whether the operation has completed (successfully or not). Never blocks.
    pub fn is_completed(&self) -> bool {
        self.pending.is_completed()
    }
}

impl<R> Drop for Work<'_, R> {
    fn drop(&mut self) {
        // The operation may still use the buffers this handle borrows: wait for it, unless
        // its completion was already seen.
        if !self.completed {
            let _ = self.pending.wait(None);
        }
    }
}

fn still_running() -> Error {
    Error::Aborted { reason: "the operation's result was already taken".into() }
}

/// A scope in which async operations may borrow buffers. See the [module docs](self).
///
/// Created by [`Communicator::scope`](crate::Communicator::scope); every method here starts
/// an operation and returns its [`Work`].
pub struct Scope<'scope, 'env: 'scope> {
    pub(crate) comm: &'env Communicator,
    pending: Mutex<Vec<Arc<dyn Pending>>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'scope, 'env> Scope<'scope, 'env> {
    pub(crate) fn track(&self, p: &Arc<dyn Pending>) {
        crate::sync::relock(&self.pending).push(Arc::clone(p));
    }

    /// The communicator this scope runs on.
    pub fn communicator(&self) -> &'env Communicator {
        self.comm
    }
}

/// Waits for every operation of a scope, also while unwinding from a panic.
struct WaitAll<'a>(&'a Mutex<Vec<Arc<dyn Pending>>>);

impl WaitAll<'_> {
    fn wait_all(&self) -> Option<Error> {
        let all = std::mem::take(&mut *crate::sync::relock(self.0));
        let mut first = None;
        for p in all {
            if let Some(Err(e)) = p.wait(None) {
                first.get_or_insert(e);
            }
        }
        first
    }
}

impl Drop for WaitAll<'_> {
    fn drop(&mut self) {
        self.wait_all();
    }
}

impl Communicator {
    /// Submits a checked operation.
    ///
    /// # Safety
    /// The buffers in `op` must satisfy `Backend::submit`'s contract until the returned
    /// work completes; callers guarantee it by borrowing them for the work's lifetime `'a`.
    pub(crate) unsafe fn submit<'a, R>(
        &self,
        op: Op,
        mode: Mode,
        finish: impl FnOnce(Completion) -> Result<R> + 'a,
    ) -> Result<Work<'a, R>> {
        self.check_opts(op.kind())?;
        self.check_devices(&op)?;
        // SAFETY: forwarded from this function's contract.
        let pending = unsafe { self.backend.submit(op, mode, &self.opts)? };
        Ok(Work::new(pending, Box::new(finish)))
    }

    /// Runs `f` with a [`Scope`] in which async operations borrow buffers soundly; returns
    /// once every operation started in it has completed. See [`work`](crate::communicator::work).
    ///
    /// # Errors
    /// The closure's error; otherwise the first error of an operation started in the scope.
    pub fn scope<'env, F, R>(&'env self, f: F) -> Result<R>
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<R>,
    {
        scope(self, f)
    }
}

/// Runs `f` in a new scope of `comm`; see [`Communicator::scope`](crate::Communicator::scope).
pub(crate) fn scope<'env, F, T>(comm: &'env Communicator, f: F) -> Result<T>
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T>,
{
    let scope = Scope { comm, pending: Mutex::new(Vec::new()), _scope: PhantomData, _env: PhantomData };
    let guard = WaitAll(&scope.pending);
    let r = f(&scope);
    let unobserved = guard.wait_all();
    drop(guard);
    let value = r?;
    match unobserved {
        Some(e) => Err(e),
        None => Ok(value),
    }
}
