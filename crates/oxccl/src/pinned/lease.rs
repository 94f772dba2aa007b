//! A lease on a pinned buffer: the bytes asked for, owned until it is dropped, then back to
//! the pool's free list.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::pool::{Block, Shared};
use crate::error::{Error, Result};

/// A pinned host buffer leased from a [`PinnedPool`](super::PinnedPool): `len` bytes
/// (what was asked for) of a page-aligned buffer of `capacity` bytes, all pinned. It
/// dereferences to `[u8]`. Dropping it returns the buffer to the pool (it stays pinned, for
/// the next request of its size class). It may be sent to another thread and may outlive the
/// pool's handle.
///
/// A device copy that reads or writes it asynchronously (through [`as_ptr`](PinnedBuf::as_ptr)
/// or [`as_mut_ptr`](PinnedBuf::as_mut_ptr)) must complete before the lease is dropped.
pub struct PinnedBuf {
    shared: Arc<Shared>,
    /// Taken out only by `drop`.
    block: ManuallyDrop<Block>,
    len: usize,
}

impl PinnedBuf {
    pub(super) fn new(shared: Arc<Shared>, block: Block, len: usize) -> PinnedBuf {
        PinnedBuf { shared, block: ManuallyDrop::new(block), len }
    }

    /// The bytes asked for (at most the capacity).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether [`len`](PinnedBuf::len) is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's size (its size class): all of it is pinned and usable through
    /// [`resize`](PinnedBuf::resize).
    pub fn capacity(&self) -> usize {
        self.block.capacity()
    }

    /// Changes [`len`](PinnedBuf::len), within the capacity (e.g. for the last, shorter chunk
    /// of a staging loop). Bytes it exposes hold whatever the buffer held.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `len` exceeds the capacity.
    pub fn resize(&mut self, len: usize) -> Result<()> {
        if len > self.capacity() {
            return Err(Error::invalid(format!(
                "a pinned buffer of capacity {} cannot be {len} bytes long",
                self.capacity()
            )));
        }
        self.len = len;
        Ok(())
    }

    /// The first byte (page aligned), for device copies.
    pub fn as_ptr(&self) -> *const u8 {
        self.block.ptr()
    }

    /// The first byte (page aligned), for device copies into the buffer.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.block.ptr()
    }

    /// The `len` bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the block's mapping is `capacity >= len` readable bytes, initialized (zeroed
        // by mmap, then written only through slices of leases), page aligned and so non-null;
        // this lease owns it alone until it is dropped, and the `&self` borrow excludes the
        // `&mut` slices of `as_mut_slice` for the returned slice's lifetime.
        unsafe { std::slice::from_raw_parts(self.block.ptr(), self.len) }
    }

    /// The `len` bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the `&mut self` borrow makes this the only slice of
        // the buffer for its lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.block.ptr(), self.len) }
    }
}

impl Deref for PinnedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for PinnedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl fmt::Debug for PinnedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuf")
            .field("ptr", &self.block.ptr())
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and `block` is not used after it is taken here.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        self.shared.give_back(block);
    }
}
