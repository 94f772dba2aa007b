//! The GPU engine: one rank of an `nccl` or `rccl` communicator, as a [`Backend`].
//!
//! Rooms:
//! - `comm.rs`: the NCCL communicator handle (created non-blocking, aborted safely; split,
//!   shrink and grow);
//! - `meet.rs`: what the ranks of a new communicator exchange over the host side first
//!   (the unique id and how it is used; gathers to decide together);
//! - `issue.rs`: how each operation becomes NCCL calls;
//! - `p2p.rs`: envelopes, buffered sends, the queue of point-to-point batches and
//!   whole-group receives;
//! - `progress.rs`: buffered sends issued when a receiver pulls, while this rank's thread is
//!   busy elsewhere;
//! - `pool.rs`: the cache of device temporaries and pinned blocks (no free on the hot path);
//! - `temps.rs`: temporaries lent from those caches, and issues kept until their event fires;
//! - `state.rs`: what the engine is made of and shares with its operations (`Parts`,
//!   [`Engine`], `Inner`, and the events, temporaries, issues and queued batches that point
//!   back at it); the other rooms stand on it, this file orchestrates;
//! - `pending.rs`: completion by event, with deadline, asynchronous error and lost peers;
//! - `lost.rs`: the grace every wait gives a peer the host side reports lost;
//! - `stage.rs`: host buffers through pinned memory and device temporaries;
//! - `recovery.rs`: revoke, shrink and grow (NCCL's own calls or a fresh communicator).
//!
//! # Streams
//! Each communicator has its own stream (and a second one where buffered sends are copied).
//! Every entry restores the caller's current device or context on the way out, as NCCL does
//! (PyTorch reads its current device back). By default an operation is ordered after the work
//! already queued on the caller's stream (the legacy default stream, or the one given with
//! `Communicator::with_stream`) by an event the engine's stream waits for: the caller's
//! stream is never blocked by communication. With `Communicator::on_stream` the calls are
//! queued on the caller's stream itself, NCCL's own model. Every operation records a
//! completion event; an asynchronous `Work` completes when it fires, a blocking call waits
//! for it.
//!
//! # Failures
//! Every wait polls the event, NCCL's asynchronous error (every millisecond) and the host
//! side's view of the peers, against the operation's deadline. Past the deadline, or on any
//! error, the communicator is poisoned and aborted (`ncclCommAbort`, safe because it was
//! created non-blocking), the host communicator is aborted so the peers learn it at once,
//! and the call returns the error ([`Error::Timeout`] names the operation and its sequence
//! number). Mismatched collectives, which NCCL cannot detect, are caught by the optional
//! fingerprint check of the host side.
//!
//! # Host buffers
//! By [`HostBuffers`] (`OXCCL_GPU_HOST_BUFFERS`): refused with [`Error::InvalidArgument`]
//! (the default of a named `nccl`/`rccl` backend); run on the host communicator in the same
//! call order (`cpu`, the default under `auto`, like torch's `cpu:gloo,cuda:nccl`); or copied
//! through device temporaries (`stage`, see `stage.rs`).

mod comm;
mod issue;
mod lost;
mod meet;
mod p2p;
mod pending;
mod pool;
mod progress;
mod recovery;
#[cfg(test)]
mod recovery_tests;
mod route;
mod stage;
mod state;
mod temps;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use self::comm::{Comm, Guard, NCCL_SPLIT_NOCOLOR};
use self::issue::{Target, Transfer};
use self::meet::{exchange, fresh_id, host_all_gather, Make};
use self::pending::GpuPending;
use self::pool::Pool;
use self::route::Route;
use self::state::{DeviceTemp, Inner, Issued, Order, PooledEvent, Queued, Staged, Ticket};
pub(crate) use self::state::{Engine, Parts};
use crate::backend::poison::Poison;
use crate::backend::{Backend, CallOptions, MessageInfo, Mode, Op, Pending, StreamOrder};
use crate::config::HostBuffers;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::fingerprint::OpKind;
use crate::sync::relock;
use crate::xccl::host_side::HostSide;
use crate::xccl::library::types::NcclUniqueId;
use crate::xccl::library::NcclResult;
use crate::xccl::runtime::{enter, DeviceRuntime, RawEvent, RawStream, Vendor};

