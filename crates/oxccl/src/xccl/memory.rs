//! Device memory in the public API: [`Gpu`] (a vendor runtime and one of its devices) and
//! [`DeviceBuffer`] (owned device memory), with borrowed views of part of a buffer
//! ([`DeviceView`], [`DeviceViewMut`]). All of them are [`Buffer`]s, so the collectives
//! take them like host slices.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use super::runtime::{CopyKind, DeviceRuntime, RawStream, Vendor};
use crate::backend::buffer::{Buffer, BufferMut};
use crate::backend::{RawBuf, RawBufMut};
use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Error, Result};

/// One GPU of a vendor runtime (CUDA or HIP, loaded at run time). Cloning is cheap.
#[derive(Clone)]
pub struct Gpu {
    rt: Arc<dyn DeviceRuntime>,
    ordinal: u32,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu").field("device", &self.device()).field("runtime", &self.rt.describe()).finish()
    }
}

impl Gpu {
    /// The GPU `device` names: `cuda:N` through the CUDA driver (`libcuda.so.1`), `rocm:N`
    /// through HIP (`libamdhip64.so`), each loaded once per process.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for [`Device::Cpu`] or an ordinal that does not exist;
    /// [`Error::BackendUnavailable`] when the runtime or any device is missing.
    pub fn of(device: Device) -> Result<Gpu> {
        use super::library::Flavor;
        match device {
            Device::Cuda(n) => Gpu::new(super::factory::runtime(Flavor::Nccl)?, n),
            Device::Rocm(n) => Gpu::new(super::factory::runtime(Flavor::Rccl)?, n),
            Device::Cpu => Err(Error::invalid("Gpu::of(Device::Cpu): the host is not a GPU")),
        }
    }

    /// CUDA device `ordinal` (see [`of`](Self::of)).
    ///
    /// # Errors
    /// As for [`of`](Self::of).
    pub fn cuda(ordinal: u32) -> Result<Gpu> {
        Gpu::of(Device::Cuda(ordinal))
    }

    /// HIP (ROCm) device `ordinal` (see [`of`](Self::of)).
    ///
    /// # Errors
    /// As for [`of`](Self::of).
    pub fn hip(ordinal: u32) -> Result<Gpu> {
        Gpu::of(Device::Rocm(ordinal))
    }

    /// Device `ordinal` of `rt`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the runtime has no such device; the runtime's error.
    pub(crate) fn new(rt: Arc<dyn DeviceRuntime>, ordinal: u32) -> Result<Gpu> {
        let count = rt.device_count()?;
        if ordinal >= count {
            return Err(Error::invalid(format!(
                "{} device {ordinal} does not exist: {count} device(s) are visible (ordinals 0..{count})",
                rt.vendor()
            )));
        }
        Ok(Gpu { rt, ordinal })
    }

    /// The runtime.
    pub(crate) fn runtime(&self) -> &Arc<dyn DeviceRuntime> {
        &self.rt
    }

    /// The device ordinal in the runtime.
    pub(crate) fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The device, as buffers name it (`cuda:N`, `rocm:N`; the test double poses as CUDA).
    pub fn device(&self) -> Device {
        match self.rt.vendor() {
            Vendor::Cuda | Vendor::Host => Device::Cuda(self.ordinal),
            Vendor::Hip => Device::Rocm(self.ordinal),
        }
    }

    /// A buffer of `len` zeros on this GPU.
    ///
    /// # Errors
    /// Out of device memory, a length whose size overflows, or the runtime's error.
    pub fn zeros<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let zeros = vec![T::zeroed(); len];
        self.copy_from_host(&zeros)
    }

    /// A buffer on this GPU holding a copy of `data`.
    ///
    /// # Errors
    /// Out of device memory, or the runtime's error.
    pub fn copy_from_host<T: Element>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let bytes = std::mem::size_of_val(data);
        let ptr = self.rt.alloc(self.ordinal, bytes)?;
        let buf = DeviceBuffer { gpu: self.clone(), ptr, len: data.len(), _elem: PhantomData };
        buf.upload(data)?;
        Ok(buf)
    }

    /// Blocks until everything queued on the device's legacy default stream has run.
    ///
    /// # Errors
    /// The runtime's error, including one of earlier queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.rt.set_current(self.ordinal)?;
        self.rt.stream_synchronize(RawStream::DEFAULT)
    }
}

/// Device memory holding `len` elements of `T`, freed on drop. Collectives take it (and its
/// views) wherever they take a host slice.
pub struct DeviceBuffer<T: Element> {
    gpu: Gpu,
    /// Device address of element 0.
    ptr: u64,
    len: usize,
    _elem: PhantomData<T>,
}

