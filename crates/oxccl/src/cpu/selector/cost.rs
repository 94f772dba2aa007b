//! The α-β-γ cost of each algorithm (Hockney's model, as Thakur, Rabenseifner and Gropp
//! use it for MPI's collectives): a message of `m` bytes over a link costs `α + m β`
//! (`β` = 1 / bandwidth, taken at the message's size: see
//! [`LinkCost::transfer`](super::profile::LinkCost::transfer)); combining `m` bytes costs
//! `m γ`; a local copy `m κ`. `n` ranks, `p` the largest power of two `≤ n`, `L = log2 p`,
//! `e = 1` when `n` is not a power of two (the fold of the halving/doubling algorithms
//! costs two more rounds), `⌈lg n⌉` the rounds of a binomial tree. `m` is
//! [`Op::message_bytes`](crate::backend::Op::message_bytes): the per-rank buffer of
//! all_reduce, reduce, broadcast; the input block of all_gather and gather; the whole input
//! of reduce_scatter and all_to_all; the output of scatter.
//!
//! | operation | algorithm | cost (β at the size of each round's message) |
//! |---|---|---|
//! | all_reduce | ring | `2(n−1)α + 2(n−1)/n·mβ + (n−1)/n·mγ` |
//! | | recursive_doubling | `(L + 2e)(α + mβ) + (L + e)·mγ` |
//! | | rabenseifner | `(2L + 2e)α + 2(p−1)/p·mβ + (p−1)/p·mγ + e·m(2β + γ)` |
//! | | binomial_tree | `2⌊lg n⌋α₁ + 2⌈lg n⌉·mβ₁ + ⌈lg n⌉·mγ` (one way, see below; `⌊lg n⌋` deep, the root's `⌈lg n⌉` messages queue) |
//! | all_gather (block b) | ring | `(n−1)(α + bβ)` |
//! | | bruck | `⌈lg n⌉α + (n−1)bβ + n·bκ` (the final rotation) |
//! | reduce_scatter (input m) | ring | `(n−1)α + (n−1)/n·m(β + γ)` |
//! | | recursive_halving | `(L + 2e)α + (p−1)/p·m(β + γ) + e·m(β + γ)` |
//! | broadcast | binomial_tree | `⌈lg n⌉(α + mβ)` |
//! | reduce | binomial_tree | `⌈lg n⌉(α + mβ + mγ)` |
//! | all_to_all (input m) | pairwise | `(n−1)α + (n−1)/n·mβ` |
//! | gather, scatter | linear | `(n−1)α + (n−1)/n·mβ` at the root |
//! | barrier | dissemination | `⌈lg n⌉α` |
//! | all_reduce, `h` hosts of `m` | hierarchical | `α` (empty messages to and from the ring neighbours), ring reduce-scatter (`m` ranks, input `m`) and ring all-gather (`m` ranks, block `m/m`) over the shared-memory link, ring all_reduce (`h` ranks, `m/m`) over TCP |
//!
//! `α` and `β` are measured in exchanges (both ranks of a pair send at once, as in a ring's
//! or recursive doubling's rounds). A tree's rounds move one way: with latency `α₁` (half a
//! ping-pong), and up to half the cache at `β₁` (the profile's `oneway_gbps`), past it at
//! `β`. On a host with a CPU per rank one way can be twice as fast.
//!
//! Each exchanging algorithm is written down as a [`Plan`]: the messages of its critical
//! path round by round, and every message the job sends with the bytes it combines and
//! copies; the table is the plan's critical path.
//!
//! The shared-memory family pays a step `σ` per chunk (every rank publishes and waits for
//! the others) and local copies instead of messages: all_reduce up to 16 KiB `σ + mκ +
//! (n−1)mγ`, above `2kσ + 2mκ + (n−1)/n·mγ·n/2` with `k` chunks; the block movers `kσ` plus
//! one copy in and one out of the bytes each rank handles (a broadcast's peers copy out
//! lines the root wrote, at the copy rate past the cache; where large moves read the
//! peers' buffers directly, single copy, they cost about `2σ` and one copy; they are
//! priced as the slots all the same, which already makes them the cheapest candidate where
//! they run, except scatter's, which a linear scatter can beat). Scatter's root alone
//! fills the slots, so its price follows the root: every peer's block written past the
//! cache, one peer's copy of its last chunk, and with single copy the peers' reads of the
//! root's input.
//!
//! Refinements price what the rounds above leave out (`o`: a link's CPU time per message
//! when messages stream one way; `c`: the crowd, the host's ranks over its CPUs):
//! - **Work.** A point-to-point algorithm costs at least the messages each rank handles
//!   times `o`.
//! - **Acknowledgements.** A message whose connection carries nothing back within the
//!   operation costs the link's `ack` (TCP's, measured by `oxccl tune`; the shared-memory
//!   and in-process links have none): TCP acknowledges it with a segment of its own as soon
//!   as it is read, where a message going back would have carried the acknowledgement. A
//!   ring's messages all go to the successor, so from 3 ranks on each pays it; Bruck and
//!   dissemination pay it in the rounds that no round answers (`d` along, with nothing
//!   sent `n − d` along: none at 3 ranks); pairwise exchanges and recursive doubling and
//!   halving use every connection both ways.
//! - **Crowded hosts.** When the ranks outnumber the CPUs they take turns, and an
//!   exchanging algorithm costs at least all of the job's work shared by the CPUs: every
//!   message's `w` (the link's `wait`: all the CPU time a message takes when ranks share
//!   CPUs, its sender's and its receiver's system calls and the switches between ranks whose
//!   waits yield), every byte sent at the link's bandwidth for that message size, every
//!   byte combined and copied; plus the turns of the critical path, in place of its
//!   latencies α (measured between ranks that spin, each on a CPU of its own): `2w` per
//!   exchanging round (it ends once both partners ran after each other's send), `w` per
//!   one-way round. `oxccl tune` measures `w` as a quarter of an 8-byte exchange between
//!   two ranks on one CPU (one exchanging round and two messages' work). Fewer messages and
//!   one-way rounds win small sizes, and fewer bytes, and messages that fit the cache, win
//!   large ones (the ring's `m/n` pieces).
//! - **One-way operations.** Broadcast, reduce, gather and scatter over point-to-point
//!   never wait for a reply, so back-to-back calls overlap: they cost the busiest rank's
//!   messages (`⌈lg n⌉` for a tree's root, `n−1` for linear) times `o/2 + 3mκ` (half the
//!   overhead, see `ONE_WAY_SHARE`; copied into the link, out into the mailbox and into
//!   the caller's buffer, from one core to another: `κ` past the cache; `o/2 + mβ` above a
//!   chunk, which streams), not rounds of `α`. A linear scatter's root copies each block
//!   once, and the receivers' copies overlap its next sends: `o/2 + m(κ + κ_c)/2`, its
//!   input in the cache (`κ_c`) and the link past it. Between two ranks, back-to-back
//!   operations are a stream that the receiver paces: the whole `o`, three copies. On
//!   crowded hosts the busiest CPU runs the busiest rank and `c − 1` average ones beside
//!   it (`busiest + (c − 1)·total/n` messages), and every message's bytes cost `β`
//!   whatever their size: the copies of its two ends no longer overlap, and run cold
//!   after another rank's turn.
//! - **Crowded rendezvous.** A shared-memory step waits for every rank: when `c > 1` the
//!   ranks must also be switched in and out, `σ + 2(c − 1)(σ₂ − σ)` per step (`σ₂`: the
//!   step `oxccl tune` measures with two ranks on one CPU, whose turns take `σ₂ − σ`).
//!   Across several CPUs the turns of each are not in step with the others', and about
//!   half of them find their rank still waiting for another CPU's: twice the turns. With
//!   3 ranks on 2 CPUs one CPU runs a single rank, which needs no switch: `c` = 1.5, not
//!   the busiest CPU's 2. This makes the tree and linear algorithms win the small rooted
//!   operations on such hosts (a rank that names another root is still caught: the
//!   shared-memory collectives keep a tally of point-to-point frames, see
//!   `algorithms/shared_memory`).
//!
//! Measurements: docs/selector.md.

