//! The memory a collective reads and writes: [`Buffer`] and [`BufferMut`].
//!
//! Every call of the front door ([`Communicator`](crate::Communicator)) takes its buffers through these two traits, so one call
//! serves host memory (slices, vectors, arrays) and device memory (oxccl's
//! `DeviceBuffer`, cudarc's `CudaSlice` with the `cudarc` feature): the buffer says where its
//! memory is ([`Device`]), and the communicator's backend refuses memory it
//! cannot reach with [`Error::InvalidArgument`](crate::Error::InvalidArgument).
//!
//! Calls with two buffers take any two buffer types of the same element type; calls with a
//! buffer that only the root passes (`reduce_into`, `broadcast_into`, `gather`, `scatter`)
//! take it as an `Option` of the *other* buffer's type, so a plain `None` needs no
//! annotation.

use super::{RawBuf, RawBufMut};
use crate::device::Device;
use crate::dtype::Element;

/// Memory a collective may read: `len` elements of [`Buffer::Elem`] on one device.
///
/// # Safety
/// An implementation promises that [`as_raw`](Buffer::as_raw) describes memory that holds
/// `count` initialised elements of `Elem` (with `dtype == Elem::DTYPE`), properly aligned, on
/// the device it names, and that this memory stays valid and is not written by anyone else
/// for as long as the `&self` borrow lasts. Host memory is named [`Device::Cpu`]; device
/// memory carries its device address in `ptr`.
pub unsafe trait Buffer {
    /// The element type.
    type Elem: Element;

    /// Where the memory is, and how long.
    fn as_raw(&self) -> RawBuf;
}

/// Memory a collective may write.
///
/// # Safety
/// As [`Buffer`]; in addition [`as_raw_mut`](BufferMut::as_raw_mut) describes the same
/// memory as `as_raw`, and nobody else reads or writes it for as long as the `&mut self`
/// borrow lasts.
pub unsafe trait BufferMut: Buffer {
    /// Where the memory is, for writing.
    fn as_raw_mut(&mut self) -> RawBufMut;
}

fn host<T: Element>(s: &[T]) -> RawBuf {
    RawBuf { ptr: s.as_ptr().cast(), count: s.len(), dtype: T::DTYPE, device: Device::Cpu }
}

fn host_mut<T: Element>(s: &mut [T]) -> RawBufMut {
    RawBufMut { ptr: s.as_mut_ptr().cast(), count: s.len(), dtype: T::DTYPE, device: Device::Cpu }
}

// SAFETY: a slice is `len` initialised, aligned elements of host memory, valid and shared
// (or, through `&mut`, exclusive) for as long as it is borrowed.
unsafe impl<T: Element> Buffer for [T] {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        host(self)
    }
}

// SAFETY: as for slices.
unsafe impl<T: Element> BufferMut for [T] {
    fn as_raw_mut(&mut self) -> RawBufMut {
        host_mut(self)
    }
}

// SAFETY: a vector's elements are a slice, borrowed with the vector (its storage cannot be
// reallocated while the vector is borrowed).
unsafe impl<T: Element> Buffer for Vec<T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        host(self)
    }
}

// SAFETY: as above.
unsafe impl<T: Element> BufferMut for Vec<T> {
    fn as_raw_mut(&mut self) -> RawBufMut {
        host_mut(self)
    }
}

// SAFETY: an array is a slice of `N` elements.
unsafe impl<T: Element, const N: usize> Buffer for [T; N] {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        host(self)
    }
}

// SAFETY: as above.
unsafe impl<T: Element, const N: usize> BufferMut for [T; N] {
    fn as_raw_mut(&mut self) -> RawBufMut {
        host_mut(self)
    }
}

// SAFETY: forwards to the referenced buffer, which stays borrowed at least as long as the
// reference is.
unsafe impl<B: Buffer + ?Sized> Buffer for &B {
    type Elem = B::Elem;
    fn as_raw(&self) -> RawBuf {
        (**self).as_raw()
    }
}

// SAFETY: as above.
unsafe impl<B: Buffer + ?Sized> Buffer for &mut B {
    type Elem = B::Elem;
    fn as_raw(&self) -> RawBuf {
        (**self).as_raw()
    }
}

// SAFETY: as above; the exclusive borrow of the reference is an exclusive borrow of the
// buffer.
unsafe impl<B: BufferMut + ?Sized> BufferMut for &mut B {
    fn as_raw_mut(&mut self) -> RawBufMut {
        (**self).as_raw_mut()
    }
}
