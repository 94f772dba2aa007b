//! The profiler (`OXCCL_PROFILE`): every operation's times, kept as statistics per operation
//! and size (count, mean, p50, p99, algbw, busbw; [`Profiler::report`]) and, for a trace,
//! as events written in the Chrome trace format (`chrome://tracing`, Perfetto) when the
//! communicator ends.
//!
//! Off by default; on, it costs two counter reads, a lock and a push per operation. Where the
//! backend measures the time it waits for each peer ([`PeerWaits`]), the profiler turns that
//! on and charges each operation what was waited during it: per peer in the trace
//! (`waited_us`) and in total in the report (`peer_waits`).
//! Durations go into log-scale histograms (8 buckets per doubling, so a percentile is within
//! 9% of the true value) that keep their size however long the job runs.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::algorithm::Algorithm;
use crate::backend::peer_waits::PeerWaits;
use crate::clock::{self, Tick};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::op_kind::OpKind;

/// Histogram buckets per doubling of the duration.
const PER_DOUBLING: f64 = 8.0;
/// Buckets: 1 ns to about 2^42 ns (73 minutes).
const BUCKETS: usize = 42 * 8;
/// Trace events kept per communicator (about 100 bytes each); later ones are counted only.
const MAX_EVENTS: usize = 1 << 20;

fn bucket_of(ns: f64) -> usize {
    ((ns.max(1.0).log2() * PER_DOUBLING) as usize).min(BUCKETS - 1)
}

fn bucket_ns(b: usize) -> f64 {
    // The middle of the bucket (geometric).
    2f64.powf((b as f64 + 0.5) / PER_DOUBLING)
}

/// The statistics of one operation at one size class.
#[derive(Debug, Clone)]
struct Stat {
    count: u64,
    sum_ns: f64,
    bytes: u64,
    hist: Vec<u32>,
}

impl Stat {
    fn quantile(&self, q: f64) -> f64 {
        let want = ((self.count as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (b, &c) in self.hist.iter().enumerate() {
            seen += u64::from(c);
            if seen >= want {
                return bucket_ns(b);
            }
        }
        bucket_ns(BUCKETS - 1)
    }
}

/// One operation of a trace.
#[derive(Debug, Clone)]
struct Event {
    fp: Fingerprint,
    bytes: u64,
    algorithm: Option<Algorithm>,
    enqueued: Tick,
    started: Tick,
    ended: Tick,
    ok: bool,
    /// Nanoseconds waited per peer during it, where the backend measures waits and it
    /// waited: (rank, ns).
    waited: Vec<(usize, u64)>,
}

/// One row of a profile: an operation at one size (the largest power of two at or below the
/// calls' bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileRow {
    /// The operation.
    pub op: String,
    /// The size class, bytes as nccl-tests counts them (all_gather: the output).
    pub size: u64,
    /// Calls.
    pub count: u64,
    /// Mean time per call, microseconds.
    pub mean_us: f64,
    /// Median time, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Algorithm bandwidth at the mean time (mean bytes / mean time), GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth (algbw times the operation's factor, as nccl-tests), GB/s.
    pub busbw_gbps: f64,
}

/// The time this rank waited for one peer, over the communicator's operations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerWaitRow {
    /// The peer (communicator rank).
    pub peer: usize,
    /// Time waited for it, microseconds.
    pub total_us: f64,
    /// Operations in which this rank waited for it.
    pub ops: u64,
}

/// A communicator's statistics on this rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileReport {
    /// This rank.
    pub rank: usize,
    /// The communicator's size.
    pub world_size: usize,
    /// The rows, by operation then size.
    pub rows: Vec<ProfileRow>,
    /// The time waited for each peer, most first, where the backend measures it (`cpu`:
    /// receives from the peer, and shared-memory waits charged to the last rank to arrive);
    /// `None` for backends that do not (`mpi`, `nccl`).
    pub peer_waits: Option<Vec<PeerWaitRow>>,
}

