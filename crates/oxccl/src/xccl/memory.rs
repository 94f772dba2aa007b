//! Device memory in the public API: [`Gpu`] (a vendor runtime and one of its devices,
//! defined in `gpu.rs`, re-exported here with the buffers it makes) and [`DeviceBuffer`]
//! (owned device memory), with borrowed views of part of a buffer ([`DeviceView`],
//! [`DeviceViewMut`]). All of them are [`Buffer`]s, so the collectives take them like host
//! slices.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;

use super::bytes::DeviceBytes;
pub use super::gpu::Gpu;
use crate::backend::buffer::{Buffer, BufferMut};
use crate::backend::{RawBuf, RawBufMut};
use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Error, Result};

impl Gpu {
    /// A buffer of `len` zeros on this GPU.
    ///
    /// # Errors
    /// Out of device memory, a length whose size overflows, or the runtime's error.
    pub fn zeros<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::invalid(format!("Gpu::zeros: {len} elements of {} do not fit in memory", T::DTYPE))
        })?;
        Ok(DeviceBuffer { bytes: DeviceBytes::zeroed(self, bytes)?, len, _elem: PhantomData })
    }

    /// A buffer on this GPU holding a copy of `data`.
    ///
    /// # Errors
    /// Out of device memory, or the runtime's error.
    pub fn copy_from_host<T: Element>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let bytes = DeviceBytes::from_host(self, bytemuck::cast_slice(data))?;
        Ok(DeviceBuffer { bytes, len: data.len(), _elem: PhantomData })
    }
}

/// Device memory holding `len` elements of `T`, freed on drop.
/// Collectives take it (and its views) wherever they take a host slice.
pub struct DeviceBuffer<T: Element> {
    bytes: DeviceBytes,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: Element> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device())
            .field("dtype", &T::DTYPE)
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Element> DeviceBuffer<T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory is on.
    pub fn device(&self) -> Device {
        self.gpu().device()
    }

    /// The GPU the memory is on.
    pub fn gpu(&self) -> &Gpu {
        self.bytes.gpu()
    }

    /// The device address of element 0 (for handing to kernels or other libraries).
    pub fn device_ptr(&self) -> u64 {
        self.bytes.device_ptr()
    }

    /// Copies the buffer to a host vector (waits for work queued on the device's default
    /// stream before it, and for the copy).
    ///
    /// # Errors
    /// The runtime's error.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.view(0..self.len)?.to_vec()
    }

    /// Overwrites the buffer with `data`, which must have the same length.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the lengths differ; the runtime's error.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::invalid(format!(
                "DeviceBuffer::copy_from_host: {} elements into a buffer of {}",
                data.len(),
                self.len
            )));
        }
        self.bytes.write(0, bytemuck::cast_slice(data))
    }

    /// A read-only view of elements `range`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the buffer.
    pub fn view(&self, range: Range<usize>) -> Result<DeviceView<'_, T>> {
        let start = self.start(&range)?;
        Ok(DeviceView { bytes: &self.bytes, start, len: range.len(), _elem: PhantomData })
    }

    /// A writable view of elements `range`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the buffer.
    pub fn view_mut(&mut self, range: Range<usize>) -> Result<DeviceViewMut<'_, T>> {
        let start = self.start(&range)?;
        let view = DeviceView { bytes: &self.bytes, start, len: range.len(), _elem: PhantomData };
        Ok(DeviceViewMut { view, _exclusive: PhantomData })
    }

    /// The byte offset of `range`'s first element, checked to lie inside the buffer.
    fn start(&self, range: &Range<usize>) -> Result<usize> {
        if range.start > range.end || range.end > self.len {
            return Err(Error::invalid(format!(
                "DeviceBuffer: the range {}..{} is outside a buffer of {} elements",
                range.start, range.end, self.len
            )));
        }
        // Cannot overflow: the allocation of `len` elements exists.
        Ok(range.start * std::mem::size_of::<T>())
    }
}

/// Part of a [`DeviceBuffer`], borrowed for reading.
pub struct DeviceView<'a, T: Element> {
    bytes: &'a DeviceBytes,
    /// Byte offset of the view's first element.
    start: usize,
    len: usize,
    _elem: PhantomData<&'a [T]>,
}

/// Part of a [`DeviceBuffer`], borrowed for writing; reads as a [`DeviceView`].
pub struct DeviceViewMut<'a, T: Element> {
    view: DeviceView<'a, T>,
    _exclusive: PhantomData<&'a mut [T]>,
}

impl<'a, T: Element> std::ops::Deref for DeviceViewMut<'a, T> {
    type Target = DeviceView<'a, T>;
    fn deref(&self) -> &DeviceView<'a, T> {
        &self.view
    }
}

impl<T: Element> DeviceView<'_, T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the view to a host vector.
    ///
    /// # Errors
    /// The runtime's error.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        self.bytes.read(self.start, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// The device address of the view's first element.
    fn ptr(&self) -> u64 {
        self.bytes.device_ptr() + self.start as u64
    }
}

fn raw<T: Element>(gpu: &Gpu, ptr: u64, len: usize) -> RawBuf {
    RawBuf { ptr: ptr as *const u8, count: len, dtype: T::DTYPE, device: gpu.device() }
}

fn raw_mut<T: Element>(gpu: &Gpu, ptr: u64, len: usize) -> RawBufMut {
    RawBufMut { ptr: ptr as *mut u8, count: len, dtype: T::DTYPE, device: gpu.device() }
}

// SAFETY: the description names this buffer's own allocation of `len` elements on its
// device, which lives (and is only reachable through the buffer) while it is borrowed.
unsafe impl<T: Element> Buffer for DeviceBuffer<T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        raw::<T>(self.gpu(), self.device_ptr(), self.len)
    }
}

// SAFETY: as above; `&mut self` is exclusive.
unsafe impl<T: Element> BufferMut for DeviceBuffer<T> {
    fn as_raw_mut(&mut self) -> RawBufMut {
        raw_mut::<T>(self.gpu(), self.device_ptr(), self.len)
    }
}

// SAFETY: a view borrows its buffer; the range was checked to lie inside it.
unsafe impl<T: Element> Buffer for DeviceView<'_, T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        raw::<T>(self.bytes.gpu(), self.ptr(), self.len)
    }
}

// SAFETY: as above.
unsafe impl<T: Element> Buffer for DeviceViewMut<'_, T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        self.view.as_raw()
    }
}

// SAFETY: a mutable view borrows its buffer exclusively.
unsafe impl<T: Element> BufferMut for DeviceViewMut<'_, T> {
    fn as_raw_mut(&mut self) -> RawBufMut {
        raw_mut::<T>(self.view.bytes.gpu(), self.view.ptr(), self.view.len)
    }
}
