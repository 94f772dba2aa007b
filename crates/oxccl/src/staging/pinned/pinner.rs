//! [`Pinner`]: how the pool makes memory page-locked.

#[cfg(doc)]
use super::MlockPinner;
use crate::error::Result;

/// How the pool makes memory page-locked: [`MlockPinner`] without a device runtime, or a
/// device runtime's host registration (`cuMemHostRegister`, `hipHostRegister`), implemented
/// by the runtime.
///
/// The pool calls [`pin`](Pinner::pin) once on each new buffer and [`unpin`](Pinner::unpin)
/// once when it evicts or frees it; never both at once on one buffer.
pub trait Pinner: Send + Sync + 'static {
    /// What pins, for statistics and messages: `mlock`, `CUDA (cuMemHostRegister)`, ...
    fn name(&self) -> &str;

    /// Pins `[ptr, ptr+len)`. Implementations must not read, write, unmap or free the memory.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` is a live mapping owned by the caller, page aligned, not pinned by
    /// this pinner; it stays mapped until [`unpin`](Pinner::unpin) has returned (or, if this
    /// call fails, until it returns).
    ///
    /// # Errors
    /// A clear [`Error`](crate::error::Error) saying why the memory could not be pinned (for `mlock`, one that
    /// names `RLIMIT_MEMLOCK` and how to raise it).
    unsafe fn pin(&self, ptr: *mut u8, len: usize) -> Result<()>;

    /// Unpins `[ptr, ptr+len)`.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` was pinned by a successful [`pin`](Pinner::pin) of this pinner with
    /// the same arguments, is still mapped, and has not been unpinned since.
    ///
    /// # Errors
    /// A clear [`Error`](crate::error::Error); the pool then leaks the buffer's mapping rather than unmap memory a
    /// device may still reach.
    unsafe fn unpin(&self, ptr: *mut u8, len: usize) -> Result<()>;
}
