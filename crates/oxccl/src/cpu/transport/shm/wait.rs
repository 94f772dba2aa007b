//! How a rank waits for its peers on one host: the [`WaitPolicy`], and the detection of an
//! oversubscribed host that chooses it.
//!
//! A wait has three phases:
//! 1. **spin** (`OXCCL_SPIN_US`): poll without a system call. The fastest hand-off when the
//!    peer runs on another core at the same time; wasted, and worse, when the peer needs the
//!    core we hold (oversubscription).
//! 2. **yield** (`OXCCL_YIELD_US`): poll, calling `sched_yield` between looks. With no other
//!    runnable thread on our core this is a spin with a short system call in it; with one,
//!    that thread runs at once, for its whole time slice. When that thread is a peer rank
//!    sharing the core, this is what removes the latency cliff of oversubscribed hosts.
//!    When it is anything else (another process, a data loader), it hands our core away
//!    while a peer waits for us.
//! 3. **sleep**: a futex wait until a writer rings the doorbell. A long wait (a peer still
//!    computing) costs no CPU, at the price of a wake-up system call and scheduling delay.
//!
//! The automatic choice ([`WaitPolicy::for_host`]):
//! - **ranks outnumber the CPUs they may run on**: never spin (a spinning rank holds the core
//!   a peer needs), yield for [`YIELD_CROWDED`], then sleep.
//! - **a CPU per rank**: spin for [`SPIN_DEDICATED`], longer than a scheduler tick, then
//!   sleep; never yield. The thread a yield would let run is not a peer (each has its own
//!   CPU) but some other work, and a rank that sleeps or yields while its peer was switched
//!   out for one tick falls into a chain of wake-ups.
//!
//! Measurements: docs/performance.md.

use std::time::Duration;

/// The spin phase when every rank has a CPU of its own: longer than a scheduler tick (4 ms
/// at 250 Hz, 10 ms at 100 Hz), so that a peer switched out for one tick finds us still
/// polling; short enough that a rank waiting for a slow peer soon stops taking CPU time.
pub const SPIN_DEDICATED: Duration = Duration::from_millis(10);
/// The yield phase when the ranks outnumber their CPUs: long enough to cover a peer that was
/// descheduled for a scheduler time slice (a few ms), short enough that a rank waiting for a
/// slow peer soon stops taking CPU time.
pub const YIELD_CROWDED: Duration = Duration::from_millis(2);

/// How long each phase of a shared-memory wait lasts (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Busy polling, no system call.
    pub spin: Duration,
    /// Polling with `sched_yield` between looks, after the spin.
    pub yield_for: Duration,
}

impl Default for WaitPolicy {
    /// The policy of a host with a CPU for every rank.
    fn default() -> Self {
        WaitPolicy { spin: SPIN_DEDICATED, yield_for: Duration::ZERO }
    }
}

impl WaitPolicy {
    /// The policy for `ranks` ranks sharing `cpus` CPUs, with the user's overrides
    /// (`OXCCL_SPIN_US`, `OXCCL_YIELD_US`) where given.
    pub fn for_host(ranks: usize, cpus: usize, spin: Option<Duration>, yield_for: Option<Duration>) -> WaitPolicy {
        let auto = if oversubscribed(ranks, cpus) {
            WaitPolicy { spin: Duration::ZERO, yield_for: YIELD_CROWDED }
        } else {
            WaitPolicy::default()
        };
        WaitPolicy { spin: spin.unwrap_or(auto.spin), yield_for: yield_for.unwrap_or(auto.yield_for) }
    }
}

/// Whether `ranks` ranks would compete for `cpus` CPUs (more ranks than CPUs; an unknown
/// CPU count, 0, counts as not oversubscribed).
pub fn oversubscribed(ranks: usize, cpus: usize) -> bool {
    crowd(ranks, cpus) > 1.0
}

/// Ranks per CPU (an unknown CPU count, 0, counts as one CPU per rank).
pub fn crowd(ranks: usize, cpus: usize) -> f64 {
    if cpus == 0 {
        1.0
    } else {
        ranks as f64 / cpus as f64
    }
}

