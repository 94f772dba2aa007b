//! What every algorithm computes with: [`Kernel`] (how values combine), the blocks a buffer
//! is cut into ([`block`], [`block_bytes`]), [`Scratch`] space and [`split_pair`].

use std::ops::Range;

use crate::backend::reduce as kernels;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::reduce_op::ReduceOp;

/// How values are combined: a dtype and an op (`Avg` combines as `Sum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    /// Element type of the working buffers.
    pub dtype: DType,
    /// The reduction.
    pub op: ReduceOp,
}

impl Kernel {
    /// `acc = acc (op) src`, element-wise.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on length or alignment problems (internal bugs).
    pub fn combine(&self, acc: &mut [u8], src: &[u8]) -> Result<()> {
        kernels::combine(self.dtype, self.op, acc, src)
    }

    /// `acc = base (op) src` element-wise, or `acc = acc (op) src` without a `base`.
    ///
    /// # Errors
    /// As [`Kernel::combine`].
    pub fn combine_from(&self, acc: &mut [u8], base: Option<&[u8]>, src: &[u8]) -> Result<()> {
        match base {
            Some(b) => kernels::combine_into(self.dtype, self.op, acc, b, src),
            None => self.combine(acc, src),
        }
    }

    /// Bytes per element.
    pub fn elem(&self) -> usize {
        self.dtype.size()
    }
}

/// The `i`-th of `n` near-equal blocks of `count` elements: the first `count % n` blocks
/// have one element more. Blocks may be empty when `count < n`.
pub fn block(count: usize, n: usize, i: usize) -> Range<usize> {
    let base = count / n;
    let extra = count % n;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start..start + len
}

/// [`block`] in bytes for elements of `elem` bytes.
pub fn block_bytes(count: usize, n: usize, i: usize, elem: usize) -> Range<usize> {
    let r = block(count, n, i);
    r.start * elem..r.end * elem
}

/// A zeroed scratch buffer aligned for every dtype (8 bytes).
pub struct Scratch {
    words: Vec<u64>,
    len: usize,
}

impl Scratch {
    /// `len` zeroed bytes.
    pub fn new(len: usize) -> Scratch {
        Scratch { words: vec![0u64; len.div_ceil(8)], len }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }

    /// A copy of `src` in aligned memory.
    pub fn copy_of(src: &[u8]) -> Scratch {
        let mut s = Scratch::new(src.len());
        s.bytes_mut().copy_from_slice(src);
        s
    }
}

/// Two disjoint byte ranges of one buffer: the first to read, the second to write.
///
/// # Errors
/// [`Error::InvalidArgument`] when the ranges overlap or leave the buffer (internal bugs).
pub fn split_pair(buf: &mut [u8], read: Range<usize>, write: Range<usize>) -> Result<(&[u8], &mut [u8])> {
    let ok = read.end <= buf.len() && write.end <= buf.len() && (read.end <= write.start || write.end <= read.start);
    if !(ok || read.is_empty() || write.is_empty()) {
        return Err(Error::invalid(format!("overlapping blocks {read:?} and {write:?} in {} bytes", buf.len())));
    }
    if read.is_empty() {
        let w = buf.get_mut(write.clone()).ok_or_else(|| Error::invalid(format!("block {write:?} out of range")))?;
        return Ok((&[], w));
    }
    if write.is_empty() {
        let r = buf.get(read.clone()).ok_or_else(|| Error::invalid(format!("block {read:?} out of range")))?;
        return Ok((r, &mut []));
    }
    if read.start < write.start {
        let (lo, hi) = buf.split_at_mut(write.start);
        Ok((&lo[read], &mut hi[..write.len()]))
    } else {
        let (lo, hi) = buf.split_at_mut(read.start);
        Ok((&hi[..read.len()], &mut lo[write]))
    }
}
