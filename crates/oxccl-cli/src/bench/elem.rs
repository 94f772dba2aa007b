//! The element types the benchmark fills and checks ([`BenchElem`]): each builds its small
//! whole input values and computes the expected reduction sequentially, in `f64` for floats
//! (exact for these inputs), with two's-complement wrapping for integers (as oxccl defines them).

use half::{bf16, f16};
use oxccl::{Element, ReduceOp};

/// An element type the benchmark can fill and check.
pub trait BenchElem: Element + Copy + Default {
    /// The element with the small whole value `v` (exact for the values the inputs use).
    fn from_i64(v: i64) -> Self;

    /// The reduction of `vals` (one per rank) with `op` over `n` ranks, as oxccl defines it
    /// for this type.
    fn reduce(vals: impl Iterator<Item = i64>, op: ReduceOp, n: usize) -> Self;
}

macro_rules! float_elem {
    ($($t:ty => $from:expr),* $(,)?) => {$(
        impl BenchElem for $t {
            fn from_i64(v: i64) -> Self {
                let f: fn(f64) -> $t = $from;
                f(v as f64)
            }

            fn reduce(vals: impl Iterator<Item = i64>, op: ReduceOp, n: usize) -> Self {
                let f: fn(f64) -> $t = $from;
                f(reduce_f64(vals, op, n))
            }
        }
    )*};
}

macro_rules! int_elem {
    ($($t:ty),* $(,)?) => {$(
        impl BenchElem for $t {
            fn from_i64(v: i64) -> Self {
                v as $t
            }

            fn reduce(vals: impl Iterator<Item = i64>, op: ReduceOp, n: usize) -> Self {
                match op {
                    // Integer avg: the sum wraps in the element type, then truncates toward zero.
                    ReduceOp::Avg => {
                        let sum = reduce_i128(vals, ReduceOp::Sum) as $t;
                        (sum as i128 / n.max(1) as i128) as $t
                    }
                    _ => reduce_i128(vals, op) as $t,
                }
            }
        }
    )*};
}

float_elem!(f32 => |v| v as f32, f64 => |v| v, f16 => f16::from_f64, bf16 => bf16::from_f64);
int_elem!(i8, u8, i32, u32, i64, u64);

fn reduce_f64(vals: impl Iterator<Item = i64>, op: ReduceOp, n: usize) -> f64 {
    let vals = vals.map(|v| v as f64);
    match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg => vals.sum::<f64>() / n.max(1) as f64,
    }
}

/// Integer reductions in i128 with wrapping; the final `as` cast to the element type
/// truncates to its width, which equals wrapping in that type for sums and products.
fn reduce_i128(vals: impl Iterator<Item = i64>, op: ReduceOp) -> i128 {
    let mut vals = vals.map(i128::from);
    let first = vals.next().unwrap_or(0);
    vals.fold(first, |a, v| match op {
        ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(v),
        ReduceOp::Prod => a.wrapping_mul(v),
        ReduceOp::Min => a.min(v),
        ReduceOp::Max => a.max(v),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_reductions_per_type() {
        let v = || [3i64, 1, 2].into_iter();
        assert_eq!(f32::reduce(v(), ReduceOp::Sum, 3), 6.0);
        assert_eq!(bf16::reduce(v(), ReduceOp::Prod, 3), bf16::from_f32(6.0));
        assert_eq!(f16::reduce(v(), ReduceOp::Min, 3), f16::from_f32(1.0));
        assert_eq!(f64::reduce(v(), ReduceOp::Max, 3), 3.0);
        assert_eq!(f64::reduce(v(), ReduceOp::Avg, 3), 2.0);
        assert_eq!(i32::reduce(v(), ReduceOp::Avg, 4), 1);
        // Integers wrap in their own width, avg divides the wrapped sum.
        assert_eq!(u8::reduce([200i64, 100].into_iter(), ReduceOp::Sum, 2), 44);
        assert_eq!(u8::reduce([200i64, 100].into_iter(), ReduceOp::Avg, 2), 22);
        assert_eq!(i8::reduce([100i64, 100].into_iter(), ReduceOp::Sum, 2), -56);
        assert_eq!(i8::reduce([100i64, 100].into_iter(), ReduceOp::Avg, 2), -28);
        assert_eq!(u8::reduce([16i64, 16].into_iter(), ReduceOp::Prod, 2), 0);
        assert_eq!(i64::reduce(std::iter::empty(), ReduceOp::Sum, 0), 0);
    }
}
