//! What counts as a correct result, per element.
//!
//! The tolerances, stated once (they are what every backend is held to):
//!
//! * **Integers**, every op: exact. `Sum`/`Prod` wrap (two's complement) and wrapping
//!   arithmetic is associative and commutative, so the result does not depend on the order
//!   in which a backend combines ranks. `Avg` is the wrapped sum divided by the world size,
//!   truncated toward zero. (When the world size does not fit in the type, as for `i8` above
//!   127 ranks, the `Avg` result is not specified and any value is accepted.)
//! * **f32 / f64**, `Sum`: `|got − ref| ≤ 2·n·ε·Σ|xᵢ|` where `n` is the world size, `ε` the
//!   type's machine epsilon and `ref` the sum computed in f64 with compensated summation.
//!   Any summation order has an error of at most `(n−1)·ε·Σ|xᵢ|`, so this admits every
//!   order with a margin of 2 and nothing that drops or repeats a contribution.
//!   `Avg`: `|got − ref/n| ≤ 2·(n+1)·ε·Σ|xᵢ|/n` (the sum's error plus the division's rounding).
//!   `Prod`: `|got − ref| ≤ 2·n·ε·Π|xᵢ|` (inputs are drawn near 1 so products stay in range).
//!   `Min` / `Max`: exact, with IEEE 754 minNum/maxNum semantics (a NaN loses against a
//!   number; the result is NaN only when every rank has NaN; `−0` and `+0` compare equal).
//! * **f16 / bf16**: the reference is computed in f64 from the exact input values and rounded
//!   once, to nearest-even, to the type ([`round_f16`], [`round_bf16`]; the `half` crate's
//!   own `from_f64` drops low bits before rounding and is not used for this). The result must
//!   be within [`HALF_ULPS`] = 1 unit in the last place of that correctly rounded reference.
//!   oxccl accumulates in f32 and rounds once; inputs are drawn so that f32 sums of them are
//!   exact, so only the final rounding(s) differ from the reference. `Min`/`Max`: exact.
//! * **Data movement** (broadcast, gathers, scatters, all-to-all, point-to-point): bit for
//!   bit, on inputs that include every bit pattern (NaN payloads, infinities, subnormals).

use std::fmt;

use half::{bf16, f16};

/// The largest distance, in units in the last place, between an f16/bf16 reduction result
/// and the correctly rounded reference.
pub const HALF_ULPS: u32 = 1;

/// What one element of a result must be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expected<T> {
    /// Exactly this value (integers; float `Min`/`Max`, where NaN matches NaN and `−0`
    /// matches `+0`).
    Exact(T),
    /// Within `tol` of `value` (f32/f64 `Sum`, `Avg`, `Prod`); NaN only matches NaN.
    Near {
        /// The reference value.
        value: f64,
        /// The largest admitted absolute difference.
        tol: f64,
    },
    /// Within `ulps` units in the last place of `value` (f16/bf16 `Sum`, `Avg`, `Prod`).
    Ulps {
        /// The correctly rounded reference.
        value: T,
        /// The largest admitted distance.
        ulps: u32,
    },
    /// Not specified by the documented semantics: anything is accepted.
    Any,
}

impl<T: fmt::Debug> fmt::Display for Expected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expected::Exact(v) => write!(f, "{v:?}"),
            Expected::Near { value, tol } => write!(f, "{value:e} ± {tol:e}"),
            Expected::Ulps { value, ulps } => write!(f, "{value:?} ± {ulps} ulp"),
            Expected::Any => f.write_str("anything (unspecified)"),
        }
    }
}

/// The tolerance of an f32/f64 `Sum` over `n` ranks: `2·n·ε·Σ|xᵢ|`.
pub fn sum_tolerance(n: usize, eps: f64, sum_abs: f64) -> f64 {
    2.0 * n as f64 * eps * sum_abs
}

/// The tolerance of an f32/f64 `Avg` over `n` ranks: `2·(n+1)·ε·Σ|xᵢ|/n`.
pub fn avg_tolerance(n: usize, eps: f64, sum_abs: f64) -> f64 {
    2.0 * (n as f64 + 1.0) * eps * sum_abs / n.max(1) as f64
}

/// The tolerance of an f32/f64 `Prod` over `n` ranks: `2·n·ε·Π|xᵢ|`.
pub fn prod_tolerance(n: usize, eps: f64, prod_abs: f64) -> f64 {
    2.0 * n as f64 * eps * prod_abs
}

/// Whether `got` is within `tol` of `value` (NaN matches only NaN, an infinity only itself).
pub fn near(got: f64, value: f64, tol: f64) -> bool {
    if value.is_nan() {
        got.is_nan()
    } else if value.is_infinite() {
        got == value
    } else {
        (got - value).abs() <= tol
    }
}

