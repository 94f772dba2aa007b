//! The element-wise kernels behind the MPI user operations (`MPI_Op_create`): minNum/maxNum
//! for the float types (MPI's own `MPI_MIN`/`MPI_MAX` let a NaN win or lose depending on
//! the operand order; oxccl's semantics is that a NaN loses against a number), and f16/bf16
//! sums and products that compute each pairwise step in f32 and round it to nearest-even.
//!
//! MPI calls a user function as `f(in, inout, len, datatype)` and expects
//! `inout[i] = in[i] op inout[i]`. The kernels here take the two buffers and the length;
//! `dtype.rs` wraps them as `extern "C"` functions. Buffers are read and written unaligned:
//! MPI does not promise alignment of its temporaries.

use half::{bf16, f16};

use crate::reduce_op::ReduceOp;

/// An element type a user operation works on.
pub(crate) trait Elem: Copy {
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
}

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            #[inline(always)]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    // f32::min / max: a NaN operand loses against a number.
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
        }
    )*};
}
float_elem!(f32, f64);

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            #[inline(always)]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
        }
    )*};
}
// 8-bit sums wrap (two's complement), as on the CPU backends. Open MPI 4.1's AVX reduction
// component *saturates* 8-bit MPI_SUM, so oxccl does not use the predefined operation there.
int_elem!(i8, u8);

macro_rules! half_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            #[inline(always)]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y) = (a.to_f32(), b.to_f32());
                <$t>::from_f32(<f32 as Elem>::combine(op, x, y))
            }
        }
    )*};
}
half_elem!(f16, bf16);

/// `inout[i] = in[i] op inout[i]` for `len` elements.
///
/// # Safety
/// `input` must point to `len` readable and `inout` to `len` readable and writable elements
/// of `T` (alignment not required); the ranges may not overlap.
pub(crate) unsafe fn apply<T: Elem>(op: ReduceOp, input: *const u8, inout: *mut u8, len: usize) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Elem + bytemuck::Pod>(op: ReduceOp, a: &[T], b: &mut [T]) {
        assert_eq!(a.len(), b.len());
        // SAFETY: both slices hold a.len() elements and do not overlap.
        unsafe { apply::<T>(op, a.as_ptr().cast(), b.as_mut_ptr().cast(), a.len()) }
    }

    #[test]
    fn min_max_let_nan_lose() {
        let a = [f32::NAN, 1.0, -0.0, f32::INFINITY];
        let mut b = [2.0f32, f32::NAN, 0.0, 3.0];
        run(ReduceOp::Min, &a, &mut b);
        assert_eq!(b[0], 2.0);
        assert_eq!(b[1], 1.0);
        assert_eq!(b[2], 0.0);
        assert_eq!(b[3], 3.0);
        let mut c = [f64::NAN, 5.0];
        run(ReduceOp::Max, &[f64::NAN, f64::NAN], &mut c);
        assert!(c[0].is_nan());
        assert_eq!(c[1], 5.0);
        let mut h = [f16::NAN, f16::from_f32(-2.0)];
        run(ReduceOp::Max, &[f16::from_f32(1.5), f16::NAN], &mut h);
        assert_eq!(h, [f16::from_f32(1.5), f16::from_f32(-2.0)]);
    }

    #[test]
    fn half_sums_round_each_step_to_nearest_even() {
        // 1 + 2^-11 is halfway between two f16 values: ties to even gives 1.0.
        let mut b = [f16::from_f32(1.0)];
        run(ReduceOp::Sum, &[f16::from_f32(2f32.powi(-11))], &mut b);
        assert_eq!(b[0], f16::from_f32(1.0));
        let mut b = [bf16::from_f32(3.0)];
        run(ReduceOp::Prod, &[bf16::from_f32(-0.5)], &mut b);
        assert_eq!(b[0], bf16::from_f32(-1.5));
        let mut b = [f16::from_f32(60000.0)];
        run(ReduceOp::Sum, &[f16::from_f32(60000.0)], &mut b);
        assert!(b[0].is_infinite());
    }

    #[test]
    fn byte_sums_wrap() {
        let mut b = [250u8, 1];
        run(ReduceOp::Sum, &[10u8, 2], &mut b);
        assert_eq!(b, [4, 3]);
        let mut c = [-128i8];
        run(ReduceOp::Sum, &[-1i8], &mut c);
        assert_eq!(c, [127]);
    }

    #[test]
    fn unaligned_buffers() {
        let mut raw = [0u8; 9];
        let a = [1.0f32, 2.0];
        raw[1..5].copy_from_slice(&3.0f32.to_ne_bytes());
        raw[5..9].copy_from_slice(&4.0f32.to_ne_bytes());
        // SAFETY: `raw[1..]` holds two (unaligned) f32 values; `a` two aligned ones.
        unsafe { apply::<f32>(ReduceOp::Sum, a.as_ptr().cast(), raw.as_mut_ptr().add(1), 2) };
        assert_eq!(f32::from_ne_bytes(raw[1..5].try_into().unwrap()), 4.0);
        assert_eq!(f32::from_ne_bytes(raw[5..9].try_into().unwrap()), 6.0);
    }
}