use super::profile::{LinkCost, Profile};
use crate::algorithm::Algorithm;
use crate::cpu::algorithms::shared_memory;
use crate::op_kind::OpKind;

/// The shared-memory collectives reduce messages up to this size in one step.
const NATIVE_DIRECT: f64 = 16.0 * 1024.0;

/// What each peer's single-copy read of a scatter's root costs besides its bytes: the
/// kernel pins the pages it reads, and readers of the same root queue behind each other
/// (see the shared-memory collectives' `reads_directly`). Fitted on a 16-core machine
/// (docs/selector.md).
const SINGLE_COPY_READER: f64 = 2e-6;

/// The part of a link's overhead `o` that the busiest rank of a one-way operation on 3
/// ranks or more pays per message, on a host with a CPU per rank. `oxccl tune` measures `o`
/// as the pace of a stream between two ranks, which the receiver's work sets (back-to-back
/// operations between two ranks are such a stream, and pay all of it); a root that sends to
/// or receives from several peers, each on a CPU of its own, pays about half of it.
/// Measurements: docs/selector.md.
const ONE_WAY_SHARE: f64 = 0.5;

fn lg_ceil(n: usize) -> f64 {
    (usize::BITS - n.saturating_sub(1).leading_zeros()) as f64
}

/// What a price depends on besides the call: the links between the ranks, the machine,
/// the communicator's shared-memory chunk and how crowded its hosts are.
#[derive(Debug, Clone, Copy)]
pub struct Costs<'a> {
    /// The slowest link between two ranks of the communicator.
    pub link: &'a LinkCost,
    /// The machine's measured costs.
    pub profile: &'a Profile,
    /// The chunk size of the shared-memory collectives.
    pub slot: usize,
    /// Ranks per CPU on the most crowded host (above 1: oversubscribed).
    pub crowd: f64,
    /// Whether the shared-memory collectives may read large blocks from the peers
    /// directly (single copy; the engine's setting on a host with a CPU per rank).
    pub single_copy: bool,
}

/// How a message on the critical path moves.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Round {
    /// Both partners send and receive at once: latency `α`, two turns on crowded hosts.
    Exchange,
    /// One way (the rank receiving it sends nothing meanwhile): `α₁`, one turn.
    OneWay,
    /// One way, queued behind another on the same rank (a binomial tree's root takes its
    /// children's messages, sent at once, one after the other): its bytes only; its latency
    /// and turn overlap the message before it.
    Queued,
}