/// Events kept for reuse at most.
const EVENT_POOL: usize = 64;
/// How long a failed communicator's stream is given to drain after the abort.
const DRAIN: Duration = Duration::from_secs(2);

/// The device as buffers name it.
fn device_of(rt: &dyn DeviceRuntime, ordinal: u32) -> Device {
    match rt.vendor() {
        Vendor::Cuda | Vendor::Host => Device::Cuda(ordinal),
        Vendor::Hip => Device::Rocm(ordinal),
    }
}

impl Engine {
    /// Creates this rank's communicator: the unique id travels over the host communicator,
    /// the NCCL communicator is created non-blocking and waited for within the timeout.
    ///
    /// # Errors
    /// The device cannot be used; NCCL's error; the host communicator's errors; a creation
    /// that does not finish within the timeout (the half-made communicator is aborted).
    pub(crate) fn create(parts: Parts) -> Result<Engine> {
        let rt = Arc::clone(&parts.rt);
        let _cur = enter(rt.as_ref(), parts.device)?;
        let (_, id) = exchange(parts.host.as_ref(), parts.timeout, || Ok((Make::Init, fresh_id(&parts.lib)?)))?;
        Self::from_id(parts, &id)
    }

    /// This rank's communicator from `id`, every rank's (`ncclCommInitRankConfig`), on the
    /// device the caller made current.
    fn from_id(parts: Parts, id: &NcclUniqueId) -> Result<Engine> {
        let host = HostSide::new(Arc::clone(&parts.host), parts.check);
        let comm = Self::init_comm(&parts, &host, id)?;
        Self::assemble(parts, host, comm)
    }

    /// `ncclCommInitRankConfig` for the host side's rank, watched by the host side.
    fn init_comm(parts: &Parts, host: &HostSide, id: &NcclUniqueId) -> Result<Comm> {
        let (rank, size) = (host.comm().rank(), host.comm().world_size());
        let kind = device_of(parts.rt.as_ref(), parts.device);
        let late = |waited: Duration| Error::Backend {
            code: i64::from(NcclResult::TIMEOUT.0),
            message: format!(
                "creating the {} communicator (rank {rank} of {size}, on {kind}) did not finish within {waited:?}; \
                 every rank must create it at the same time. Set NCCL_DEBUG=WARN for NCCL's view",
                parts.lib.describe()
            ),
        };
        let guard = Guard { deadline: Instant::now() + parts.timeout, watch: &|| host.liveness(), late: &late };
        let comm = Comm::init(&parts.lib, size, id, rank, &guard)?;
        comm.verify(size, rank, parts.device)?;
        Ok(comm)
    }

    /// The engine around a ready communicator: its stream, scratch word and events.
    fn assemble(parts: Parts, host: HostSide, comm: Comm) -> Result<Engine> {
        let Parts { name, lib, rt, device, host_buffers, timeout, algorithms, .. } = parts;
        let stream = rt.stream_create(device)?;
        let copy_stream = match rt.stream_create(device) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: just created, nothing queued on it.
                let _ = unsafe { rt.stream_destroy(stream) };
                return Err(e);
            }
        };
        let made = rt.alloc(device, 4).and_then(|scratch| match rt.event_create(device) {
            Ok(ev) => Ok((scratch, ev)),
            Err(e) => {
                // SAFETY: just allocated, never used.
                let _ = unsafe { rt.free(device, scratch) };
                Err(e)
            }
        });
        let (scratch, order_event) = match made {
            Ok(x) => x,
            Err(e) => {
                // SAFETY: just created, nothing queued on them.
                let _ = unsafe { rt.stream_destroy(stream) };
                // SAFETY: as above.
                let _ = unsafe { rt.stream_destroy(copy_stream) };
                return Err(e);
            }
        };
        let kind = device_of(rt.as_ref(), device);
        let (rank, size) = (host.comm().rank(), host.comm().world_size());
        let inner = Inner {
            name,
            lib,
            rt,
            device,
            kind,
            rank,
            size,
            timeout,
            algorithms,
            host,
            host_buffers,
            comm,
            stream,
            copy_stream,
            scratch,
            order_event,
            events: Mutex::new(Vec::new()),
            pool: Mutex::new(Pool::default()),
            pinned_pool: Mutex::new(Pool::default()),
            retiring: Mutex::new(Vec::new()),
            progress: Mutex::new(false),
            order: Mutex::new(Order {
                collectives: 0,
                p2p: 0,
                queue: Vec::new(),
                stash: (0..size).map(|_| std::collections::VecDeque::new()).collect(),
                touched: Instant::now(),
            }),
            poison: Mutex::new(Poison::default()),
        };
        Ok(Engine { inner: Arc::new(inner) })
    }
}

