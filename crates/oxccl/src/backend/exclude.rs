//! The list of a planned removal (`shrink_excluding`), checked alike on every backend: every
//! rank that passes the same list gets the same answer.

use std::collections::BTreeSet;

use crate::error::{Error, Result};

/// Checks `exclude` against a communicator of `n` ranks; the ranks it names.
///
/// # Errors
/// [`Error::InvalidArgument`] for a rank out of range, a rank listed twice, or every rank.
pub(crate) fn check_exclude(exclude: &[usize], n: usize) -> Result<BTreeSet<usize>> {
    let mut seen = BTreeSet::new();
    for &r in exclude {
        if r >= n {
            return Err(Error::invalid(format!("shrink_excluding: rank {r} is not in this communicator of {n}")));
        }
        if !seen.insert(r) {
            return Err(Error::invalid(format!("shrink_excluding: rank {r} is listed twice")));
        }
    }
    if seen.len() == n {
        return Err(Error::invalid("shrink_excluding: every rank is excluded; keep at least one"));
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusion_lists_are_checked() {
        assert_eq!(check_exclude(&[2, 0], 4).unwrap(), [0, 2].into_iter().collect());
        assert!(check_exclude(&[], 1).unwrap().is_empty());
        let e = check_exclude(&[4], 4).unwrap_err().to_string();
        assert!(e.contains("rank 4 is not in this communicator of 4"), "{e}");
        let e = check_exclude(&[1, 1], 4).unwrap_err().to_string();
        assert!(e.contains("rank 1 is listed twice"), "{e}");
        let e = check_exclude(&[0, 1], 2).unwrap_err().to_string();
        assert!(e.contains("every rank is excluded"), "{e}");
        assert!(matches!(check_exclude(&[9], 2), Err(Error::InvalidArgument(_))));
    }
}
