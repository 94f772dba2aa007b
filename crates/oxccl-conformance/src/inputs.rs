//! Deterministic pseudo-random inputs.
//!
//! Every value is a pure function of `(seed, case key, rank, index)`: a splitmix64 stream is
//! keyed by the seed, the case and the rank, and element `i` is the stream's `i`-th output.
//! So every rank can generate every other rank's input and compute the expected result
//! locally, without any communication beyond the collective under test, and a failure
//! reproduces exactly from the seed and the case name.
//!
//! How the 64 random bits become a value depends on the element type and on what the value
//! is for ([`Dist`]); see [`TestElement::reduce_input`] for the reduction distributions.

use std::ops::Range;

use oxccl::ReduceOp;

use crate::element::TestElement;

/// The splitmix64 increment (2^64 / golden ratio).
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 output function: a bijective mix of 64 bits.
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One splitmix64 step from state `x`: `mix64(x + GOLDEN)`.
pub const fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GOLDEN))
}

/// A stable 64-bit key for a case name (FNV-1a, then mixed).
pub fn case_key(name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(h)
}

/// The key of sub-case `sub` (a count, a root, a pattern) of the case with key `key`.
pub fn sub_key(key: u64, sub: u64) -> u64 {
    splitmix64(key ^ mix64(sub.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// The random stream of one rank's buffer in one (sub-)case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    base: u64,
}

impl Stream {
    /// The stream keyed by `(seed, key, rank)`.
    pub fn new(seed: u64, key: u64, rank: usize) -> Stream {
        let s = splitmix64(seed ^ splitmix64(key));
        Stream { base: splitmix64(s ^ mix64((rank as u64).wrapping_add(0x5EED))) }
    }

    /// The 64 random bits of element `index`.
    pub fn bits(&self, index: usize) -> u64 {
        mix64(self.base.wrapping_add((index as u64).wrapping_add(1).wrapping_mul(GOLDEN)))
    }
}

/// What the values are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dist {
    /// Any bit pattern of the type (NaNs and infinities included): for operations that move
    /// data, whose results are compared bit for bit.
    Bits,
    /// Values suited to a reduction with this op (see [`TestElement::reduce_input`]).
    Reduce(ReduceOp),
}

/// Salt that separates the sentinel streams (initial contents of output buffers) from inputs.
const SENTINEL_SALT: u64 = 0x5E47_1E1C_0FFE_E000;

/// `count` values of `rank`'s buffer in the (sub-)case with key `key`.
pub fn rank_input<T: TestElement>(seed: u64, key: u64, rank: usize, count: usize, dist: Dist) -> Vec<T> {
    rank_slice(seed, key, rank, 0..count, dist)
}

/// The values at `range` of `rank`'s buffer in the (sub-)case with key `key`, made without
/// the rest (the streams are indexed): what one rank needs of another's buffer.
pub fn rank_slice<T: TestElement>(seed: u64, key: u64, rank: usize, range: Range<usize>, dist: Dist) -> Vec<T> {
    let s = Stream::new(seed, key, rank);
    match dist {
        Dist::Bits => range.map(|i| T::from_bits(s.bits(i))).collect(),
        Dist::Reduce(op) => range.map(|i| T::reduce_input(op, s.bits(i))).collect(),
    }
}

/// Every rank's input: rank `r` has `count(r)` values.
pub fn all_inputs<T: TestElement>(
    seed: u64,
    key: u64,
    n: usize,
    count: impl Fn(usize) -> usize,
    dist: Dist,
) -> Vec<Vec<T>> {
    all_slices(seed, key, n, |r| 0..count(r), dist)
}

/// Of every rank `r`'s input, the values at `range(r)` ([`rank_slice`] for each).
pub fn all_slices<T: TestElement>(
    seed: u64,
    key: u64,
    n: usize,
    range: impl Fn(usize) -> Range<usize>,
    dist: Dist,
) -> Vec<Vec<T>> {
    (0..n).map(|r| rank_slice(seed, key, r, range(r), dist)).collect()
}

/// Initial contents for an output buffer of `rank`: arbitrary bits from a stream that no
/// input uses, so an output element that is never written is caught.
pub fn sentinel<T: TestElement>(seed: u64, key: u64, rank: usize, count: usize) -> Vec<T> {
    rank_input(seed, key ^ SENTINEL_SALT, rank, count, Dist::Bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_distinct() {
        let a = Stream::new(1, 2, 3);
        assert_eq!(a.bits(7), Stream::new(1, 2, 3).bits(7));
        assert_ne!(a.bits(7), Stream::new(1, 2, 4).bits(7));
        assert_ne!(a.bits(7), Stream::new(1, 3, 3).bits(7));
        assert_ne!(a.bits(7), Stream::new(2, 2, 3).bits(7));
        assert_ne!(a.bits(7), a.bits(8));
        assert_ne!(case_key("all_reduce/f32"), case_key("all_reduce/f64"));
        assert_ne!(sub_key(5, 0), sub_key(5, 1));
    }

    /// A slice is the same values as that range of the whole input, for both kinds of values
    /// (integers: a float input may hold NaNs, which compare unequal).
    #[test]
    fn slices_are_ranges_of_the_whole_input() {
        for dist in [Dist::Bits, Dist::Reduce(ReduceOp::Sum)] {
            let whole: Vec<i64> = rank_input(9, 9, 2, 16, dist);
            assert_eq!(rank_slice::<i64>(9, 9, 2, 5..11, dist), whole[5..11]);
            let all: Vec<Vec<i64>> = all_slices(9, 9, 3, |r| r..r + 4, dist);
            let wholes: Vec<Vec<i64>> = all_inputs(9, 9, 3, |_| 8, dist);
            for r in 0..3 {
                assert_eq!(all[r], wholes[r][r..r + 4], "rank {r}");
            }
        }
    }

    #[test]
    fn sentinels_differ_from_inputs() {
        let x: Vec<u64> = rank_input(9, 9, 0, 16, Dist::Bits);
        let s: Vec<u64> = sentinel(9, 9, 0, 16);
        assert!(x.iter().zip(&s).all(|(a, b)| a != b));
    }
}
