//! The suite must be able to fail: run it on deliberately broken backends and check that the
//! cases covering the broken behaviour fail (every one of them), and that the others pass.
//!
//! A [`Faulty`] backend wraps the real CPU backend (same algorithms, in-memory transport) and
//! injects one fault: a corrupted output on the last rank for one operation kind, a result
//! one ulp off (caught only by the bitwise-agreement check), or errors reported under the
//! wrong kind.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use oxccl::backend::CallOptions;
use oxccl::backend::{Backend, Completion, MessageInfo, Mode, Op, P2p, Pending};
use oxccl::{Communicator, Error, OpKind};
use oxccl_conformance::{Report, SuiteOptions};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Flips bit 6 of the last byte of the output of operations of this kind on the last rank
    /// (`Recv`: of the received part of the first receive of a batch).
    CorruptOutput(OpKind),
    /// Flips the lowest bit of the first element of float all_reduce outputs on the last rank.
    OneUlpAllReduce,
    /// Reports every timeout as an abort.
    TimeoutAsAborted,
    /// Reports every mismatch as an abort.
    MismatchAsAborted,
}

struct Faulty {
    inner: Arc<dyn Backend>,
    fault: Fault,
}

/// Where to write: the address of the byte to flip (or of the start of a receive buffer).
#[derive(Clone, Copy)]
enum Target {
    Byte { addr: usize, mask: u8 },
    FirstRecv { addr: usize, elem: usize },
}

struct FaultyPending {
    inner: Arc<dyn Pending>,
    fault: Fault,
    target: Option<Target>,
    applied: AtomicBool,
}

fn output_of(op: &Op) -> Option<(usize, usize, oxccl::DType)> {
    let o = match op {
        Op::AllReduce { output, .. }
        | Op::Broadcast { output, .. }
        | Op::AllGather { output, .. }
        | Op::AllGatherV { output, .. }
        | Op::ReduceScatter { output, .. }
        | Op::AllToAll { output, .. }
        | Op::AllToAllV { output, .. }
        | Op::Scatter { output, .. } => Some(*output),
        Op::Reduce { output, .. } | Op::Gather { output, .. } => *output,
        Op::Barrier | Op::Batch(_) => None,
    }?;
    Some((o.ptr as usize, o.bytes(), o.dtype))
}

impl Faulty {
    fn target(&self, op: &Op) -> Option<Target> {
        if self.inner.rank() + 1 != self.inner.world_size() {
            return None;
        }
        match self.fault {
            Fault::CorruptOutput(OpKind::Recv) => match op {
                Op::Batch(ops) => ops.iter().find_map(|p| match p {
                    P2p::Recv { buf, .. } | P2p::RecvAny { buf, .. } => {
                        Some(Target::FirstRecv { addr: buf.ptr as usize, elem: buf.dtype.size() })
                    }
                    P2p::Send { .. } => None,
                }),
                _ => None,
            },
            Fault::CorruptOutput(kind) if kind == op.kind() => {
                let is_root_or_all = match op {
                    Op::Reduce { root, .. } | Op::Gather { root, .. } => *root == self.inner.rank(),
                    _ => true,
                };
                let (addr, bytes, _) = output_of(op)?;
                (bytes > 0 && is_root_or_all).then(|| Target::Byte { addr: addr + bytes - 1, mask: 0x40 })
            }
            Fault::OneUlpAllReduce => match op {
                Op::AllReduce { output, .. } if output.dtype.is_float() && output.count > 0 => {
                    Some(Target::Byte { addr: output.ptr as usize, mask: 0x01 })
                }
                _ => None,
            },
            _ => None,
        }
    }
}

impl Pending for FaultyPending {
    fn wait(&self, timeout: Option<Duration>) -> Option<oxccl::Result<Completion>> {
        let r = self.inner.wait(timeout)?;
        Some(match r {
            Ok(c) => {
                if !self.applied.swap(true, Ordering::SeqCst) {
                    match self.target {
                        // SAFETY: the operation has completed; its output buffer is still
                        // borrowed by the caller's pending operation and nobody else uses it.
                        Some(Target::Byte { addr, mask }) => unsafe { *(addr as *mut u8) ^= mask },
                        Some(Target::FirstRecv { addr, elem }) => {
                            if let Some(&n) = c.received.first().filter(|&&n| n > 0) {
                                // SAFETY: as above; `n` elements were received there.
                                unsafe { *((addr + n * elem - 1) as *mut u8) ^= 0x40 }
                            }
                        }
                        None => {}
                    }
                }
                Ok(c)
            }
            Err(Error::Timeout { op, seq, .. }) if self.fault == Fault::TimeoutAsAborted => {
                Err(Error::Aborted { reason: format!("(mutant) {op}#{seq} timed out") })
            }
            Err(Error::Mismatch { peer, .. }) if self.fault == Fault::MismatchAsAborted => {
                Err(Error::Aborted { reason: format!("(mutant) mismatch with rank {peer}") })
            }
            Err(e) => Err(e),
        })
    }

    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
}

