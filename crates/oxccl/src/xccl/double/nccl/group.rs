//! Groups of the double: what `ncclGroupStart`/`ncclGroupEnd` collect on the calling
//! thread, the kernel a group's sends and receives become (every receive posted, then the
//! sends, which wait for their peers' receives), the aliasing NCCL's kernels cannot take, and
//! `ncclInProgress` at the first use of an algorithm on a non-blocking communicator.

use std::cell::RefCell;
use std::sync::Arc;

use super::comm::{Hang, Shared};
use super::gathering::Member;
use super::status::{fail, guard};
use crate::xccl::library::types::NcclResult;
use crate::xccl::runtime::host::{enqueue_anywhere, Closure};
use crate::xccl::runtime::RawStream;

/// One `ncclSend` or `ncclRecv`, waiting to become part of a kernel.
#[derive(Debug, Clone, Copy)]
pub(super) struct P2pOp {
    /// A send (else a receive).
    pub(super) send: bool,
    /// The peer.
    pub(super) peer: usize,
    /// The buffer's address.
    pub(super) ptr: usize,
    /// Its length in bytes.
    pub(super) len: usize,
}

/// What a call of a group becomes at the group's end.
pub(super) enum Work {
    /// A collective's job.
    Coll(Closure),
    /// A send or receive: every one of a group on one communicator and stream runs as one
    /// kernel, so they progress together (NCCL fuses a group into one launch).
    P2p(P2pOp, Option<Arc<Hang>>, Member),
}

/// An operation waiting for the end of its group.
pub(super) struct Deferred {
    /// Its communicator.
    pub(super) shared: Arc<Shared>,
    /// Its stream.
    pub(super) stream: RawStream,
    /// What runs.
    pub(super) work: Work,
    /// The algorithm it uses, for `ncclInProgress` at first use.
    pub(super) key: String,
}

/// The calling thread's group (NCCL's groups are per thread).
#[derive(Default)]
struct Group {
    /// `ncclGroupStart`s not yet ended.
    depth: usize,
    /// The operations of the group, in call order.
    deferred: Vec<Deferred>,
    /// The first error of a call in the group (the group end reports it too).
    error: Option<NcclResult>,
}

