//! A small dense [`Tensor`] and the tensor-parallel collectives over it.
//!
//! A tensor is a shape, a [`DType`], a [`Device`] and contiguous row-major storage. The
//! storage is dtype-erased but aligned for every dtype (it is backed by `u64` words), so
//! [`Tensor::as_slice`] views it as `&[T]` for the tensor's element type without copying and
//! without `unsafe`. Only [`Device::Cpu`] storage exists today.
//!
//! The collectives ([`Communicator::all_reduce_tensor`], [`Communicator::broadcast_tensor`],
//! [`Communicator::all_gather_tensor`], [`Communicator::reduce_scatter_tensor`]) dispatch on
//! the dtype to the typed slice collectives. Gather and reduce-scatter work along any
//! dimension: the tensor is rearranged so that one flat collective moves each rank's block.
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

use half::{bf16, f16};

use crate::communicator::Communicator;
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::reduce_op::ReduceOp;

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
/// Cloning copies the data.
#[derive(Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    device: Device,
    numel: usize,
    /// `numel * dtype.size()` bytes, rounded up to whole words; the padding stays zero.
    data: Vec<u64>,
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

fn check_cpu(what: &str, device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        other => Err(Error::invalid(format!(
            "{what}: tensors on device {other} are not supported yet; only cpu storage exists"
        ))),
    }
}

/// Copies `src`, viewed as `[a, b, block]` bytes, into `dst` as `[b, a, block]`.
fn swap_leading(src: &[u8], dst: &mut [u8], a: usize, b: usize, block: usize) {
    if block == 0 {
        return;
    }
    for i in 0..a {
        for j in 0..b {
            let s = (i * b + j) * block;
            let d = (j * a + i) * block;
            dst[d..d + block].copy_from_slice(&src[s..s + block]);
        }
    }
}

impl Tensor {
    fn alloc(what: &str, shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        check_cpu(what, device)?;
        let numel = shape_numel(what, shape, dtype.size())?;
        let words = (numel * dtype.size()).div_ceil(8);
        Ok(Tensor { shape: shape.to_vec(), dtype, device, numel, data: vec![0u64; words] })
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
        let mut t = Tensor::alloc("Tensor::from_vec", shape, T::DTYPE, Device::Cpu)?;
        t.bytes_mut().copy_from_slice(bytemuck::cast_slice(&data));
        Ok(t)
    }

    /// A CPU tensor of `shape` and `dtype` filled with zeros.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the tensor's size in bytes overflows `usize`.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::alloc("Tensor::zeros", shape, dtype, Device::Cpu)
    }

    /// A tensor of `shape` and `dtype` filled with zeros on `device`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any device other than [`Device::Cpu`] (the only storage
    /// that exists today) and when the size in bytes overflows `usize`.
    pub fn zeros_on(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::alloc("Tensor::zeros_on", shape, dtype, device)
    }

    /// This tensor moved to `device` (the same tensor when it is already there).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any device other than [`Device::Cpu`].
    pub fn to_device(self, device: Device) -> Result<Tensor> {
        check_cpu("Tensor::to_device", device)?;
        Ok(self)
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
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.data)[..self.numel * self.dtype.size()]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.numel * self.dtype.size();
        &mut bytemuck::cast_slice_mut(&mut self.data)[..n]
    }

    fn check_dtype<T: Element>(&self, what: &str) -> Result<()> {
        if T::DTYPE == self.dtype {
            Ok(())
        } else {
            Err(Error::invalid(format!("{what}: the tensor holds {}, not {}", self.dtype, T::DTYPE)))
        }
    }

    /// The elements as a slice of `T` (row-major).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `T` is not the tensor's dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check_dtype::<T>("Tensor::as_slice")?;
        bytemuck::try_cast_slice(self.as_bytes())
            .map_err(|e| Error::invalid(format!("Tensor::as_slice: cannot view the storage as {}: {e}", T::DTYPE)))
    }

    /// The elements as a mutable slice of `T` (row-major).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `T` is not the tensor's dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check_dtype::<T>("Tensor::as_mut_slice")?;
        bytemuck::try_cast_slice_mut(self.bytes_mut())
            .map_err(|e| Error::invalid(format!("Tensor::as_mut_slice: cannot view the storage as {}: {e}", T::DTYPE)))
    }

    /// A copy of the elements as a `Vec<T>` (row-major).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `T` is not the tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.as_slice::<T>().map(<[T]>::to_vec)
    }

    /// The same data with another shape of the same element count (no copy).
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
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `dim` is out of range or the range does not fit in
    /// `shape[dim]`.
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
        let mut out = Tensor::alloc("Tensor::narrow", &shape, self.dtype, self.device)?;
        let row = inner * self.dtype.size();
        let (src, dst) = (self.as_bytes(), out.bytes_mut());
        if row > 0 {
            for o in 0..outer {
                let s = (o * d + start) * row;
                let t = o * len * row;
                dst[t..t + len * row].copy_from_slice(&src[s..s + len * row]);
            }
        }
        Ok(out)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 16;
        let mut s = f.debug_struct("Tensor");
        s.field("shape", &self.shape).field("dtype", &self.dtype).field("device", &self.device);
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