impl Backend for Faulty {
    fn name(&self) -> &'static str {
        "faulty"
    }

    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    unsafe fn submit(&self, op: Op, mode: Mode, opts: &CallOptions) -> oxccl::Result<Arc<dyn Pending>> {
        let target = self.target(&op);
        // SAFETY: forwarded from this function's contract.
        let inner = unsafe { self.inner.submit(op, mode, opts)? };
        Ok(Arc::new(FaultyPending { inner, fault: self.fault, target, applied: AtomicBool::new(false) }))
    }

    fn probe(&self, peer: usize, tag: u32) -> oxccl::Result<Option<MessageInfo>> {
        self.inner.probe(peer, tag)
    }

    fn split(&self, color: Option<u32>, key: i64, opts: &CallOptions) -> oxccl::Result<Option<Arc<dyn Backend>>> {
        let sub = self.inner.split(color, key, opts)?;
        Ok(sub.map(|inner| Arc::new(Faulty { inner, fault: self.fault }) as Arc<dyn Backend>))
    }

    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }
}

/// Runs the suite under `opts` on a faulty world of `n` ranks.
fn run_faulty(n: usize, fault: Fault, opts: &SuiteOptions) -> Report {
    let comms: Vec<Communicator> = oxccl::testing::local_backends(&oxccl::Config::new(), n, "faulty")
        .unwrap()
        .into_iter()
        .map(|inner| Communicator::from_backend(Arc::new(Faulty { inner, fault })))
        .collect();
    let reports = std::thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || oxccl_conformance::run_suite(&c, opts))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    Report::merge(reports)
}

/// Every case matching `family` fails under `fault`; cases matching `healthy` all pass.
fn assert_caught(fault: Fault, family: &str, healthy: &str) {
    let n = 3;
    let opts = SuiteOptions::new().only([family, healthy]).quick(true);
    let report = run_faulty(n, fault, &opts);
    let (sick, fine): (Vec<_>, Vec<_>) =
        report.cases.iter().partition(|c| oxccl_conformance::pattern_matches(family, &c.name));
    assert!(!sick.is_empty(), "no case matches {family}");
    let missed: Vec<&str> = sick.iter().filter(|c| !c.is_failed()).map(|c| c.name.as_str()).collect();
    assert!(missed.is_empty(), "{fault:?}: these cases did not notice: {missed:?}");
    let wrongly: Vec<&str> = fine.iter().filter(|c| c.is_failed()).map(|c| c.name.as_str()).collect();
    assert!(wrongly.is_empty(), "{fault:?}: unrelated cases failed: {wrongly:?}\n{}", report.failure_details(5, 3));
    println!("{fault:?}: {} cases caught it, {} unrelated cases passed", sick.len(), fine.len());
    if let Some(oxccl_conformance::Status::Failed(f)) = sick.first().map(|c| &c.status) {
        println!("    e.g. {}: rank {}: {}", sick[0].name, f[0].rank, f[0].message);
    }
}

#[test]
fn corrupted_reductions_are_caught() {
    assert_caught(Fault::CorruptOutput(OpKind::AllReduce), "all_reduce/", "^broadcast/");
    assert_caught(Fault::CorruptOutput(OpKind::Reduce), "^reduce/", "^gather/");
    assert_caught(Fault::CorruptOutput(OpKind::ReduceScatter), "^reduce_scatter/", "^all_gather/");
}

#[test]
fn corrupted_data_movement_is_caught() {
    assert_caught(Fault::CorruptOutput(OpKind::Broadcast), "^broadcast/", "^scatter/");
    assert_caught(Fault::CorruptOutput(OpKind::AllGather), "^all_gather/", "^all_gather_v/");
    assert_caught(Fault::CorruptOutput(OpKind::AllGatherV), "^all_gather_v/", "^all_to_all/");
    assert_caught(Fault::CorruptOutput(OpKind::AllToAll), "^all_to_all/", "^all_to_all_v/");
    assert_caught(Fault::CorruptOutput(OpKind::AllToAllV), "^all_to_all_v/", "^gather/");
    assert_caught(Fault::CorruptOutput(OpKind::Gather), "^gather/", "^scatter/");
    assert_caught(Fault::CorruptOutput(OpKind::Scatter), "^scatter/", "^gather/");
}

#[test]
fn corrupted_receives_are_caught() {
    assert_caught(Fault::CorruptOutput(OpKind::Recv), "p2p/", "^barrier/");
}

#[test]
fn results_that_differ_between_ranks_are_caught() {
    // One ulp on one rank is within the float tolerance of the value checks: only the
    // bitwise agreement check notices.
    assert_caught(Fault::OneUlpAllReduce, "bitwise/all_reduce/f32/", "^all_reduce/f32/sum/");
}

#[test]
fn wrong_error_kinds_are_caught() {
    assert_caught(Fault::TimeoutAsAborted, "errors/timeout/", "errors/invalid/");
    assert_caught(Fault::MismatchAsAborted, "mismatch/", "errors/abort/");
}
