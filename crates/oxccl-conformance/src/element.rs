//! [`TestElement`]: what the suite needs to know about each of the ten element types.
//!
//! Implemented by three macros (integers, f32/f64, f16/bf16) so that every dtype goes
//! through the same generic case code.

use half::{bf16, f16};
use oxccl::{Element, ReduceOp};

use crate::tolerance::{self, Expected};

/// An [`oxccl::Element`] the conformance suite can generate, reduce by reference and compare.
pub trait TestElement: Element + Copy {
    /// A value from 64 random bits in which every bit pattern of the type can occur
    /// (NaN payloads, infinities and subnormals included): for data-movement tests.
    fn from_bits(bits: u64) -> Self;

    /// A value from 64 random bits for a reduction with `op`.
    ///
    /// * integers: any value, for every op (wrapping makes every op exact in any order);
    /// * f32/f64: `Sum`/`Avg` uniform in ±[0, 8) with magnitudes spread over 2^-3..2^3,
    ///   `Prod` ±[0.75, 1.25), `Min`/`Max` a mix of ordinary values, ±0, ±∞ and NaN;
    /// * f16/bf16: `Sum`/`Avg` multiples of 2^-8 (f16) or 2^-5 (bf16) in [-8, 8), so that
    ///   f32 sums of them are exact, `Prod` ±(1 + k/64) for |k| ≤ 16, `Min`/`Max` any pattern.
    fn reduce_input(op: ReduceOp, bits: u64) -> Self;

    /// The reference reduction with `op` of `vals`, one value per rank in rank order, under
    /// the semantics documented on [`oxccl::ReduceOp`] and the tolerances of [`tolerance`].
    fn reduce_ref(op: ReduceOp, vals: &[Self]) -> Expected<Self>;

    /// Whether `self` meets `want`.
    fn satisfies(self, want: &Expected<Self>) -> bool;

    /// The value and its bit pattern, for failure messages.
    fn show(self) -> String;

    /// Whether two values have the same bit pattern.
    fn same_bits(self, other: Self) -> bool {
        bytemuck::bytes_of(&self) == bytemuck::bytes_of(&other)
    }
}

macro_rules! int_element {
    ($($t:ty),*) => {$(
        impl TestElement for $t {
            fn from_bits(bits: u64) -> Self {
                bits as $t
            }

            fn reduce_input(_op: ReduceOp, bits: u64) -> Self {
                bits as $t
            }

            fn reduce_ref(op: ReduceOp, vals: &[Self]) -> Expected<Self> {
                let Some((&first, rest)) = vals.split_first() else { return Expected::Any };
                let fold = |f: fn($t, $t) -> $t| rest.iter().fold(first, |a, &b| f(a, b));
                match op {
                    ReduceOp::Sum => Expected::Exact(fold(<$t>::wrapping_add)),
                    ReduceOp::Prod => Expected::Exact(fold(<$t>::wrapping_mul)),
                    ReduceOp::Min => Expected::Exact(fold(Ord::min)),
                    ReduceOp::Max => Expected::Exact(fold(Ord::max)),
                    ReduceOp::Avg => match <$t>::try_from(vals.len()) {
                        Ok(d) if d != 0 => Expected::Exact(fold(<$t>::wrapping_add).wrapping_div(d)),
                        _ => Expected::Any,
                    },
                }
            }

            fn satisfies(self, want: &Expected<Self>) -> bool {
                match want {
                    Expected::Exact(v) | Expected::Ulps { value: v, .. } => self == *v,
                    Expected::Near { value, tol } => tolerance::near(self as f64, *value, *tol),
                    Expected::Any => true,
                }
            }

            fn show(self) -> String {
                format!("{self}")
            }
        }
    )*};
}
int_element!(i8, u8, i32, u32, i64, u64);

