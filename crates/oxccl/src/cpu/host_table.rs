//! The job's host table: which host and which machine each rank is on, how many ranks and
//! CPUs each machine has, and how crowded the most crowded one is. Setup needs it on every
//! rank (shared memory within a host, the wait policy of a machine, hierarchical
//! algorithms), but no rank needs the other ranks' raw arrival messages: rank 0 reads them
//! (one lookup per rank) and publishes this table, and every other rank reads one key. The
//! store then carries O(N) bytes per rank, instead of every rank reading every arrival
//! (N² lookups through one server).
//!
//! The text form, one line each:
//!
//! ```text
//! oxccl-hosts 1
//! <crowd>                         ranks per CPU on the most crowded machine
//! <host of rank 0> <host of 1> ...  hosts numbered in order of first appearance
//! <machine of rank 0> ...           machines likewise
//! <ranks>:<cpus> ...                per machine: its ranks, and the union of their CPUs
//! ```

use crate::cpu::transport::shm::wait;
use crate::error::{Error, Result};

const MAGIC: &str = "oxccl-hosts 1";

/// See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostTable {
    /// The host of each rank, numbered in order of first appearance.
    pub(crate) host_of: Vec<usize>,
    /// The machine of each rank (hosts emulated in network namespaces, or containers, share
    /// one), numbered likewise.
    pub(crate) machine_of: Vec<usize>,
    /// Per machine: its ranks, and how many CPUs they may run on together.
    pub(crate) machines: Vec<(usize, usize)>,
    /// Ranks per CPU on the most crowded machine (at least 1).
    pub(crate) crowd: f64,
}

/// Numbers `items` in order of first appearance.
fn number<T: PartialEq>(items: &[T]) -> Vec<usize> {
    let mut seen: Vec<&T> = Vec::new();
    items
        .iter()
        .map(|h| {
            seen.iter().position(|s| *s == h).unwrap_or_else(|| {
                seen.push(h);
                seen.len() - 1
            })
        })
        .collect()
}

impl HostTable {
    /// The table of ranks whose hosts, machines and CPUs are `hosts[r]`, `machines[r]` and
    /// `masks[r]`.
    pub(crate) fn new(hosts: &[&[u8]], machines: &[&[u8]], masks: &[Vec<usize>]) -> HostTable {
        let host_of = number(hosts);
        let machine_of = number(machines);
        let count = machine_of.iter().max().map_or(0, |m| m + 1);
        let machines: Vec<(usize, usize)> = (0..count)
            .map(|m| {
                let ranks: Vec<usize> = (0..machine_of.len()).filter(|&r| machine_of[r] == m).collect();
                (ranks.len(), wait::union_len(ranks.iter().map(|&r| masks[r].as_slice())))
            })
            .collect();
        let crowd = machines.iter().fold(1.0f64, |worst, &(ranks, cpus)| worst.max(wait::crowd(ranks, cpus)));
        HostTable { host_of, machine_of, machines, crowd }
    }

    /// The ranks on `rank`'s host, ascending (`rank` among them).
    pub(crate) fn local(&self, rank: usize) -> Vec<usize> {
        (0..self.host_of.len()).filter(|&r| self.host_of[r] == self.host_of[rank]).collect()
    }

    /// `rank`'s machine: its ranks and CPUs.
    pub(crate) fn machine(&self, rank: usize) -> (usize, usize) {
        self.machines[self.machine_of[rank]]
    }

    /// The text form (see the module documentation).
    pub(crate) fn encode(&self) -> String {
        let join = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(" ");
        let machines: Vec<String> = self.machines.iter().map(|(r, c)| format!("{r}:{c}")).collect();
        format!("{MAGIC}\n{}\n{}\n{}\n{}", self.crowd, join(&self.host_of), join(&self.machine_of), machines.join(" "))
    }

    /// Parses the text form of a world of `n` ranks.
    ///
    /// # Errors
    /// [`Error::Internal`] for a malformed table (rank 0 and this rank run different
    /// versions, or the store returned something else).
    pub(crate) fn parse(text: &str, n: usize) -> Result<HostTable> {
        let bad = |why: &str| Error::Internal(format!("rank 0's host table is malformed ({why})"));
        let mut lines = text.split('\n');
        if lines.next() != Some(MAGIC) {
            return Err(bad("not an oxccl host table of this version"));
        }
        let crowd: f64 = lines.next().and_then(|l| l.parse().ok()).ok_or_else(|| bad("crowd"))?;
        let numbers = |l: Option<&str>, what: &str| -> Result<Vec<usize>> {
            let v: Option<Vec<usize>> = l.map(|l| l.split(' ').map(|x| x.parse().ok()).collect()).unwrap_or(None);
            v.filter(|v| v.len() == n).ok_or_else(|| bad(what))
        };
        let host_of = numbers(lines.next(), "hosts")?;
        let machine_of = numbers(lines.next(), "machines")?;
        let machines: Option<Vec<(usize, usize)>> = lines
            .next()
            .map(|l| {
                l.split(' ')
                    .map(|m| m.split_once(':').and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?))))
                    .collect::<Option<Vec<_>>>()
            })
            .unwrap_or(None);
        let machines = machines.ok_or_else(|| bad("machine sizes"))?;
        if machine_of.iter().any(|&m| m >= machines.len()) || crowd.is_nan() || crowd < 1.0 {
            return Err(bad("out of range"));
        }
        Ok(HostTable { host_of, machine_of, machines, crowd })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_numbers_hosts_and_machines_and_round_trips() {
        let (a, b, c): (&[u8], &[u8], &[u8]) = (b"a", b"b", b"c");
        // Hosts a and b are two namespaces of machine 1; c is machine 2.
        let hosts = [a, b, a, c, b];
        let machines: [&[u8]; 5] = [b"m1", b"m1", b"m1", b"m2", b"m1"];
        let masks = [vec![0, 1], vec![0, 1], vec![1], vec![0, 1, 2, 3], vec![]];
        let t = HostTable::new(&hosts, &machines, &masks);
        assert_eq!(t.host_of, vec![0, 1, 0, 2, 1]);
        assert_eq!(t.machine_of, vec![0, 0, 0, 1, 0]);
        assert_eq!(t.machines, vec![(4, 2), (1, 4)]);
        assert_eq!(t.crowd, 2.0);
        assert_eq!(t.local(4), vec![1, 4]);
        assert_eq!(t.machine(3), (1, 4));
        assert_eq!(HostTable::parse(&t.encode(), 5).unwrap(), t);
    }

    #[test]
    fn malformed_tables_are_refused() {
        let t = HostTable::new(&[b"a", b"a"], &[b"m", b"m"], &[vec![0], vec![1]]);
        assert_eq!(t.crowd, 1.0);
        let good = t.encode();
        assert!(HostTable::parse(&good, 3).is_err(), "wrong world size");
        for bad in [
            "",
            "oxccl-hosts 2\n1\n0 0\n0 0\n2:2",
            "oxccl-hosts 1\nx\n0 0\n0 0\n2:2",
            "oxccl-hosts 1\n1\n0 0\n0 1\n2:2",
            "oxccl-hosts 1\n1\n0 0\n0 0\n2",
            "oxccl-hosts 1\n0.5\n0 0\n0 0\n2:2",
            "oxccl-hosts 1\n1\n0 0\n0 0",
        ] {
            let e = HostTable::parse(bad, 2).unwrap_err().to_string();
            assert!(e.contains("host table"), "{bad:?}: {e}");
        }
    }
}
