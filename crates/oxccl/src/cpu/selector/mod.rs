//! Which algorithm runs a call of the CPU backends: the one the cost model predicts fastest
//! for the operation, the message size, the world size and the links between the ranks,
//! from measured machine costs. It owns the whole decision: a forced choice (per call, or
//! `OXCCL_ALGO`) wins; otherwise every applicable algorithm is priced and the cheapest
//! runs, the shared-memory family included where the communicator has it.
//!
//! - [`profile`]: the measured costs (α and bandwidth per transport, step, copy and
//!   reduction costs), their file form (`OXCCL_TUNE_FILE`, written by `oxccl tune`);
//! - [`cost`]: each algorithm's predicted time.
//!
//! Decisions are made per size class, a quarter of an octave each (the model is evaluated
//! at the class's upper bound, within 25% of any size in it; powers of two end a class),
//! once per class, operation and communicator, the first time a call needs them: a call
//! then costs one lookup. An operation's choices are logged when its first is made
//! (`tracing` at debug level, target `oxccl::cpu::selector`:
//! `OXCCL_LOG=warn,oxccl::cpu::selector=debug`): the algorithm of every size range, and the
//! costs it came from.
//!
//! Quarter octaves, not whole ones: a 3-rank gather of 4 KiB moves blocks of 1.3 KiB,
//! which a class ending at 2 KiB priced half as large again (its crowded crossover with
//! the shared-memory collectives lies between the two).

pub mod cost;
pub mod profile;

/// A file of recorded sweeps and profiles (`crates/oxccl/testdata/selector/`), for tests.
#[cfg(test)]
macro_rules! recorded {
    ($name:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/selector/", $name))
    };
}

#[cfg(test)]
mod replay;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use crate::algorithm::Algorithm;
use crate::cpu::transport::LinkKind;
use crate::op_kind::OpKind;
use profile::{LinkCost, Profile};

/// Size classes: sizes up to 8 bytes one class each; above, each octave `(2^(k-1), 2^k]` cut
/// in four equal quarters.
const CLASSES: usize = 9 + 4 * (usize::BITS as usize - 3);

/// The algorithm choice of one communicator.
pub struct Selector {
    profile: Arc<Profile>,
    link: LinkKind,
    n: usize,
    /// Ranks per CPU on the communicator's most crowded host (see [`cost`]).
    crowd: f64,
    /// `(hosts, ranks per host)` when the ranks span several hosts with several ranks on
    /// each, alike (where `hierarchical` runs).
    layout: Option<(usize, usize)>,
    /// The slot size of the shared-memory collectives each host's ranks set up among
    /// themselves, when they do (the hierarchical algorithms run their host phases on them).
    host_slot: Option<usize>,
    /// The setting that lets the shared-memory collectives read large blocks from the peers
    /// directly (see [`Selector::single_copy`]).
    single_copy: bool,
    /// Per operation (index in [`OpKind::ALL`]), without and with the shared-memory
    /// collectives, per size class: the algorithm's tag, 0 ([`Algorithm::Auto`]) until a
    /// call needed it ([`Selector::choose`]).
    choices: Box<[AtomicU8]>,
    /// Per operation, without and with the shared-memory collectives: whether its choices
    /// were logged.
    logged: Box<[AtomicBool]>,
}

/// A decision and what it was made from.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The algorithm that runs.
    pub algorithm: Algorithm,
    /// Every candidate with its predicted seconds, cheapest first (empty for a forced
    /// choice).
    pub predictions: Vec<(Algorithm, f64)>,
}

fn class_of(bytes: usize) -> usize {
    if bytes <= 8 {
        return bytes;
    }
    // 2^(k-1) < bytes <= 2^k, k >= 4: the quarter of that octave.
    let k = (usize::BITS - (bytes - 1).leading_zeros()) as usize;
    let base = 1usize << (k - 1);
    // (bytes - base).div_ceil(base / 4) by shifts: every call looks up its class, and a
    // division is tens of cycles. Cannot overflow: bytes - base < base <= 2^63.
    let shift = k - 3;
    let quarter = (bytes - base + (1 << shift) - 1) >> shift;
    9 + 4 * (k - 4) + quarter - 1
}