impl Inner {
    /// `Ok` unless the communicator is poisoned.
    fn poisoned(&self) -> Result<()> {
        relock(&self.poison).check()
    }

    /// What a wait watches besides its event: NCCL's asynchronous error and lost peers.
    fn watch(&self) -> Result<()> {
        self.poisoned()?;
        if let Some(e) = self.comm.async_error()? {
            return Err(e);
        }
        self.host.liveness()
    }

    /// Poisons the communicator with `e`, aborts it and the host communicator, lets the
    /// stream drain, and returns `e`. When it was poisoned already (an `abort()` from another
    /// thread, an earlier failure), that first cause is returned instead: what `e` reports
    /// (a broken stream, a remote error) is then its consequence.
    ///
    /// NCCL's own report of a peer's abort or failure (`ncclRemoteError`, a stream that
    /// failed) is a consequence too. A peer tells its host communicator first and NCCL
    /// second (see [`Inner::abort_both`]), so when the host communicator already knows of a
    /// peer's abort, failure or death, that is the cause returned. Without this, when every
    /// rank aborted at once, a rank whose own abort came a moment after a peer's could end
    /// with "remote process exited" instead of [`Error::Aborted`].
    fn fail(&self, e: Error) -> Error {
        let e = match e {
            e @ Error::Backend { .. } => self.host.liveness().err().unwrap_or(e),
            e => e,
        };
        let first = relock(&self.poison).set(e.clone());
        if !first {
            return self.poisoned().err().unwrap_or(e);
        }
        self.abort_both(&format!("rank {} failed: {e}", self.rank));
        self.drain();
        e
    }

    /// Aborts the host communicator, then NCCL's. In that order, a peer that NCCL fails
    /// (`ncclRemoteError`) can already read this rank's reason from its host communicator
    /// (in one process at once; across processes the reason was sent first).
    fn abort_both(&self, reason: &str) {
        self.host.comm().abort(reason);
        self.comm.abort(reason);
    }