impl fmt::Display for ProfileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "oxccl profile, rank {} of {}:", self.rank, self.world_size)?;
        writeln!(
            f,
            "{:>15} {:>12} {:>9} {:>11} {:>11} {:>11} {:>8} {:>8}",
            "op", "size", "count", "mean_us", "p50_us", "p99_us", "algbw", "busbw"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:>15} {:>12} {:>9} {:>11.2} {:>11.2} {:>11.2} {:>8.2} {:>8.2}",
                r.op, r.size, r.count, r.mean_us, r.p50_us, r.p99_us, r.algbw_gbps, r.busbw_gbps
            )?;
        }
        if let Some(waits) = &self.peer_waits {
            if waits.is_empty() {
                writeln!(f, "waited for peers: never")?;
            } else {
                writeln!(f, "waited for peers (blocked on their data; most first):")?;
                for w in waits {
                    writeln!(f, "{:>15} {:>12.1} us in {} ops", format!("rank {}", w.peer), w.total_us, w.ops)?;
                }
            }
        }
        Ok(())
    }
}

/// The bytes of an operation as nccl-tests sizes it, from its message bytes.
fn sized(op: OpKind, message: u64, n: usize) -> u64 {
    match op {
        OpKind::AllGather | OpKind::Gather => message * n as u64,
        _ => message,
    }
}

/// nccl-tests' bus-bandwidth factor.
fn bus_factor(op: OpKind, n: usize) -> f64 {
    let n = n.max(1) as f64;
    match op {
        OpKind::AllReduce => 2.0 * (n - 1.0) / n,
        OpKind::AllGather | OpKind::AllGatherV | OpKind::ReduceScatter | OpKind::AllToAll | OpKind::AllToAllV => {
            (n - 1.0) / n
        }
        _ => 1.0,
    }
}

#[derive(Debug, Default)]
struct State {
    /// The end of the latest operation: the next one started no earlier (a communicator
    /// runs its operations in order).
    last_end: Tick,
    /// By (operation, size class); the operation as its position in [`OpKind::ALL`].
    index: BTreeMap<(usize, u64), usize>,
    /// The statistics, in the order first seen ([`State::index`] finds them).
    stats: Vec<Stat>,
    /// The latest operation, size class and its statistics' place: a run of calls of one
    /// kind and size class finds its entry without a search.
    hot: Option<(OpKind, u64, usize)>,
    events: Vec<Event>,
    dropped_events: u64,
    /// The backend's per-peer wait totals at the latest record, and their sum.
    waits_seen: Vec<u64>,
    waits_seen_total: u64,
    /// Per peer: nanoseconds waited, operations that waited.
    peer_waits: BTreeMap<usize, (u64, u64)>,
}

/// The profiler of one communicator on this rank.
#[derive(Debug)]
pub struct Profiler {
    rank: usize,
    world_size: usize,
    comm: u64,
    job: Option<String>,
    created: Tick,
    created_unix_us: u64,
    summary: bool,
    trace_dir: Option<PathBuf>,
    next_seq: std::sync::atomic::AtomicU64,
    finished: std::sync::atomic::AtomicBool,
    state: Mutex<State>,
    /// The backend's wait accounting, where it keeps one (turned on by [`Profiler::new`]).
    waits: Option<Arc<PeerWaits>>,
}

impl Profiler {
    /// A profiler for communicator `comm` (its flight recorder's number) of `world_size`
    /// ranks, this one `rank`, doing what `settings` ask when it finishes (its communicator is dropped, or the
    /// process exits).
    ///
    /// `waits`: the backend's account of the time waited per peer, which the profiler turns on
    /// and attributes to each operation (the difference at its end).
    pub fn new(
        rank: usize,
        world_size: usize,
        comm: u64,
        settings: &crate::config::ProfileSettings,
        waits: Option<Arc<PeerWaits>>,
    ) -> Profiler {
        // Measure the counter's rate now (a few ms, once per process), not on an operation.
        clock::Scale::now_cached();
        if let Some(w) = &waits {
            w.enable();
        }
        let seen = waits.as_ref().map_or_else(Vec::new, |w| w.per_peer_ticks());
        let seen_total = waits.as_ref().map_or(0, |w| w.total_ticks());
        Profiler {
            rank,
            world_size,
            comm,
            job: crate::bootstrap::env::job_id_from_env(),
            created: clock::now(),
            created_unix_us: super::flight_recorder::unix_us(),
            summary: settings.summary,
            trace_dir: settings.trace_dir.clone(),
            next_seq: std::sync::atomic::AtomicU64::new(0),
            finished: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(State { waits_seen: seen, waits_seen_total: seen_total, ..State::default() }),
            waits,
        }
    }