/// The largest size of class `c < CLASSES` (the last class: every size up to `usize::MAX`).
fn class_upper(c: usize) -> usize {
    if c <= 8 {
        return c;
    }
    let (k, quarter) = ((c - 9) / 4 + 4, (c - 9) % 4 + 1);
    let base = 1usize << (k - 1);
    base.saturating_add(quarter * (base / 4))
}

impl Selector {
    /// A selector for a communicator of `n` ranks whose slowest link is `link`, on hosts
    /// with at most `crowd` ranks per CPU. Every rank must pass the same values, or their
    /// choices differ.
    pub fn new(profile: Arc<Profile>, link: LinkKind, n: usize, crowd: f64) -> Selector {
        let choices = (0..OpKind::ALL.len() * 2 * CLASSES).map(|_| AtomicU8::new(0)).collect();
        let logged = (0..OpKind::ALL.len() * 2).map(|_| AtomicBool::new(false)).collect();
        Selector { profile, link, n, crowd, layout: None, host_slot: None, single_copy: false, choices, logged }
    }

    /// The same selector for ranks laid out on `layout`'s `(hosts, ranks per host)` (`None`:
    /// not several hosts with several ranks each, alike): `hierarchical` becomes a candidate.
    pub fn with_layout(mut self, layout: Option<(usize, usize)>) -> Selector {
        self.layout = layout;
        self
    }

    /// The same selector for shared-memory collectives that read large blocks from the
    /// peers directly where they may (`OXCCL_SHM_SINGLE_COPY`; off until this is called).
    pub fn with_single_copy(mut self, single_copy: bool) -> Selector {
        self.single_copy = single_copy;
        self
    }

    /// Whether the shared-memory collectives move large buffers by single-copy reads: as
    /// the settings say, on hosts with a CPU per rank (where ranks take turns on the CPUs,
    /// the kernel's copies serialize behind each other and the slots' pipelined chunks are
    /// faster; measurements: docs/selector.md). The same on every rank: the crowd is the
    /// job's. The engine sets its collectives up so, and the cost model prices them so.
    pub fn single_copy(&self) -> bool {
        self.single_copy && self.crowd <= 1.0
    }

    /// The same selector for hosts whose ranks run shared-memory collectives among
    /// themselves with slots of `slot` bytes (`None`: rings over the shared-memory
    /// transport), for pricing the host phases of `hierarchical`. It must be the same on
    /// every rank: the engine passes what the settings allow, not what each host managed
    /// to set up.
    pub fn with_host_collectives(mut self, slot: Option<usize>) -> Selector {
        self.set_host_collectives(slot);
        self
    }

    /// [`Selector::with_host_collectives`] in place (its decisions so far are forgotten).
    pub fn set_host_collectives(&mut self, slot: Option<usize>) {
        self.host_slot = slot;
        self.choices.iter_mut().for_each(|c| *c.get_mut() = 0);
        self.logged.iter_mut().for_each(|l| *l.get_mut() = false);
    }

    /// `(hosts, ranks per host)` when `hierarchical` can run.
    #[cfg(test)]
    pub fn layout(&self) -> Option<(usize, usize)> {
        self.layout
    }

    /// The same communicator priced with other costs and crowding.
    pub fn for_machine(&self, profile: Arc<Profile>, crowd: f64) -> Selector {
        Selector::new(profile, self.link, self.n, crowd)
            .with_layout(self.layout)
            .with_host_collectives(self.host_slot)
            .with_single_copy(self.single_copy)
    }

    /// The ranks per CPU this selector assumes.
    pub fn crowd(&self) -> f64 {
        self.crowd
    }

    /// The measured costs this selector reads.
    pub fn profile(&self) -> &Arc<Profile> {
        &self.profile
    }

    fn link_cost(&self) -> LinkCost {
        match self.link {
            LinkKind::Memory => self.profile.memory,
            LinkKind::Shm => self.profile.shm,
            LinkKind::Tcp => self.profile.tcp,
        }
    }

