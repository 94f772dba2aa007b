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
//! The collectives ([`Communicator::all_reduce_tensor`], [`Communicator::broadcast_tensor`],
//! [`Communicator::all_gather_tensor`], [`Communicator::reduce_scatter_tensor`]) dispatch on
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

use half::{bf16, f16};

use crate::backend::buffer::{Buffer, BufferMut};
use crate::backend::{RawBuf, RawBufMut};
use crate::communicator::Communicator;
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::reduce_op::ReduceOp;
use crate::xccl::bytes::{same_gpu, Block, DeviceBytes};
use crate::xccl::memory::Gpu;

/// Runs `$body` with the type alias `$T` bound to the Rust type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, |$T:ident| $body:expr) => {
        match $dtype {
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::U32 => {
                type $T = u32;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::U64 => {
                type $T = u64;
                $body
            }
            DType::F16 => {
                type $T = f16;
                $body
            }
            DType::BF16 => {
                type $T = bf16;
                $body
            }
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}

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

/// The `Gpu` for a CUDA or ROCm `device` (the process's runtime of that vendor).
fn gpu_for(device: Device) -> Result<Gpu> {
    Gpu::of(device)
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
            other => Tensor::zeros_on_gpu(shape, dtype, &gpu_for(other).map_err(|e| in_call("Tensor::zeros_on", e))?),
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
            (_, other) => self.to_gpu(&gpu_for(other).map_err(|e| in_call("Tensor::to_device", e))?),
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
        with_dtype!(self.dtype, |T| {
            match self.as_slice::<T>() {
                Ok(v) if v.len() <= SHOWN => s.field("data", &v),
                Ok(v) => s.field("data (first 16)", &&v[..SHOWN]),
                Err(e) => s.field("data", &e),
            }
        });
        s.finish()
    }
}

/// Tensor collectives: each dispatches on the tensor's dtype to the typed collective, with
/// the tensor's memory where it lives (host or device memory; a backend refuses memory it
/// cannot reach with [`Error::InvalidArgument`]). Results are allocated beside the input
/// (on the host, or on the input's GPU).
///
/// Every rank must pass tensors of the same dtype and shape. Different element counts or
/// dtypes are caught as [`Error::Mismatch`]; different shapes with the same element count
/// are not detected and give a meaningless (but memory-safe) result.
impl Communicator {
    /// All-reduce in place: every rank's `tensor` becomes the element-wise reduction of all
    /// ranks' tensors.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a tensor on a device the communicator's backend cannot
    /// reach; communication errors ([`Error::Timeout`], [`Error::Mismatch`],
    /// [`Error::PeerLost`], [`Error::Aborted`]).
    pub fn all_reduce_tensor(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        const WHAT: &str = "all_reduce_tensor";
        with_dtype!(tensor.dtype, |T| self.all_reduce(&mut tensor.buf_mut::<T>(WHAT)?, op))
    }

    /// Broadcast in place: every rank's `tensor` becomes the root's.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a root out of range or a tensor on a device the
    /// backend cannot reach; communication errors.
    pub fn broadcast_tensor(&self, tensor: &mut Tensor, root: usize) -> Result<()> {
        const WHAT: &str = "broadcast_tensor";
        with_dtype!(tensor.dtype, |T| self.broadcast(&mut tensor.buf_mut::<T>(WHAT)?, root))
    }