/// An exchanging algorithm's messages: the critical path, round by round, and the whole
/// job's traffic.
#[derive(Debug, Default)]
struct Plan {
    /// The size of each message on the critical path, and how it moves.
    rounds: Vec<(f64, Round)>,
    /// Every message the job sends, as (how many, size) groups.
    total: Vec<(f64, f64)>,
    /// Bytes combined on the critical path and in the whole job.
    reduced: (f64, f64),
    /// Bytes copied locally on the critical path and in the whole job.
    copied: (f64, f64),
    /// Messages each rank sends, all on its critical path, whose connection carries
    /// nothing back within the operation: each costs the link's `ack`.
    acked: f64,
    /// The buffer the local work runs over (in the cache or not).
    working: f64,
}

impl Plan {
    /// `count` rounds of `size`-byte messages, `each` of them sent per round in the job.
    fn rounds(mut self, count: f64, size: f64, each: f64) -> Plan {
        self.rounds.extend(std::iter::repeat_n((size, Round::Exchange), count as usize));
        self.total.push((count * each, size));
        self
    }

    /// Rounds as [`Plan::rounds`] whose messages move one way.
    fn oneway_rounds(mut self, count: f64, size: f64, each: f64) -> Plan {
        self.rounds.extend(std::iter::repeat_n((size, Round::OneWay), count as usize));
        self.total.push((count * each, size));
        self
    }

    /// `count` messages of `size` on the critical path that queue behind others
    /// ([`Round::Queued`]); the job's traffic counts them elsewhere.
    fn queued(mut self, count: f64, size: f64) -> Plan {
        self.rounds.extend(std::iter::repeat_n((size, Round::Queued), count as usize));
        self
    }

    /// Messages off the critical path.
    fn also(mut self, count: f64, size: f64) -> Plan {
        self.total.push((count, size));
        self
    }

    fn reduce(mut self, critical: f64, total: f64) -> Plan {
        self.reduced = (critical, total);
        self
    }

    fn copy(mut self, critical: f64, total: f64) -> Plan {
        self.copied = (critical, total);
        self
    }

    /// `each` of every rank's messages travel one way on their connection (see
    /// [`one_way_connection`]).
    fn acked(mut self, each: f64) -> Plan {
        self.acked = each;
        self
    }

    /// Seconds for `n` ranks: the critical path, bounded below by each rank's share of the
    /// messages' overhead; on crowded hosts, the critical path's turns and the whole job's
    /// work shared by the CPUs.
    fn price(&self, n: f64, c: &Costs<'_>) -> f64 {
        let (link, prof) = (c.link, c.profile);
        let send = |s: f64| link.transfer(s, prof.cache);
        let one_way = |s: f64| link.transfer_oneway(s, prof.cache);
        let (g, k) = (prof.reduce_time(self.working), prof.copy_time(self.working));
        let bytes = |&(s, how): &(f64, Round)| if how == Round::Exchange { send(s) } else { one_way(s) };
        let latency = |&(_, how): &(f64, Round)| match how {
            Round::Exchange => link.alpha,
            Round::OneWay => link.alpha_oneway(),
            Round::Queued => 0.0,
        };
        let local = self.reduced.0 * g + self.copied.0 * k + self.acked * link.ack;
        let streamed: f64 = self.rounds.iter().map(bytes).sum::<f64>() + local;
        let messages: f64 = self.total.iter().map(|t| t.0).sum();
        if c.crowd <= 1.0 {
            let critical = streamed + self.rounds.iter().map(latency).sum::<f64>();
            return critical.max(messages / n * link.overhead);
        }
        // Crowded, the latency α (measured between ranks that spin, each on its CPU) gives
        // way to the turns below.
        let critical = streamed;
        let cpus = n / c.crowd;
        let work = messages * link.wait
            + self.total.iter().map(|&(count, s)| count * send(s)).sum::<f64>()
            + self.reduced.1 * g
            + self.copied.1 * k
            + self.acked * n * link.ack;
        // An exchanging round ends once both partners ran after each other's send; a
        // one-way round once the receiver ran after the send.
        let turns: f64 = self
            .rounds
            .iter()
            .map(|&(_, how)| match how {
                Round::Exchange => 2.0,
                Round::OneWay => 1.0,
                Round::Queued => 0.0,
            })
            .sum();
        critical.max(turns * link.wait + work / cpus)
    }
}

/// Whether the messages sent `d` ranks along (to rank `r + d`, or all to `r − d`) among `n`
/// ranks travel one way on their connections, when the operation's rounds send at the
/// distances `all`: the messages coming back on the same connection would be sent `n − d`
/// along. A ring (`all = [1]`) uses its connections one way from 3 ranks on; Bruck and
/// dissemination at 3 ranks (1 and 2 along) use each both ways.
fn one_way_connection(n: usize, d: usize, all: &[usize]) -> bool {
    d < n && !all.contains(&(n - d))
}

