//! A small dense [`Tensor`] and the tensor-parallel collectives over it.
//!
//! A tensor is a shape, a [`DType`], a [`Device`] and contiguous row-major storage, which is
//! either host memory or device memory on a GPU:
//! - Host storage is dtype-erased but aligned for every dtype (it is backed by `u64` words),
//!   so [`Tensor::as_slice`] views it as `&[T]` for the tensor's element type without copying
//!   and without `unsafe`.
//! - Device storage is an untyped device allocation on one `Gpu` ([`Tensor::zeros_on_gpu`],
//!   [`Tensor::to_gpu`]). The host cannot view it: [`Tensor::to_vec`] and
//!   [`Tensor::to_device`]`(Device::Cpu)` copy it back. Clones share it until one of them is
//!   written (by a collective), which then copies it first, so a clone never sees another's
//!   writes.
//!
//! The collectives ([`Communicator::all_reduce_tensor`](crate::Communicator::all_reduce_tensor),
//! [`broadcast_tensor`](crate::Communicator::broadcast_tensor),
//! [`all_gather_tensor`](crate::Communicator::all_gather_tensor),
//! [`reduce_scatter_tensor`](crate::Communicator::reduce_scatter_tensor), in `collectives.rs`) dispatch on
//! the dtype to the typed collectives, handing them the tensor's memory where it lives (a
//! host slice, or device memory that a GPU backend reads in place and a host backend
//! refuses). Gather and reduce-scatter work along any dimension: the tensor is rearranged so
//! that one flat collective moves each rank's block.
//!
//! ```
//! use oxccl::{ReduceOp, Tensor};
//! let out = oxccl::local::run(2, |comm| -> oxccl::Result<Vec<f32>> {
//!     // Rank r holds a [2, 1] column with values r*10 + row.
//!     let r = comm.rank() as f32;
//!     let col = Tensor::from_vec(vec![r * 10.0, r * 10.0 + 1.0], &[2, 1])?;
//!     let full = comm.all_gather_tensor(&col, 1)?; // [2, 2]: the columns side by side
//!     assert_eq!(full.shape(), &[2, 2]);
//!     full.to_vec::<f32>()
//! }).unwrap();
//! assert_eq!(out[0].as_ref().unwrap(), &vec![0.0, 10.0, 1.0, 11.0]);
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::backend::buffer::{Buffer, BufferMut};
use crate::backend::{RawBuf, RawBufMut};
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::with_dtype;
use crate::xccl::bytes::{same_gpu, Block, DeviceBytes};
use crate::xccl::memory::Gpu;

/// A dense, contiguous, row-major tensor of one [`DType`] on one [`Device`].
///
/// Cloning a host tensor copies the data. Cloning a device tensor is cheap and infallible:
/// the clones share the device memory until one of them is written by a collective, which
/// copies it first (and reports a failed copy as the collective's error); use
/// [`Tensor::try_clone`] to copy at once.
#[derive(Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    device: Device,
    numel: usize,
    storage: Storage,
}

/// Where a tensor's bytes are.
#[derive(Clone)]
enum Storage {
    /// `numel * dtype.size()` bytes, rounded up to whole words; the padding stays zero.
    Host(Vec<u64>),
    /// Exactly `numel * dtype.size()` bytes of device memory, shared by clones (copy on
    /// write: see [`Tensor::device_bytes_mut`]).
    Device(Arc<DeviceBytes>),
}

/// Where to allocate a tensor.
#[derive(Clone, Copy)]
enum Place<'a> {
    Host,
    Gpu(&'a Gpu),
}

/// The element count of `shape` (1 for a scalar) for elements of `elem` bytes.
///
/// Also checks that `elem` times the shape's extent (the product of its dimensions, a zero
/// counted as one) fits in `usize`, so every partial product of the shape, in elements or
/// bytes, fits too (also for an empty tensor).
fn shape_numel(what: &str, shape: &[usize], elem: usize) -> Result<usize> {
    let too_large = || Error::invalid(format!("{what}: the shape {shape:?} has more elements than fit in memory"));
    shape.iter().try_fold(elem, |a, &d| a.checked_mul(d.max(1))).ok_or_else(too_large)?;
    Ok(shape.iter().product())
}