thread_local! {
    /// The calling thread's group.
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Runs `f` on the thread's group.
fn with_group<T>(f: impl FnOnce(&mut Group) -> T) -> Option<T> {
    GROUP.try_with(|g| g.try_borrow_mut().ok().map(|mut g| f(&mut g))).ok().flatten()
}

/// Queues `job` on `stream`.
///
/// # Errors
/// `ncclUnhandledCudaError` when the runtime refuses it (the stream is broken or gone).
pub(super) fn enqueue(stream: RawStream, job: Closure, call: &str) -> Result<(), NcclResult> {
    enqueue_anywhere(stream, job)
        .map_err(|e| fail(NcclResult::UNHANDLED_CUDA_ERROR, format!("{call}: the stream refused the work: {e}")))
}

/// Queues `d` now, or at the end of the thread's group. Returns `ncclInProgress` when it is
/// the first use of its algorithm on a non-blocking communicator.
pub(super) fn submit(d: Deferred, call: &str) -> Result<NcclResult, NcclResult> {
    let mut d = Some(d);
    let grouped = with_group(|g| {
        if g.depth > 0 {
            if let Some(d) = d.take() {
                g.deferred.push(d);
            }
            true
        } else {
            false
        }
    })
    .unwrap_or(false);
    match d {
        Some(d) if !grouped => launch(vec![d], call),
        _ => Ok(NcclResult::SUCCESS),
    }
}

/// The kernel of the sends and receives `ops` of one rank: every receive is posted, then
/// every send waits for its peer's receive and delivers, then the receives are waited for.
fn p2p_kernel(shared: Arc<Shared>, member: Member, ops: Vec<P2pOp>, hangs: Vec<Arc<Hang>>) -> Closure {
    Box::new(move || {
        let failed = |why: String, usage: bool| {
            let fallback = if usage { NcclResult::INVALID_USAGE } else { NcclResult::INTERNAL_ERROR };
            let code = member.net.abort_code(member.rank).unwrap_or(fallback);
            shared.failed(code, &format!("ncclSend/ncclRecv: {why}"))
        };
        for h in &hangs {
            h.wait(&member.net).map_err(|w| failed(w, false))?;
        }
        let world = &member.net.world;
        let tickets: Vec<u64> = ops
            .iter()
            .filter(|o| !o.send)
            // SAFETY: the receive buffer holds `len` bytes until the stream passes this job
            // (the contract of the ncclRecv that queued it); this job waits for the ticket.
            .map(|o| unsafe { world.post_recv(o.peer, member.rank, o.ptr, o.len) })
            .collect();
        let mut first: Option<(String, bool)> = None;
        for o in ops.iter().filter(|o| o.send) {
            // SAFETY: the send buffer holds `len` bytes until the stream passes this job
            // (the contract of the ncclSend that queued it).
            if let Err(w) = unsafe { world.send(member.rank, o.peer, o.ptr, o.len) } {
                first.get_or_insert((w, true));
            }
        }
        for t in tickets {
            if let Err(w) = world.wait_recv(t) {
                first.get_or_insert((w, true));
            }
        }
        match first {
            None => Ok(()),
            Some((why, usage)) => Err(failed(why, usage)),
        }
    })
}

/// Refuses a kernel whose receive overwrites memory another of its calls reads or writes:
/// the GPU would run them at the same time (NCCL does not look; the result would be
/// undefined).
fn check_aliasing(ops: &[P2pOp], call: &str) -> Result<(), NcclResult> {
    let overlap = |a: &P2pOp, b: &P2pOp| a.len > 0 && b.len > 0 && a.ptr < b.ptr + b.len && b.ptr < a.ptr + a.len;
    for (i, r) in ops.iter().enumerate().filter(|(_, o)| !o.send) {
        if let Some(o) = ops.iter().enumerate().find(|&(j, o)| j != i && overlap(r, o)).map(|(_, o)| o) {
            return Err(fail(
                NcclResult::INVALID_USAGE,
                format!(
                    "{call}: the receive from rank {} into {:#x}+{} overlaps the {} {} rank {} at {:#x}+{} in the same \
                     group: the GPU runs them concurrently",
                    r.peer,
                    r.ptr,
                    r.len,
                    if o.send { "send" } else { "receive" },
                    if o.send { "to" } else { "from" },
                    o.peer,
                    o.ptr,
                    o.len
                ),
            ));
        }
    }
    Ok(())
}

/// Queues the operations `ds` (a group, or one call): the sends and receives of each
/// communicator and stream as one kernel (at the place of the first), collectives as they
/// come. Work of a communicator using an algorithm for the first time is held until it is
/// polled, and the result is `ncclInProgress` (NCCL 2.22+ connects lazily).
fn launch(ds: Vec<Deferred>, call: &str) -> Result<NcclResult, NcclResult> {
    type Kernel = (Arc<Shared>, RawStream, Member, Vec<P2pOp>, Vec<Arc<Hang>>);
    /// A job, or the index of a kernel, with its communicator, stream and algorithm keys.
    type Queued = (Arc<Shared>, RawStream, Result<Closure, usize>, String);
    /// A communicator's jobs and algorithm keys.
    type PerComm = (Arc<Shared>, Vec<(RawStream, Closure)>, Vec<String>);
    let mut kernels: Vec<Kernel> = Vec::new();
    // (communicator, stream, job or kernel index), in order.
    let mut order: Vec<Queued> = Vec::new();
    for d in ds {
        match d.work {
            Work::Coll(job) => order.push((d.shared, d.stream, Ok(job), d.key)),
            Work::P2p(op, hang, member) => {
                let at = kernels.iter().position(|k| Arc::ptr_eq(&k.0, &d.shared) && k.1 == d.stream);
                let at = match at {
                    Some(at) => at,
                    None => {
                        kernels.push((Arc::clone(&d.shared), d.stream, member, Vec::new(), Vec::new()));
                        order.push((Arc::clone(&d.shared), d.stream, Err(kernels.len() - 1), String::new()));
                        kernels.len() - 1
                    }
                };
                kernels[at].3.push(op);
                kernels[at].4.extend(hang);
                if let Some(o) = order.iter_mut().find(|o| o.2.as_ref().err() == Some(&at)) {
                    o.3.push_str(&d.key);
                    o.3.push(' ');
                }
            }
        }
    }
    for k in &kernels {
        check_aliasing(&k.3, call)?;
    }
    let mut kernels: Vec<Option<Kernel>> = kernels.into_iter().map(Some).collect();
    // Per communicator: its jobs, and whether it uses something for the first time.
    let mut per_comm: Vec<PerComm> = Vec::new();
    for (shared, stream, what, key) in order {
        let job = match what {
            Ok(job) => job,
            Err(at) => match kernels[at].take() {
                Some((sh, _, member, ops, hangs)) => p2p_kernel(sh, member, ops, hangs),
                None => continue,
            },
        };
        let keys = key.split_whitespace().map(str::to_string);
        match per_comm.iter_mut().find(|c| Arc::ptr_eq(&c.0, &shared)) {
            Some(c) => {
                c.1.push((stream, job));
                c.2.extend(keys);
            }
            None => per_comm.push((shared, vec![(stream, job)], keys.collect())),
        }
    }
    let mut result = NcclResult::SUCCESS;
    for (shared, jobs, keys) in per_comm {
        if shared.cold(&keys) {
            shared.hold(jobs);
            result = NcclResult::IN_PROGRESS;
            continue;
        }
        for (stream, job) in jobs {
            enqueue(stream, job, call)?;
        }
    }
    Ok(result)
}

/// The outcome of an operation's call: inside a group an error is remembered for the
/// group's end, as NCCL does.
pub(super) fn finish(result: Result<NcclResult, NcclResult>) -> NcclResult {
    match result {
        Ok(code) => code,
        Err(code) => {
            with_group(|g| {
                if g.depth > 0 {
                    g.error.get_or_insert(code);
                }
            });
            code
        }
    }
}

/// `ncclResult_t ncclGroupStart()`.
///
/// # Safety
/// None needed.
pub(super) unsafe extern "C" fn nccl_group_start() -> NcclResult {
    guard("ncclGroupStart", || {
        with_group(|g| {
            g.depth += 1;
            NcclResult::SUCCESS
        })
        .unwrap_or_else(|| fail(NcclResult::INTERNAL_ERROR, "ncclGroupStart: the thread is exiting"))
    })
}

/// `ncclResult_t ncclGroupEnd()`: at the outermost end, queues the group's operations (see
/// [`launch`]), or, when a call in the group failed, drops them and reports that error.
/// `ncclInProgress` when a communicator uses an algorithm for the first time.
///
/// # Safety
/// None needed.
pub(super) unsafe extern "C" fn nccl_group_end() -> NcclResult {
    const CALL: &str = "ncclGroupEnd";
    guard(CALL, || {
        let taken = with_group(|g| {
            if g.depth == 0 {
                return Err(fail(NcclResult::INVALID_USAGE, format!("{CALL}: no group was started")));
            }
            g.depth -= 1;
            if g.depth > 0 {
                return Ok(None);
            }
            Ok(Some((std::mem::take(&mut g.deferred), g.error.take())))
        });
        let (deferred, error) = match taken {
            None => return fail(NcclResult::INTERNAL_ERROR, format!("{CALL}: the thread is exiting")),
            Some(Err(code)) => return code,
            Some(Ok(None)) => return NcclResult::SUCCESS,
            Some(Ok(Some(t))) => t,
        };
        if let Some(code) = error {
            return code;
        }
        launch(deferred, CALL).unwrap_or_else(|code| code)
    })
}
