//! Reduction kernels: combine two buffers element-wise for every dtype × op.
//!
//! Loops are written so the compiler vectorizes them (one tight loop per dtype and op, the
//! op chosen outside the loop). `f16`/`bf16` collectives do not reduce in half precision:
//! the dispatcher widens them to `f32` working buffers ([`widen`]), reduces there, and rounds
//! once at the end ([`narrow`]), so a sum over many ranks is as exact as the type allows.

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::reduce_op::ReduceOp;
use crate::with_dtype;

mod sealed {
    pub trait Sealed {}
    impl<T: bytemuck::Pod> Sealed for T {}
}

/// The reduction rules of every element type, in one place for every engine: integer sums
/// and products wrap (two's complement), float min/max let a NaN lose against a number
/// (minNum/maxNum), f16/bf16 combine in f32 and round each step to nearest-even, and `Avg`
/// divides a sum by the count (integers truncate toward zero).
pub trait Arith: bytemuck::Pod + sealed::Sealed {
    /// `a + b`.
    fn add(a: Self, b: Self) -> Self;
    /// `a * b`.
    fn mul(a: Self, b: Self) -> Self;
    /// The smaller (a NaN loses).
    fn min(a: Self, b: Self) -> Self;
    /// The larger (a NaN loses).
    fn max(a: Self, b: Self) -> Self;
    /// `a / n`, for `Avg`.
    fn div_count(a: Self, n: usize) -> Self;
    /// `a op b`; `Avg` combines as `Sum` (the division comes once, at the end).
    #[inline(always)]
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => Self::add(a, b),
            ReduceOp::Prod => Self::mul(a, b),
            ReduceOp::Min => Self::min(a, b),
            ReduceOp::Max => Self::max(a, b),
        }
    }
}

/// `inout[i] = input[i] op inout[i]` for `len` elements of `T` over memory that need not be
/// aligned: the shape of an MPI user operation (`MPI_Op_create`), whose temporaries MPI does
/// not promise to align.
///
/// # Safety
/// `input` must point to `len` readable and `inout` to `len` readable and writable elements
/// of `T` (alignment not required); the ranges may not overlap.
pub unsafe fn combine_unaligned<T: Arith>(op: ReduceOp, input: *const u8, inout: *mut u8, len: usize) {
    let (a, b) = (input.cast::<T>(), inout.cast::<T>());
    for i in 0..len {
        // SAFETY: i < len, and the caller promises `len` elements behind both pointers.
        unsafe {
            let x = a.add(i).read_unaligned();
            let y = b.add(i).read_unaligned();
            b.add(i).write_unaligned(T::combine(op, x, y));
        }
    }
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            // Truncates toward zero. A world size that does not fit the type (above 127 for
            // i8, 255 for u8) gives 0: no value of the type can be that many times larger.
            #[inline(always)] fn div_count(a: Self, n: usize) -> Self {
                match <$t>::try_from(n) { Ok(d) if d != 0 => a.wrapping_div(d), _ => 0 }
            }
        }
    )*};
}
int_arith!(i8, u8, i32, u32, i64, u64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { a + b }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { a * b }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { a.min(b) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { a.max(b) }
            #[inline(always)] fn div_count(a: Self, n: usize) -> Self { a / n as $t }
        }
    )*};
}
float_arith!(f32, f64);

macro_rules! half_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() + b.to_f32()) }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() * b.to_f32()) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32().min(b.to_f32())) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32().max(b.to_f32())) }
            #[inline(always)] fn div_count(a: Self, n: usize) -> Self { <$t>::from_f32(a.to_f32() / n as f32) }
        }
    )*};
}
half_arith!(f16, bf16);

#[inline(always)]
fn zip_apply<T: Arith>(acc: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (a, b) in acc.iter_mut().zip(src) {
        *a = f(*a, *b);
    }
}

