//! `agree` and `shrink_excluding`'s list check as pure logic over one primitive: a
//! fault-tolerant AND of a 32-bit word among the live ranks ([`Agreer::and`]:
//! `MPIX_Comm_agree`, whose result ULFM makes identical on every rank that completes it, even
//! when ranks die during the call), and this rank's view of the failed ranks
//! ([`Agreer::known_failed`]: `MPIX_Comm_failure_ack`, then `MPIX_Comm_failure_get_acked`).
//!
//! ## Why the failed set is the same on every survivor
//!
//! `MPIX_Comm_agree` agrees on one `int`, and only implicitly on the failed processes (which
//! it does not return). [`agree`] therefore runs rounds of word agreements:
//!
//! 1. the flag's low and high 32 bits (two calls);
//! 2. an *alive* bitmask, 32 ranks a word (`ceil(n / 32)` calls): each rank contributes 0
//!    for every rank it knows failed (acknowledged just before) or that the previous round
//!    agreed failed, and 1 for every other rank. The AND is the union of the contributors'
//!    views: the candidate failed set `A`, identical everywhere because each word's AND is;
//! 3. a *stable* bit (one call): each rank acknowledges again and contributes 1 when every
//!    failure it now knows is in `A`. ULFM says that a process that failed before
//!    contributing to an agreement is found by a later `failure_ack` on every survivor, so a
//!    rank that died during the round makes some survivor contribute 0.
//!
//! When the stable AND is 1, every survivor returns the round's flag and `A`; otherwise
//! every survivor runs another round (the decision rests on agreed values only, so all take
//! the same branch). `A` never shrinks from one round to the next (the previous round's `A`
//! is contributed as failed), and a round ends unstable only because some survivor knew a
//! failure outside `A`, which the next round adds unless that survivor died first: at most
//! about two rounds per failure, so the loop ends ([`max_rounds`], `4 n + 4`, guards it anyway). A rank
//! that dies after contributing to the last stable bit is found by the next operation (or
//! agreement) that needs it, as on the cpu backend.
//!
//! The return codes of the word agreements are not used to steer: `MPIX_ERR_PROC_FAILED`
//! from `MPIX_Comm_agree` still carries the agreed flag (the failure it reports is what step
//! 3 catches), so [`Agreer::and`] hands back the value either way.
//!
//! Cost: `ceil(n / 32) + 3` agreements a round; one round without failures.

use std::collections::BTreeSet;

use crate::error::{Error, Result};

/// The rounds [`agree`] runs at most before it gives up (far more than failures can cause).
pub(crate) fn max_rounds(n: usize) -> usize {
    4 * n + 4
}

/// The fault-tolerant primitives one rank uses.
pub(crate) trait Agreer {
    /// The AND of `word` over the live ranks that contributed: the same value on every rank
    /// that completes the call.
    ///
    /// # Errors
    /// What the MPI reports other than a process failure; a timeout.
    fn and(&mut self, word: u32) -> Result<u32>;

    /// The ranks this rank knows failed (acknowledged): grows only.
    ///
    /// # Errors
    /// What the MPI reports.
    fn known_failed(&mut self) -> Result<BTreeSet<usize>>;
}

/// What the survivors agreed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The AND of the flags.
    pub(crate) flag: u64,
    /// The ranks agreed failed, in order.
    pub(crate) failed: Vec<usize>,
    /// Rounds it took.
    pub(crate) rounds: usize,
}

/// The alive bitmask of a world of `n` ranks without `failed`: bit `r % 32` of word `r / 32`
/// is 0 for a failed rank, 1 otherwise (also past `n`).
pub(crate) fn alive_words(n: usize, failed: &BTreeSet<usize>) -> Vec<u32> {
    let mut words = vec![u32::MAX; n.div_ceil(32)];
    for &r in failed.iter().filter(|&&r| r < n) {
        words[r / 32] &= !(1u32 << (r % 32));
    }
    words
}

/// The ranks below `n` whose bit in `words` is 0.
pub(crate) fn failed_of(n: usize, words: &[u32]) -> Vec<usize> {
    (0..n).filter(|&r| words.get(r / 32).is_none_or(|w| w & (1u32 << (r % 32)) == 0)).collect()
}

/// The agreement of `flag` among the survivors of `n` ranks (see the module's doc).
///
/// # Errors
/// The primitives' errors; [`Error::Internal`] after [`max_rounds`] rounds without a stable
/// one (on every survivor alike).
pub(crate) fn agree(a: &mut impl Agreer, n: usize, flag: u64) -> Result<Decision> {
    let mut agreed: BTreeSet<usize> = BTreeSet::new();
    for round in 1..=max_rounds(n) {
        let mut mine = a.known_failed()?;
        mine.extend(agreed.iter().copied());
        let lo = a.and(flag as u32)?;
        let hi = a.and((flag >> 32) as u32)?;
        let words = alive_words(n, &mine).into_iter().map(|w| a.and(w)).collect::<Result<Vec<u32>>>()?;
        let failed = failed_of(n, &words);
        agreed = failed.iter().copied().collect();
        let now = a.known_failed()?;
        if a.and(u32::from(now.is_subset(&agreed)))? & 1 == 1 {
            return Ok(Decision { flag: u64::from(lo) | (u64::from(hi) << 32), failed, rounds: round });
        }
    }
    Err(Error::Internal(format!(
        "agree: the survivors did not settle on the failed ranks in {} rounds of MPIX_Comm_agree",
        max_rounds(n)
    )))
}

/// A 32-bit digest of a list of ranks (sorted, without repeats), the same in every process
/// (FNV-1a over the ranks' little-endian bytes; not `DefaultHasher`, whose keys are not
/// promised to stay fixed).
pub(crate) fn list_digest(ranks: &BTreeSet<usize>) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &r in ranks {
        for b in (r as u64).to_le_bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h
}

/// Whether every survivor passed the list whose digest is `digest`: the AND of the digests
/// equals the OR (the complement of the AND of the complements) only when they are all equal,
/// and the answer depends on agreed values only, so it is the same on every survivor.
///
/// # Errors
/// The primitive's errors.
pub(crate) fn same_everywhere(a: &mut impl Agreer, digest: u32) -> Result<bool> {
    let and = a.and(digest)?;
    let and_of_complements = a.and(!digest)?;
    Ok(and == !and_of_complements)
}

#[cfg(test)]
mod tests;