// SAFETY: the buffer owns device memory, which any thread may use through the runtime (the
// runtime's calls are thread-safe); `T` values are plain data (`Element: Pod`).
unsafe impl<T: Element> Send for DeviceBuffer<T> {}
// SAFETY: shared references only read the description, or queue reads of the memory.
unsafe impl<T: Element> Sync for DeviceBuffer<T> {}

impl<T: Element> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.gpu.device())
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
        self.gpu.device()
    }

    /// The GPU the memory is on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The device address of element 0 (for handing to kernels or other libraries).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
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
        self.upload(data)
    }

    /// A read-only view of elements `range`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the buffer.
    pub fn view(&self, range: Range<usize>) -> Result<DeviceView<'_, T>> {
        let ptr = self.offset(&range)?;
        Ok(DeviceView { gpu: &self.gpu, ptr, len: range.len(), _elem: PhantomData })
    }

    /// A writable view of elements `range`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the buffer.
    pub fn view_mut(&mut self, range: Range<usize>) -> Result<DeviceViewMut<'_, T>> {
        let ptr = self.offset(&range)?;
        let view = DeviceView { gpu: &self.gpu, ptr, len: range.len(), _elem: PhantomData };
        Ok(DeviceViewMut { view, _exclusive: PhantomData })
    }

    fn offset(&self, range: &Range<usize>) -> Result<u64> {
        if range.start > range.end || range.end > self.len {
            return Err(Error::invalid(format!(
                "DeviceBuffer: the range {}..{} is outside a buffer of {} elements",
                range.start, range.end, self.len
            )));
        }
        // Cannot overflow: the allocation of `len` elements exists.
        Ok(self.ptr + (range.start * std::mem::size_of::<T>()) as u64)
    }

    /// Copies `data` to the start of the buffer and waits for the copy.
    fn upload(&self, data: &[T]) -> Result<()> {
        let dst = self.offset(&(0..data.len()))?;
        let rt = &self.gpu.rt;
        rt.set_current(self.gpu.ordinal)?;
        // SAFETY: `dst` is inside this buffer's allocation (checked above) and `data` is a
        // host slice of the same size; the stream is synchronized before `data`'s borrow
        // ends, so the copy has read it by then.
        unsafe {
            rt.copy_async(
                dst,
                data.as_ptr() as u64,
                std::mem::size_of_val(data),
                CopyKind::HostToDevice,
                RawStream::DEFAULT,
            )?
        };
        rt.stream_synchronize(RawStream::DEFAULT)
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        let rt = &self.gpu.rt;
        // Work that used the buffer borrowed it, so it has completed (collectives wait
        // before handing buffers back); a failed free leaks rather than panics.
        if rt.set_current(self.gpu.ordinal).is_ok() {
            // SAFETY: `ptr` came from `alloc` on this device and is freed once, here.
            let _ = unsafe { rt.free(self.gpu.ordinal, self.ptr) };
        }
    }
}

/// Part of a [`DeviceBuffer`], borrowed for reading.
pub struct DeviceView<'a, T: Element> {
    gpu: &'a Gpu,
    ptr: u64,
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
        download(self.gpu, self.ptr, self.len)
    }
}

fn download<T: Element>(gpu: &Gpu, ptr: u64, len: usize) -> Result<Vec<T>> {
    let mut out = vec![T::zeroed(); len];
    let rt = &gpu.rt;
    rt.set_current(gpu.ordinal)?;
    // SAFETY: `ptr..ptr + len` elements are device memory of a live buffer (a view borrows
    // it), `out` is a host vector of that size, and the stream is synchronized before `out`
    // is read or dropped.
    unsafe {
        rt.copy_async(
            out.as_mut_ptr() as u64,
            ptr,
            len * std::mem::size_of::<T>(),
            CopyKind::DeviceToHost,
            RawStream::DEFAULT,
        )?
    };
    rt.stream_synchronize(RawStream::DEFAULT)?;
    Ok(out)
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
        raw::<T>(&self.gpu, self.ptr, self.len)
    }
}

// SAFETY: as above; `&mut self` is exclusive.
unsafe impl<T: Element> BufferMut for DeviceBuffer<T> {
    fn as_raw_mut(&mut self) -> RawBufMut {
        raw_mut::<T>(&self.gpu, self.ptr, self.len)
    }
}

// SAFETY: a view borrows its buffer; the range was checked to lie inside it.
unsafe impl<T: Element> Buffer for DeviceView<'_, T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        raw::<T>(self.gpu, self.ptr, self.len)
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
        raw_mut::<T>(self.view.gpu, self.view.ptr, self.view.len)
    }
}
