//! cudarc's device memory as collective buffers (cargo feature `cudarc`): `CudaSlice<T>`,
//! `CudaView<T>` and `CudaViewMut<T>` are [`Buffer`]s (the last two and `CudaSlice` also
//! [`BufferMut`]s) on `cuda:N`, N being their context's ordinal.
//!
//! The example `examples/cudarc_all_reduce.rs`:
//!
//! ```no_run
#![doc = include_str!("../../examples/cudarc_all_reduce.rs")]
//! ```
//!
//! # Streams and cudarc's event tracking
//! cudarc orders work on its slices with events of its own. Taking a slice's address
//! (`DevicePtr::device_ptr` on the slice's own stream) makes cudarc wait for the slice's
//! last write on that stream and record a read after it; the collective itself runs on the
//! communicator's stream. So, as with any foreign stream: pass the slice's stream with
//! `Communicator::with_stream` (the collective waits for the work queued there, through an
//! event) or `on_stream` (it is queued there), and do not touch the slice from cudarc until
//! the call returned or its `Work` was waited for; the borrow of the slice enforces that.
//!
//! cudarc's loader panics when `libcuda.so.1` or a symbol is missing; nothing here calls it
//! (a `CudaSlice` exists only after cudarc loaded the driver), and oxccl's own CUDA calls go
//! through its own table (`runtime/cuda/`).

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DeviceSlice};

use crate::backend::buffer::{Buffer, BufferMut};
use crate::backend::{RawBuf, RawBufMut, Stream};
use crate::device::Device;
use crate::dtype::Element;

/// The device address and device of a cudarc slice or view.
fn describe<T, S: DevicePtr<T> + DeviceSlice<T>>(s: &S) -> (u64, Device) {
    let stream = s.stream();
    let (ptr, _read) = s.device_ptr(stream);
    (ptr, Device::Cuda(stream.context().ordinal() as u32))
}

// SAFETY: the address is the slice's device allocation of `len` elements of `T` (cudarc's
// contract for `device_ptr`), valid while the slice is borrowed; the device is its context's.
unsafe impl<T: Element> Buffer for CudaSlice<T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        let (ptr, device) = describe(self);
        RawBuf { ptr: ptr as *const u8, count: self.len(), dtype: T::DTYPE, device }
    }
}

// SAFETY: as above; `&mut self` makes the collective the only user of the memory.
unsafe impl<T: Element> BufferMut for CudaSlice<T> {
    fn as_raw_mut(&mut self) -> RawBufMut {
        let r = self.as_raw();
        RawBufMut { ptr: r.ptr.cast_mut(), count: r.count, dtype: r.dtype, device: r.device }
    }
}

// SAFETY: as for `CudaSlice`: a view is a range of a live allocation, borrowed.
unsafe impl<T: Element> Buffer for CudaView<'_, T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        let (ptr, device) = describe(self);
        RawBuf { ptr: ptr as *const u8, count: self.len(), dtype: T::DTYPE, device }
    }
}

// SAFETY: as for `CudaSlice`.
unsafe impl<T: Element> Buffer for CudaViewMut<'_, T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        let (ptr, device) = describe(self);
        RawBuf { ptr: ptr as *const u8, count: self.len(), dtype: T::DTYPE, device }
    }
}

// SAFETY: as for `CudaSlice`; a mutable view is the only way to its range while it lives.
unsafe impl<T: Element> BufferMut for CudaViewMut<'_, T> {
    fn as_raw_mut(&mut self) -> RawBufMut {
        let r = self.as_raw();
        RawBufMut { ptr: r.ptr.cast_mut(), count: r.count, dtype: r.dtype, device: r.device }
    }
}

impl Stream {
    /// The handle of a cudarc stream, for `Communicator::with_stream` / `on_stream`.
    ///
    /// # Safety
    /// As [`Stream::from_raw`]: `stream` stays alive while operations using the handle are
    /// in flight (until blocking calls return and asynchronous `Work` is waited for).
    pub unsafe fn from_cudarc(stream: &CudaStream) -> Stream {
        // SAFETY: a CUstream of the CUDA driver, alive as long as our caller promises.
        unsafe { Stream::from_raw(stream.cu_stream().cast()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compile-time: cudarc's slices and views are collective buffers. (Making one needs a
    /// GPU, which CI does not have; the calls themselves run in scripts/gpu/gpu_check.sh.)
    #[test]
    fn cudarc_slices_and_views_are_buffers() {
        fn takes<B: BufferMut<Elem = f32>>() {}
        fn reads<B: Buffer<Elem = half::bf16>>() {}
        takes::<CudaSlice<f32>>();
        takes::<CudaViewMut<'static, f32>>();
        reads::<CudaView<'static, half::bf16>>();
        reads::<CudaSlice<half::bf16>>();
    }
}
