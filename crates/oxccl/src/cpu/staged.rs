//! Device buffers of large element-wise collectives (all_reduce, broadcast), staged in a
//! pipeline: the buffer runs as chunks of [`CHUNK`] bytes through a ring of three pinned host
//! buffers, and while chunk `i` runs on the host a copy thread copies chunk `i + 1` in and
//! chunk `i - 1` back, so the device copies overlap the communication (gloo's chunked CUDA
//! all-reduce is the idea; here both directions overlap and the pinned buffers are reused
//! across calls). Other operations, and buffers of one chunk or less, are staged whole
//! (`backend::staging`).
//!
//! Cost, with `k = ⌈bytes / CHUNK⌉`: about `copy(CHUNK) + k · max(collective(CHUNK),
//! 2 · copy(CHUNK)) + copy(CHUNK)` instead of `copy(bytes) + collective(bytes) + copy(bytes)`.
//!
//! Every rank of a collective must stage it alike: the chunks are separate collectives of
//! the same fixed size on every rank, and a rank that runs it whole (host buffers where the
//! others pass device buffers) is reported by the others as a mismatch.

use std::sync::mpsc;
use std::sync::Arc;

use crate::backend::staging::{copier_for, DeviceCopy, Temp};
use crate::backend::{Completion, Op, RawBuf, RawBufMut};
use crate::device::Device;
use crate::error::{Error, Result};

/// Bytes per chunk: large enough that a collective of it runs near its bandwidth, small
/// enough that three fit the pinned pool many times over.
pub(crate) const CHUNK: usize = 4 << 20;

/// One pipelined operation: where chunks come from and go to, and how a chunk runs.
struct Plan {
    /// The device memory to copy each chunk in from (`None`: nothing comes in, a
    /// broadcast's receivers).
    src: Option<RawBuf>,
    /// The device memory each chunk goes back to.
    dst: RawBufMut,
    /// The operation of one chunk, in place on a host buffer of `count` elements.
    chunk_op: Box<dyn Fn(*mut u8, usize) -> Op>,
}

impl Plan {
    /// The pipeline for `op` when `stage(device)` says its buffers are staged and it spans
    /// more than one chunk; `None` for everything else.
    fn of(op: &Op, stage: impl Fn(Device) -> bool) -> Option<Plan> {
        let host =
            |ptr: *mut u8, count: usize, b: &RawBufMut| RawBufMut { ptr, count, dtype: b.dtype, device: Device::Cpu };
        match op {
            Op::AllReduce { input, output, op: r } if stage(output.device) && output.bytes() > CHUNK => {
                let (out, r) = (*output, *r);
                Some(Plan {
                    src: Some(*input),
                    dst: out,
                    chunk_op: Box::new(move |p, n| {
                        let t = host(p, n, &out);
                        Op::AllReduce { input: t.as_const(), output: t, op: r }
                    }),
                })
            }
            Op::Broadcast { input, output, root } if stage(output.device) && output.bytes() > CHUNK => {
                let (out, root, sends) = (*output, *root, input.is_some());
                Some(Plan {
                    src: *input,
                    dst: out,
                    chunk_op: Box::new(move |p, n| {
                        let t = host(p, n, &out);
                        Op::Broadcast { input: sends.then(|| t.as_const()), output: t, root }
                    }),
                })
            }
            _ => None,
        }
    }
}

/// A copy for the copy thread.
struct Job {
    to_host: bool,
    device: Device,
    dev: *mut u8,
    host: *mut u8,
    bytes: usize,
}

// SAFETY: the pointers are the user's device buffer (valid until the operation completes,
// the `Backend::submit` contract) and this pipeline's host buffers; the pipeline waits for
// every job before it returns, and no two live jobs, nor a job and a running chunk, touch
// the same bytes (see `run`).
unsafe impl Send for Job {}

impl Job {
    fn run(&self, copy: &dyn DeviceCopy) -> Result<()> {
        // SAFETY: `Job`'s invariant: both ranges are valid for `bytes` and not in use elsewhere.
        unsafe {
            if self.to_host {
                copy.to_host(self.device, self.dev, self.host, self.bytes)
            } else {
                copy.to_device(self.device, self.host, self.dev, self.bytes)
            }
        }
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
    let es = plan.dst.dtype.size().max(1);
    let per = CHUNK / es;
    let total = plan.dst.count;
    let chunks = total.div_ceil(per);
    let copy: Arc<dyn DeviceCopy> = copier_for(plan.dst.device, backend)?;
    if let Some(src) = plan.src {
        if src.device != plan.dst.device {
            return Err(Error::Internal(format!("a staged operation spans {} and {}", src.device, plan.dst.device)));
        }
    }
    let mut temps = [Temp::new(CHUNK), Temp::new(CHUNK), Temp::new(CHUNK)];
    let hosts: Vec<*mut u8> = temps.iter_mut().map(Temp::ptr).collect();
    let span = |i: usize| (i * per, per.min(total - i * per));
    let job_in = |i: usize| {
        plan.src.map(|s| {
            let (at, n) = span(i);
            // Chunk `i` lies within the buffer of `total` elements.
            Job {
                to_host: true,
                device: s.device,
                dev: s.ptr.wrapping_add(at * es).cast_mut(),
                host: hosts[i % 3],
                bytes: n * es,
            }
        })
    };
    let job_out = |i: usize| {
        let (at, n) = span(i);
        Job {
            to_host: false,
            device: plan.dst.device,
            dev: plan.dst.ptr.wrapping_add(at * es),
            host: hosts[i % 3],
            bytes: n * es,
        }
    };
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
        in_done[0] = push(job_in(0), &mut queued)?;
        let mut last = Completion::default();
        for i in 0..chunks {
            if i + 1 < chunks {
                in_done[i + 1] = push(job_in(i + 1), &mut queued)?;
            }
            if let Some(n) = in_done[i] {
                wait_for(n, &mut finished)?;
            }
            let (_, n) = span(i);
            last = run_chunk((plan.chunk_op)(hosts[i % 3], n))?;
            push(Some(job_out(i)), &mut queued)?;
        }
        wait_for(queued, &mut finished)?;
        drop(jobs);
        Ok(last)
    })
}