/// The plan of an exchanging algorithm; `None` for the one-way and shared-memory ones.
fn plan(op: OpKind, algo: Algorithm, n: usize, m: f64) -> Option<Plan> {
    use Algorithm as A;
    use OpKind as O;
    let nf = n as f64;
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let pf = p as f64;
    let l = pf.log2();
    // The ranks beyond the power of two fold into a partner and get the result back: two
    // one-way rounds.
    let (e, extra) = if p == n { (0.0, 0.0) } else { (1.0, nf - pf) };
    let lgn = lg_ceil(n);
    // Recursive halving's steps: m/2, m/4, ... among p ranks.
    let halving = |mut plan: Plan, rounds: f64| {
        for i in 1..=rounds as i32 {
            plan = plan.rounds(1.0, m / 2f64.powi(i), pf);
        }
        plan
    };
    let plan = Plan { working: m, ..Plan::default() };
    // The ring sends 1 along; Bruck and dissemination 1, 2, 4, ... along.
    let ring_acked = f64::from(u8::from(one_way_connection(n, 1, &[1])));
    let doubling: Vec<usize> = (0..usize::BITS).map(|i| 1usize << i).take_while(|&d| d < n).collect();
    Some(match (op, algo) {
        (O::AllReduce, A::Ring) => plan
            .rounds(2.0 * (nf - 1.0), m / nf, nf)
            .reduce((nf - 1.0) / nf * m, (nf - 1.0) * m)
            .acked(ring_acked * 2.0 * (nf - 1.0)),
        (O::AllReduce, A::RecursiveDoubling) => {
            plan.rounds(l, m, pf).oneway_rounds(2.0 * e, m, extra).reduce((l + e) * m, (pf * l / 2.0 + extra) * m)
        }
        (O::AllReduce, A::Rabenseifner) => {
            // Reduce-scatter by halving, all-gather by doubling: the same sizes twice.
            let plan = halving(halving(plan, l), l).oneway_rounds(2.0 * e, m, extra);
            plan.reduce(((pf - 1.0) / pf + e) * m, (pf - 1.0 + extra) * m)
        }
        (O::AllReduce, A::BinomialTree) => {
            // Each round a rank either sends or receives: one way. The tree is `⌊lg n⌋` deep
            // (the longest chain of ranks waiting for a child), but the root takes and sends
            // `⌈lg n⌉` messages: at 3 ranks both leaves send at once.
            let depth = nf.log2().floor();
            plan.oneway_rounds(2.0 * depth, m, 0.0)
                .queued(2.0 * (lgn - depth), m)
                .also(2.0 * (nf - 1.0), m)
                .reduce(lgn * m, (nf - 1.0) * m)
        }
        (O::AllGather, A::Ring) => plan.rounds(nf - 1.0, m, nf).acked(ring_acked * (nf - 1.0)),
        (O::AllGather, A::Bruck) => {
            // Round i sends the 2^i blocks gathered so far (the last, what is missing).
            let mut plan = plan;
            let mut have = 1.0;
            let mut acked = 0.0;
            while have < nf {
                let k = have.min(nf - have);
                plan = plan.rounds(1.0, k * m, nf);
                acked += f64::from(u8::from(one_way_connection(n, have as usize, &doubling)));
                have += k;
            }
            plan.copy(nf * m, nf * nf * m).acked(acked)
        }
        (O::ReduceScatter, A::Ring) => {
            plan.rounds(nf - 1.0, m / nf, nf).reduce((nf - 1.0) / nf * m, (nf - 1.0) * m).acked(ring_acked * (nf - 1.0))
        }
        (O::ReduceScatter, A::RecursiveHalving) => halving(plan, l)
            .oneway_rounds(e, m, extra)
            .oneway_rounds(e, m / nf, extra)
            .reduce(((pf - 1.0) / pf + e) * m, (pf - 1.0 + extra) * m),
        (O::AllToAll | O::AllToAllV, A::Pairwise) => plan.rounds(nf - 1.0, m / nf, nf),
        (O::AllGatherV, A::Ring) => plan.rounds(nf - 1.0, m / nf, nf).acked(ring_acked * (nf - 1.0)),
        (O::Barrier, A::Dissemination) => {
            let acked = doubling.iter().filter(|&&d| one_way_connection(n, d, &doubling)).count() as f64;
            plan.rounds(lgn, 0.0, nf).acked(acked)
        }
        _ => return None,
    })
}

/// Seconds per step of the shared-memory collectives with `crowd` ranks per CPU: the
/// measured step `σ`, and above one rank per CPU `2(c − 1)(σ₂ − σ)` more, `σ₂` measured
/// with two ranks on one CPU (see the module documentation).
fn step_cost(prof: &Profile, crowd: f64) -> f64 {
    let extra = (prof.crowded_step - prof.native_step).max(0.0);
    prof.native_step + 2.0 * (crowd - 1.0).max(0.0) * extra
}