/// Whether two floats are equal as minNum/maxNum results: equal values (so `−0 == +0`) or
/// both NaN.
pub fn same_float(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// Sum with Neumaier's compensation: accurate to about one rounding of the result.
pub fn compensated_sum(xs: impl IntoIterator<Item = f64>) -> f64 {
    let mut sum = 0.0f64;
    let mut c = 0.0f64;
    for x in xs {
        let t = sum + x;
        if sum.abs() >= x.abs() {
            c += (sum - t) + x;
        } else {
            c += (x - t) + sum;
        }
        sum = t;
    }
    sum + c
}

/// 2^k for k in the normal f64 exponent range.
fn pow2(k: i32) -> f64 {
    let k = k.clamp(-1022, 1023);
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// floor(log2 |x|) for finite non-zero x (f64 subnormals report -1023).
fn exponent(x: f64) -> i32 {
    ((x.to_bits() >> 52) & 0x7FF) as i32 - 1023
}

/// Rounds `x` to nearest-even at `sig_bits` significant bits, with `emin` the smallest normal
/// exponent (below it the spacing stays 2^(emin − sig_bits + 1): gradual underflow).
/// Overflow is left to the caller.
fn round_to_precision(x: f64, sig_bits: i32, emin: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let e = exponent(x).max(emin);
    let q = e - (sig_bits - 1);
    // Both scalings are by powers of two inside the f64 range: exact.
    let scaled = x * pow2(-q);
    let fl = scaled.floor();
    let frac = scaled - fl;
    // Round half to even: up when above the midpoint, or on it with an odd floor.
    let r = if frac > 0.5 || (frac == 0.5 && fl % 2.0 != 0.0) { fl + 1.0 } else { fl };
    let out = r * pow2(q);
    if out == 0.0 {
        0.0f64.copysign(x)
    } else {
        out
    }
}

/// `x` rounded once, to nearest-even, to f16 (overflowing to ±infinity).
pub fn round_f16(x: f64) -> f16 {
    if x.is_nan() {
        return f16::NAN;
    }
    let r = round_to_precision(x, 11, -14);
    if r.abs() > f64::from(f16::MAX) {
        return if r > 0.0 { f16::INFINITY } else { f16::NEG_INFINITY };
    }
    // `r` is representable, so the conversion is exact.
    f16::from_f64(r)
}

/// `x` rounded once, to nearest-even, to bf16 (overflowing to ±infinity).
pub fn round_bf16(x: f64) -> bf16 {
    if x.is_nan() {
        return bf16::NAN;
    }
    let r = round_to_precision(x, 8, -126);
    if r.abs() > f64::from(bf16::MAX) {
        return if r > 0.0 { bf16::INFINITY } else { bf16::NEG_INFINITY };
    }
    bf16::from_f64(r)
}

/// The position of a 16-bit float's bit pattern on the number line (sign-magnitude to
/// two's complement), so that neighbours differ by one and `−0` and `+0` coincide.
fn ordered16(bits: u16) -> i32 {
    let mag = i32::from(bits & 0x7FFF);
    if bits & 0x8000 != 0 {
        -mag
    } else {
        mag
    }
}

/// The distance in units in the last place between two f16/bf16 bit patterns (`None` when
/// either is NaN). Infinity counts as one step above the largest finite value.
pub fn ulp_distance16(a: u16, b: u16, is_nan: impl Fn(u16) -> bool) -> Option<u32> {
    if is_nan(a) || is_nan(b) {
        return None;
    }
    Some(ordered16(a).abs_diff(ordered16(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_correct_where_half_from_f64_is_not() {
        // 1 + 2^-11 is exactly halfway between two f16 values: ties to even -> 1.0.
        assert_eq!(round_f16(1.0 + 2f64.powi(-11)), f16::from_f32(1.0));
        // Just above the halfway point (in bits the `half` crate drops) -> rounds up.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(round_f16(x), f16::from_bits(0x3C01));
        // bf16: 1 + 2^-8 is a tie -> 1.0; slightly above -> next.
        assert_eq!(round_bf16(1.0 + 2f64.powi(-8)), bf16::from_f32(1.0));
        assert_eq!(round_bf16(1.0 + 2f64.powi(-8) + 2f64.powi(-45)), bf16::from_bits(0x3F81));
        // Overflow, subnormals, signs.
        assert_eq!(round_f16(65520.0), f16::INFINITY);
        assert_eq!(round_f16(65519.0), f16::MAX);
        assert_eq!(round_f16(-3.0 * 2f64.powi(-25)), f16::from_bits(0x8002));
        assert_eq!(round_f16(2f64.powi(-26)), f16::ZERO);
        assert!(round_bf16(f64::NAN).is_nan());
    }

    #[test]
    fn exact_values_round_to_themselves() {
        for bits in (0u16..=0xFFFF).step_by(7) {
            let h = f16::from_bits(bits);
            if h.is_finite() {
                assert_eq!(round_f16(h.to_f64()).to_bits() & 0x7FFF, bits & 0x7FFF, "{bits:#x}");
            }
            let b = bf16::from_bits(bits);
            if b.is_finite() {
                assert_eq!(round_bf16(b.to_f64()).to_bits() & 0x7FFF, bits & 0x7FFF, "{bits:#x}");
            }
        }
    }

    #[test]
    fn ulp_distance_crosses_zero() {
        let nan = |b: u16| f16::from_bits(b).is_nan();
        assert_eq!(ulp_distance16(0x0001, 0x8001, nan), Some(2));
        assert_eq!(ulp_distance16(0x0000, 0x8000, nan), Some(0));
        assert_eq!(ulp_distance16(0x3C00, 0x3C01, nan), Some(1));
        assert_eq!(ulp_distance16(0x7E00, 0x3C01, nan), None);
    }

    #[test]
    fn compensated_sum_is_accurate() {
        let s = compensated_sum([1e16, 1.0, -1e16, 1.0]);
        assert_eq!(s, 2.0);
        assert!(near(1.0 + 1e-9, 1.0, 1e-8));
        assert!(!near(1.0, f64::NAN, 1.0));
        assert!(same_float(-0.0, 0.0) && same_float(f64::NAN, f64::NAN));
    }
}