    /// The algorithms that may run `op`: its own, and `shared_memory` when `native_slot`
    /// (the chunk size of the communicator's shared-memory collectives) is given.
    pub fn candidates(op: OpKind, native_slot: Option<usize>) -> Vec<Algorithm> {
        let mut c = Algorithm::for_op(op).to_vec();
        if native_slot.is_some() && Algorithm::SharedMemory.applies_to(op) {
            c.push(Algorithm::SharedMemory);
        }
        c
    }

    /// Every candidate for `op` on `bytes` (its [`message_bytes`](crate::backend::Op::message_bytes)),
    /// priced by the model, cheapest first. `native_slot`: see [`Selector::candidates`].
    pub fn explain(&self, op: OpKind, bytes: usize, native_slot: Option<usize>) -> Choice {
        let link = self.link_cost();
        let costs = cost::Costs {
            link: &link,
            profile: &self.profile,
            slot: native_slot.unwrap_or(0),
            crowd: self.crowd,
            single_copy: self.single_copy(),
        };
        let mut predictions: Vec<(Algorithm, f64)> = Selector::candidates(op, native_slot)
            .into_iter()
            .filter_map(|a| cost::predict(op, a, self.n, bytes, &costs).map(|t| (a, t)))
            .collect();
        if let (OpKind::AllReduce, Some((h, m))) = (op, self.layout) {
            let (shm, tcp) = (self.profile.shm, self.profile.tcp);
            let (local, remote) = (cost::Costs { link: &shm, ..costs }, cost::Costs { link: &tcp, ..costs });
            let t = cost::predict_hierarchical(h, m, bytes, &local, &remote, self.host_slot);
            predictions.push((Algorithm::Hierarchical, t));
        }
        // Stable: among equal predictions the earlier candidate (the op's default) stays first.
        predictions.sort_by(|x, y| x.1.total_cmp(&y.1));
        let algorithm = predictions.first().map_or_else(|| Algorithm::for_op(op)[0], |p| p.0);
        Choice { algorithm, predictions }
    }

    /// The algorithm for `op` on `bytes`: `forced` when it is not `Auto`, else the model's
    /// choice for the size class of `bytes`.
    #[inline]
    pub fn choose(&self, op: OpKind, bytes: usize, forced: Algorithm, native_slot: Option<usize>) -> Algorithm {
        if forced != Algorithm::Auto {
            return forced;
        }
        // `OpKind::ALL` is in tag order: an operation's index in it is its tag.
        let variant = op as usize * 2 + usize::from(native_slot.is_some());
        let class = class_of(bytes).min(CLASSES - 1);
        let slot = &self.choices[variant * CLASSES + class];
        match Algorithm::from_tag(slot.load(Ordering::Relaxed)) {
            Some(known) if known != Algorithm::Auto => known,
            _ => self.choose_first(op, variant, class, slot, native_slot),
        }
    }

    /// The first choice for an operation and size class: the model's, remembered in `slot`.
    #[cold]
    fn choose_first(
        &self,
        op: OpKind,
        variant: usize,
        class: usize,
        slot: &AtomicU8,
        native_slot: Option<usize>,
    ) -> Algorithm {
        // Two threads that race here make the same choice.
        let chosen = self.explain(op, class_upper(class), native_slot).algorithm;
        slot.store(chosen as u8, Ordering::Relaxed);
        if tracing::enabled!(tracing::Level::DEBUG) && !self.logged[variant].swap(true, Ordering::Relaxed) {
            self.log(op, native_slot);
        }
        chosen
    }