/// A float in ±[0, 8) with its magnitude spread over 2^-3..2^3 (Sum/Avg inputs).
fn spread(bits: u64) -> f64 {
    let u = (bits >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
    let e = (bits & 7) as i32 - 3; // -3..=4
    (2.0 * u - 1.0) * 2f64.powi(e.min(3))
}

/// A factor in ±[0.75, 1.25) (Prod inputs).
fn near_one(bits: u64) -> f64 {
    let u = (bits >> 11) as f64 / (1u64 << 53) as f64;
    let v = 0.75 + 0.5 * u;
    if bits & 1 == 0 {
        v
    } else {
        -v
    }
}

/// Min/Max inputs: mostly ordinary values, sometimes NaN, ±∞ or ±0.
fn min_max_input(bits: u64) -> f64 {
    match (bits >> 58) & 31 {
        0 | 1 => f64::NAN,
        2 => f64::INFINITY,
        3 => f64::NEG_INFINITY,
        4 => 0.0,
        5 => -0.0,
        _ => spread(bits) * 1000.0,
    }
}

/// minNum / maxNum folded over `xs` (a NaN loses against a number).
fn min_max_num(op: ReduceOp, xs: impl Iterator<Item = f64>) -> f64 {
    xs.fold(f64::NAN, |acc, x| {
        if acc.is_nan() {
            x
        } else if x.is_nan() {
            acc
        } else if (op == ReduceOp::Min && x < acc) || (op == ReduceOp::Max && x > acc) {
            x
        } else {
            acc
        }
    })
}

macro_rules! float_element {
    ($($t:ty => $bits:ty),*) => {$(
        impl TestElement for $t {
            fn from_bits(bits: u64) -> Self {
                <$t>::from_bits(bits as $bits)
            }

            fn reduce_input(op: ReduceOp, bits: u64) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => spread(bits) as $t,
                    ReduceOp::Prod => near_one(bits) as $t,
                    ReduceOp::Min | ReduceOp::Max => min_max_input(bits) as $t,
                }
            }

            fn reduce_ref(op: ReduceOp, vals: &[Self]) -> Expected<Self> {
                let n = vals.len();
                let eps = f64::from(<$t>::EPSILON);
                let xs = vals.iter().map(|&v| f64::from(v));
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        let sum = tolerance::compensated_sum(xs.clone());
                        let sum_abs: f64 = xs.map(f64::abs).sum();
                        if op == ReduceOp::Sum {
                            Expected::Near { value: sum, tol: tolerance::sum_tolerance(n, eps, sum_abs) }
                        } else {
                            Expected::Near {
                                value: sum / n.max(1) as f64,
                                tol: tolerance::avg_tolerance(n, eps, sum_abs),
                            }
                        }
                    }
                    ReduceOp::Prod => {
                        let p: f64 = xs.product();
                        Expected::Near { value: p, tol: tolerance::prod_tolerance(n, eps, p.abs()) }
                    }
                    ReduceOp::Min | ReduceOp::Max => Expected::Exact(min_max_num(op, xs) as $t),
                }
            }

            fn satisfies(self, want: &Expected<Self>) -> bool {
                match want {
                    Expected::Exact(v) | Expected::Ulps { value: v, .. } => {
                        tolerance::same_float(f64::from(self), f64::from(*v))
                    }
                    Expected::Near { value, tol } => tolerance::near(f64::from(self), *value, *tol),
                    Expected::Any => true,
                }
            }

            fn show(self) -> String {
                format!("{self:e} ({:#x})", self.to_bits())
            }
        }
    )*};
}
float_element!(f32 => u32, f64 => u64);