/// The CPUs this thread may run on (its affinity mask), as CPU numbers. Falls back to
/// `0..available_parallelism` where the mask cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size and pointer describe `set`, which the kernel
    // fills.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        return (0..n).collect();
    }
    // SAFETY: CPU_ISSET reads the set within its size (CPU_SETSIZE bits).
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// `cpus` as a compact list (`0-3,8,10-11`), the form the ranks of a host exchange.
pub fn format_cpus(cpus: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    out.join(",")
}

/// Parses [`format_cpus`]'s form; `None` when it is malformed.
pub fn parse_cpus(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// The CPUs a host's ranks may run on together: the union of their masks (so that ranks
/// bound one per core count as many CPUs as ranks, not one).
pub fn union_len<'a>(masks: impl IntoIterator<Item = &'a [usize]>) -> usize {
    let mut all: Vec<usize> = masks.into_iter().flatten().copied().collect();
    all.sort_unstable();
    all.dedup();
    all.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_ranks_than_cpus_never_spin_and_ranks_with_their_own_cpus_never_yield() {
        let p = WaitPolicy::for_host(4, 2, None, None);
        assert_eq!(p, WaitPolicy { spin: Duration::ZERO, yield_for: YIELD_CROWDED });
        let p = WaitPolicy::for_host(3, 2, None, None);
        assert_eq!(p.spin, Duration::ZERO);
        // One CPU per rank, or more: spin past a scheduler tick, then sleep.
        assert_eq!(
            WaitPolicy::for_host(2, 2, None, None),
            WaitPolicy { spin: SPIN_DEDICATED, yield_for: Duration::ZERO }
        );
        assert!(SPIN_DEDICATED > Duration::from_millis(4));
        assert_eq!(WaitPolicy::for_host(16, 64, None, None).spin, SPIN_DEDICATED);
        // An unknown CPU count is not taken for oversubscription.
        assert_eq!(WaitPolicy::for_host(8, 0, None, None).spin, SPIN_DEDICATED);
    }

    #[test]
    fn the_users_settings_win() {
        let us = |n| Some(Duration::from_micros(n));
        let p = WaitPolicy::for_host(4, 2, us(300), us(0));
        assert_eq!(p, WaitPolicy { spin: Duration::from_micros(300), yield_for: Duration::ZERO });
        assert_eq!(WaitPolicy::for_host(2, 8, us(0), None).spin, Duration::ZERO);
        // Each phase on its own: the other stays automatic.
        assert_eq!(
            WaitPolicy::for_host(2, 8, None, us(70)),
            WaitPolicy { spin: SPIN_DEDICATED, yield_for: Duration::from_micros(70) }
        );
        assert_eq!(WaitPolicy::for_host(4, 2, us(5), None).yield_for, YIELD_CROWDED);
    }

    #[test]
    fn cpu_lists_round_trip_and_union() {
        for cpus in [vec![], vec![0], vec![0, 1, 2, 3], vec![0, 2, 3, 4, 9, 11, 12]] {
            let s = format_cpus(&cpus);
            assert_eq!(parse_cpus(&s), Some(cpus.clone()), "{s}");
        }
        assert_eq!(format_cpus(&[0, 2, 3, 4, 9]), "0,2-4,9");
        assert_eq!(parse_cpus("1-x"), None);
        assert_eq!(parse_cpus("4-1"), None);
        assert_eq!(parse_cpus("0-99999999"), None);
        // Four ranks bound one per core use four CPUs; four ranks on the same two, two.
        let bound: Vec<Vec<usize>> = (0..4).map(|c| vec![c]).collect();
        assert_eq!(union_len(bound.iter().map(|m| m.as_slice())), 4);
        let shared = [vec![0, 1], vec![0, 1], vec![0, 1], vec![0, 1]];
        assert_eq!(union_len(shared.iter().map(|m| m.as_slice())), 2);
        assert!(!allowed_cpus().is_empty());
    }
}