    fn log(&self, op: OpKind, native_slot: Option<usize>) {
        // Ranges of equal choice up to 2^47 bytes (larger classes are not worth a line).
        let shown = class_of(1 << 47) + 1;
        let table: Vec<Algorithm> =
            (0..shown).map(|c| self.explain(op, class_upper(c), native_slot).algorithm).collect();
        let mut ranges = Vec::new();
        let mut from = 0;
        for c in 1..=shown {
            if c == shown || table[c] != table[from] {
                let upto = match (c == shown, from) {
                    (true, 0) => "every size".to_string(),
                    (true, f) => format!("above {} B", class_upper(f - 1)),
                    (false, _) => format!("up to {} B", class_upper(c - 1)),
                };
                ranges.push(format!("{upto}: {}", table[from]));
                from = c;
            }
        }
        let sample = self.explain(op, 1 << 20, native_slot);
        let costs: Vec<String> = sample.predictions.iter().map(|(a, t)| format!("{a} {:.1} us", t * 1e6)).collect();
        tracing::debug!(
            "{op} on {} ranks over {:?} links, {:.2} ranks per CPU: {}; at 1 MiB the model predicts {}; costs from {}",
            self.n,
            self.link,
            self.crowd,
            ranges.join(", "),
            costs.join(", "),
            self.profile.source
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(link: LinkKind, prof: Profile) -> Selector {
        Selector::new(Arc::new(prof), link, 8, 1.0)
    }

    fn pick(s: &Selector, op: OpKind, bytes: usize, n: usize, native: Option<usize>) -> Algorithm {
        Selector::new(Arc::clone(&s.profile), s.link, n, s.crowd).choose(op, bytes, Algorithm::Auto, native)
    }

    #[test]
    fn every_choice_applies_to_its_op() {
        let s = selector(LinkKind::Tcp, Profile::default());
        for op in OpKind::ALL {
            for bytes in [0, 8, 16 << 10, 1 << 20, 1 << 26] {
                for n in 1..=9 {
                    for native in [None, Some(1 << 20)] {
                        let a = pick(&s, op, bytes, n, native);
                        assert!(a.applies_to(op), "{op} {bytes} {n} -> {a}");
                    }
                }
            }
        }
        assert_eq!(s.choose(OpKind::AllReduce, 1 << 26, Algorithm::BinomialTree, None), Algorithm::BinomialTree);
        // The table's choice is the model's at the class's upper bound.
        assert_eq!(
            s.choose(OpKind::AllReduce, 3000, Algorithm::Auto, None),
            s.explain(OpKind::AllReduce, 3072, None).algorithm
        );
    }

    #[test]
    fn size_classes_are_quarter_octaves_that_powers_of_two_end() {
        for b in [0, 1, 8] {
            assert_eq!(class_upper(class_of(b)), b);
        }
        // Every size lies in its class, above the class before; powers of two end one.
        let mut sizes: Vec<usize> = (0..2000).collect();
        sizes.extend((4..usize::BITS).flat_map(|k| [(1usize << k) - 1, 1 << k, (1 << k) + 1, 3 << (k - 2)]));
        sizes.push(usize::MAX);
        for b in sizes {
            let c = class_of(b);
            assert!(c < CLASSES, "{b}");
            assert!(b <= class_upper(c), "{b} in class {c} up to {}", class_upper(c));
            assert!(c == 0 || b > class_upper(c - 1), "{b} in class {c}, above {}", class_upper(c - 1));
            // Within 25% of the size the class is priced at.
            assert!(class_upper(c) as f64 <= b as f64 * 1.25 + 2.0, "{b}: {}", class_upper(c));
        }
        for k in 4..usize::BITS {
            assert_eq!(class_upper(class_of(1 << k)), 1 << k);
        }
        assert_eq!(class_upper(CLASSES - 1), usize::MAX);
        assert_eq!(class_of(1364), class_of(1536));
        assert_ne!(class_of(1364), class_of(2048));
    }

    #[test]
    fn tcp_acknowledgements_tip_three_ranks_from_the_ring_to_bruck() {
        // At 3 ranks the ring and Bruck both take two exchanging rounds of one block; the
        // ring's messages travel one way on their connections and pay TCP's separate
        // acknowledgement (measured: docs/selector.md, "TCP's acknowledgements").
        let tcp = |ack| Profile { tcp: LinkCost { ack, ..Profile::default().tcp }, ..Profile::default() };
        let s = Selector::new(Arc::new(tcp(2e-6)), LinkKind::Tcp, 3, 1.0);
        assert_eq!(s.choose(OpKind::AllGather, 4096, Algorithm::Auto, None), Algorithm::Bruck);
        // Without acknowledgements Bruck's final rotation leaves the ring cheaper.
        let s = Selector::new(Arc::new(tcp(0.0)), LinkKind::Tcp, 3, 1.0);
        assert_eq!(s.choose(OpKind::AllGather, 4096, Algorithm::Auto, None), Algorithm::Ring);
        // Large blocks: the rotation's copy outweighs two acknowledgements.
        let s = Selector::new(Arc::new(tcp(2e-6)), LinkKind::Tcp, 3, 1.0);
        assert_eq!(s.choose(OpKind::AllGather, 4 << 20, Algorithm::Auto, None), Algorithm::Ring);
        // Shared memory has no acknowledgements: its picks ignore TCP's.
        let shm = |ack| Selector::new(Arc::new(tcp(ack)), LinkKind::Shm, 3, 1.0);
        assert_eq!(shm(2e-6).explain(OpKind::AllGather, 4096, None), shm(0.0).explain(OpKind::AllGather, 4096, None));
    }

    #[test]
    fn synthetic_costs_move_the_crossovers() {
        // A high-latency, high-bandwidth network: recursive doubling's lg p rounds win small
        // and medium sizes, Rabenseifner's 2 lg p rounds at ring bandwidth large ones; the
        // ring's 2(n - 1) rounds only pay off where the fold makes Rabenseifner move more.
        let slow_start = Profile {
            tcp: LinkCost {
                alpha: 100e-6,
                oneway_alpha: 100e-6,
                bandwidth: 10e9,
                cached_bandwidth: 10e9,
                oneway_bandwidth: 10e9,
                overhead: 1e-6,
                ack: 0.0,
                wait: 0.0,
            },
            ..Profile::default()
        };
        let s = selector(LinkKind::Tcp, slow_start);
        let ar = |bytes, n| pick(&s, OpKind::AllReduce, bytes, n, None);
        assert_eq!(ar(8, 8), Algorithm::RecursiveDoubling);
        assert_eq!(ar(256 << 10, 8), Algorithm::RecursiveDoubling);
        assert_eq!(ar(4 << 20, 8), Algorithm::Rabenseifner);
        assert_eq!(ar(256 << 20, 6), Algorithm::Ring, "a non-power-of-two world pays the fold");
        // A near-zero latency link: the ring's bandwidth optimality wins from small sizes on.
        let cheap = Profile {
            tcp: LinkCost {
                alpha: 0.01e-6,
                oneway_alpha: 0.01e-6,
                bandwidth: 1e9,
                cached_bandwidth: 1e9,
                oneway_bandwidth: 1e9,
                overhead: 0.01e-6,
                ack: 0.0,
                wait: 0.0,
            },
            ..Profile::default()
        };
        let s = selector(LinkKind::Tcp, cheap);
        assert_eq!(pick(&s, OpKind::AllReduce, 64 << 10, 6, None), Algorithm::Ring);
        assert_eq!(pick(&s, OpKind::AllGather, 64 << 10, 6, None), Algorithm::Ring);
        // Expensive latency: Bruck's lg n rounds beat the ring's n - 1 for all_gather.
        let far = Profile {
            tcp: LinkCost {
                alpha: 1e-3,
                oneway_alpha: 1e-3,
                bandwidth: 1e9,
                cached_bandwidth: 1e9,
                oneway_bandwidth: 1e9,
                overhead: 1e-6,
                ack: 0.0,
                wait: 0.0,
            },
            ..Profile::default()
        };
        let s = selector(LinkKind::Tcp, far);
        assert_eq!(pick(&s, OpKind::AllGather, 1024, 8, None), Algorithm::Bruck);
        assert_eq!(pick(&s, OpKind::ReduceScatter, 8 << 10, 8, None), Algorithm::RecursiveHalving);
    }

    #[test]
    fn shared_memory_wins_on_one_host_with_the_default_costs() {
        let s = selector(LinkKind::Shm, Profile::default());
        for op in [OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter, OpKind::Broadcast, OpKind::AllToAll] {
            for bytes in [8, 64 << 10, 16 << 20] {
                for n in [2, 3, 4, 8] {
                    let g = Selector::new(Arc::clone(&s.profile), LinkKind::Shm, n, 1.0);
                    let c = g.explain(op, bytes * if op == OpKind::ReduceScatter { n } else { 1 }, Some(1 << 20));
                    assert_eq!(c.algorithm, Algorithm::SharedMemory, "{op} {bytes} B on {n}: {:?}", c.predictions);
                }
            }
        }
        // Without the segment, it is not a candidate.
        let c = s.explain(OpKind::AllReduce, 8, None);
        assert!(c.predictions.iter().all(|(a, _)| *a != Algorithm::SharedMemory));
    }

    #[test]
    fn crowded_hosts_favour_fewer_messages_and_no_rendezvous() {
        let prof = Arc::new(Profile::default());
        let at = |link, n, crowd, op, bytes, native| {
            Selector::new(Arc::clone(&prof), link, n, crowd).explain(op, bytes, native).algorithm
        };
        let native = Some(1 << 20);
        let shm = |n, crowd, op, bytes| {
            let costs = cost::Costs { link: &prof.shm, profile: &prof, slot: 1 << 20, crowd, single_copy: false };
            let p2p = Algorithm::for_op(op)[0];
            (
                cost::predict(op, p2p, n, bytes, &costs).unwrap(),
                cost::predict(op, Algorithm::SharedMemory, n, bytes, &costs).unwrap(),
            )
        };
        for op in [OpKind::Broadcast, OpKind::Reduce, OpKind::Gather, OpKind::Scatter] {
            // One CPU per rank: the shared-memory rendezvous is the cheapest rooted operation.
            let (p2p, native_t) = shm(2, 1.0, op, 8);
            assert!(native_t < p2p, "{op}");
            // 3 and 8 ranks on 2 CPUs: each step waits for every rank to be scheduled in,
            // while one-way point-to-point calls overlap (measured: docs/selector.md).
            for (n, crowd) in [(3, 1.5), (4, 2.0), (8, 4.0)] {
                let (p2p, native_t) = shm(n, crowd, op, 8);
                assert!(p2p < native_t, "{op} on {n} ranks, {crowd} per CPU");
                assert_ne!(at(LinkKind::Shm, n, crowd, op, 8, native), Algorithm::SharedMemory);
            }
            // Large messages: the copies dominate and shared memory makes fewer.
            let (p2p, native_t) = shm(4, 2.0, op, 4 << 20);
            assert!(native_t < p2p, "{op}");
        }
        // The crowded step is the machine's: where turns are cheap (σ = 0.37 and σ₂ = 1.2
        // or 2.0 µs, as on the two VMs of docs/selector.md), a 4 KiB broadcast on 4 ranks
        // and 2 CPUs takes the rendezvous; where they are dear (σ₂ = 4 µs), the tree. Small
        // ones take the tree on all.
        for (crowded, bytes, want) in [
            (1.2e-6, 4096, Algorithm::SharedMemory),
            (2.0e-6, 4096, Algorithm::SharedMemory),
            (4.0e-6, 4096, Algorithm::BinomialTree),
            (1.2e-6, 8, Algorithm::BinomialTree),
            (2.0e-6, 8, Algorithm::BinomialTree),
        ] {
            let machine = Arc::new(Profile { native_step: 0.37e-6, crowded_step: crowded, ..Profile::default() });
            let s = Selector::new(machine, LinkKind::Shm, 4, 2.0);
            assert_eq!(s.explain(OpKind::Broadcast, bytes, native).algorithm, want, "σ₂ {crowded}, {bytes} B");
        }
        // A tree's rounds move one way: where that is faster than an exchange (a CPU per
        // rank; the link below is a 2-CPU VM's TCP over loopback, docs/selector.md), the
        // tree takes 2 ranks' mid sizes; where it is not, recursive doubling (one exchange)
        // keeps them. Past half the cache one way gains nothing.
        let two = |oneway_gbps: f64, bytes| {
            let tcp = LinkCost {
                alpha: 7.8e-6,
                oneway_alpha: 4.2e-6,
                bandwidth: 1.9e9,
                cached_bandwidth: 1.9e9,
                oneway_bandwidth: oneway_gbps * 1e9,
                overhead: 1.5e-6,
                ack: 0.0,
                wait: 15e-6,
            };
            let machine = Arc::new(Profile { tcp, cache: 2048.0 * 1024.0, ..Profile::default() });
            Selector::new(machine, LinkKind::Tcp, 2, 1.0).explain(OpKind::AllReduce, bytes, None).algorithm
        };
        assert_eq!(two(4.7, 256 << 10), Algorithm::BinomialTree);
        assert_eq!(two(1.9, 256 << 10), Algorithm::RecursiveDoubling);
        assert_ne!(two(4.7, 2 << 20), Algorithm::BinomialTree);
        // Symmetric operations keep the rendezvous: every rank waits for all anyway.
        assert_eq!(at(LinkKind::Shm, 4, 2.0, OpKind::AllReduce, 8, native), Algorithm::SharedMemory);
        // The work bound: with a costly crowded message and 8 ranks taking turns on 2 CPUs,
        // a binomial tree's 2(n - 1) messages beat recursive doubling's n lg n, which wins
        // on latency when every rank has a CPU.
        let busy = Arc::new(Profile { tcp: LinkCost { wait: 10e-6, ..prof.tcp }, ..Profile::default() });
        let tcp8 = |crowd| Selector::new(Arc::clone(&busy), LinkKind::Tcp, 8, crowd);
        assert_eq!(tcp8(1.0).explain(OpKind::AllReduce, 8, None).algorithm, Algorithm::RecursiveDoubling);
        assert_eq!(tcp8(4.0).explain(OpKind::AllReduce, 8, None).algorithm, Algorithm::BinomialTree);
        // With the measured costs of the reference machine, 8 ranks on 2 CPUs over TCP: the
        // binomial tree's 14 messages and one-way rounds beat recursive doubling's 24
        // messages at 8 B; at 2 MiB the ring's 256 KiB pieces fit the cache where
        // Rabenseifner's 1 MiB ones stream from memory (measured: docs/selector.md).
        let tcp =
            |n, crowd, op, bytes| Selector::new(Arc::clone(&prof), LinkKind::Tcp, n, crowd).explain(op, bytes, None);
        assert_eq!(tcp(8, 4.0, OpKind::AllReduce, 8).algorithm, Algorithm::BinomialTree);
        assert_eq!(tcp(8, 1.0, OpKind::AllReduce, 8).algorithm, Algorithm::RecursiveDoubling);
        assert_eq!(tcp(8, 4.0, OpKind::AllReduce, 2 << 20).algorithm, Algorithm::Ring);
        let no_cache = Arc::new(Profile { cache: 1.0, ..Profile::default() });
        let flat = Selector::new(no_cache, LinkKind::Tcp, 8, 4.0).explain(OpKind::AllReduce, 2 << 20, None);
        assert_ne!(flat.algorithm, Algorithm::Ring, "without the cache the ring's extra messages cost more");
        // A crowd below one CPU per rank changes nothing.
        for op in OpKind::ALL {
            for bytes in [8, 64 << 10, 16 << 20] {
                assert_eq!(at(LinkKind::Tcp, 8, 0.25, op, bytes, None), at(LinkKind::Tcp, 8, 1.0, op, bytes, None));
            }
        }
    }

    #[test]
    fn hierarchical_is_a_candidate_only_across_hosts_and_wins_large_all_reduces() {
        let flat = selector(LinkKind::Tcp, Profile::default());
        assert!(flat
            .explain(OpKind::AllReduce, 1 << 26, None)
            .predictions
            .iter()
            .all(|p| p.0 != Algorithm::Hierarchical));
        let (n, layout) = (4, Some((2, 2)));
        let s = Selector::new(Arc::new(Profile::default()), LinkKind::Tcp, n, 1.0).with_layout(layout);
        assert_eq!(s.choose(OpKind::AllReduce, 64 << 20, Algorithm::Auto, None), Algorithm::Hierarchical);
        assert_ne!(s.choose(OpKind::AllReduce, 8, Algorithm::Auto, None), Algorithm::Hierarchical);
        // Only all_reduce has it; the layout survives a change of machine costs.
        assert_ne!(s.choose(OpKind::AllGather, 64 << 20, Algorithm::Auto, None), Algorithm::Hierarchical);
        assert_eq!(s.for_machine(Arc::new(Profile::default()), 1.0).layout(), layout);
        // When TCP is as cheap as shared memory, splitting the work by host buys nothing.
        let mut same = Profile::default();
        same.tcp = same.shm;
        let s = Selector::new(Arc::new(same), LinkKind::Tcp, n, 1.0).with_layout(layout);
        assert_ne!(s.choose(OpKind::AllReduce, 64 << 20, Algorithm::Auto, None), Algorithm::Hierarchical);
    }

    #[test]
    fn the_xeons_profile_picks_its_fastest_scatter_and_small_broadcast() {
        // What `oxccl tune --ranks 2` wrote on the GPU machine's 16-core host (2026-11-28),
        // the profile the replay reads too.
        let prof = Arc::new(Profile::parse(recorded!("xeon16.profile")).expect("a valid profile"));
        let at = |n, single_copy, op, bytes| {
            Selector::new(Arc::clone(&prof), LinkKind::Shm, n, 1.0)
                .with_single_copy(single_copy)
                .explain(op, bytes, Some(256 << 10))
                .algorithm
        };
        // The fastest there, as measured (docs/selector.md, "Scatter").
        assert_eq!(at(8, true, OpKind::Scatter, 1 << 10), Algorithm::SharedMemory);
        assert_eq!(at(8, true, OpKind::Scatter, 16 << 10), Algorithm::Linear);
        assert_eq!(at(8, true, OpKind::Scatter, 256 << 10), Algorithm::SharedMemory);
        assert_eq!(at(8, false, OpKind::Scatter, 256 << 10), Algorithm::Linear);
        assert_eq!(at(16, false, OpKind::Scatter, 64 << 10), Algorithm::Linear);
        assert_eq!(at(8, true, OpKind::Scatter, 128 << 10), Algorithm::Linear);
        // A 64-byte broadcast on 8 ranks: the slots beat the tree.
        assert_eq!(at(8, true, OpKind::Broadcast, 64), Algorithm::SharedMemory);
    }

    #[test]
    fn hierarchical_prices_its_host_phases_as_the_hosts_shared_memory_collectives() {
        // A shared-memory transport as slow as TCP: rings inside the hosts buy nothing, but
        // the hosts' own shared-memory collectives (copies at memory speed) do.
        let mut slow = Profile::default();
        slow.shm = slow.tcp;
        let layout = Some((2, 2));
        let rings = Selector::new(Arc::new(slow), LinkKind::Tcp, 4, 1.0).with_layout(layout);
        let native = rings.for_machine(Arc::clone(rings.profile()), 1.0).with_host_collectives(Some(1 << 18));
        let price = |s: &Selector| {
            let c = s.explain(OpKind::AllReduce, 64 << 20, None);
            c.predictions.iter().find(|p| p.0 == Algorithm::Hierarchical).map(|p| p.1).unwrap()
        };
        assert!(price(&native) < 0.8 * price(&rings), "{} vs {}", price(&native), price(&rings));
        assert_ne!(rings.choose(OpKind::AllReduce, 64 << 20, Algorithm::Auto, None), Algorithm::Hierarchical);
        assert_eq!(native.choose(OpKind::AllReduce, 64 << 20, Algorithm::Auto, None), Algorithm::Hierarchical);
        // Kept across a change of machine costs; a decision made before is forgotten.
        let mut again = native.for_machine(Arc::clone(native.profile()), 1.0);
        assert_eq!(again.choose(OpKind::AllReduce, 64 << 20, Algorithm::Auto, None), Algorithm::Hierarchical);
        again.set_host_collectives(None);
        assert_ne!(again.choose(OpKind::AllReduce, 64 << 20, Algorithm::Auto, None), Algorithm::Hierarchical);
    }
}