/// The error for viewing device memory from the host.
fn on_device(what: &str, device: Device) -> Error {
    Error::invalid(format!(
        "{what}: the tensor is on {device}, whose memory the host cannot view; copy it to the host with \
         to_device(Device::Cpu) (or read it with to_vec)"
    ))
}

/// The blocks that copy `[a, b, block]` bytes into `[b, a, block]` (none when `block` is 0).
fn swap_leading(a: usize, b: usize, block: usize) -> impl Iterator<Item = Block> + Clone {
    let a = if block == 0 { 0 } else { a };
    (0..a).flat_map(move |i| {
        (0..b).map(move |j| Block { src: (i * b + j) * block, dst: (j * a + i) * block, len: block })
    })
}

/// Copies every block of `blocks` from the bytes of `src` to the bytes of `dst` (the two must
/// be on the same GPU, or both on the host).
fn copy_blocks(src: &Tensor, dst: &mut Tensor, blocks: impl Iterator<Item = Block> + Clone) -> Result<()> {
    if let Storage::Device(from) = &src.storage {
        if matches!(dst.storage, Storage::Device(_)) {
            return dst.device_bytes_mut()?.copy_blocks_from(from, blocks);
        }
    }
    // Host to host (anything else is refused here, naming the device).
    let from = src.host_bytes("copy_blocks")?;
    let to = dst.host_bytes_mut("copy_blocks")?;
    for b in blocks.filter(|b| b.len > 0) {
        let s = b.src.checked_add(b.len).and_then(|end| from.get(b.src..end));
        let (n, d) = (to.len(), b.dst.checked_add(b.len).and_then(|end| to.get_mut(b.dst..end)));
        match (s, d) {
            (Some(s), Some(d)) => d.copy_from_slice(s),
            _ => {
                return Err(Error::invalid(format!(
                    "copy_blocks: the block {b:?} does not fit in a source of {} bytes and a destination of {n} bytes",
                    from.len()
                )));
            }
        }
    }
    Ok(())
}

/// A tensor's memory as a collective's input.
struct TensorBuf<'a, T> {
    raw: RawBuf,
    _borrow: PhantomData<&'a Tensor>,
    _elem: PhantomData<fn() -> T>,
}

/// A tensor's memory as a collective's output.
struct TensorBufMut<'a, T> {
    raw: RawBufMut,
    _borrow: PhantomData<&'a mut Tensor>,
    _elem: PhantomData<fn() -> T>,
}

// SAFETY: built by `Tensor::buf` from the tensor's own storage (host words or a device
// allocation of `numel` elements of `T`, aligned for every dtype), with `T` checked to be the
// tensor's dtype; the tensor is borrowed shared for the buffer's lifetime, and a collective
// writes device storage only after unsharing it (`Tensor::device_bytes_mut`), so nobody
// writes this memory meanwhile.
unsafe impl<T: Element> Buffer for TensorBuf<'_, T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        self.raw
    }
}

// SAFETY: built by `Tensor::buf_mut` from the tensor's own storage, as above, with the tensor
// borrowed exclusively and device storage unshared first, so nobody else reads or writes it.
unsafe impl<T: Element> Buffer for TensorBufMut<'_, T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        self.raw.as_const()
    }
}

// SAFETY: as above; `as_raw_mut` and `as_raw` describe the same memory.
unsafe impl<T: Element> BufferMut for TensorBufMut<'_, T> {
    fn as_raw_mut(&mut self) -> RawBufMut {
        self.raw
    }
}

impl Tensor {
    /// A tensor of `shape` and `dtype` at `place`: zeros on the host, unspecified bytes on a
    /// GPU (the caller overwrites them all).
    fn alloc(what: &str, shape: &[usize], dtype: DType, place: Place<'_>) -> Result<Tensor> {
        let numel = shape_numel(what, shape, dtype.size())?;
        let bytes = numel * dtype.size();
        let (device, storage) = match place {
            Place::Host => (Device::Cpu, Storage::Host(vec![0u64; bytes.div_ceil(8)])),
            Place::Gpu(gpu) => (gpu.device(), Storage::Device(Arc::new(DeviceBytes::uninit(gpu, bytes)?))),
        };
        Ok(Tensor { shape: shape.to_vec(), dtype, device, numel, storage })
    }