fn combine_typed<T: Arith>(op: ReduceOp, acc: &mut [u8], src: &[u8]) -> Result<()> {
    let acc: &mut [T] = bytemuck::try_cast_slice_mut(acc).map_err(misaligned)?;
    let src: &[T] = bytemuck::try_cast_slice(src).map_err(misaligned)?;
    match op {
        ReduceOp::Sum | ReduceOp::Avg => zip_apply(acc, src, T::add),
        ReduceOp::Prod => zip_apply(acc, src, T::mul),
        ReduceOp::Min => zip_apply(acc, src, T::min),
        ReduceOp::Max => zip_apply(acc, src, T::max),
    }
    Ok(())
}

// Empty slices need no work, and may be dangling `&mut []`s that are not aligned for the
// dtype (which bytemuck would reject): every entry point below returns early on them.

fn misaligned(e: bytemuck::PodCastError) -> Error {
    Error::invalid(format!("buffer is not aligned for its element type ({e:?})"))
}

/// `acc[i] = acc[i] (op) src[i]` for every element. `Avg` combines as `Sum`
/// (the division happens once, in [`divide`]).
///
/// # Errors
/// [`Error::InvalidArgument`] when the lengths differ or a buffer is misaligned for `dtype`.
pub fn combine(dtype: DType, op: ReduceOp, acc: &mut [u8], src: &[u8]) -> Result<()> {
    if acc.len() != src.len() || !acc.len().is_multiple_of(dtype.size()) {
        return Err(Error::invalid(format!("reduction of {} bytes with {} bytes of {dtype}", acc.len(), src.len())));
    }
    if acc.is_empty() {
        return Ok(());
    }
    with_dtype!(dtype, T => combine_typed::<T>(op, acc, src))
}

/// `dst = a (op) b`, element-wise (`Avg` adds: its division comes last, as in [`combine`]);
/// `dst` may alias neither source. One pass that reads two buffers and writes a third,
/// where [`combine`] into a copy of `a` would first copy it.
///
/// # Errors
/// [`Error::InvalidArgument`] when the lengths differ or a buffer is misaligned for `dtype`.
pub fn combine_into(dtype: DType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) -> Result<()> {
    if dst.len() != a.len() || a.len() != b.len() || !dst.len().is_multiple_of(dtype.size()) {
        return Err(Error::invalid(format!(
            "reduction of {} and {} bytes into {} bytes of {dtype}",
            a.len(),
            b.len(),
            dst.len()
        )));
    }
    if dst.is_empty() {
        return Ok(());
    }
    with_dtype!(dtype, T => combine3_typed::<T>(op, dst, a, b))
}

fn divide_typed<T: Arith>(buf: &mut [u8], n: usize) -> Result<()> {
    let buf: &mut [T] = bytemuck::try_cast_slice_mut(buf).map_err(misaligned)?;
    for x in buf {
        *x = T::div_count(*x, n);
    }
    Ok(())
}

/// Divides every element by `n` (the last step of `Avg`): exact division for floats,
/// truncation toward zero for integers.
///
/// # Errors
/// [`Error::InvalidArgument`] when the buffer is misaligned for `dtype`.
pub fn divide(dtype: DType, buf: &mut [u8], n: usize) -> Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    with_dtype!(dtype, T => divide_typed::<T>(buf, n))
}

/// Converts `f16`/`bf16` elements to `f32` (`dtype` must be one of the two).
///
/// # Errors
/// [`Error::InvalidArgument`] for another dtype or a misaligned buffer.
pub fn widen(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    if src.is_empty() && matches!(dtype, DType::F16 | DType::BF16) {
        return Ok(());
    }
    match dtype {
        DType::F16 => {
            let s: &[f16] = bytemuck::try_cast_slice(src).map_err(misaligned)?;
            for (d, x) in dst.iter_mut().zip(s) {
                *d = x.to_f32();
            }
        }
        DType::BF16 => {
            let s: &[bf16] = bytemuck::try_cast_slice(src).map_err(misaligned)?;
            for (d, x) in dst.iter_mut().zip(s) {
                *d = x.to_f32();
            }
        }
        other => return Err(Error::invalid(format!("widen expects f16 or bf16, not {other}"))),
    }
    Ok(())
}