    /// All-gather along `dim`: the result concatenates every rank's `input` along `dim` in
    /// rank order, so its `shape[dim]` is `world_size * input.shape()[dim]` (torch's
    /// `all_gather_into_tensor` followed by `cat(dim)`). One flat all-gather, then a local
    /// rearrangement `[n, outer, d, inner] -> [outer, n*d, inner]` (on a GPU: one
    /// device-to-device copy per block of `d * inner` elements, `n * outer` of them).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `dim` is out of range (a scalar has no dimension), the
    /// result is too large, or the tensor is on a device the backend cannot reach;
    /// communication errors; the device runtime's error.
    pub fn all_gather_tensor(&self, input: &Tensor, dim: usize) -> Result<Tensor> {
        const WHAT: &str = "all_gather_tensor";
        let (outer, d, inner) = input.around(WHAT, dim)?;
        let n = self.world_size();
        let mut shape = input.shape.clone();
        shape[dim] = d.checked_mul(n).ok_or_else(|| {
            Error::invalid(format!("{WHAT}: {n} ranks × {d} elements along dim {dim} overflow usize"))
        })?;
        // Checked before communicating, so a result too large fails on every rank alike.
        let flat_len = shape_numel(WHAT, &shape, input.dtype.size())?;
        let mut flat = Tensor::alloc(WHAT, &[flat_len], input.dtype, input.place())?;
        with_dtype!(input.dtype, |T| self.all_gather(&input.buf::<T>(WHAT)?, &mut flat.buf_mut::<T>(WHAT)?))?;
        if outer == 1 || n == 1 {
            // [n, 1, d, inner] and [1, outer, d, inner] are already [outer, n*d, inner].
            flat.shape = shape;
            return Ok(flat);
        }
        let mut out = Tensor::alloc(WHAT, &shape, input.dtype, input.place())?;
        copy_blocks(&flat, &mut out, swap_leading(n, outer, d * inner * input.dtype.size()))?;
        Ok(out)
    }

