//! Device buffers of large collectives (all_reduce, reduce, broadcast, all_gather,
//! reduce_scatter), staged in a pipeline: the operation runs as chunks through a ring of
//! three pinned host buffers, and while chunk `i` runs on the host a copy thread copies chunk
//! `i + 1` in and chunk `i - 1` back, so the device copies overlap the communication (gloo's
//! chunked CUDA all-reduce is the idea; here both directions overlap, every large
//! bandwidth-bound collective is chunked, and the pinned buffers are reused across calls).
//! A chunk of all_reduce, reduce and broadcast is [`CHUNK`] bytes of the buffer; one of
//! all_gather and reduce_scatter is the same slice of every rank's block (about `CHUNK /
//! (n + 1)` bytes each, so a host buffer holds its input and output in `CHUNK` bytes), copied
//! with one device copy per block. Other operations (all_to_all, gather, scatter, the `v`
//! forms, point-to-point), and buffers of one chunk or less, are staged whole
//! (`whole.rs`). The backend runs each chunk ([`run`]'s `run_chunk`); the `cpu` backend
//! pipelines this way.
//!
//! Cost, with `k` chunks of `c` bytes: about `copy(c) + k · max(collective(c), 2 · copy(c))
//! + copy(c)` instead of `copy(bytes) + collective(bytes) + copy(bytes)`.
//!
//! Every rank of a collective must stage it alike: the chunks are separate collectives of
//! the same fixed size on every rank, and a rank that runs it whole (host buffers where the
//! others pass device buffers) is reported by the others as a mismatch.

use std::sync::mpsc;
use std::sync::Arc;

use super::copy::{copier_for, DeviceCopy};
use super::temp::Temp;
use crate::backend::{Completion, Op, RawBufMut};
use crate::device::Device;
use crate::error::{Error, Result};

/// Bytes of host buffer per chunk: large enough that a collective of it runs near its
/// bandwidth, small enough that three fit the pinned pool many times over.
pub(crate) const CHUNK: usize = 4 << 20;

/// A contiguous piece of a chunk's device data: its device address and where it sits in the
/// chunk's host buffer.
#[derive(Clone, Copy)]
struct Seg {
    dev: *mut u8,
    at: usize,
    bytes: usize,
}

/// One pipelined operation: how many chunks, what each copies in and back, how it runs.
struct Plan {
    chunks: usize,
    /// The device of every staged buffer.
    device: Device,
    /// The device pieces copied into chunk `i`'s host buffer before it runs.
    ins: Box<dyn Fn(usize) -> Vec<Seg>>,
    /// The device pieces copied back from it after.
    outs: Box<dyn Fn(usize) -> Vec<Seg>>,
    /// The operation of chunk `i` on its host buffer.
    chunk_op: Box<dyn Fn(*mut u8, usize) -> Op>,
}

/// A chunk of `per` elements out of `total`: chunk `i`'s first element and length.
fn span(per: usize, total: usize, i: usize) -> (usize, usize) {
    (i * per, per.min(total - i * per))
}

/// A whole-buffer plan (all_reduce, reduce, broadcast): chunk `i` is elements
/// `span(per, count, i)` of `src` (copied in, if any) and of `dst` (copied back, if any),
/// run in place on the host buffer.
fn elementwise(
    count: usize,
    es: usize,
    device: Device,
    src: Option<*const u8>,
    dst: Option<*mut u8>,
    chunk_op: impl Fn(RawBufMut) -> Op + 'static,
    dtype: crate::dtype::DType,
) -> Plan {
    let per = (CHUNK / es).max(1);
    let seg = move |base: *mut u8, i: usize| {
        let (at, n) = span(per, count, i);
        // Chunk `i` lies within the buffer of `count` elements.
        vec![Seg { dev: base.wrapping_add(at * es), at: 0, bytes: n * es }]
    };
    Plan {
        chunks: count.div_ceil(per),
        device,
        ins: Box::new(move |i| src.map_or_else(Vec::new, |b| seg(b.cast_mut(), i))),
        outs: Box::new(move |i| dst.map_or_else(Vec::new, |b| seg(b, i))),
        chunk_op: Box::new(move |p, i| {
            let (_, n) = span(per, count, i);
            chunk_op(RawBufMut { ptr: p, count: n, dtype, device: Device::Cpu })
        }),
    }
}

/// Slice `[at, at + m)` of each of the `n` blocks of `k` elements at `base`, placed one after
/// another in a chunk's host buffer from byte `host0`: what all_gather copies back and
/// reduce_scatter copies in.
fn block_slices(base: *mut u8, n: usize, k: usize, es: usize, (at, m): (usize, usize), host0: usize) -> Vec<Seg> {
    (0..n).map(|r| Seg { dev: base.wrapping_add((r * k + at) * es), at: host0 + r * m * es, bytes: m * es }).collect()
}