/// Tensor collectives: each dispatches on the tensor's dtype to the typed slice collective.
///
/// Every rank must pass tensors of the same dtype and shape. Different element counts or
/// dtypes are caught as [`Error::Mismatch`]; different shapes with the same element count
/// are not detected and give a meaningless (but memory-safe) result.
impl Communicator {
    /// All-reduce in place: every rank's `tensor` becomes the element-wise reduction of all
    /// ranks' tensors.
    ///
    /// # Errors
    /// Communication errors ([`Error::Timeout`], [`Error::Mismatch`], [`Error::PeerLost`],
    /// [`Error::Aborted`]).
    pub fn all_reduce_tensor(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        check_cpu("all_reduce_tensor", tensor.device)?;
        with_dtype!(tensor.dtype, |T| self.all_reduce(tensor.as_mut_slice::<T>()?, op))
    }

    /// Broadcast in place: every rank's `tensor` becomes the root's.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a root out of range; communication errors.
    pub fn broadcast_tensor(&self, tensor: &mut Tensor, root: usize) -> Result<()> {
        check_cpu("broadcast_tensor", tensor.device)?;
        with_dtype!(tensor.dtype, |T| self.broadcast(tensor.as_mut_slice::<T>()?, root))
    }

    /// All-gather along `dim`: the result concatenates every rank's `input` along `dim` in
    /// rank order, so its `shape[dim]` is `world_size * input.shape()[dim]` (torch's
    /// `all_gather_into_tensor` followed by `cat(dim)`). One flat all-gather, then a local
    /// rearrangement `[n, outer, d, inner] -> [outer, n*d, inner]`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `dim` is out of range (a scalar has no dimension) or
    /// the result is too large; communication errors.
    pub fn all_gather_tensor(&self, input: &Tensor, dim: usize) -> Result<Tensor> {
        const WHAT: &str = "all_gather_tensor";
        check_cpu(WHAT, input.device)?;
        let (outer, d, inner) = input.around(WHAT, dim)?;
        let n = self.world_size();
        let mut shape = input.shape.clone();
        shape[dim] = d.checked_mul(n).ok_or_else(|| {
            Error::invalid(format!("{WHAT}: {n} ranks × {d} elements along dim {dim} overflow usize"))
        })?;
        // Checked before communicating, so a result too large fails on every rank alike.
        let flat_len = shape_numel(WHAT, &shape, input.dtype.size())?;
        let mut flat = Tensor::alloc(WHAT, &[flat_len], input.dtype, input.device)?;
        with_dtype!(input.dtype, |T| self.all_gather(input.as_slice::<T>()?, flat.as_mut_slice::<T>()?))?;
        if outer == 1 || n == 1 {
            // [n, 1, d, inner] and [1, outer, d, inner] are already [outer, n*d, inner].
            flat.shape = shape;
            return Ok(flat);
        }
        let mut out = Tensor::alloc(WHAT, &shape, input.dtype, input.device)?;
        swap_leading(flat.as_bytes(), out.bytes_mut(), n, outer, d * inner * input.dtype.size());
        Ok(out)
    }

    /// Reduce-scatter along `dim`: `input` is reduced element-wise over all ranks and split
    /// into world_size equal parts along `dim`; rank i gets part i, whose `shape[dim]` is
    /// `input.shape()[dim] / world_size` (torch's `reduce_scatter_tensor` along any dim).
    /// A local rearrangement `[outer, n, d/n, inner] -> [n, outer, d/n, inner]`, then one flat
    /// reduce-scatter.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `dim` is out of range or `shape[dim]` does not divide by
    /// the world size; communication errors.
    pub fn reduce_scatter_tensor(&self, input: &Tensor, dim: usize, op: ReduceOp) -> Result<Tensor> {
        const WHAT: &str = "reduce_scatter_tensor";
        check_cpu(WHAT, input.device)?;
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
            let mut t = Tensor::alloc(WHAT, &input.shape, input.dtype, input.device)?;
            swap_leading(input.as_bytes(), t.bytes_mut(), outer, n, part * inner * input.dtype.size());
            staged = t;
            &staged
        };
        let mut out = Tensor::alloc(WHAT, &shape, input.dtype, input.device)?;
        with_dtype!(input.dtype, |T| self.reduce_scatter(src.as_slice::<T>()?, out.as_mut_slice::<T>()?, op))?;
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
        assert!(matches!(Tensor::zeros_on(&[2], DType::F32, Device::Cuda(0)), Err(Error::InvalidArgument(_))));
        assert!(matches!(Tensor::zeros(&[0, usize::MAX, 2], DType::U8), Err(Error::InvalidArgument(_))));
        assert!(matches!(Tensor::zeros(&[usize::MAX / 4, 0], DType::F64), Err(Error::InvalidArgument(_))));
        assert!(matches!(t.clone().to_device(Device::Rocm(1)), Err(Error::InvalidArgument(_))));
        assert_eq!(t.clone().to_device(Device::Cpu).unwrap().numel(), 6);
        // Scalars, empty tensors and odd byte counts.
        let s = Tensor::from_vec(vec![7i8], &[]).unwrap();
        assert_eq!((s.numel(), s.ndim(), s.as_bytes().len()), (1, 0, 1));
        let e = Tensor::zeros(&[3, 0, 2], DType::F64).unwrap();
        assert_eq!((e.numel(), e.to_vec::<f64>().unwrap().len()), (0, 0));
        for d in DType::ALL {
            let z = Tensor::zeros(&[3, 1], d).unwrap();
            assert_eq!(z.as_bytes(), vec![0u8; 3 * d.size()]);
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
}