    /// Waits (boundedly) until the engine's stream has run what was queued, after an abort
    /// made every NCCL call on it return. Whether it did (a failed stream counts: it runs
    /// nothing more).
    fn drain(&self) -> bool {
        let Ok(ev) = self.event() else { return false };
        let mut drained = false;
        if self.rt.event_record(ev, self.stream).is_ok() {
            let until = Instant::now() + DRAIN;
            loop {
                drained = matches!(self.rt.event_query(ev), Ok(true) | Err(_));
                if drained || Instant::now() >= until {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        self.give_back_event(ev);
        drained
    }

    /// A completion event (from the pool when it has one).
    fn event(&self) -> Result<RawEvent> {
        if let Some(event) = relock(&self.events).pop() {
            return Ok(event);
        }
        self.rt.event_create(self.device)
    }

    /// Returns an event to the pool.
    fn give_back_event(&self, event: RawEvent) {
        let mut pool = relock(&self.events);
        if pool.len() < EVENT_POOL {
            pool.push(event);
        } else {
            drop(pool);
            // SAFETY: the event's last user is gone (its `PooledEvent` is being dropped).
            let _ = unsafe { self.rt.event_destroy(event) };
        }
    }

    /// Issues the queued batches (see `p2p.rs`).
    fn flush_queue(self: &Arc<Self>) -> Result<()> {
        let mut order = relock(&self.order);
        self.flush(&mut order)
    }

    /// Makes the engine's stream wait for the work queued so far on the caller's stream.
    fn follow(&self, caller: RawStream) -> Result<()> {
        self.follow_on(caller, self.stream)
    }

    /// Makes `stream` wait for the work queued so far on the caller's stream (under the
    /// order lock, which guards the event).
    fn follow_on(&self, caller: RawStream, stream: RawStream) -> Result<()> {
        self.rt.event_record(self.order_event, caller)?;
        self.rt.stream_wait_event(stream, self.order_event)
    }

    /// The stream an operation with `order` is queued on, ordered after the caller's work.
    fn stream_for(&self, order: Option<StreamOrder>) -> Result<RawStream> {
        match order {
            Some(StreamOrder::On(s)) => Ok(RawStream(s.as_raw())),
            Some(StreamOrder::After(s)) => self.follow(RawStream(s.as_raw())).map(|()| self.stream),
            None => self.follow(RawStream::DEFAULT).map(|()| self.stream),
        }
    }

    /// A guard for waits of operation `kind` number `seq`.
    fn late(kind: OpKind, seq: u64) -> impl Fn(Duration) -> Error {
        move |waited| Error::Timeout { op: kind, seq, peer: None, waited }
    }

    /// Records a completion event on `stream`.
    fn complete_on(self: &Arc<Self>, stream: RawStream) -> Result<Arc<PooledEvent>> {
        let ev = Arc::new(PooledEvent { inner: Arc::clone(self), event: self.event()? });
        self.rt.event_record(ev.event, stream)?;
        Ok(ev)
    }

    /// Issues `transfers` as one group on the engine's stream, after every caller stream
    /// `orders` name, then queues `after`'s work on that stream; streams asked for with `On`
    /// wait for the completion event recorded last.
    ///
    /// # Safety
    /// Every pointer of `transfers` is device memory valid until the event fires.
    unsafe fn issue_group(
        self: &Arc<Self>,
        transfers: &[Transfer],
        orders: &[Option<StreamOrder>],
        deadline: Instant,
        after: &mut dyn FnMut(RawStream) -> Result<()>,
    ) -> Result<Arc<PooledEvent>> {
        let _cur = enter(self.rt.as_ref(), self.device)?;
        let mut callers: Vec<RawStream> = Vec::new();
        let mut on: Vec<RawStream> = Vec::new();
        for o in orders {
            let (s, is_on) = match o {
                None => (RawStream::DEFAULT, false),
                Some(StreamOrder::After(s)) => (RawStream(s.as_raw()), false),
                Some(StreamOrder::On(s)) => (RawStream(s.as_raw()), true),
            };
            if !callers.contains(&s) {
                callers.push(s);
            }
            if is_on && !on.contains(&s) {
                on.push(s);
            }
        }
        for s in callers {
            self.follow(s)?;
        }
        let result = self.comm.with(|c| {
            let target = Target {
                lib: &self.lib,
                comm: c,
                stream: self.stream,
                rt: self.rt.as_ref(),
                rank: self.rank,
                size: self.size,
            };
            // SAFETY: forwarded from this function's contract; `c` is live under the lock.
            unsafe { target.group(transfers) }
        })?;
        let late = Self::late(OpKind::Batch, 0);
        let guard = Guard { deadline, watch: &|| self.watch(), late: &late };
        let settled = result.and_then(|r| self.comm.settle("ncclGroupEnd", r, &guard));
        settled.map_err(|e| self.fail(e))?;
        after(self.stream)?;
        let ev = self.complete_on(self.stream)?;
        for s in on {
            self.rt.stream_wait_event(s, ev.event)?;
        }
        Ok(ev)
    }

    /// Issues a collective (under the order lock) and returns its completion.
    ///
    /// # Safety
    /// As for [`Backend::submit`].
    unsafe fn issue_collective(
        self: &Arc<Self>,
        op: &Op,
        order: Option<StreamOrder>,
        seq: u64,
        deadline: Instant,
        staged: Option<Staged>,
    ) -> Result<Issued> {
        let _cur = enter(self.rt.as_ref(), self.device)?;
        let stream = self.stream_for(order)?;
        if let Some(st) = &staged {
            // SAFETY: the host ranges stay valid until completion (our contract).
            unsafe { st.copy_in(self, stream)? };
        }
        let mut temps: Vec<DeviceTemp> = Vec::new();
        let result = self.comm.with(|c| {
            let target =
                Target { lib: &self.lib, comm: c, stream, rt: self.rt.as_ref(), rank: self.rank, size: self.size };
            let mut temp = |bytes: usize| {
                let t = self.temp(bytes)?;
                let p = t.ptr;
                temps.push(t);
                Ok(p)
            };
            // SAFETY: forwarded from this function's contract; `c` is live under the lock;
            // `scratch` is the engine's 4-byte device word.
            unsafe { target.collective(op, self.scratch, &mut temp) }
        })?;
        let late = Self::late(op.kind(), seq);
        let guard = Guard { deadline, watch: &|| self.watch(), late: &late };
        let settled = result.and_then(|r| self.comm.settle("the collective", r, &guard));
        settled.map_err(|e| self.fail(e))?;
        let (mut back, mut pinned) = (Vec::new(), Vec::new());
        if let Some(st) = staged {
            // SAFETY: the temporaries and pinned mirrors are kept with the issue.
            back = unsafe { st.copy_out(self, stream, &[])? };
            temps.extend(st.temps);
            pinned = st.pinned;
        }
        let event = self.complete_on(stream)?;
        let mut issued = Issued::plain(event, temps);
        issued.back = Mutex::new(back);
        issued.pinned = pinned;
        Ok(issued)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _cur = enter(self.rt.as_ref(), self.device);
        if relock(&self.poison).is_set() {
            self.comm.abort("the communicator was dropped");
        } else {
            self.comm.destroy(Instant::now() + self.timeout.min(Duration::from_secs(10)));
        }
        let drained = self.drain();
        let mut blocks = relock(&self.pool).drain();
        let mut pinned = relock(&self.pinned_pool).drain();
        blocks.extend(relock(&self.order).stash.drain(..).flat_map(|q| q.into_iter().map(|m| m.ptr)));
        if !drained {
            // Work still queued may use them (a send whose receiver never came): leaking is
            // the safe choice, and the process is usually ending.
            tracing::warn!(
                "the {} stream of rank {} did not drain within {DRAIN:?}; {} device block(s) are not freed",
                self.name,
                self.rank,
                blocks.len()
            );
            blocks.clear();
            pinned.clear();
        }
        // SAFETY: the communicator is gone and the stream drained: nothing uses the stream,
        // the events, the scratch word or the cached blocks any more; each is released once.
        unsafe {
            let _ = self.rt.stream_destroy(self.stream);
            let _ = self.rt.stream_destroy(self.copy_stream);
            let _ = self.rt.event_destroy(self.order_event);
            for ev in relock(&self.events).drain(..) {
                let _ = self.rt.event_destroy(ev);
            }
            if drained {
                let _ = self.rt.free(self.device, self.scratch);
            }
            for b in blocks {
                let _ = self.rt.free(self.device, b);
            }
            for a in pinned {
                let _ = self.rt.host_free(std::ptr::with_exposed_provenance_mut(a as usize));
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Buffered sends left in the queue are issued: their submitters were told they were
        // sent, and issuing them waits for nothing (the communicator's destruction waits,
        // boundedly, for them to be received). Whatever else is left is failed, not issued:
        // issuing could wait for a peer's envelope for a whole timeout. Dropping the batches
        // also lets go of their device temporaries, which point back at the engine.
        let i = &self.inner;
        let mut order = relock(&i.order);
        let (sends, left): (Vec<Queued>, Vec<Queued>) =
            std::mem::take(&mut order.queue).into_iter().partition(|q| q.buffered);
        for q in left {
            q.ticket
                .set(Err(Error::Aborted { reason: "the communicator was dropped before the batch was issued".into() }));
        }
        if !sends.is_empty() && i.poisoned().is_ok() {
            order.queue = sends;
            if let Err(e) = i.flush(&mut order) {
                tracing::warn!("rank {}: sends buffered before the communicator was dropped were lost: {e}", i.rank);
            }
        }
        drop(order);
        // The retired issues hold the engine; what they keep is freed with it, after its
        // stream drained.
        let retired = std::mem::take(&mut *relock(&i.retiring));
        drop(retired);
    }
}

impl Backend for Engine {
    fn name(&self) -> &'static str {
        self.inner.name
    }

    fn rank(&self) -> usize {
        self.inner.rank
    }

    fn world_size(&self) -> usize {
        self.inner.size
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    fn device(&self) -> Device {
        self.inner.kind
    }

    fn check_device(&self, device: Device) -> Result<()> {
        if device == self.inner.kind || (device == Device::Cpu && self.inner.host_buffers != HostBuffers::Refuse) {
            Ok(())
        } else {
            Err(self.wrong_device(device))
        }
    }

    unsafe fn submit(&self, op: Op, mode: Mode, opts: &CallOptions) -> Result<Arc<dyn Pending>> {
        let i = &self.inner;
        i.poisoned()?;
        if let Op::Batch(ops) = &op {
            if ops.iter().any(|p| matches!(p, crate::backend::P2p::RecvAny { .. })) {
                return Err(Error::invalid(format!(
                    "the {} backend receives from a named rank: NCCL has no receive from any source (torch's NCCL \
                     backend refuses it too); pass the sender's rank, or receive on a host communicator (cpu)",
                    self.name()
                )));
            }
        }
        let (op, staged) = match self.route(&op)? {
            Route::Device => (op, None),
            // SAFETY: forwarded from our caller.
            Route::HostComm => return unsafe { i.host.comm().submit(op, mode, opts) },
            Route::Stage => {
                let mut staged = i.stage(op)?;
                let op = std::mem::replace(&mut staged.op, Op::Barrier);
                (op, Some(staged))
            }
        };
        let timeout = opts.timeout_or(i.timeout);
        let started = Instant::now();
        let deadline = started + timeout;
        let kind = op.kind();
        let forced = opts.forced_algorithm(kind, &i.algorithms)?;
        if let Op::Batch(ops) = op {
            let ticket = Arc::new(Ticket::default());
            let mut order = relock(&i.order);
            order.touched = Instant::now();
            // Under the lock: envelopes go out in the order the sends are queued, also when
            // several threads submit (a receiver matches them in that order).
            i.host.announce(&p2p::envelopes(&ops, i.rank), timeout)?;
            let seq = order.p2p;
            order.p2p += 1;
            let _cur = enter(i.rt.as_ref(), i.device)?;
            // Sends only: buffered, done once copied (see `p2p.rs`); NCCL's own send would
            // wait for the peer's receive. The copies run on the copy stream, which no group
            // holds up; the group waits for them.
            let buffered = ops.iter().all(|p| matches!(p, crate::backend::P2p::Send { .. }));
            if let Some(st) = &staged {
                let on = if buffered { i.copy_stream } else { i.stream };
                // SAFETY: the host ranges stay valid until completion (our caller's contract);
                // the group that uses the temporaries is queued later on the engine's stream
                // (after these copies, by stream order or by the copy event).
                unsafe { st.copy_in(i, on)? };
            }
            let (ops, keep, mine) = if buffered && staged.is_some() {
                let event = i.complete_on(i.copy_stream)?;
                (ops, Vec::new(), Some(Issued::plain(event, Vec::new())))
            } else if buffered {
                // SAFETY: the buffers stay valid until the copies ran (our caller's contract).
                let (ops, keep, issued) = unsafe { i.buffer_sends(ops, opts.stream)? };
                (ops, keep, Some(issued))
            } else {
                (ops, Vec::new(), None)
            };
            let ready = mine.as_ref().map(|m| Arc::clone(&m.event));
            let q = Queued {
                ops,
                ticket: Arc::clone(&ticket),
                deadline,
                order: opts.stream,
                staged,
                seq,
                keep,
                buffered,
                ready,
            };
            order.queue.push(q);
            if buffered {
                i.wake_progress();
            }
            let ticket = match mine {
                Some(issued) => Ticket::issued(Ok(issued)),
                None => {
                    if mode == Mode::Blocking {
                        i.flush(&mut order)?;
                    }
                    ticket
                }
            };
            drop(order);
            return Ok(Arc::new(GpuPending {
                inner: Arc::clone(i),
                ticket,
                kind,
                seq,
                started,
                deadline,
                done: Mutex::new(None),
            }));
        }
        let mut order = relock(&i.order);
        order.touched = Instant::now();
        let seq = order.collectives;
        order.collectives += 1;
        if let Err(e) = i.host.check_collective(&op.fingerprint(seq, forced), timeout) {
            // The ranks disagree (or one is gone): the communicator cannot go on, as on the
            // host backends. A wait in the check is this operation's wait.
            let e = match e {
                Error::Timeout { peer, waited, .. } => Error::Timeout { op: kind, seq, peer, waited },
                other => other,
            };
            return Err(i.fail(e));
        }
        i.flush(&mut order)?;
        // SAFETY: forwarded from our caller.
        let issued = unsafe { i.issue_collective(&op, opts.stream, seq, deadline, staged)? };
        drop(order);
        Ok(Arc::new(GpuPending {
            inner: Arc::clone(i),
            ticket: Ticket::issued(Ok(issued)),
            kind,
            seq,
            started,
            deadline,
            done: Mutex::new(None),
        }))
    }

    fn probe(&self, peer: usize, tag: u32) -> Result<Option<MessageInfo>> {
        let i = &self.inner;
        i.poisoned()?;
        if let Some(m) = i.probe_message(peer, tag)? {
            return Ok(Some(m));
        }
        if i.host_buffers == HostBuffers::Cpu {
            return i.host.comm().probe(peer, tag);
        }
        Ok(None)
    }

    fn split(&self, color: Option<u32>, key: i64, opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        let i = &self.inner;
        i.poisoned()?;
        let timeout = opts.timeout_or(i.timeout);
        let mut order = relock(&i.order);
        order.touched = Instant::now();
        i.flush(&mut order)?;
        let parent = i.host.comm();
        let child_host = parent.split(color, key, opts)?;
        let parts = |host: Arc<dyn Backend>| i.parts(host);
        let _cur = enter(i.rt.as_ref(), i.device)?;
        if i.lib.table.comm_split.is_some() {
            // NCCL's colors are non-negative ints: number the distinct colors densely, the
            // same way on every rank; the key is the rank in the host split, whose order
            // (key, rank) is the one oxccl promises.
            let code = color.map_or(0, |c| u64::from(c) + 1);
            let all = host_all_gather(parent.as_ref(), code, timeout)?;
            let mut distinct: Vec<u64> = all.into_iter().filter(|&c| c != 0).collect();
            distinct.sort_unstable();
            distinct.dedup();
            let nccl_color = match color {
                None => NCCL_SPLIT_NOCOLOR,
                Some(c) => {
                    let at = distinct
                        .binary_search(&(u64::from(c) + 1))
                        .map_err(|_| Error::Internal("this rank's color is missing from the gathered colors".into()))?;
                    std::ffi::c_int::try_from(at).map_err(|_| Error::invalid("too many split colors for NCCL"))?
                }
            };
            let nccl_key = match &child_host {
                Some(h) => comm::rank_for_nccl(h.rank())?,
                None => 0,
            };
            let late = Inner::late(OpKind::Barrier, order.collectives);
            let guard = Guard { deadline: Instant::now() + timeout, watch: &|| i.watch(), late: &late };
            let child = i.comm.split(nccl_color, nccl_key, &guard).map_err(|e| i.fail(e))?;
            drop(order);
            // The new communicator's own creation: its failure (a peer that aborted it at
            // once, say) is the new communicator's, not this one's, which stays usable.
            // Dropping the child on the way out aborts it.
            if let Some(c) = &child {
                c.wait_ready("ncclCommSplit", &guard)?;
            }
            return match (child, child_host) {
                (Some(comm), Some(host)) => {
                    let p = parts(host);
                    let side = HostSide::new(Arc::clone(&p.host), p.check);
                    Ok(Some(Arc::new(Engine::assemble(p, side, comm)?) as Arc<dyn Backend>))
                }
                (None, None) => Ok(None),
                _ => Err(Error::Internal("NCCL's split and the host split disagree about this rank".into())),
            };
        }
        drop(order);
        match child_host {
            None => Ok(None),
            Some(host) => {
                let (_, id) = exchange(host.as_ref(), timeout, || Ok((Make::Init, fresh_id(&i.lib)?)))?;
                Ok(Some(Arc::new(Engine::from_id(parts(host), &id)?) as Arc<dyn Backend>))
            }
        }
    }

    fn abort(&self, reason: &str) {
        let i = &self.inner;
        let e = Error::Aborted { reason: format!("rank {} called abort: {reason}", i.rank) };
        relock(&i.poison).set(e);
        i.abort_both(reason);
    }

    fn revoke(&self, reason: &str) -> Result<()> {
        self.inner.revoke(reason)
    }

    fn agree(&self, flag: u64, opts: &CallOptions) -> Result<crate::backend::Agreement> {
        self.inner.host.comm().agree(flag, opts)
    }

    fn shrink(&self, exclude: &[usize], opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        self.inner.shrink(exclude, opts)
    }

    fn grow(&self, joiners: usize, opts: &CallOptions) -> Result<Arc<dyn Backend>> {
        self.inner.grow(joiners, opts)
    }
}