/// Elements per rank block in one chunk of all_gather or reduce_scatter over `n` ranks: the
/// chunk's input and output (`n + 1` such slices) fill one host buffer. `None` when `blocks`
/// is not `n` blocks of `count` or a slice of one element would not fit.
fn block_chunk(blocks: usize, count: usize, es: usize) -> Option<(usize, usize)> {
    let n = blocks / count.max(1);
    let per = CHUNK / es.max(1) / (n + 1);
    (n >= 1 && n * count == blocks && per >= 1).then_some((n, per))
}

impl Plan {
    /// The pipeline for `op` when `stage(device)` says its buffers are staged and it spans
    /// more than one chunk; `None` for everything else.
    fn of(op: &Op, stage: impl Fn(Device) -> bool) -> Option<Plan> {
        match op {
            // Every staged buffer of a pipelined operation is on one device (else: whole).
            Op::AllReduce { input, output, op: r }
                if stage(output.device) && output.bytes() > CHUNK && input.device == output.device =>
            {
                let r = *r;
                Some(elementwise(
                    output.count,
                    output.dtype.size(),
                    output.device,
                    Some(input.ptr),
                    Some(output.ptr),
                    move |t| Op::AllReduce { input: t.as_const(), output: t, op: r },
                    output.dtype,
                ))
            }
            Op::Reduce { input, output, op: r, root }
                if stage(input.device) && input.bytes() > CHUNK && output.is_none_or(|o| o.device == input.device) =>
            {
                let (r, root, receives) = (*r, *root, output.is_some());
                Some(elementwise(
                    input.count,
                    input.dtype.size(),
                    input.device,
                    Some(input.ptr),
                    output.map(|o| o.ptr),
                    move |t| Op::Reduce { input: t.as_const(), output: receives.then_some(t), op: r, root },
                    input.dtype,
                ))
            }
            Op::Broadcast { input, output, root }
                if stage(output.device)
                    && output.bytes() > CHUNK
                    && input.is_none_or(|i| i.device == output.device) =>
            {
                let (root, sends) = (*root, input.is_some());
                Some(elementwise(
                    output.count,
                    output.dtype.size(),
                    output.device,
                    input.map(|i| i.ptr),
                    Some(output.ptr),
                    move |t| Op::Broadcast { input: sends.then(|| t.as_const()), output: t, root },
                    output.dtype,
                ))
            }
            Op::AllGather { input, output }
                if stage(output.device) && input.bytes() > CHUNK && input.device == output.device =>
            {
                let (k, es, dtype) = (input.count, input.dtype.size(), input.dtype);
                let (n, p) = block_chunk(output.count, k, es)?;
                let (src, dst) = (input.ptr, output.ptr);
                Some(Plan {
                    chunks: k.div_ceil(p),
                    device: output.device,
                    // [this rank's slice (p)][every rank's slice (n * m)]
                    ins: Box::new(move |i| {
                        let (at, m) = span(p, k, i);
                        vec![Seg { dev: src.wrapping_add(at * es).cast_mut(), at: 0, bytes: m * es }]
                    }),
                    outs: Box::new(move |i| block_slices(dst, n, k, es, span(p, k, i), p * es)),
                    chunk_op: Box::new(move |t, i| {
                        let (_, m) = span(p, k, i);
                        let host = |ptr: *mut u8, count| RawBufMut { ptr, count, dtype, device: Device::Cpu };
                        Op::AllGather { input: host(t, m).as_const(), output: host(t.wrapping_add(p * es), n * m) }
                    }),
                })
            }
            Op::ReduceScatter { input, output, op: r }
                if stage(output.device) && output.bytes() > CHUNK && input.device == output.device =>
            {
                let (k, es, dtype, r) = (output.count, output.dtype.size(), output.dtype, *r);
                let (n, p) = block_chunk(input.count, k, es)?;
                let (src, dst) = (input.ptr, output.ptr);
                Some(Plan {
                    chunks: k.div_ceil(p),
                    device: output.device,
                    // [every rank's slice (n * m)][this rank's reduced slice (m), at n * p]
                    ins: Box::new(move |i| block_slices(src.cast_mut(), n, k, es, span(p, k, i), 0)),
                    outs: Box::new(move |i| {
                        let (at, m) = span(p, k, i);
                        vec![Seg { dev: dst.wrapping_add(at * es), at: n * p * es, bytes: m * es }]
                    }),
                    chunk_op: Box::new(move |t, i| {
                        let (_, m) = span(p, k, i);
                        let host = |ptr: *mut u8, count| RawBufMut { ptr, count, dtype, device: Device::Cpu };
                        Op::ReduceScatter {
                            input: host(t, n * m).as_const(),
                            output: host(t.wrapping_add(n * p * es), m),
                            op: r,
                        }
                    }),
                })
            }
            _ => None,
        }
    }
}