/// Predicted seconds for `algo` running `op` on `bytes` (see the module documentation) over
/// `n` ranks. `None` when the algorithm does not run the operation.
pub fn predict(op: OpKind, algo: Algorithm, n: usize, bytes: usize, costs: &Costs<'_>) -> Option<f64> {
    if n <= 1 {
        return Some(0.0);
    }
    let (link, prof) = (costs.link, costs.profile);
    let nf = n as f64;
    let m = bytes as f64;
    if let Some(plan) = plan(op, algo, n, m) {
        return Some(plan.price(nf, costs));
    }
    let b = 1.0 / link.bandwidth;
    let slot = costs.slot.max(4096) as f64;
    // The shared-memory family streams through its slots in pieces that stay in the cache:
    // its copies and reductions run at the cached rates.
    let g = 1.0 / prof.cached_reduce;
    let k = 1.0 / prof.cached_copy;
    let crowd = costs.crowd.max(1.0);
    let s = step_cost(prof, costs.crowd);
    let chunks = |per_step: f64| (m / per_step.max(64.0)).ceil().max(1.0);
    // A one-way operation: the busiest rank handles `busiest` messages of `size` bytes
    // (`copies`: the per-byte cost of its copies with a CPU per rank; `extra`: per-byte work
    // besides them), `total` in all. With a CPU per rank, a message up to a chunk is copied
    // into the link and out without waiting, and the busiest rank pays its share of the
    // link's overhead ([`ONE_WAY_SHARE`]); a larger message streams at the link's
    // bandwidth. On crowded hosts every message's bytes cost the link's bandwidth and its
    // whole overhead (see the module documentation).
    // Between two ranks, back-to-back one-way operations are a stream between one pair.
    let several_peers = n > 2;
    let share = if crowd <= 1.0 && several_peers { ONE_WAY_SHARE } else { 1.0 };
    let one_way = |busiest: f64, total: f64, size: f64, copies: f64, extra: f64| {
        let per_byte = if crowd <= 1.0 && size <= slot { copies } else { b };
        let per = share * link.overhead + size * (per_byte + extra);
        // The busiest CPU runs the busiest rank and `c − 1` average ones beside it.
        (busiest + (crowd - 1.0) * total / nf) * per
    };
    // A message that a rank receives to pass on or keep is copied three times (into the
    // link, out into the mailbox's buffer, into the caller's), from one core to another, at
    // the copy rate past the cache whatever its size.
    let relayed = 3.0 / prof.copy;
    // A linear scatter's root copies each block once, from its input (in the cache: the
    // caller wrote it) into the link (past it: the receiver read those lines last), half of
    // the bytes' traffic at each rate; the receivers' copies overlap the root's next sends.
    // Between two ranks the receiver's copies pace the stream.
    let sent_once = if several_peers { (1.0 / prof.copy + k) / 2.0 } else { relayed };
    let lgn = lg_ceil(n);
    use Algorithm as A;
    use OpKind as O;
    let t = match (op, algo) {
        (O::AllReduce, A::SharedMemory) if m <= NATIVE_DIRECT.min(slot) => s + m * k + (nf - 1.0) * m * g,
        (O::AllReduce, A::SharedMemory) => 2.0 * chunks(slot) * s + 2.0 * m * k + (nf - 1.0) / nf * m * g,
        (O::AllGather, A::SharedMemory) => chunks(slot) * s + (1.0 + nf) * m * k,
        (O::ReduceScatter, A::SharedMemory) => chunks(slot) * s + m * k + (nf - 1.0) / nf * m * g,
        (O::Broadcast, A::BinomialTree) => one_way(lgn, nf - 1.0, m, relayed, 0.0),
        // The root copies its input into its slot (cached); each peer then copies the
        // root's lines out from the root's core, at the copy rate past the cache.
        (O::Broadcast, A::SharedMemory) => chunks(slot) * s + m * k + m / prof.copy,
        (O::Reduce, A::BinomialTree) => one_way(lgn, nf - 1.0, m, relayed, g),
        // The root combines n chunks in one pass: reading n sources costs about n/2
        // two-source reductions.
        (O::Reduce, A::SharedMemory) => chunks(slot) * s + m * k + nf / 2.0 * m * g,
        (O::AllToAll, A::SharedMemory) => chunks(slot) * s + 2.0 * (nf - 1.0) / nf * m * k,
        (O::Gather, A::Linear) => one_way(nf - 1.0, nf - 1.0, m, relayed, 0.0),
        (O::Scatter, A::Linear) => one_way(nf - 1.0, nf - 1.0, m, sent_once, 0.0),
        (O::Gather, A::SharedMemory) => chunks(slot) * s + nf * m * k,
        // Single copy: every peer reads its block of the root's input at once (see
        // `scatter_reads_directly`), each at the copy rate past the cache, all of them
        // together at about twice that, and each reader's call costs the root
        // [`SINGLE_COPY_READER`].
        (O::Scatter, A::SharedMemory)
            if costs.single_copy && crowd <= 1.0 && shared_memory::scatter_reads_directly(n, bytes) =>
        {
            s + (m / prof.copy).max(nf * m / (2.0 * prof.copy)) + (nf - 1.0) * SINGLE_COPY_READER
        }
        // The root fills its slot with a chunk for each peer (chunks of `1/n` of a slot),
        // writing lines that the peers read last, at the copy rate past the cache; then each
        // peer copies its chunk out (at that rate too). A fill overlaps the copies of the
        // step before it, so only the last one adds.
        (O::Scatter, A::SharedMemory) => {
            let chunk = (slot / nf).max(64.0);
            chunks(chunk) * s + ((nf - 1.0) * m + m.min(chunk)) / prof.copy + m * k
        }
        (O::Barrier, A::SharedMemory) => s,
        _ => return None,
    };
    Some(t)
}

