//! The tensor collectives: each dispatches on the dtype to the typed collective, with the
//! tensor's memory where it lives.

use super::{copy_blocks, shape_numel, swap_leading, Tensor};
use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::reduce_op::ReduceOp;
use crate::with_dtype;

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
        with_dtype!(tensor.dtype, T => self.all_reduce(&mut tensor.buf_mut::<T>(WHAT)?, op))
    }

    /// Broadcast in place: every rank's `tensor` becomes the root's.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a root out of range or a tensor on a device the
    /// backend cannot reach; communication errors.
    pub fn broadcast_tensor(&self, tensor: &mut Tensor, root: usize) -> Result<()> {
        const WHAT: &str = "broadcast_tensor";
        with_dtype!(tensor.dtype, T => self.broadcast(&mut tensor.buf_mut::<T>(WHAT)?, root))
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
        with_dtype!(input.dtype, T => self.all_gather(&input.buf::<T>(WHAT)?, &mut flat.buf_mut::<T>(WHAT)?))?;
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
        with_dtype!(input.dtype, T => self.reduce_scatter(&src.buf::<T>(WHAT)?, &mut out.buf_mut::<T>(WHAT)?, op))?;
        Ok(out)
    }
}