/// The copies of one chunk in one direction, for the copy thread.
struct Job {
    to_host: bool,
    device: Device,
    /// The chunk's host buffer.
    host: *mut u8,
    segs: Vec<Seg>,
}

// SAFETY: the pointers are the user's device buffer (valid until the operation completes,
// the `Backend::submit` contract) and this pipeline's host buffers; the pipeline waits for
// every job before it returns, and no two live jobs, nor a job and a running chunk, touch
// the same bytes (see `run`).
unsafe impl Send for Job {}

impl Job {
    fn run(&self, copy: &dyn DeviceCopy) -> Result<()> {
        for s in &self.segs {
            let host = self.host.wrapping_add(s.at);
            // SAFETY: `Job`'s invariant: each piece is valid for `bytes` at both ends (its
            // host range within the chunk's buffer) and not in use elsewhere.
            unsafe {
                if self.to_host {
                    copy.to_host(self.device, s.dev, host, s.bytes)?;
                } else {
                    copy.to_device(self.device, host, s.dev, s.bytes)?;
                }
            }
        }
        Ok(())
    }
}

/// Runs `op` pipelined if it is one ([`Plan::of`]), each chunk through `run_chunk`; `None`
/// when it is not.
///
/// The three host buffers rotate: chunk `i` uses buffer `i % 3`. Jobs run in the order they
/// are queued: `in(0)`, then for each `i`: `in(i + 1)`, (chunk `i` runs), `out(i)`. Buffer
/// `(i + 1) % 3` was last used by chunk `i - 2`, whose `out(i - 2)` was queued (and so runs)
/// before `in(i + 1)`; chunk `i` runs only after `in(i)` has completed and before `out(i)`
/// is queued. So no two live uses of a buffer overlap.
pub(crate) fn run(
    op: &Op,
    stage: impl Fn(Device) -> bool,
    backend: &str,
    mut run_chunk: impl FnMut(Op) -> Result<Completion>,
) -> Option<Result<Completion>> {
    let plan = Plan::of(op, stage)?;
    Some(pipeline(&plan, backend, &mut run_chunk))
}

fn pipeline(plan: &Plan, backend: &str, run_chunk: &mut dyn FnMut(Op) -> Result<Completion>) -> Result<Completion> {
    let copy: Arc<dyn DeviceCopy> = copier_for(plan.device, backend)?;
    let mut temps = [Temp::new(CHUNK), Temp::new(CHUNK), Temp::new(CHUNK)];
    let hosts: Vec<*mut u8> = temps.iter_mut().map(Temp::ptr).collect();
    let job = |to_host: bool, i: usize| {
        let segs = if to_host { (plan.ins)(i) } else { (plan.outs)(i) };
        (!segs.is_empty()).then(|| Job { to_host, device: plan.device, host: hosts[i % 3], segs })
    };
    let chunks = plan.chunks;
    std::thread::scope(|s| -> Result<Completion> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (done_tx, done) = mpsc::channel::<Result<()>>();
        let copier = Arc::clone(&copy);
        s.spawn(move || {
            for j in queue {
                if done_tx.send(j.run(copier.as_ref())).is_err() {
                    break;
                }
            }
        });
        let mut queued = 0usize;
        let mut finished = 0usize;
        // Waits until the first `n` jobs have run; the first error ends the pipeline.
        let wait_for = |n: usize, finished: &mut usize| -> Result<()> {
            while *finished < n {
                done.recv().map_err(|_| Error::Internal("the staging copy thread stopped".into()))??;
                *finished += 1;
            }
            Ok(())
        };
        let push = |j: Option<Job>, queued: &mut usize| -> Result<Option<usize>> {
            let Some(j) = j else { return Ok(None) };
            jobs.send(j).map_err(|_| Error::Internal("the staging copy thread stopped".into()))?;
            *queued += 1;
            Ok(Some(*queued))
        };
        let mut in_done = vec![None; chunks];
        in_done[0] = push(job(true, 0), &mut queued)?;
        let mut last = Completion::default();
        for i in 0..chunks {
            if i + 1 < chunks {
                in_done[i + 1] = push(job(true, i + 1), &mut queued)?;
            }
            if let Some(n) = in_done[i] {
                wait_for(n, &mut finished)?;
            }
            last = run_chunk((plan.chunk_op)(hosts[i % 3], i))?;
            push(job(false, i), &mut queued)?;
        }
        wait_for(queued, &mut finished)?;
        drop(jobs);
        Ok(last)
    })
}
