//! Collective fingerprints: what each message says it belongs to, so that ranks running
//! different collectives find out (with [`Error::Mismatch`](crate::Error::Mismatch)) instead
//! of hanging or exchanging garbage.

use std::fmt;

use crate::algorithm::Algorithm;
use crate::dtype::DType;
pub use crate::op_kind::OpKind;
use crate::reduce_op::ReduceOp;

/// What a collective is: every rank must agree on all of it.
///
/// For the uneven variants (`all_gather_v`, `all_to_all_v`) `count` is what this rank
/// expects from the peer in question, so a peer that sends a different amount is caught too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// Position of the collective on its communicator (0, 1, 2, ...).
    pub seq: u64,
    /// Which collective.
    pub op: OpKind,
    /// Element type.
    pub dtype: DType,
    /// Element count (per rank, as the operation defines it).
    pub count: u64,
    /// The root rank, for rooted collectives.
    pub root: Option<u32>,
    /// The reduce op, for reductions.
    pub reduce: Option<ReduceOp>,
    /// The algorithm that runs it (ranks that chose differently cannot interoperate).
    pub algorithm: Algorithm,
}

impl Fingerprint {
    /// The fingerprint of a split (`Communicator::split`, `new_group`) as collective `seq`:
    /// every rank exchanges its (color, key) pair, two `i64` values.
    pub fn of_split(seq: u64, algorithm: Algorithm) -> Fingerprint {
        Fingerprint { seq, op: OpKind::Split, dtype: DType::I64, count: 2, root: None, reduce: None, algorithm }
    }

    /// The fingerprint of point-to-point operation `op` (`Send` or `Recv`) of `count`
    /// elements of `dtype`, as batch `seq`: what a receiver compares a message against.
    pub fn of_p2p(op: OpKind, seq: u64, dtype: DType, count: usize) -> Fingerprint {
        Fingerprint { seq, op, dtype, count: count as u64, root: None, reduce: None, algorithm: Algorithm::Linear }
    }

    /// The length of [`to_bytes`](Self::to_bytes).
    pub const BYTES: usize = 24;

    /// The fingerprint in 24 bytes, as it travels between ranks: sequence number, count and
    /// root (little-endian; no root is `u32::MAX`), then the tags of op, dtype, reduction
    /// (none is 255) and algorithm.
    pub fn to_bytes(&self) -> [u8; Fingerprint::BYTES] {
        let mut b = [0u8; Fingerprint::BYTES];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..20].copy_from_slice(&self.root.unwrap_or(u32::MAX).to_le_bytes());
        b[20..24].copy_from_slice(&[
            self.op as u8,
            self.dtype as u8,
            self.reduce.map_or(u8::MAX, |r| r as u8),
            self.algorithm as u8,
        ]);
        b
    }

    /// The fingerprint as three words (the little-endian words of [`to_bytes`](Self::to_bytes)),
    /// for memory that holds it in atomics: the shared-memory control lines, the flight
    /// recorder's ring.
    pub fn to_words(&self) -> [u64; 3] {
        let b = self.to_bytes();
        std::array::from_fn(|i| u64::from_le_bytes(std::array::from_fn(|j| b[8 * i + j])))
    }

    /// Decodes [`to_words`](Self::to_words).
    ///
    /// # Errors
    /// As [`from_bytes`](Self::from_bytes).
    pub fn from_words(w: [u64; 3]) -> std::result::Result<Fingerprint, &'static str> {
        let mut b = [0u8; Fingerprint::BYTES];
        for (i, x) in w.iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&x.to_le_bytes());
        }
        Fingerprint::from_bytes(&b)
    }

    /// Decodes [`to_bytes`](Self::to_bytes).
    ///
    /// # Errors
    /// What is wrong: a truncated encoding or an unknown tag.
    pub fn from_bytes(b: &[u8]) -> std::result::Result<Fingerprint, &'static str> {
        let b: &[u8; Fingerprint::BYTES] =
            b.get(..Fingerprint::BYTES).and_then(|b| b.try_into().ok()).ok_or("truncated fingerprint")?;
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let root = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
        Ok(Fingerprint {
            seq: word(0),
            count: word(8),
            root: (root != u32::MAX).then_some(root),
            op: OpKind::from_tag(b[20]).ok_or("unknown op tag in a fingerprint")?,
            dtype: DType::from_tag(b[21]).ok_or("unknown dtype tag in a fingerprint")?,
            reduce: match b[22] {
                u8::MAX => None,
                t => Some(ReduceOp::from_tag(t).ok_or("unknown reduce op tag in a fingerprint")?),
            },
            algorithm: Algorithm::from_tag(b[23]).ok_or("unknown algorithm tag in a fingerprint")?,
        })
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}({} x {}", self.op, self.seq, self.dtype, self.count)?;
        if let Some(r) = self.reduce {
            write!(f, ", {r}")?;
        }
        if let Some(root) = self.root {
            write!(f, ", root {root}")?;
        }
        write!(f, ", {})", self.algorithm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_kinds_are_listed_in_tag_order() {
        // The wire decodes a tag by its index in `ALL`, and the selector indexes its table by
        // the tag: both need every kind at the index of its tag.
        for (i, op) in OpKind::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, i, "{op}");
            assert_eq!(OpKind::from_tag(op as u8), Some(op));
        }
        assert_eq!(OpKind::from_tag(OpKind::ALL.len() as u8), None);
    }
}