macro_rules! half_element {
    ($($t:ty => $round:path, $frac_bits:expr, $scale:expr);*) => {$(
        impl TestElement for $t {
            fn from_bits(bits: u64) -> Self {
                <$t>::from_bits(bits as u16)
            }

            fn reduce_input(op: ReduceOp, bits: u64) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        // k in [-2^p, 2^p) with p+1 significant bits at most: exact in the type,
                        // and sums of up to 2^12 of them are exact in f32.
                        let span = 1i64 << $frac_bits;
                        let k = (bits % (2 * span as u64)) as i64 - span;
                        <$t>::from_f64(k as f64 * $scale)
                    }
                    ReduceOp::Prod => {
                        let k = (bits % 33) as i64 - 16;
                        let v = 1.0 + k as f64 / 64.0;
                        <$t>::from_f64(if (bits >> 40) & 1 == 0 { v } else { -v })
                    }
                    ReduceOp::Min | ReduceOp::Max => <$t>::from_bits((bits >> 16) as u16),
                }
            }

            fn reduce_ref(op: ReduceOp, vals: &[Self]) -> Expected<Self> {
                let n = vals.len();
                let xs = vals.iter().map(|v| v.to_f64());
                let ulps = tolerance::HALF_ULPS;
                match op {
                    ReduceOp::Sum => Expected::Ulps { value: $round(tolerance::compensated_sum(xs)), ulps },
                    ReduceOp::Avg => Expected::Ulps {
                        value: $round(tolerance::compensated_sum(xs) / n.max(1) as f64),
                        ulps,
                    },
                    ReduceOp::Prod => Expected::Ulps { value: $round(xs.product()), ulps },
                    // Exact: every input is representable, so is the chosen one.
                    ReduceOp::Min | ReduceOp::Max => Expected::Exact($round(min_max_num(op, xs))),
                }
            }

            fn satisfies(self, want: &Expected<Self>) -> bool {
                match want {
                    Expected::Exact(v) => tolerance::same_float(self.to_f64(), v.to_f64()),
                    Expected::Ulps { value, ulps } => {
                        if value.is_nan() {
                            return self.is_nan();
                        }
                        let is_nan = |b: u16| <$t>::from_bits(b).is_nan();
                        tolerance::ulp_distance16(self.to_bits(), value.to_bits(), is_nan)
                            .is_some_and(|d| d <= *ulps)
                    }
                    Expected::Near { value, tol } => tolerance::near(self.to_f64(), *value, *tol),
                    Expected::Any => true,
                }
            }

            fn show(self) -> String {
                format!("{} ({:#06x})", self, self.to_bits())
            }
        }
    )*};
}
half_element!(f16 => tolerance::round_f16, 11, 1.0 / 256.0; bf16 => tolerance::round_bf16, 8, 1.0 / 32.0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_reference_wraps_and_truncates() {
        assert_eq!(i8::reduce_ref(ReduceOp::Sum, &[100, 100]), Expected::Exact(-56));
        assert_eq!(i32::reduce_ref(ReduceOp::Avg, &[-7, 0]), Expected::Exact(-3));
        assert_eq!(u8::reduce_ref(ReduceOp::Prod, &[16, 16, 3]), Expected::Exact(0));
        assert_eq!(u64::reduce_ref(ReduceOp::Max, &[1, u64::MAX, 0]), Expected::Exact(u64::MAX));
    }

    #[test]
    fn float_min_max_ignore_nan() {
        assert_eq!(f32::reduce_ref(ReduceOp::Min, &[f32::NAN, 2.0, -1.0]), Expected::Exact(-1.0));
        let all_nan = f64::reduce_ref(ReduceOp::Max, &[f64::NAN, f64::NAN]);
        assert!(f64::NAN.satisfies(&all_nan));
        assert!(!1.0f64.satisfies(&all_nan));
        assert!(f16::from_f32(3.0).satisfies(&f16::reduce_ref(ReduceOp::Max, &[f16::NAN, f16::from_f32(3.0)])));
    }

    #[test]
    fn half_sums_are_within_one_ulp_of_the_rounded_reference() {
        let vals = [f16::from_f32(1.0), f16::from_f32(2f32.powi(-11))];
        let want = f16::reduce_ref(ReduceOp::Sum, &vals);
        assert_eq!(want, Expected::Ulps { value: f16::from_f32(1.0), ulps: 1 });
        assert!(f16::from_bits(0x3C01).satisfies(&want));
        assert!(!f16::from_bits(0x3C02).satisfies(&want));
    }

    #[test]
    fn float_tolerance_rejects_a_missing_contribution() {
        let vals = [0.5f32, 0.25, 0.125];
        let want = f32::reduce_ref(ReduceOp::Sum, &vals);
        assert!(0.875f32.satisfies(&want));
        assert!(!0.75f32.satisfies(&want));
    }

    /// The documented semantics (accumulate in f32, round once) always pass; accumulating in
    /// half precision, rounding after every addition, is caught.
    #[test]
    fn half_tolerance_separates_f32_from_half_accumulation() {
        let (mut f32_bad, mut half_bad) = (0, 0);
        for i in 0..2000u64 {
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Prod] {
                let vals: Vec<f16> =
                    (0..8u64).map(|r| f16::reduce_input(op, crate::inputs::splitmix64(i * 8 + r))).collect();
                let want = f16::reduce_ref(op, &vals);
                let f = |a: f32, b: f32| if op == ReduceOp::Prod { a * b } else { a + b };
                let mut acc32 = vals[0].to_f32();
                let mut acc16 = vals[0];
                for v in &vals[1..] {
                    acc32 = f(acc32, v.to_f32());
                    acc16 = f16::from_f32(f(acc16.to_f32(), v.to_f32()));
                }
                if op == ReduceOp::Avg {
                    acc32 /= 8.0;
                    acc16 = f16::from_f32(acc16.to_f32() / 8.0);
                }
                f32_bad += usize::from(!f16::from_f32(acc32).satisfies(&want));
                half_bad += usize::from(!acc16.satisfies(&want));
            }
        }
        assert_eq!(f32_bad, 0);
        assert!(half_bad > 100, "half-precision accumulation slipped through: {half_bad} caught");
    }

    #[test]
    fn half_sum_inputs_are_exact_multiples() {
        for b in 0..1000u64 {
            let x = f16::reduce_input(ReduceOp::Sum, crate::inputs::splitmix64(b)).to_f64();
            assert!((x * 256.0).fract() == 0.0 && x.abs() <= 8.0, "{x}");
            let y = bf16::reduce_input(ReduceOp::Sum, crate::inputs::splitmix64(b)).to_f64();
            assert!((y * 32.0).fract() == 0.0 && y.abs() <= 8.0, "{y}");
        }
    }
}