/// Rounds `f32` values to `f16`/`bf16` (round to nearest even), the inverse of [`widen`].
///
/// # Errors
/// [`Error::InvalidArgument`] for another dtype or a misaligned buffer.
pub fn narrow(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    if dst.is_empty() && matches!(dtype, DType::F16 | DType::BF16) {
        return Ok(());
    }
    match dtype {
        DType::F16 => {
            let d: &mut [f16] = bytemuck::try_cast_slice_mut(dst).map_err(misaligned)?;
            for (o, x) in d.iter_mut().zip(src) {
                *o = f16::from_f32(*x);
            }
        }
        DType::BF16 => {
            let d: &mut [bf16] = bytemuck::try_cast_slice_mut(dst).map_err(misaligned)?;
            for (o, x) in d.iter_mut().zip(src) {
                *o = bf16::from_f32(*x);
            }
        }
        other => return Err(Error::invalid(format!("narrow expects f16 or bf16, not {other}"))),
    }
    Ok(())
}

fn combine3_typed<T: Arith>(op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) -> Result<()> {
    let dst: &mut [T] = bytemuck::try_cast_slice_mut(dst).map_err(misaligned)?;
    let a: &[T] = bytemuck::try_cast_slice(a).map_err(misaligned)?;
    let b: &[T] = bytemuck::try_cast_slice(b).map_err(misaligned)?;
    let mut f = |g: fn(T, T) -> T| {
        for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
            *d = g(*x, *y);
        }
    };
    match op {
        ReduceOp::Sum | ReduceOp::Avg => f(T::add),
        ReduceOp::Prod => f(T::mul),
        ReduceOp::Min => f(T::min),
        ReduceOp::Max => f(T::max),
    }
    Ok(())
}

/// Tile of half-precision elements accumulated in f32 registers/stack at a time.
const TILE: usize = 512;

fn reduce_half<H: bytemuck::Pod>(
    op: ReduceOp,
    srcs: &[&[u8]],
    dst: &mut [u8],
    to: fn(H) -> f32,
    from: fn(f32) -> H,
) -> Result<()> {
    let dst: &mut [H] = bytemuck::try_cast_slice_mut(dst).map_err(misaligned)?;
    let srcs: Vec<&[H]> =
        srcs.iter().map(|s| bytemuck::try_cast_slice(s).map_err(misaligned)).collect::<Result<_>>()?;
    let g: fn(f32, f32) -> f32 = match op {
        ReduceOp::Sum | ReduceOp::Avg => |a, b| a + b,
        ReduceOp::Prod => |a, b| a * b,
        ReduceOp::Min => f32::min,
        ReduceOp::Max => f32::max,
    };
    let mut acc = [0f32; TILE];
    for (t, out) in dst.chunks_mut(TILE).enumerate() {
        let base = t * TILE;
        let acc = &mut acc[..out.len()];
        for (a, x) in acc.iter_mut().zip(&srcs[0][base..base + out.len()]) {
            *a = to(*x);
        }
        for s in &srcs[1..] {
            for (a, x) in acc.iter_mut().zip(&s[base..base + out.len()]) {
                *a = g(*a, to(*x));
            }
        }
        if op == ReduceOp::Avg {
            let n = srcs.len() as f32;
            for a in acc.iter_mut() {
                *a /= n;
            }
        }
        for (o, a) in out.iter_mut().zip(acc.iter()) {
            *o = from(*a);
        }
    }
    Ok(())
}

