//! Every rank's TCP address, handed to every rank at setup: the barrier that waits for all
//! of them ([`all_published`]) carries them, and the TCP links look there before the store
//! ([`KnownAddresses`]). A rank can then reach any peer without the store, whose host (rank
//! 0) may die: the survivors of a `shrink` connect to peers they never talked to.

use std::sync::Arc;
use std::time::Duration;

use crate::bootstrap::{MemoryRendezvous, Rendezvous};
use crate::error::{Error, Result};

/// Returns once every rank has published its TCP address, with every rank's address (empty
/// for a rank that has none): each rank publishes its own under `{prefix}/ready/{rank}`,
/// rank 0 waits for all and publishes them together under `{prefix}/ready`, which the
/// others read (O(N) lookups at rank 0, one at every other rank). With every address in hand
/// a rank can reach any peer without the store, whose host (rank 0) may die (`shrink`).
pub(crate) fn all_published(
    rank: usize,
    n: usize,
    rdv: &dyn Rendezvous,
    prefix: &str,
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    let own_key = crate::cpu::transport::tcp::address_key(prefix, rank);
    let mine = rdv.lookup_from(rank, &own_key, Duration::from_millis(1)).unwrap_or_default();
    rdv.publish(&format!("{prefix}/ready/{rank}"), &mine)?;
    if rank == 0 {
        let mut all = vec![mine];
        for r in 1..n {
            all.push(rdv.lookup_from(r, &format!("{prefix}/ready/{r}"), timeout).map_err(|e| {
                Error::Store(format!("rank {r} did not finish setting up its TCP transport within {timeout:?}: {e}"))
            })?);
        }
        rdv.publish(&format!("{prefix}/ready"), &encode_addresses(&all))?;
        return Ok(all);
    }
    let raw = rdv
        .lookup_from(0, &format!("{prefix}/ready"), timeout)
        .map_err(|e| Error::Store(format!("rank 0 did not see every rank set up within {timeout:?}: {e}")))?;
    decode_addresses(&raw, n)
}

/// Every rank's address as one value: per rank, its length (u32, little-endian), then it.
fn encode_addresses(all: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in all {
        out.extend_from_slice(&(a.len() as u32).to_le_bytes());
        out.extend_from_slice(a);
    }
    out
}

/// The inverse of [`encode_addresses`], for `n` ranks.
fn decode_addresses(mut b: &[u8], n: usize) -> Result<Vec<Vec<u8>>> {
    let bad = || Error::Store(format!("rank 0 published a malformed table of {n} TCP addresses"));
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        let (len, rest) = b.split_first_chunk::<4>().ok_or_else(bad)?;
        let len = u32::from_le_bytes(*len) as usize;
        let a = rest.get(..len).ok_or_else(bad)?;
        all.push(a.to_vec());
        b = &rest[len..];
    }
    if !b.is_empty() {
        return Err(bad());
    }
    Ok(all)
}

/// Peers' TCP addresses: the copy every rank got at setup ([`all_published`]) first, then
/// the directory the links were given (the store), for addresses the copy lacks.
pub(crate) struct KnownAddresses {
    pub(crate) copy: Arc<MemoryRendezvous>,
    pub(crate) directory: Arc<dyn Rendezvous>,
}

impl Rendezvous for KnownAddresses {
    fn publish(&self, key: &str, value: &[u8]) -> Result<()> {
        self.directory.publish(key, value)
    }

    fn lookup(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.copy.lookup(key, Duration::ZERO).or_else(|_| self.directory.lookup(key, timeout))
    }

    fn lookup_from(&self, owner: usize, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.copy.lookup(key, Duration::ZERO).or_else(|_| self.directory.lookup_from(owner, key, timeout))
    }

    fn rest(&self) {
        self.directory.rest();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ranks_address_travels_in_one_table_and_a_bad_one_is_refused() {
        let all = vec![b"10.0.0.1:5000".to_vec(), Vec::new(), b"[::1]:7".to_vec()];
        let b = encode_addresses(&all);
        assert_eq!(decode_addresses(&b, 3).expect("round trip"), all);
        for bad in [&b[..b.len() - 1], &b[..3], &[b.as_slice(), &[0]].concat()[..]] {
            let e = decode_addresses(bad, 3).expect_err("malformed");
            assert!(e.to_string().contains("malformed table of 3 TCP addresses"), "{e}");
        }
        assert!(decode_addresses(&b, 4).is_err(), "a table for fewer ranks");
    }
}
