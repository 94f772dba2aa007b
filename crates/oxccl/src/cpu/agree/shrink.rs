//! Who is left after a failure: the membership of a shrunk communicator, agreed.
//!
//! One agreement decides a set of dead ranks, the same everywhere, but a rank may learn of a
//! death the decision missed (one that died after the coordinator proposed). So the ranks
//! agree again, each flagging whether everything it knows dead is in the last decision, until
//! every survivor says so: two agreements after a failure, one for a planned removal with
//! none. Dead sets only grow, so it ends. A rank that dies after the last agreement is found
//! by the new communicator's first operation that needs it (shrink again then).
//!
//! A planned removal (`shrink_excluding`) passes the same list on every rank; each rank
//! contributes a hash of its list (ANDed and ORed: equal only when every survivor's list is),
//! so lists that differ are an error on every rank alike.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use super::protocol::Contribution;
use super::service::Agreements;
use crate::backend::exclude::check_exclude;
use crate::error::{Error, Result};

/// A shrunk communicator's members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Membership {
    /// The old ranks that stay, in order (new rank i is old rank `kept[i]`).
    pub(crate) kept: Vec<usize>,
    /// The ranks agreed dead.
    pub(crate) dead: Vec<usize>,
    /// The last agreement's number: the same on every survivor, so it names the new
    /// communicator.
    pub(crate) number: u64,
}

/// The membership after this rank (`me` of `n`) and every survivor call it with `exclude`.
///
/// # Errors
/// [`Error::InvalidArgument`] when the survivors passed different lists; the agreement's
/// errors (a timeout at `deadline`).
pub(crate) fn agree_membership(ag: &Agreements, n: usize, exclude: &[usize], deadline: Instant) -> Result<Membership> {
    let excluded = check_exclude(exclude, n)?;
    // The list's hash in the high 63 bits; bit 0 says "everything I know dead is agreed".
    let list = {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        excluded.hash(&mut h);
        h.finish() & !1
    };
    let mut agreed: BTreeSet<usize> = BTreeSet::new();
    loop {
        let bit = u64::from(ag.dead().is_subset(&agreed));
        let (number, d) = ag.agree(Contribution { and: list | bit, or: list }, deadline)?;
        if d.and & !1 != d.or {
            return Err(Error::invalid(
                "shrink_excluding: the ranks passed different lists of ranks to exclude; every rank must pass the same",
            ));
        }
        agreed = d.dead.iter().copied().collect();
        if d.and & 1 == 1 {
            let kept = (0..n).filter(|r| !agreed.contains(r) && !excluded.contains(r)).collect();
            return Ok(Membership { kept, dead: d.dead, number });
        }
    }
}