/// `dst = srcs[0] (op) srcs[1] (op) ...`, combining in source order (so every caller that
/// passes the sources in the same order gets bitwise the same result). `f16`/`bf16`
/// accumulate in `f32` and round once. `Avg` is the sum divided by the number of sources.
///
/// # Errors
/// [`Error::InvalidArgument`] when there is no source, the lengths differ, or a buffer is
/// misaligned for `dtype`.
pub fn reduce_sources(dtype: DType, op: ReduceOp, srcs: &[&[u8]], dst: &mut [u8]) -> Result<()> {
    if srcs.is_empty() || srcs.iter().any(|s| s.len() != dst.len()) || !dst.len().is_multiple_of(dtype.size()) {
        return Err(Error::invalid(format!("reduction of {} sources into {} bytes of {dtype}", srcs.len(), dst.len())));
    }
    if dst.is_empty() {
        return Ok(());
    }
    match dtype {
        DType::F16 => return reduce_half::<f16>(op, srcs, dst, f16::to_f32, f16::from_f32),
        DType::BF16 => return reduce_half::<bf16>(op, srcs, dst, bf16::to_f32, bf16::from_f32),
        _ => {}
    }
    match srcs {
        [] => {}
        [one] => dst.copy_from_slice(one),
        [a, b, ..] => with_dtype!(dtype, T => combine3_typed::<T>(op, dst, a, b))?,
    }
    for s in srcs.iter().skip(2) {
        with_dtype!(dtype, T => combine_typed::<T>(op, dst, s))?;
    }
    if op == ReduceOp::Avg {
        divide(dtype, dst, srcs.len())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn integer_ops_wrap_and_truncate() {
        let mut a = bytes(&[i32::MAX, -7, 3, 10]);
        combine(DType::I32, ReduceOp::Sum, &mut a, &bytes(&[1, 2, -5, 10])).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&a), &[i32::MIN, -5, -2, 20]);
        divide(DType::I32, &mut a[4..], 2).unwrap();
        assert_eq!(&bytemuck::cast_slice::<u8, i32>(&a)[1..], &[-2, -1, 10]);

        let mut m = bytes(&[5u8, 200, 0]);
        combine(DType::U8, ReduceOp::Max, &mut m, &bytes(&[7u8, 100, 0])).unwrap();
        assert_eq!(m, vec![7, 200, 0]);
        combine(DType::U8, ReduceOp::Prod, &mut m, &bytes(&[2u8, 2, 9])).unwrap();
        assert_eq!(m, vec![14, 144, 0]);
    }

    #[test]
    fn float_min_and_half_widening() {
        let mut a = bytes(&[1.5f64, -2.0]);
        combine(DType::F64, ReduceOp::Min, &mut a, &bytes(&[0.5f64, 3.0])).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f64>(&a), &[0.5, -2.0]);

        let h = [bf16::from_f32(1.0), bf16::from_f32(-3.5)];
        let mut w = [0f32; 2];
        widen(DType::BF16, bytemuck::cast_slice(&h), &mut w).unwrap();
        assert_eq!(w, [1.0, -3.5]);
        let mut back = [bf16::ZERO; 2];
        narrow(DType::BF16, &w, bytemuck::cast_slice_mut(&mut back)).unwrap();
        assert_eq!(back, h);
        assert!(widen(DType::F32, &[], &mut []).is_err());
    }

    #[test]
    fn empty_unaligned_buffers_are_fine() {
        // A dangling empty slice is only 1-byte aligned.
        let empty: &mut [u8] = &mut [];
        combine(DType::F64, ReduceOp::Sum, empty, &[]).unwrap();
        divide(DType::I64, empty, 3).unwrap();
        narrow(DType::BF16, &[], empty).unwrap();
        widen(DType::F16, &[], &mut []).unwrap();
    }

    #[test]
    fn multi_source_reduction_matches_pairwise_and_rounds_halves_once() {
        let a = bytes(&[1i32, -5, 7]);
        let b = bytes(&[2i32, 9, -1]);
        let c = bytes(&[3i32, 3, 3]);
        let mut d = vec![0u8; 12];
        reduce_sources(DType::I32, ReduceOp::Max, &[&a, &b, &c], &mut d).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&d), &[3, 9, 7]);
        // 1 + 2^-11 (not representable in f16) added 8 times: f32 accumulation then one
        // rounding gives 8 + 2^-8, exactly representable; pairwise f16 sums would lose it.
        let x = [half::f16::from_f32(1.0 + 1.0 / 1024.0); 1];
        let eight: Vec<&[u8]> = (0..8).map(|_| bytemuck::cast_slice(&x)).collect();
        let mut out = [half::f16::ZERO; 1];
        reduce_sources(DType::F16, ReduceOp::Sum, &eight, bytemuck::cast_slice_mut(&mut out)).unwrap();
        assert_eq!(out[0].to_f32(), 8.0 + 8.0 / 1024.0);
        assert!(reduce_sources(DType::F32, ReduceOp::Sum, &[], &mut []).is_err());
    }

    #[test]
    fn length_mismatch_is_an_error() {
        let mut a = vec![0u8; 8];
        assert!(combine(DType::F32, ReduceOp::Sum, &mut a, &[0u8; 4]).is_err());
    }

    // The unaligned entry point of MPI user operations (these tests lived with the mpi
    // backend, which used to repeat the rules).

    fn run_unaligned<T: Arith>(op: ReduceOp, a: &[T], b: &mut [T]) {
        assert_eq!(a.len(), b.len());
        // SAFETY: both slices hold a.len() elements and do not overlap.
        unsafe { combine_unaligned::<T>(op, a.as_ptr().cast(), b.as_mut_ptr().cast(), a.len()) }
    }

    #[test]
    fn unaligned_min_max_let_nan_lose() {
        let a = [f32::NAN, 1.0, -0.0, f32::INFINITY];
        let mut b = [2.0f32, f32::NAN, 0.0, 3.0];
        run_unaligned(ReduceOp::Min, &a, &mut b);
        assert_eq!(b[0], 2.0);
        assert_eq!(b[1], 1.0);
        assert_eq!(b[2], 0.0);
        assert_eq!(b[3], 3.0);
        let mut c = [f64::NAN, 5.0];
        run_unaligned(ReduceOp::Max, &[f64::NAN, f64::NAN], &mut c);
        assert!(c[0].is_nan());
        assert_eq!(c[1], 5.0);
        let mut h = [f16::NAN, f16::from_f32(-2.0)];
        run_unaligned(ReduceOp::Max, &[f16::from_f32(1.5), f16::NAN], &mut h);
        assert_eq!(h, [f16::from_f32(1.5), f16::from_f32(-2.0)]);
    }

    #[test]
    fn unaligned_half_sums_round_each_step_to_nearest_even() {
        // 1 + 2^-11 is halfway between two f16 values: ties to even gives 1.0.
        let mut b = [f16::from_f32(1.0)];
        run_unaligned(ReduceOp::Sum, &[f16::from_f32(2f32.powi(-11))], &mut b);
        assert_eq!(b[0], f16::from_f32(1.0));
        let mut b = [bf16::from_f32(3.0)];
        run_unaligned(ReduceOp::Prod, &[bf16::from_f32(-0.5)], &mut b);
        assert_eq!(b[0], bf16::from_f32(-1.5));
        let mut b = [f16::from_f32(60000.0)];
        run_unaligned(ReduceOp::Sum, &[f16::from_f32(60000.0)], &mut b);
        assert!(b[0].is_infinite());
    }

    #[test]
    fn unaligned_byte_sums_wrap() {
        let mut b = [250u8, 1];
        run_unaligned(ReduceOp::Sum, &[10u8, 2], &mut b);
        assert_eq!(b, [4, 3]);
        let mut c = [-128i8];
        run_unaligned(ReduceOp::Sum, &[-1i8], &mut c);
        assert_eq!(c, [127]);
    }

    #[test]
    fn unaligned_buffers() {
        let mut raw = [0u8; 9];
        let a = [1.0f32, 2.0];
        raw[1..5].copy_from_slice(&3.0f32.to_ne_bytes());
        raw[5..9].copy_from_slice(&4.0f32.to_ne_bytes());
        // SAFETY: `raw[1..]` holds two (unaligned) f32 values; `a` two aligned ones.
        unsafe { combine_unaligned::<f32>(ReduceOp::Sum, a.as_ptr().cast(), raw.as_mut_ptr().add(1), 2) };
        assert_eq!(f32::from_ne_bytes(raw[1..5].try_into().unwrap()), 4.0);
        assert_eq!(f32::from_ne_bytes(raw[5..9].try_into().unwrap()), 6.0);
    }
}