    /// Where this tensor's storage is, for allocating another beside it.
    fn place(&self) -> Place<'_> {
        match &self.storage {
            Storage::Host(_) => Place::Host,
            Storage::Device(d) => Place::Gpu(d.gpu()),
        }
    }

    /// A tensor of `shape` holding `data` (row-major); its dtype is `T`'s.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `data.len()` differs from the product of `shape`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        let numel = shape_numel("Tensor::from_vec", shape, T::DTYPE.size())?;
        if numel != data.len() {
            return Err(Error::invalid(format!(
                "Tensor::from_vec: {} elements do not fill the shape {shape:?} ({numel} elements)",
                data.len()
            )));
        }
        let mut t = Tensor::alloc("Tensor::from_vec", shape, T::DTYPE, Place::Host)?;
        t.host_bytes_mut("Tensor::from_vec")?.copy_from_slice(bytemuck::cast_slice(&data));
        Ok(t)
    }

    /// A CPU tensor of `shape` and `dtype` filled with zeros.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the tensor's size in bytes overflows `usize`.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::alloc("Tensor::zeros", shape, dtype, Place::Host)
    }

    /// A tensor of `shape` and `dtype` filled with zeros on `device`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the size in bytes overflows `usize`, and for now for
    /// any device other than [`Device::Cpu`]: make a device tensor with
    /// [`Tensor::zeros_on_gpu`].
    pub fn zeros_on(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        match device {
            Device::Cpu => Tensor::alloc("Tensor::zeros_on", shape, dtype, Place::Host),
            other => Tensor::zeros_on_gpu(shape, dtype, &Gpu::of(other).map_err(|e| in_call("Tensor::zeros_on", e))?),
        }
    }

    /// A tensor of `shape` and `dtype` filled with zeros in the memory of `gpu`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the size in bytes overflows `usize`; out of device
    /// memory, or the device runtime's error.
    pub fn zeros_on_gpu(shape: &[usize], dtype: DType, gpu: &Gpu) -> Result<Tensor> {
        let numel = shape_numel("Tensor::zeros_on_gpu", shape, dtype.size())?;
        let bytes = DeviceBytes::zeroed(gpu, numel * dtype.size())?;
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            device: gpu.device(),
            numel,
            storage: Storage::Device(Arc::new(bytes)),
        })
    }

    /// This tensor moved to `device` (the same tensor when it is already there). A device
    /// tensor moved to [`Device::Cpu`] is copied back to the host.
    ///
    /// # Errors
    /// The device runtime's error copying back to the host; for now
    /// [`Error::InvalidArgument`] for a host tensor moved to a GPU device: use
    /// [`Tensor::to_gpu`].
    pub fn to_device(self, device: Device) -> Result<Tensor> {
        match (&self.storage, device) {
            (Storage::Host(_), Device::Cpu) => Ok(self),
            (Storage::Device(d), Device::Cpu) => {
                let mut out = Tensor::alloc("Tensor::to_device", &self.shape, self.dtype, Place::Host)?;
                d.to_host(out.host_bytes_mut("Tensor::to_device")?)?;
                Ok(out)
            }
            (_, other) if other == self.device => Ok(self),
            (_, other) => self.to_gpu(&Gpu::of(other).map_err(|e| in_call("Tensor::to_device", e))?),
        }
    }

    /// This tensor moved to the memory of `gpu` (the same tensor when it is already there;
    /// from another GPU it is copied through the host).
    ///
    /// # Errors
    /// Out of device memory, or the device runtime's error.
    pub fn to_gpu(self, gpu: &Gpu) -> Result<Tensor> {
        let bytes = match &self.storage {
            Storage::Device(d) if same_gpu(d.gpu(), gpu) => return Ok(self),
            Storage::Device(_) => return self.to_device(Device::Cpu)?.to_gpu(gpu),
            Storage::Host(_) => DeviceBytes::from_host(gpu, self.host_bytes("Tensor::to_gpu")?)?,
        };
        Ok(Tensor { device: gpu.device(), storage: Storage::Device(Arc::new(bytes)), ..self })
    }

    /// A copy of this tensor with its own storage (for a device tensor, a new device
    /// allocation filled by a device-to-device copy; `clone` shares it instead).
    ///
    /// # Errors
    /// Out of device memory, or the device runtime's error.
    pub fn try_clone(&self) -> Result<Tensor> {
        let storage = match &self.storage {
            Storage::Host(w) => Storage::Host(w.clone()),
            Storage::Device(d) => Storage::Device(Arc::new(d.try_clone()?)),
        };
        Ok(Tensor { shape: self.shape.clone(), storage, ..*self })
    }

    /// The size of every dimension (empty for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The number of elements (the product of the shape; 1 for a scalar).
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// The data as raw bytes (row-major, native endianness).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a tensor on a GPU, whose memory the host cannot view:
    /// copy it to the host with [`Tensor::to_device`]`(Device::Cpu)`.
    pub fn as_bytes(&self) -> Result<&[u8]> {
        self.host_bytes("Tensor::as_bytes")
    }

    fn host_bytes(&self, what: &str) -> Result<&[u8]> {
        match &self.storage {
            Storage::Host(w) => Ok(&bytemuck::cast_slice(w)[..self.numel * self.dtype.size()]),
            Storage::Device(_) => Err(on_device(what, self.device)),
        }
    }

    fn host_bytes_mut(&mut self, what: &str) -> Result<&mut [u8]> {
        let n = self.numel * self.dtype.size();
        match &mut self.storage {
            Storage::Host(w) => Ok(&mut bytemuck::cast_slice_mut(w)[..n]),
            Storage::Device(_) => Err(on_device(what, self.device)),
        }
    }

    /// The device storage for writing: shared storage (a clone's) is copied first, so the
    /// write is seen by this tensor only.
    fn device_bytes_mut(&mut self) -> Result<&mut DeviceBytes> {
        let Storage::Device(arc) = &mut self.storage else {
            return Err(Error::invalid(format!("the tensor is on {}, not on a GPU", self.device)));
        };
        if Arc::get_mut(arc).is_none() {
            *arc = Arc::new(arc.try_clone()?);
        }
        // Unique now: the Arc was just made, and no Weak of it is ever taken.
        Arc::get_mut(arc).ok_or_else(|| Error::invalid("Tensor: the device storage is still shared after copying it"))
    }

    fn check_dtype<T: Element>(&self, what: &str) -> Result<()> {
        if T::DTYPE == self.dtype {
            Ok(())
        } else {
            Err(Error::invalid(format!("{what}: the tensor holds {}, not {}", self.dtype, T::DTYPE)))
        }
    }

    /// The tensor's memory, wherever it is, as a collective's input of `T`.
    fn buf<T: Element>(&self, what: &str) -> Result<TensorBuf<'_, T>> {
        self.check_dtype::<T>(what)?;
        let ptr = match &self.storage {
            Storage::Host(w) => w.as_ptr().cast::<u8>(),
            Storage::Device(d) => d.device_ptr() as *const u8,
        };
        let raw = RawBuf { ptr, count: self.numel, dtype: self.dtype, device: self.device };
        Ok(TensorBuf { raw, _borrow: PhantomData, _elem: PhantomData })
    }

    /// The tensor's memory, wherever it is, as a collective's output of `T` (device storage
    /// shared with a clone is copied first).
    fn buf_mut<T: Element>(&mut self, what: &str) -> Result<TensorBufMut<'_, T>> {
        self.check_dtype::<T>(what)?;
        let ptr = match &mut self.storage {
            Storage::Host(w) => w.as_mut_ptr().cast::<u8>(),
            Storage::Device(_) => self.device_bytes_mut()?.device_ptr() as *mut u8,
        };
        let raw = RawBufMut { ptr, count: self.numel, dtype: self.dtype, device: self.device };
        Ok(TensorBufMut { raw, _borrow: PhantomData, _elem: PhantomData })
    }

    /// The elements as a slice of `T` (row-major).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `T` is not the tensor's dtype, or for a tensor on a
    /// GPU (copy it to the host with [`Tensor::to_device`]`(Device::Cpu)`).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check_dtype::<T>("Tensor::as_slice")?;
        bytemuck::try_cast_slice(self.host_bytes("Tensor::as_slice")?)
            .map_err(|e| Error::invalid(format!("Tensor::as_slice: cannot view the storage as {}: {e}", T::DTYPE)))
    }

    /// The elements as a mutable slice of `T` (row-major).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `T` is not the tensor's dtype, or for a tensor on a
    /// GPU (copy it to the host with [`Tensor::to_device`]`(Device::Cpu)`).
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check_dtype::<T>("Tensor::as_mut_slice")?;
        bytemuck::try_cast_slice_mut(self.host_bytes_mut("Tensor::as_mut_slice")?)
            .map_err(|e| Error::invalid(format!("Tensor::as_mut_slice: cannot view the storage as {}: {e}", T::DTYPE)))
    }

    /// A copy of the elements as a `Vec<T>` (row-major), copied back from the GPU for a
    /// device tensor.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `T` is not the tensor's dtype; the device runtime's
    /// error.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        match &self.storage {
            Storage::Host(_) => self.as_slice::<T>().map(<[T]>::to_vec),
            Storage::Device(d) => {
                self.check_dtype::<T>("Tensor::to_vec")?;
                let mut out = vec![T::zeroed(); self.numel];
                d.to_host(bytemuck::cast_slice_mut(&mut out))?;
                Ok(out)
            }
        }
    }

    /// The same data with another shape of the same element count (no copy, on the host or
    /// a GPU).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `shape` has a different element count (the tensor is
    /// dropped).
    pub fn reshape(mut self, shape: &[usize]) -> Result<Tensor> {
        let numel = shape_numel("Tensor::reshape", shape, self.dtype.size())?;
        if numel != self.numel {
            return Err(Error::invalid(format!(
                "Tensor::reshape: cannot reshape {:?} ({} elements) into {shape:?} ({numel} elements)",
                self.shape, self.numel
            )));
        }
        self.shape = shape.to_vec();
        Ok(self)
    }

    /// `(outer, shape[dim], inner)`: the tensor seen as a 3-D `[outer, d, inner]` around `dim`.
    fn around(&self, what: &str, dim: usize) -> Result<(usize, usize, usize)> {
        if dim >= self.shape.len() {
            return Err(Error::invalid(format!(
                "{what}: dim {dim} is out of range for a tensor of shape {:?} ({} dimensions)",
                self.shape,
                self.shape.len()
            )));
        }
        // The products cannot overflow: they divide the shape's extent (see `shape_numel`).
        let outer = self.shape[..dim].iter().product();
        let inner = self.shape[dim + 1..].iter().product();
        Ok((outer, self.shape[dim], inner))
    }

    /// A copy of elements `start..start + len` along `dim` (the other dimensions whole), like
    /// torch's `narrow` followed by `contiguous`. Used to take a rank's shard of a weight.
    /// The copy is on the tensor's device (on a GPU: one device-to-device copy per contiguous
    /// block, that is per index of the dimensions before `dim`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `dim` is out of range or the range does not fit in
    /// `shape[dim]`; out of device memory, or the device runtime's error.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let (outer, d, inner) = self.around("Tensor::narrow", dim)?;
        if start.checked_add(len).is_none_or(|end| end > d) {
            return Err(Error::invalid(format!(
                "Tensor::narrow: elements {start}..{start}+{len} along dim {dim} do not fit in the shape {:?}",
                self.shape
            )));
        }
        let mut shape = self.shape.clone();
        shape[dim] = len;
        let mut out = Tensor::alloc("Tensor::narrow", &shape, self.dtype, self.place())?;
        let row = inner * self.dtype.size();
        // No blocks for an empty result (whose `outer` may be huge).
        let outer = if len * row == 0 { 0 } else { outer };
        let blocks = (0..outer).map(move |o| Block { src: (o * d + start) * row, dst: o * len * row, len: len * row });
        copy_blocks(self, &mut out, blocks)?;
        Ok(out)
    }
}

/// Prefixes an [`Error::InvalidArgument`]'s message with the call that failed.
fn in_call(what: &str, e: Error) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::invalid(format!("{what}: {m}")),
        e => e,
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 16;
        let mut s = f.debug_struct("Tensor");
        s.field("shape", &self.shape).field("dtype", &self.dtype).field("device", &self.device);
        if let Storage::Device(_) = self.storage {
            s.field("data", &format_args!("(in device memory; copy it to the host to see it)"));
            return s.finish();
        }
        with_dtype!(self.dtype, T => {
            match self.as_slice::<T>() {
                Ok(v) if v.len() <= SHOWN => s.field("data", &v),
                Ok(v) => s.field("data (first 16)", &&v[..SHOWN]),
                Err(e) => s.field("data", &e),
            }
        });
        s.finish()
    }
}

mod collectives;
#[cfg(test)]
mod tests;