    /// Whether it writes a trace (which names each operation's algorithm).
    pub(crate) fn traces(&self) -> bool {
        self.trace_dir.is_some()
    }

    /// The next operation's sequence number.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Records one finished operation, submitted at `enqueued` and finished at `ended`.
    pub(crate) fn record(
        &self,
        fp: Fingerprint,
        message_bytes: u64,
        algorithm: Option<Algorithm>,
        enqueued: Tick,
        ended: Tick,
        ok: bool,
    ) {
        let bytes = sized(fp.op, message_bytes, self.world_size);
        let class = if bytes == 0 { 0 } else { 1u64 << (63 - bytes.leading_zeros()) };
        let mut st = crate::sync::relock(&self.state);
        let started = enqueued.max(st.last_end).min(ended);
        st.last_end = st.last_end.max(ended);
        let ns = clock::Scale::now_cached().ns(ended.saturating_sub(started));
        let at = match st.hot {
            Some((op, c, at)) if op == fp.op && c == class => at,
            _ => {
                let key = (OpKind::ALL.iter().position(|&o| o == fp.op).unwrap_or(0), class);
                let fresh = st.stats.len();
                let at = *st.index.entry(key).or_insert(fresh);
                if at == fresh {
                    st.stats.push(Stat { count: 0, sum_ns: 0.0, bytes: 0, hist: vec![0; BUCKETS] });
                }
                st.hot = Some((fp.op, class, at));
                at
            }
        };
        let s = &mut st.stats[at];
        s.count += 1;
        s.sum_ns += ns;
        s.bytes += bytes;
        s.hist[bucket_of(ns)] += 1;
        let waited = self.waited_since_last(&mut st);
        if self.trace_dir.is_some() {
            if st.events.len() < MAX_EVENTS {
                st.events.push(Event { fp, bytes, algorithm, enqueued, started, ended, ok, waited });
            } else {
                st.dropped_events += 1;
            }
        }
    }

    /// What the backend's wait account gained since the last operation, per peer (nothing
    /// read beyond one counter when it did not change), added to the totals.
    fn waited_since_last(&self, st: &mut State) -> Vec<(usize, u64)> {
        let Some(w) = &self.waits else { return Vec::new() };
        let total = w.total_ticks();
        if total == st.waits_seen_total {
            return Vec::new();
        }
        st.waits_seen_total = total;
        let now = w.per_peer_ticks();
        let mut out = Vec::new();
        for (p, &ticks) in now.iter().enumerate() {
            let before = st.waits_seen.get(p).copied().unwrap_or(0);
            if ticks > before {
                let ns = PeerWaits::ns(ticks - before) as u64;
                out.push((p, ns));
                let e = st.peer_waits.entry(p).or_insert((0, 0));
                e.0 += ns;
                e.1 += 1;
            }
        }
        st.waits_seen = now;
        out
    }

    /// The statistics so far.
    pub fn report(&self) -> ProfileReport {
        let st = crate::sync::relock(&self.state);
        let rows = st
            .index
            .iter()
            .map(|(&(op, size), &at)| (op, size, &st.stats[at]))
            .map(|(op, size, s)| {
                let op = OpKind::ALL[op];
                let mean_ns = s.sum_ns / s.count as f64;
                let mean_bytes = s.bytes as f64 / s.count as f64;
                let algbw = if mean_ns > 0.0 { mean_bytes / mean_ns } else { 0.0 };
                ProfileRow {
                    op: op.to_string(),
                    size,
                    count: s.count,
                    mean_us: mean_ns / 1e3,
                    p50_us: s.quantile(0.5) / 1e3,
                    p99_us: s.quantile(0.99) / 1e3,
                    algbw_gbps: algbw,
                    busbw_gbps: algbw * bus_factor(op, self.world_size),
                }
            })
            .collect();
        let peer_waits = self.waits.as_ref().map(|_| {
            let mut w: Vec<PeerWaitRow> = st
                .peer_waits
                .iter()
                .map(|(&peer, &(ns, ops))| PeerWaitRow { peer, total_us: ns as f64 / 1e3, ops })
                .collect();
            w.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
            w
        });
        ProfileReport { rank: self.rank, world_size: self.world_size, rows, peer_waits }
    }

    /// The file name of this profiler's trace.
    pub fn trace_file_name(&self) -> String {
        format!("oxccl-trace-{}-comm{}-rank{}.json", super::dump::job_tag(self.job.as_deref()), self.comm, self.rank)
    }