    /// Reduce-scatter along `dim`: `input` is reduced element-wise over all ranks and split
    /// into world_size equal parts along `dim`; rank i gets part i, whose `shape[dim]` is
    /// `input.shape()[dim] / world_size` (torch's `reduce_scatter_tensor` along any dim).
    /// A local rearrangement `[outer, n, d/n, inner] -> [n, outer, d/n, inner]` (on a GPU:
    /// one device-to-device copy per block of `d/n * inner` elements), then one flat
    /// reduce-scatter.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `dim` is out of range, `shape[dim]` does not divide by
    /// the world size, or the tensor is on a device the backend cannot reach; communication
    /// errors; the device runtime's error.
    pub fn reduce_scatter_tensor(&self, input: &Tensor, dim: usize, op: ReduceOp) -> Result<Tensor> {
        const WHAT: &str = "reduce_scatter_tensor";
        let (outer, d, inner) = input.around(WHAT, dim)?;
        let n = self.world_size();
        if !d.is_multiple_of(n) {
            return Err(Error::invalid(format!(
                "{WHAT}: dim {dim} of the shape {:?} has {d} elements, which do not divide into {n} equal parts \
                 (one per rank)",
                input.shape
            )));
        }
        let part = d / n;
        let mut shape = input.shape.clone();
        shape[dim] = part;
        let staged;
        let src = if outer == 1 || n == 1 {
            input
        } else {
            let mut t = Tensor::alloc(WHAT, &input.shape, input.dtype, input.place())?;
            copy_blocks(input, &mut t, swap_leading(outer, n, part * inner * input.dtype.size()))?;
            staged = t;
            &staged
        };
        let mut out = Tensor::alloc(WHAT, &shape, input.dtype, input.place())?;
        with_dtype!(input.dtype, |T| self.reduce_scatter(&src.buf::<T>(WHAT)?, &mut out.buf_mut::<T>(WHAT)?, op))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local;

    /// A deterministic value for rank `r` at 3-D index `(i, j, k)`, small enough to be exact
    /// in every float type once summed over 5 ranks.
    fn val(r: usize, i: usize, j: usize, k: usize) -> i64 {
        (r * 37 + i * 11 + j * 5 + k) as i64 % 50
    }

    fn make(r: usize, shape: [usize; 3]) -> Vec<i64> {
        let mut v = Vec::with_capacity(shape.iter().product());
        for i in 0..shape[0] {
            for j in 0..shape[1] {
                for k in 0..shape[2] {
                    v.push(val(r, i, j, k));
                }
            }
        }
        v
    }

    /// Sequential reference for all_gather along `dim`: index loops over the output.
    fn gather_ref(n: usize, shape: [usize; 3], dim: usize) -> (Vec<usize>, Vec<i64>) {
        let mut out_shape = shape;
        out_shape[dim] *= n;
        let mut out = Vec::new();
        for i in 0..out_shape[0] {
            for j in 0..out_shape[1] {
                for k in 0..out_shape[2] {
                    let mut idx = [i, j, k];
                    let r = idx[dim] / shape[dim];
                    idx[dim] %= shape[dim];
                    out.push(val(r, idx[0], idx[1], idx[2]));
                }
            }
        }
        (out_shape.to_vec(), out)
    }

    /// Sequential reference for a Sum reduce_scatter along `dim`, as seen by rank `me`.
    fn scatter_ref(n: usize, me: usize, shape: [usize; 3], dim: usize) -> (Vec<usize>, Vec<i64>) {
        let mut out_shape = shape;
        out_shape[dim] /= n;
        let mut out = Vec::new();
        for i in 0..out_shape[0] {
            for j in 0..out_shape[1] {
                for k in 0..out_shape[2] {
                    let mut idx = [i, j, k];
                    idx[dim] += me * out_shape[dim];
                    out.push((0..n).map(|r| val(r, idx[0], idx[1], idx[2])).sum());
                }
            }
        }
        (out_shape.to_vec(), out)
    }

    fn to_dtype(v: &[i64], dtype: DType) -> Tensor {
        with_dtype!(dtype, |T| {
            let data: Vec<T> = v.iter().map(|&x| cast::<T>(x)).collect();
            Tensor::from_vec(data, &[v.len()]).unwrap()
        })
    }

    fn from_dtype(t: &Tensor) -> Vec<i64> {
        with_dtype!(t.dtype(), |T| t.as_slice::<T>().unwrap().iter().map(|&x| uncast::<T>(x)).collect())
    }

    trait Small: Element {
        fn from_i64(x: i64) -> Self;
        fn to_i64(self) -> i64;
    }
    macro_rules! small_int {
        ($($t:ty),*) => {$(impl Small for $t {
            fn from_i64(x: i64) -> Self { x as $t }
            fn to_i64(self) -> i64 { self as i64 }
        })*};
    }
    small_int!(i8, u8, i32, u32, i64, u64);
    impl Small for f32 {
        fn from_i64(x: i64) -> Self {
            x as f32
        }
        fn to_i64(self) -> i64 {
            self as i64
        }
    }
    impl Small for f64 {
        fn from_i64(x: i64) -> Self {
            x as f64
        }
        fn to_i64(self) -> i64 {
            self as i64
        }
    }
    impl Small for f16 {
        fn from_i64(x: i64) -> Self {
            f16::from_f64(x as f64)
        }
        fn to_i64(self) -> i64 {
            self.to_f64() as i64
        }
    }
    impl Small for bf16 {
        fn from_i64(x: i64) -> Self {
            bf16::from_f64(x as f64)
        }
        fn to_i64(self) -> i64 {
            self.to_f64() as i64
        }
    }
    fn cast<T: Small>(x: i64) -> T {
        T::from_i64(x)
    }
    fn uncast<T: Small>(x: T) -> i64 {
        x.to_i64()
    }

    #[test]
    fn construction_and_views() {
        let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        assert_eq!(
            (t.shape(), t.dtype(), t.device(), t.numel(), t.ndim()),
            (&[2, 3][..], DType::F32, Device::Cpu, 6, 2)
        );
        assert_eq!(t.as_slice::<f32>().unwrap()[4], 5.0);
        assert!(matches!(t.as_slice::<i32>(), Err(Error::InvalidArgument(_))));
        assert!(matches!(t.to_vec::<f64>(), Err(Error::InvalidArgument(_))));
        let mut t = t.reshape(&[3, 2]).unwrap();
        t.as_mut_slice::<f32>().unwrap()[0] = 9.0;
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![9.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert!(matches!(t.clone().reshape(&[4, 2]), Err(Error::InvalidArgument(_))));
        assert!(matches!(Tensor::from_vec(vec![1u8; 5], &[2, 3]), Err(Error::InvalidArgument(_))));
        assert!(matches!(Tensor::from_vec(vec![1u8; 5], &[usize::MAX, 3]), Err(Error::InvalidArgument(_))));
        // A GPU named by its Device: made through the process's CUDA runtime, or
        // BackendUnavailable where there is none (CI).
        match Tensor::zeros_on(&[2], DType::F32, Device::Cuda(0)) {
            Ok(g) => assert_eq!(g.device(), Device::Cuda(0)),
            Err(e) => assert!(matches!(e, Error::BackendUnavailable { .. }), "{e}"),
        }
        assert!(matches!(Tensor::zeros(&[0, usize::MAX, 2], DType::U8), Err(Error::InvalidArgument(_))));
        assert!(matches!(Tensor::zeros(&[usize::MAX / 4, 0], DType::F64), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            t.clone().to_device(Device::Rocm(1)),
            Err(Error::InvalidArgument(_) | Error::BackendUnavailable { .. })
        ));
        assert_eq!(t.clone().to_device(Device::Cpu).unwrap().numel(), 6);
        // Scalars, empty tensors and odd byte counts.
        let s = Tensor::from_vec(vec![7i8], &[]).unwrap();
        assert_eq!((s.numel(), s.ndim(), s.as_bytes().unwrap().len()), (1, 0, 1));
        let e = Tensor::zeros(&[3, 0, 2], DType::F64).unwrap();
        assert_eq!((e.numel(), e.to_vec::<f64>().unwrap().len()), (0, 0));
        for d in DType::ALL {
            let z = Tensor::zeros(&[3, 1], d).unwrap();
            assert_eq!(z.as_bytes().unwrap(), vec![0u8; 3 * d.size()]);
            assert_eq!(from_dtype(&to_dtype(&[1, 2, 3], d)), vec![1, 2, 3]);
        }
        let dbg = format!("{:?}", Tensor::from_vec(vec![1u32, 2], &[2]).unwrap());
        assert!(dbg.contains("[1, 2]") && dbg.contains("U32"), "{dbg}");
    }

    #[test]
    fn narrow_takes_shards() {
        let t = Tensor::from_vec((0..24i32).collect(), &[2, 3, 4]).unwrap();
        let n = t.narrow(1, 1, 2).unwrap();
        assert_eq!(n.shape(), &[2, 2, 4]);
        assert_eq!(n.to_vec::<i32>().unwrap(), vec![4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23]);
        assert_eq!(t.narrow(2, 3, 1).unwrap().to_vec::<i32>().unwrap(), vec![3, 7, 11, 15, 19, 23]);
        assert_eq!(t.narrow(0, 2, 0).unwrap().numel(), 0);
        assert!(matches!(t.narrow(1, 2, 2), Err(Error::InvalidArgument(_))));
        assert!(matches!(t.narrow(1, usize::MAX, 2), Err(Error::InvalidArgument(_))));
        assert!(matches!(t.narrow(3, 0, 1), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn all_gather_along_every_dim() {
        let shape = [2, 3, 4];
        for n in 1..=5 {
            for dim in 0..3 {
                let dtype = [DType::I64, DType::F32, DType::BF16][dim];
                let res = local::run(n, |comm| -> Result<Tensor> {
                    let t = to_dtype(&make(comm.rank(), shape), dtype).reshape(&shape)?;
                    comm.all_gather_tensor(&t, dim)
                })
                .unwrap();
                let (want_shape, want) = gather_ref(n, shape, dim);
                for (r, got) in res.into_iter().enumerate() {
                    let got = got.unwrap_or_else(|e| panic!("n={n} dim={dim} rank {r}: {e}"));
                    assert_eq!(got.shape(), &want_shape[..], "n={n} dim={dim} rank {r}");
                    assert_eq!(got.dtype(), dtype);
                    assert_eq!(from_dtype(&got), want, "n={n} dim={dim} rank {r}");
                }
            }
        }
    }

    #[test]
    fn reduce_scatter_along_every_dim() {
        for n in 1..=5 {
            for dim in 0..3 {
                let mut shape = [2, 3, 2];
                shape[dim] *= n;
                let dtype = [DType::F64, DType::I32, DType::F16][dim];
                let res = local::run(n, |comm| -> Result<Tensor> {
                    let t = to_dtype(&make(comm.rank(), shape), dtype).reshape(&shape)?;
                    comm.reduce_scatter_tensor(&t, dim, ReduceOp::Sum)
                })
                .unwrap();
                for (r, got) in res.into_iter().enumerate() {
                    let (want_shape, want) = scatter_ref(n, r, shape, dim);
                    let got = got.unwrap_or_else(|e| panic!("n={n} dim={dim} rank {r}: {e}"));
                    assert_eq!(got.shape(), &want_shape[..], "n={n} dim={dim} rank {r}");
                    assert_eq!(from_dtype(&got), want, "n={n} dim={dim} rank {r}");
                }
            }
        }
    }

    #[test]
    fn gather_then_scatter_round_trips() {
        // reduce_scatter(all_gather(x)) with Sum is n * x, along every dim.
        for n in 1..=5 {
            let res = local::run(n, |comm| -> Result<()> {
                for dim in 0..3 {
                    let x = to_dtype(&make(comm.rank(), [3, 2, 5]), DType::I64).reshape(&[3, 2, 5])?;
                    let g = comm.all_gather_tensor(&x, dim)?;
                    let back = comm.reduce_scatter_tensor(&g, dim, ReduceOp::Sum)?;
                    let want: Vec<i64> = x.as_slice::<i64>()?.iter().map(|v| v * n as i64).collect();
                    assert_eq!(back.shape(), x.shape());
                    assert_eq!(back.to_vec::<i64>()?, want, "n={n} dim={dim}");
                }
                Ok(())
            })
            .unwrap();
            assert!(res.iter().all(Result::is_ok), "n={n}: {res:?}");
        }
    }

    #[test]
    fn argument_errors_leave_the_communicator_usable() {
        for n in 1..=5 {
            let res = local::run(n, |comm| -> Result<()> {
                let t = Tensor::zeros(&[2, n + 1, 3], DType::F32)?;
                if n > 1 {
                    let e = comm.reduce_scatter_tensor(&t, 1, ReduceOp::Sum).unwrap_err();
                    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("divide")), "{e}");
                }
                for dim in [3, 7] {
                    let e = comm.all_gather_tensor(&t, dim).unwrap_err();
                    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("out of range")), "{e}");
                    let e = comm.reduce_scatter_tensor(&t, dim, ReduceOp::Sum).unwrap_err();
                    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
                }
                let scalar = Tensor::from_vec(vec![1.0f32], &[])?;
                assert!(matches!(comm.all_gather_tensor(&scalar, 0), Err(Error::InvalidArgument(_))));
                let mut bad = Tensor::zeros(&[1], DType::F32)?;
                assert!(matches!(comm.broadcast_tensor(&mut bad, n), Err(Error::InvalidArgument(_))));
                // Still usable.
                let mut x = Tensor::from_vec(vec![1i32, 2], &[2])?;
                comm.all_reduce_tensor(&mut x, ReduceOp::Sum)?;
                assert_eq!(x.to_vec::<i32>()?, vec![n as i32, 2 * n as i32]);
                Ok(())
            })
            .unwrap();
            assert!(res.iter().all(Result::is_ok), "n={n}: {res:?}");
        }
    }

    #[test]
    fn all_reduce_and_broadcast_every_dtype() {
        let res = local::run(3, |comm| -> Result<()> {
            for d in DType::ALL {
                let r = comm.rank() as i64;
                let mut t = to_dtype(&[r, r + 1, 2 * r, 5, 0, 1], d).reshape(&[2, 3])?;
                comm.all_reduce_tensor(&mut t, ReduceOp::Sum)?;
                assert_eq!(t.shape(), &[2, 3]);
                assert_eq!(from_dtype(&t), vec![3, 6, 6, 15, 0, 3], "{d}");
                let mut b = to_dtype(&[r + 10; 4], d).reshape(&[2, 2])?;
                comm.broadcast_tensor(&mut b, 2)?;
                assert_eq!(from_dtype(&b), vec![12; 4], "{d}");
            }
            // Empty tensors with huge other dims: no overflow, and a result too large is refused.
            let huge = Tensor::zeros(&[0, usize::MAX / 16, 2], DType::F32)?;
            assert_eq!(comm.all_gather_tensor(&huge, 0)?.shape(), &[0, usize::MAX / 16, 2]);
            assert!(matches!(comm.all_gather_tensor(&huge, 1), Err(Error::InvalidArgument(_))));
            assert!(matches!(comm.reduce_scatter_tensor(&huge, 2, ReduceOp::Sum), Err(Error::InvalidArgument(_))));
            // Empty tensors go through too.
            let e = Tensor::zeros(&[0, 6], DType::F32)?;
            assert_eq!(comm.all_gather_tensor(&e, 1)?.shape(), &[0, 18]);
            assert_eq!(comm.reduce_scatter_tensor(&e, 1, ReduceOp::Sum)?.shape(), &[0, 2]);
            Ok(())
        })
        .unwrap();
        assert!(res.iter().all(Result::is_ok), "{res:?}");
    }

    // ---- Device tensors, over the host double posing as a two-GPU CUDA runtime. ----

    use crate::xccl::runtime::host::HostRuntime;

    fn gpu() -> Gpu {
        Gpu::new(Arc::new(HostRuntime::new(2)), 1).unwrap()
    }

    const SHAPES: &[&[usize]] = &[&[], &[0], &[3, 0, 2], &[1], &[7], &[3, 5], &[2, 3, 5], &[3, 1, 5, 3]];

    fn host_tensor(shape: &[usize], dtype: DType, seed: usize) -> Tensor {
        let numel: usize = shape.iter().product();
        let v: Vec<i64> = (0..numel).map(|i| ((i * 7 + seed * 13) % 60) as i64).collect();
        to_dtype(&v, dtype).reshape(shape).unwrap()
    }

    /// The bytes of any tensor, copied back to the host.
    fn host_bytes(t: &Tensor) -> Vec<u8> {
        t.clone().to_device(Device::Cpu).unwrap().as_bytes().unwrap().to_vec()
    }

    #[test]
    fn device_round_trips_every_dtype_and_shape() {
        let g = gpu();
        for d in DType::ALL {
            for (i, &shape) in SHAPES.iter().enumerate() {
                let h = host_tensor(shape, d, i);
                let dev = h.clone().to_gpu(&g).unwrap();
                assert_eq!(
                    (dev.shape(), dev.dtype(), dev.device(), dev.numel()),
                    (shape, d, Device::Cuda(1), h.numel())
                );
                let back = dev.clone().to_device(Device::Cpu).unwrap();
                assert_eq!(back.device(), Device::Cpu);
                assert_eq!(back.shape(), shape);
                assert_eq!(back.as_bytes().unwrap(), h.as_bytes().unwrap(), "{d} {shape:?}");
                with_dtype!(d, |T| assert_eq!(dev.to_vec::<T>().unwrap(), h.to_vec::<T>().unwrap()));
                // Already there: the same tensor; to another GPU of the runtime: through the host.
                let same = dev.clone().to_gpu(&g).unwrap();
                assert_eq!(host_bytes(&same), h.as_bytes().unwrap());
                let other = Gpu::new(Arc::clone(g.runtime()), 0).unwrap();
                let moved = dev.clone().to_gpu(&other).unwrap();
                assert_eq!(moved.device(), Device::Cuda(0));
                assert_eq!(host_bytes(&moved), h.as_bytes().unwrap(), "{d} {shape:?}");
                assert_eq!(dev.clone().to_device(Device::Cuda(1)).unwrap().device(), Device::Cuda(1));
                let z = Tensor::zeros_on_gpu(shape, d, &g).unwrap();
                assert_eq!(host_bytes(&z), Tensor::zeros(shape, d).unwrap().as_bytes().unwrap());
            }
        }
        assert!(matches!(Tensor::zeros_on_gpu(&[usize::MAX, 2], DType::U8, &g), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn device_tensors_refuse_host_views() {
        let g = gpu();
        let mut dev = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap().to_gpu(&g).unwrap();
        let hint = |e: Error| matches!(e, Error::InvalidArgument(ref m) if m.contains("cuda:1") && m.contains("to_device(Device::Cpu)"));
        assert!(hint(dev.as_slice::<f32>().unwrap_err()));
        assert!(hint(dev.as_mut_slice::<f32>().unwrap_err()));
        assert!(hint(dev.as_bytes().unwrap_err()));
        assert!(matches!(dev.to_vec::<i32>(), Err(Error::InvalidArgument(_))));
        assert_eq!(dev.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
        let dbg = format!("{dev:?}");
        assert!(dbg.contains("Cuda(1)") && dbg.contains("device memory"), "{dbg}");
        // A device named by its Device goes through the process's runtime of that vendor:
        // where there is none, that is BackendUnavailable, not a panic.
        let absent = |r: Result<Tensor>| match r {
            Ok(t) => t.device() == Device::Cuda(0),
            Err(e) => matches!(e, Error::BackendUnavailable { ref backend, .. } if backend == "nccl"),
        };
        assert!(absent(Tensor::zeros_on(&[2], DType::F32, Device::Cuda(0))));
        assert!(absent(Tensor::zeros(&[2], DType::F32).unwrap().to_device(Device::Cuda(0))));
        assert_eq!(Tensor::zeros_on(&[2], DType::F32, Device::Cpu).unwrap().device(), Device::Cpu);
    }

    #[test]
    fn device_narrow_and_reshape_match_the_host() {
        let g = gpu();
        for (k, d) in DType::ALL.into_iter().enumerate() {
            for &shape in &SHAPES[4..] {
                let h = host_tensor(shape, d, k);
                let dev = h.clone().to_gpu(&g).unwrap();
                for dim in 0..shape.len() {
                    for start in 0..=shape[dim] {
                        for len in 0..=shape[dim] - start {
                            let want = h.narrow(dim, start, len).unwrap();
                            let got = dev.narrow(dim, start, len).unwrap();
                            assert_eq!(got.device(), Device::Cuda(1));
                            assert_eq!(got.shape(), want.shape());
                            assert_eq!(host_bytes(&got), want.as_bytes().unwrap(), "{d} {shape:?} {dim} {start} {len}");
                        }
                    }
                    assert!(matches!(dev.narrow(dim, 1, shape[dim]), Err(Error::InvalidArgument(_))));
                }
                assert!(matches!(dev.narrow(shape.len(), 0, 0), Err(Error::InvalidArgument(_))));
                let flat = dev.clone().reshape(&[h.numel()]).unwrap();
                assert_eq!((flat.shape(), flat.device()), (&[h.numel()][..], Device::Cuda(1)));
                assert_eq!(host_bytes(&flat), h.as_bytes().unwrap());
                assert!(matches!(dev.clone().reshape(&[h.numel() + 1]), Err(Error::InvalidArgument(_))));
            }
        }
        // An empty result with a huge leading extent copies nothing (and finishes).
        let e = Tensor::zeros_on_gpu(&[usize::MAX / 16, 0, 2], DType::U8, &g).unwrap();
        assert_eq!(e.narrow(2, 1, 1).unwrap().shape(), &[usize::MAX / 16, 0, 1]);
    }

    #[test]
    fn device_block_permutation_matches_the_host() {
        let g = gpu();
        for (a, b, block) in [(1, 1, 4), (2, 3, 4), (3, 2, 1), (5, 4, 6), (4, 5, 0), (0, 3, 2)] {
            let src =
                Tensor::from_vec((0..(a * b * block) as u32).map(|x| x as u8).collect::<Vec<u8>>(), &[a * b * block])
                    .unwrap();
            let mut want = Tensor::zeros(src.shape(), DType::U8).unwrap();
            copy_blocks(&src, &mut want, swap_leading(a, b, block)).unwrap();
            let dsrc = src.clone().to_gpu(&g).unwrap();
            let mut got = Tensor::zeros_on_gpu(src.shape(), DType::U8, &g).unwrap();
            copy_blocks(&dsrc, &mut got, swap_leading(a, b, block)).unwrap();
            assert_eq!(host_bytes(&got), want.as_bytes().unwrap(), "{a} {b} {block}");
            // The independent reference: [a, b, block] -> [b, a, block] by index.
            let s = src.as_bytes().unwrap();
            let reference: Vec<u8> = (0..b)
                .flat_map(|j| (0..a).flat_map(move |i| (0..block).map(move |k| s[(i * b + j) * block + k])))
                .collect();
            assert_eq!(want.as_bytes().unwrap(), reference);
            // Host to device blocks are refused, not attempted.
            assert!(matches!(copy_blocks(&src, &mut got, swap_leading(a, b, block)), Err(Error::InvalidArgument(_))));
        }
    }

    #[test]
    fn device_clones_share_until_written() {
        let g = gpu();
        let a = Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap().to_gpu(&g).unwrap();
        let mut b = a.clone();
        let new = Tensor::from_vec(vec![7i64, 8, 9], &[3]).unwrap().to_gpu(&g).unwrap();
        // A write (as a collective's output makes it) unshares b first.
        copy_blocks(&new, &mut b, [Block { src: 0, dst: 0, len: 24 }].into_iter()).unwrap();
        assert_eq!(b.to_vec::<i64>().unwrap(), vec![7, 8, 9]);
        assert_eq!(a.to_vec::<i64>().unwrap(), vec![1, 2, 3]);
        let c = a.try_clone().unwrap();
        assert_eq!(c.to_vec::<i64>().unwrap(), vec![1, 2, 3]);
        let ptr = |t: &Tensor| t.buf::<i64>("test").unwrap().as_raw().ptr;
        assert_ne!(ptr(&c), ptr(&a));
        assert_eq!(ptr(&a.clone()), ptr(&a));
        // A unique tensor is written in place.
        let mut c = c;
        let before = ptr(&c);
        assert_eq!(c.buf_mut::<i64>("test").unwrap().as_raw_mut().ptr.cast_const(), before);
        let h = Tensor::from_vec(vec![5u8], &[]).unwrap();
        assert_eq!(h.try_clone().unwrap().to_vec::<u8>().unwrap(), vec![5]);
    }

    #[test]
    fn device_tensors_reach_the_backends_device_check() {
        let res = local::run(2, |comm| -> Result<()> {
            let g = gpu();
            let refused = |e: Error, what: &str| {
                assert!(
                    matches!(e, Error::InvalidArgument(ref m) if m.contains("cuda:1") && m.contains("host memory only")),
                    "{what}: {e}"
                );
            };
            let h = host_tensor(&[4, 6], DType::F32, comm.rank());
            let mut dev = h.clone().to_gpu(&g)?;
            refused(comm.all_reduce_tensor(&mut dev, ReduceOp::Sum).unwrap_err(), "all_reduce");
            refused(comm.broadcast_tensor(&mut dev, 0).unwrap_err(), "broadcast");
            for dim in 0..2 {
                refused(comm.all_gather_tensor(&dev, dim).unwrap_err(), "all_gather");
                refused(comm.reduce_scatter_tensor(&dev, dim, ReduceOp::Sum).unwrap_err(), "reduce_scatter");
            }
            // The tensor is untouched and the communicator still usable.
            assert_eq!(host_bytes(&dev), h.as_bytes()?);
            let mut x = dev.to_device(Device::Cpu)?;
            comm.all_reduce_tensor(&mut x, ReduceOp::Sum)?;
            let want: Vec<i64> = (0..24).map(|i| ((i * 7) % 60 + (i * 7 + 13) % 60) as i64).collect();
            assert_eq!(from_dtype(&x), want);
            Ok(())
        })
        .unwrap();
        assert!(res.iter().all(Result::is_ok), "{res:?}");
    }
}