/// Predicted seconds for `hierarchical` all_reduce of `bytes` on `h` hosts of `m` ranks (see
/// the table): its phases inside the hosts priced with `local`'s link (as the host's
/// shared-memory collectives with slots of `host_slot` bytes where the hosts have them,
/// else as rings), the one between them with `remote`'s.
pub fn predict_hierarchical(
    h: usize,
    m: usize,
    bytes: usize,
    local: &Costs<'_>,
    remote: &Costs<'_>,
    host_slot: Option<usize>,
) -> f64 {
    let (s, mf) = (bytes as f64, m as f64);
    let priced = |op, n: usize, size: f64, c: &Costs<'_>| {
        plan(op, Algorithm::Ring, n, size).map_or(0.0, |p| p.price(n as f64, c))
    };
    // Inside the host: the host's shared-memory collectives where it has them, else rings.
    let on_host = |op, size: f64| match host_slot {
        Some(slot) => predict(op, Algorithm::SharedMemory, m, size as usize, &Costs { slot, ..*local }),
        None => Some(priced(op, m, size, local)),
    };
    // The opening empty messages to and from the ring neighbours (one round).
    remote.link.alpha
        + on_host(OpKind::ReduceScatter, s).unwrap_or(0.0)
        + priced(OpKind::AllReduce, h, s / mf, remote)
        + on_host(OpKind::AllGather, s / mf).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(alpha_us: f64, gbps: f64) -> LinkCost {
        LinkCost {
            alpha: alpha_us * 1e-6,
            oneway_alpha: alpha_us * 1e-6,
            bandwidth: gbps * 1e9,
            cached_bandwidth: gbps * 1e9,
            oneway_bandwidth: gbps * 1e9,
            overhead: 0.5e-6,
            ack: 0.0,
            wait: 0.0,
        }
    }

    #[test]
    fn costs_follow_the_textbook_shapes() {
        let prof = Profile { tcp: link(10.0, 1.0), ..Profile::default() };
        let costs = Costs { link: &prof.tcp, profile: &prof, slot: 1 << 20, crowd: 1.0, single_copy: false };
        let t = |op, a, n, m| predict(op, a, n, m, &costs).unwrap();
        // Latency terms: rounds times alpha at zero bytes.
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        assert!(close(t(OpKind::AllReduce, Algorithm::Ring, 4, 0), 6.0 * 10e-6));
        assert!(close(t(OpKind::AllReduce, Algorithm::RecursiveDoubling, 4, 0), 2.0 * 10e-6));
        assert!(close(t(OpKind::AllReduce, Algorithm::RecursiveDoubling, 6, 0), 4.0 * 10e-6), "fold: +2 rounds");
        assert!(close(t(OpKind::AllReduce, Algorithm::Rabenseifner, 8, 0), 6.0 * 10e-6));
        assert!(close(t(OpKind::Barrier, Algorithm::Dissemination, 5, 0), 3.0 * 10e-6));
        // Bandwidth terms: the ring moves 2(n-1)/n of the buffer, recursive doubling lg(n) times it.
        let big = 1 << 26;
        assert!(
            t(OpKind::AllReduce, Algorithm::Ring, 8, big) < t(OpKind::AllReduce, Algorithm::RecursiveDoubling, 8, big)
        );
        assert!(t(OpKind::AllReduce, Algorithm::Ring, 8, 8) > t(OpKind::AllReduce, Algorithm::RecursiveDoubling, 8, 8));
        assert_eq!(predict(OpKind::Broadcast, Algorithm::Ring, 4, 8, &costs), None);
        assert_eq!(predict(OpKind::AllReduce, Algorithm::Ring, 1, 1 << 20, &costs), Some(0.0));
        assert_eq!(lg_ceil(1), 0.0);
        assert_eq!(lg_ceil(5), 3.0);
        assert_eq!(lg_ceil(8), 3.0);
    }

    #[test]
    fn messages_on_one_way_connections_pay_an_acknowledgement() {
        // A ring sends every message to its successor: from 3 ranks on nothing comes back
        // on those connections, and each message costs the link's `ack`; at 2 ranks the
        // successor is the predecessor. Bruck at 3 ranks sends 1 and then 2 along, so each
        // connection carries a message each way; at 4, its first round (1 along) is one
        // way, its second (2 along) an exchange. Pairwise and recursive doubling use every
        // connection both ways.
        use Algorithm as A;
        use OpKind as O;
        let acked = Profile { tcp: LinkCost { ack: 2e-6, ..link(10.0, 1.0) }, ..Profile::default() };
        let plain = Profile { tcp: link(10.0, 1.0), ..Profile::default() };
        let extra = |op, algo, n, crowd| {
            let t = |p: &Profile| {
                let costs = Costs { link: &p.tcp, profile: p, slot: 1 << 20, crowd, single_copy: false };
                predict(op, algo, n, 0, &costs).unwrap()
            };
            t(&acked) - t(&plain)
        };
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        for (op, algo, n, acks) in [
            (O::AllGather, A::Ring, 2, 0.0),
            (O::AllGather, A::Ring, 3, 2.0),
            (O::ReduceScatter, A::Ring, 4, 3.0),
            (O::AllReduce, A::Ring, 5, 8.0),
            (O::AllGatherV, A::Ring, 3, 2.0),
            (O::AllGather, A::Bruck, 3, 0.0),
            (O::AllGather, A::Bruck, 4, 1.0),
            // 1, 2 and 4 along: only the messages 2 along have no partner 3 along.
            (O::Barrier, A::Dissemination, 5, 1.0),
            (O::Barrier, A::Dissemination, 3, 0.0),
            (O::AllToAll, A::Pairwise, 5, 0.0),
            (O::AllReduce, A::RecursiveDoubling, 4, 0.0),
        ] {
            let got = extra(op, algo, n, 1.0);
            assert!(close(got, acks * 2e-6), "{op} {algo} on {n} ranks: {got}");
        }
        // Crowded, every such message of the job adds its acknowledgement to the work the
        // CPUs share: 3 ranks on 2 CPUs, a ring's 6 messages.
        assert!(close(extra(O::AllGather, A::Ring, 3, 1.5), 6.0 * 2e-6 / 2.0));
        assert!(close(extra(O::AllGather, A::Bruck, 3, 1.5), 0.0));
    }

    #[test]
    fn a_binomial_trees_latency_is_its_depth_and_its_roots_messages_queue() {
        let prof = Profile { tcp: link(10.0, 1.0), ..Profile::default() };
        let t = |n, m, crowd| {
            let costs = Costs { link: &prof.tcp, profile: &prof, slot: 1 << 20, crowd, single_copy: false };
            predict(OpKind::AllReduce, Algorithm::BinomialTree, n, m, &costs).unwrap()
        };
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9 * y.max(1e-6);
        // 3 ranks: both leaves send at once, one hop up and one down; 5: two each way; 4
        // and 8: lg n each way.
        for (n, hops) in [(3, 2.0), (4, 4.0), (5, 4.0), (7, 4.0), (8, 6.0)] {
            assert!(close(t(n, 0, 1.0), hops * 10e-6), "{n} ranks: {}", t(n, 0, 1.0));
        }
        // The root still takes and sends ⌈lg n⌉ buffers one after the other, each with its
        // bytes (1 MB at 1 GB/s: 1 ms, far above the latency).
        let m = 1_000_000;
        assert!(t(3, m, 1.0) > 4e-3 && t(5, m, 1.0) > 6e-3, "{} {}", t(3, m, 1.0), t(5, m, 1.0));
        // Crowded, a hop is one turn (a wait each): 3 ranks take two turns, recursive
        // doubling four (an exchange and the fold's two one-way rounds).
        let wait = LinkCost { wait: 5e-6, ..prof.tcp };
        let crowded = Costs { link: &wait, profile: &prof, slot: 1 << 20, crowd: 1.5, single_copy: false };
        let tree = predict(OpKind::AllReduce, Algorithm::BinomialTree, 3, 0, &crowded).unwrap();
        let rd = predict(OpKind::AllReduce, Algorithm::RecursiveDoubling, 3, 0, &crowded).unwrap();
        assert!(close(rd - tree, 2.0 * 5e-6), "tree {tree}, recursive doubling {rd}");
    }

    #[test]
    fn a_crowded_rooted_operation_loads_the_busiest_cpu_and_pays_the_links_rate() {
        // The link's rate (1 GB/s: 1 ns per byte) far below the copies' (3 copies at 30
        // GB/s: 0.1 ns per byte), so the two prices tell apart.
        let shm = LinkCost { overhead: 1e-6, ..link(1.0, 1.0) };
        let prof = Profile { shm, copy: 30e9, ..Profile::default() };
        let t = |op, algo, n, m, crowd| {
            let costs = Costs { link: &prof.shm, profile: &prof, slot: 1 << 20, crowd, single_copy: false };
            predict(op, algo, n, m, &costs).unwrap()
        };
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9 * y;
        let m = 4096;
        // A CPU per rank: the root's two messages, each copied three times, at half the
        // overhead.
        let per = 0.5e-6 + m as f64 * 3.0 / 30e9;
        assert!(close(t(OpKind::Broadcast, Algorithm::BinomialTree, 4, m, 1.0), 2.0 * per));
        // 4 ranks on 2 CPUs: the root's CPU also runs an average rank (3 messages in all,
        // 3/4 each), and a message's bytes cost the link's rate and its whole overhead.
        let per = 1e-6 + m as f64 * 1e-9;
        assert!(close(t(OpKind::Broadcast, Algorithm::BinomialTree, 4, m, 2.0), 2.75 * per));
        // Linear gather on 8 ranks on 2 CPUs: the root's 7 messages and 3 ranks' 7/8.
        assert!(close(t(OpKind::Gather, Algorithm::Linear, 8, m, 4.0), (7.0 + 3.0 * 7.0 / 8.0) * per));
    }

    #[test]
    fn a_shared_memory_scatter_takes_a_step_per_nth_of_a_slot() {
        // Copies free, a step 1 µs: the price counts the steps. Gather moves a slot per
        // step; scatter's root fills its slot with a chunk for each of the n ranks.
        let prof = Profile { native_step: 1e-6, copy: f64::INFINITY, cached_copy: f64::INFINITY, ..Profile::default() };
        let costs = Costs { link: &prof.shm, profile: &prof, slot: 64 << 10, crowd: 1.0, single_copy: false };
        let t = |op, n, m| predict(op, Algorithm::SharedMemory, n, m, &costs).unwrap();
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        assert!(close(t(OpKind::Gather, 4, 256 << 10), 4e-6));
        assert!(close(t(OpKind::Scatter, 4, 256 << 10), 16e-6));
        assert!(close(t(OpKind::Scatter, 3, 100), 1e-6), "at least one step");
    }

    #[test]
    fn a_shared_memory_broadcast_is_read_from_the_roots_core() {
        // A step 1 µs, copies 10 GB/s past the cache and 40 in it, slots of 256 KiB: the
        // root's copy in runs in the cache, the peers' copies out at the rate past it.
        let prof = Profile { native_step: 1e-6, copy: 10e9, cached_copy: 40e9, ..Profile::default() };
        let costs = Costs { link: &prof.shm, profile: &prof, slot: 256 << 10, crowd: 1.0, single_copy: false };
        let t = |n, m| predict(OpKind::Broadcast, Algorithm::SharedMemory, n, m, &costs).unwrap();
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9 * y;
        let m = 65536.0;
        assert!(close(t(3, 65536), 1e-6 + m / 40e9 + m / 10e9), "{}", t(3, 65536));
        // Four slots' worth: four steps.
        assert!(close(t(8, 1 << 20), 4e-6 + 16.0 * m / 40e9 + 16.0 * m / 10e9));
    }

    #[test]
    fn a_slot_scatter_follows_its_root_and_single_copy_its_readers() {
        // Round numbers: a step 1 µs, copies 10 GB/s past the cache and 20 in it; slots of
        // 256 KiB.
        let prof = Profile { native_step: 1e-6, copy: 10e9, cached_copy: 20e9, ..Profile::default() };
        let price = |n, m, crowd, single_copy| {
            let costs = Costs { link: &prof.shm, profile: &prof, slot: 256 << 10, crowd, single_copy };
            predict(OpKind::Scatter, Algorithm::SharedMemory, n, m, &costs).unwrap()
        };
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9 * y;
        // 8 ranks, 16 KiB blocks, one step (chunks of 32 KiB): the root writes 7 blocks past
        // the cache, then one peer copies its block out, and the root its own in the cache.
        let m = 16384.0;
        let slots = 1e-6 + 8.0 * m / 10e9 + m / 20e9;
        assert!(close(price(8, 16384, 1.0, true), slots), "{}", price(8, 16384, 1.0, true));
        // 128 KiB blocks: four steps of 32 KiB, the last read only.
        let m = 131072.0;
        let slots = 4e-6 + (7.0 * m + 32768.0) / 10e9 + m / 20e9;
        assert!(close(price(8, 131072, 1.0, false), slots));
        // With single copy, from 1 MiB in all on 8 ranks: the readers together at twice the
        // copy rate, above one reader's time, and each reader's call.
        let reader = SINGLE_COPY_READER;
        assert!(close(price(8, 131072, 1.0, true), 1e-6 + 8.0 * m / 20e9 + 7.0 * reader));
        // On 3 ranks from 64 KiB blocks; one reader's time where it is the larger.
        assert!(close(price(3, 65536, 1.0, true), 1e-6 + 3.0 * 65536.0 / 20e9 + 2.0 * reader));
        assert!(close(price(2, 65536, 1.0, true), 1e-6 + 65536.0 / 10e9 + reader));
        // Not below those sizes, nor on a crowded host (the engine turns single copy off).
        assert!(close(price(8, 65536, 1.0, true), price(8, 65536, 1.0, false)));
        assert!(close(price(3, 32768, 1.0, true), price(3, 32768, 1.0, false)));
        let crowded_step = step_cost(&prof, 1.5) - step_cost(&prof, 1.0);
        assert!(close(price(3, 65536, 1.5, true), price(3, 65536, 1.0, false) + crowded_step));
    }

    #[test]
    fn a_linear_scatters_root_copies_each_block_once_at_half_the_overhead() {
        let shm = LinkCost { overhead: 1e-6, ..link(1.0, 1.0) };
        let prof = Profile { shm, copy: 10e9, cached_copy: 30e9, ..Profile::default() };
        let t = |op, n, m, crowd| {
            let costs = Costs { link: &prof.shm, profile: &prof, slot: 1 << 20, crowd, single_copy: false };
            predict(op, Algorithm::Linear, n, m, &costs).unwrap()
        };
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9 * y;
        let m = 8192;
        // A CPU per rank: 7 messages, each half the overhead and one copy, from the cache
        // into the link past it.
        let once = 0.5e-6 + m as f64 * (1.0 / 10e9 + 1.0 / 30e9) / 2.0;
        assert!(close(t(OpKind::Scatter, 8, m, 1.0), 7.0 * once));
        // Gather's root takes every block through the mailbox: three copies.
        assert!(close(t(OpKind::Gather, 8, m, 1.0), 7.0 * (0.5e-6 + m as f64 * 3.0 / 10e9)));
        // Crowded, both pay the link's rate and the whole overhead (see the crowded test).
        let crowded = 1e-6 + m as f64 * 1e-9;
        assert!(close(t(OpKind::Scatter, 8, m, 4.0), (7.0 + 3.0 * 7.0 / 8.0) * crowded));
    }

    #[test]
    fn a_crowded_step_takes_the_turns_of_the_average_crowd() {
        let prof = Profile { native_step: 1e-6, crowded_step: 3e-6, ..Profile::default() };
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        // One rank per CPU: the step; 3 ranks on 2 CPUs: one switch pair more (2 µs); 4 on 2:
        // two; 8 on 2: six.
        for (crowd, step) in [(1.0, 1e-6), (0.5, 1e-6), (1.5, 3e-6), (2.0, 5e-6), (4.0, 13e-6)] {
            assert!(close(step_cost(&prof, crowd), step), "crowd {crowd}: {}", step_cost(&prof, crowd));
        }
    }
}