    /// The events as a Chrome trace (JSON): one complete event (`"ph": "X"`) per operation,
    /// timestamps in microseconds since the communicator's creation, the rank as the process
    /// and the communicator as the thread; `otherData` carries the creation's wall-clock time
    /// (what `oxccl trace merge` aligns the ranks by).
    pub fn chrome_trace(&self) -> serde_json::Value {
        let st = crate::sync::relock(&self.state);
        let scale = clock::Scale::now();
        let base = scale.us(self.created);
        let us = |t: Tick| (scale.us(t) - base).max(0.0);
        let mut events: Vec<serde_json::Value> = Vec::with_capacity(st.events.len() + 2);
        events.push(serde_json::json!({
            "name": "process_name", "ph": "M", "pid": self.rank, "tid": self.comm,
            "args": { "name": format!("rank {}", self.rank) }
        }));
        for e in &st.events {
            let mut args = serde_json::json!({
                "seq": e.fp.seq, "dtype": e.fp.dtype.to_string(), "count": e.fp.count, "bytes": e.bytes,
                "queued_us": us(e.started) - us(e.enqueued), "ok": e.ok,
            });
            if let Some(r) = e.fp.root {
                args["root"] = r.into();
            }
            if let Some(r) = e.fp.reduce {
                args["reduce"] = r.to_string().into();
            }
            if let Some(a) = e.algorithm {
                args["algorithm"] = a.to_string().into();
            }
            if !e.waited.is_empty() {
                let by_peer: serde_json::Map<String, serde_json::Value> =
                    e.waited.iter().map(|&(p, ns)| (p.to_string(), (ns as f64 / 1e3).into())).collect();
                args["waited_us"] = by_peer.into();
            }
            events.push(serde_json::json!({
                "name": e.fp.op.to_string(), "cat": "collective", "ph": "X",
                "ts": us(e.started), "dur": (us(e.ended) - us(e.started)).max(0.0),
                "pid": self.rank, "tid": self.comm, "args": args,
            }));
        }
        serde_json::json!({
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "oxccl_version": 1, "rank": self.rank, "world_size": self.world_size, "comm": self.comm,
                "created_unix_us": self.created_unix_us, "dropped_events": st.dropped_events,
            }
        })
    }

    /// Prints the statistics (`summary`) and writes the trace (`trace:DIR`), once: when the
    /// communicator is dropped, or when the process exits with it still alive.
    pub(crate) fn finish(&self) {
        if self.finished.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        if self.summary {
            eprint!("{}", self.report());
        }
        if let Some(dir) = &self.trace_dir {
            match self.write_trace(dir) {
                Ok(p) => tracing::info!("rank {}: trace written to {}", self.rank, p.display()),
                Err(e) => tracing::error!("rank {}: could not write the trace: {e}", self.rank),
            }
        }
    }

    /// Writes [`Profiler::chrome_trace`] into `dir`; returns the path.
    ///
    /// # Errors
    /// [`Error::Io`] naming what could not be written.
    pub fn write_trace(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), &e))?;
        let path = dir.join(self.trace_file_name());
        let text = serde_json::to_string(&self.chrome_trace())
            .map_err(|e| Error::Internal(format!("encoding a trace: {e}")))?;
        std::fs::write(&path, text).map_err(|e| Error::io(format!("writing {}", path.display()), &e))?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_histogram_within_its_resolution() {
        let mut s = Stat { count: 0, sum_ns: 0.0, bytes: 0, hist: vec![0; BUCKETS] };
        for ns in 1..=1000 {
            s.count += 1;
            s.hist[bucket_of(ns as f64 * 1000.0)] += 1;
        }
        let close = |got: f64, want: f64| (got / want - 1.0).abs() < 0.1;
        assert!(close(s.quantile(0.5), 500_000.0), "{}", s.quantile(0.5));
        assert!(close(s.quantile(0.99), 990_000.0), "{}", s.quantile(0.99));
        assert_eq!(bucket_of(0.0), 0);
        assert_eq!(bucket_of(1e30), BUCKETS - 1);
        assert_eq!(bus_factor(OpKind::AllReduce, 4), 1.5);
        assert_eq!(sized(OpKind::AllGather, 100, 4), 400);
    }
}
