//! Which ranks share a host: the groups the hierarchical algorithms run in. Hosts are
//! numbered by the transport ([`Transport::host_of`](crate::cpu::transport::Transport::host_of));
//! every rank derives the same groups from the same numbering, once per communicator (the
//! engine keeps them and hands them to each call in its `Ctx`).

use crate::error::{Error, Result};

/// This rank's two groups: the ranks of its host, and the ranks at its position on every host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGroups {
    /// The communicator ranks on this rank's host, in rank order.
    pub local: Vec<usize>,
    /// This rank's position in `local`.
    pub local_index: usize,
    /// The communicator ranks at position `local_index` on each host, hosts in order of
    /// their lowest rank.
    pub cross: Vec<usize>,
    /// This rank's position in `cross`.
    pub cross_index: usize,
}

/// The communicator's ranks grouped by host (`host[i]`: the host of rank `i`), hosts in
/// order of their lowest rank.
fn by_host(host: &[usize]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (rank, &h) in host.iter().enumerate() {
        match groups.iter_mut().find(|g| g.0 == h) {
            Some(g) => g.1.push(rank),
            None => groups.push((h, vec![rank])),
        }
    }
    groups.into_iter().map(|g| g.1).collect()
}

/// `(hosts, ranks per host)` when the ranks (`host[i]`: the host of rank `i`) span at least
/// two hosts with the same number, at least two, on each: where the hierarchical algorithms
/// run ([`groups`] answers the same, with the groups).
#[cfg(test)]
fn uniform(host: &[usize]) -> Option<(usize, usize)> {
    layout_of(&by_host(host))
}

/// `(hosts, ranks per host)` of ranks already grouped by host, when hierarchical runs.
fn layout_of(groups: &[Vec<usize>]) -> Option<(usize, usize)> {
    let m = groups.first()?.len();
    (groups.len() >= 2 && m >= 2 && groups.iter().all(|g| g.len() == m)).then_some((groups.len(), m))
}

/// Rank `rank`'s groups among ranks on hosts `host` (`host[i]`: the host of rank `i`).
///
/// # Errors
/// [`Error::InvalidArgument`] unless the ranks span at least two hosts with the same number,
/// at least two, on each.
pub fn groups(host: &[usize], rank: usize) -> Result<HostGroups> {
    let all = by_host(host);
    if layout_of(&all).is_none() {
        return Err(Error::invalid(format!(
            "algorithm `hierarchical` needs a communicator spanning several hosts with the same number of ranks, at \
             least 2, on each; its ranks' hosts are {host:?}"
        )));
    }
    let mine = all.iter().find(|g| g.contains(&rank)).ok_or_else(|| Error::invalid(format!("no rank {rank}")))?;
    let local_index = mine.iter().position(|&r| r == rank).unwrap_or(0);
    let cross: Vec<usize> = all.iter().map(|g| g[local_index]).collect();
    let cross_index = cross.iter().position(|&r| r == rank).unwrap_or(0);
    Ok(HostGroups { local: mine.clone(), local_index, cross, cross_index })
}

impl HostGroups {
    /// `(hosts, ranks per host)`.
    pub fn layout(&self) -> (usize, usize) {
        (self.cross.len(), self.local.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_follow_the_hosts() {
        // Ranks 0 and 2 on host 5, 1 and 3 on host 9: interleaved placement.
        let host = [5, 9, 5, 9];
        assert_eq!(uniform(&host), Some((2, 2)));
        let g = groups(&host, 3).unwrap();
        assert_eq!(g, HostGroups { local: vec![1, 3], local_index: 1, cross: vec![2, 3], cross_index: 1 });
        let g = groups(&host, 0).unwrap();
        assert_eq!((g.local, g.cross), (vec![0, 2], vec![0, 1]));
        // Three hosts of three.
        let host = [0, 0, 0, 1, 1, 1, 2, 2, 2];
        assert_eq!(uniform(&host), Some((3, 3)));
        assert_eq!(groups(&host, 7).unwrap().cross, vec![1, 4, 7]);
        // Not hierarchical: one host, one rank per host, uneven hosts.
        for host in [&[0, 0, 0][..], &[0, 1, 2], &[0, 0, 1], &[]] {
            assert_eq!(uniform(host), None, "{host:?}");
            assert!(groups(host, 0).is_err());
        }
    }
}
