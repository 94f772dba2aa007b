//! The executor of the CPU backends: one communicator's collectives run one at a time, in
//! submission order, like a CUDA stream. Blocking calls run on the caller's thread when
//! nothing is queued (no thread hand-off on the latency path); async calls run on a worker
//! thread started on first use. Any failure poisons the communicator and is reported to the
//! peers so that they fail fast instead of waiting for their deadlines.
//!
//! Point-to-point operations stand apart from that stream, as gloo's and MPI's do (a posted
//! receive must not hold up the send after it, which its peer may be waiting for: torch's
//! `batch_isend_irecv` posts receives first). An async batch's sends go out at once, on
//! the caller's thread (sends are eager: the transport takes the data whatever the peer is
//! doing); its receives complete on a lane of their own, in the order they were posted,
//! and a blocking batch takes its turn on that lane.

use crate::sync::relock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::agree::service::Agreements;
use super::algorithms::hosts::HostGroups;
use super::algorithms::shared_memory::ShmCollectives;
use super::algorithms::{all_gather, Clock, Ctx, FrameTally, HostPhases};
use super::dispatch;
use super::executor::Executor;
use super::grow::Lineage;
use super::point_to_point::P2pCtx;
use super::selector::profile::Profile;
use super::selector::Selector;
use super::transport::shm::wait::WaitPolicy;
use super::transport::{LinkKind, Stage, Transport};
use crate::algorithm::Algorithm;
use crate::backend::completion::CompletionSlot;
use crate::backend::peer_waits::PeerWaits;
use crate::backend::poison::Poison;
use crate::backend::CallOptions;
use crate::backend::{Agreement, Backend, Completion, MessageInfo, Mode, Op, P2p, Pending};
use crate::config::ResolvedConfig;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::op_kind::OpKind;
use crate::staging;

/// The id of a world's first communicator; sub-communicators derive theirs from it.
pub const WORLD_COMM_ID: u64 = 1;

/// One rank's membership in one communicator of a CPU backend (`local`, later `cpu`).
pub struct CpuBackend {
    inner: Arc<Inner>,
    /// Resources that must outlive the communicator (e.g. the store rank 0 hosts); dropped
    /// after `Drop::drop` has shut the communicator down.
    keep: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

struct Inner {
    name: &'static str,
    transport: Arc<dyn Transport>,
    comm_id: u64,
    /// Communicator rank -> transport rank.
    ranks: Arc<[usize]>,
    rank: usize,
    cfg: ResolvedConfig,
    /// One operation at a time, in order; the worker's queue of asynchronous ones.
    exec: Executor<Job>,
    /// The point-to-point lane: receives, one at a time, in the order posted.
    p2p: Executor<Job>,
    state: Mutex<CommState>,
    /// Whether `state.poisoned` holds a failure (checked without the lock on every call).
    poisoned: AtomicBool,
    /// The sequence number of the next collective.
    seq: AtomicU64,
    /// Tests: the next operation panics (as a bug inside one would).
    #[cfg(test)]
    panic_next: AtomicBool,
    /// Collectives in shared memory, when every rank is on this host.
    native: OnceLock<ShmCollectives>,
    /// Collectives in shared memory among the ranks of this rank's host, when the ranks
    /// span hosts alike (the host phases of `hierarchical`).
    host_native: OnceLock<ShmCollectives>,
    /// Which algorithm runs each call.
    selector: Selector,
    /// This rank's groups by host, when the ranks span hosts alike (for `hierarchical`).
    host_groups: Option<HostGroups>,
    /// CompletionSlot size and wait policy of the shared-memory collectives of this communicator (of
    /// the whole of it, or of each host's ranks) and its splits: set where shared memory
    /// is allowed.
    native_setup: OnceLock<(usize, WaitPolicy)>,
    /// Time waited for each peer, for the profiler (off unless it turns it on).
    waits: Arc<PeerWaits>,
    /// Agreements and shrinks: their thread and state, made by the first.
    agreements: OnceLock<Arc<Agreements>>,
    /// The agreements of the communicator this one was shrunk or grown from, kept (their
    /// thread answering) until this one's first agreement decides: a member that took the
    /// parent's last decision from a coordinator that died halfway through its commits may
    /// be the one the others ask for it, after it dropped the parent. A decision here means
    /// every live member has left the parent's call.
    ancestor: Mutex<Option<Arc<Agreements>>>,
    /// The store-made world this communicator descends from (by shrinks and grows), which
    /// it can grow; none for splits and worlds made without a store.
    lineage: OnceLock<Arc<Lineage<CpuBackend>>>,
}

#[derive(Default)]
struct CommState {
    poisoned: Poison,
}

struct Job {
    op: Op,
    opts: CallOptions,
    slot: Arc<CompletionSlot>,
}

/// The "sequence number" and "color" from which a communicator's agreement id derives
/// (splits use collective sequence numbers and 32-bit colors, never these).
const AGREE_ID: (u64, u64) = (u64::MAX - 1, u64::MAX);
/// The color from which a shrunk communicator's id derives, with its last agreement's number.
const SHRINK_COLOR: u64 = u64::MAX - 1;

/// Mixes a parent id, a sequence number and a color into a new communicator id.
fn derive_comm_id(parent: u64, seq: u64, color: u64) -> u64 {
    let x = parent ^ seq.wrapping_mul(super::GOLDEN) ^ color.rotate_left(32);
    // Setting bit 1 keeps derived ids away from 0 and WORLD_COMM_ID.
    super::mix64(x) | 2
}

/// The fingerprint of the frames that set up shared-memory collectives with slots of
/// `slot_bytes` (`algorithm`: of the whole communicator, or of each host's ranks). It takes
/// the reserved sequence number, none the user would see.
fn setup_fingerprint(slot_bytes: usize, algorithm: Algorithm) -> Fingerprint {
    Fingerprint {
        seq: Stage::SETUP_SEQ,
        op: OpKind::Split,
        dtype: DType::U8,
        count: slot_bytes as u64,
        root: None,
        reduce: None,
        algorithm,
    }
}

impl CpuBackend {
    /// A communicator over `transport` with id `comm_id` whose rank i is transport rank
    /// `ranks[i]`; this endpoint is rank `rank`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `rank` is out of range or `ranks[rank]` is not this
    /// transport's rank.
    pub fn new(
        name: &'static str,
        transport: Arc<dyn Transport>,
        comm_id: u64,
        ranks: Arc<[usize]>,
        rank: usize,
        cfg: ResolvedConfig,
    ) -> Result<CpuBackend> {
        if ranks.get(rank) != Some(&transport.rank()) {
            return Err(Error::invalid(format!(
                "rank {rank} of {:?} is not transport rank {}",
                ranks,
                transport.rank()
            )));
        }
        let link = ranks
            .iter()
            .filter(|&&r| r != transport.rank())
            .map(|&r| transport.link_kind(r))
            .max()
            .unwrap_or(LinkKind::Memory);
        let hosts: Vec<usize> = ranks.iter().map(|&t| transport.host_of(t)).collect();
        let host_groups = super::algorithms::hosts::groups(&hosts, rank).ok();
        let selector = Selector::new(Arc::new(Profile::default()), link, ranks.len(), 1.0)
            .with_layout(host_groups.as_ref().map(|g| g.layout()))
            .with_single_copy(cfg.cpu.shm_single_copy);
        let n_ranks = ranks.len();
        Ok(CpuBackend {
            inner: Arc::new(Inner {
                selector,
                host_groups,
                name,
                transport,
                comm_id,
                ranks,
                rank,
                cfg,
                exec: Executor::new(),
                p2p: Executor::new(),
                state: Mutex::new(CommState::default()),
                poisoned: AtomicBool::new(false),
                seq: AtomicU64::new(0),
                #[cfg(test)]
                panic_next: AtomicBool::new(false),
                native: OnceLock::new(),
                host_native: OnceLock::new(),
                native_setup: OnceLock::new(),
                waits: Arc::new(PeerWaits::new(n_ranks)),
                agreements: OnceLock::new(),
                ancestor: Mutex::new(None),
                lineage: OnceLock::new(),
            }),
            keep: Vec::new(),
        })
    }

    /// Prices algorithms with `profile` (measured costs, e.g. from `OXCCL_TUNE_FILE`)
    /// instead of the built-in defaults, for hosts with up to `crowd` ranks per CPU (1 when
    /// every rank has a CPU of its own); communicators split from this one inherit both.
    /// Every rank must pass the same values, or their choices differ (a mismatch error).
    ///
    /// # Errors
    /// [`Error::Internal`] when the communicator is already shared (call it right after
    /// [`CpuBackend::new`]).
    pub fn with_machine(mut self, profile: Arc<Profile>, crowd: f64) -> Result<Self> {
        let inner = Arc::get_mut(&mut self.inner)
            .ok_or_else(|| Error::Internal("with_machine on a communicator already in use".into()))?;
        inner.selector = inner.selector.for_machine(profile, crowd);
        Ok(self)
    }

    /// Ties the communicator to the store-made world it descends from, which it can then
    /// grow (once; later calls are ignored).
    pub(crate) fn set_lineage(&self, lineage: Arc<Lineage<CpuBackend>>) {
        let _ = self.inner.lineage.set(lineage);
    }

    /// The lineage this communicator can grow (newcomer threads of a world of threads join
    /// through it).
    pub(crate) fn lineage(&self) -> Option<&Arc<Lineage<CpuBackend>>> {
        self.inner.lineage.get()
    }

    /// Keeps `resource` alive as long as this communicator (it is dropped after it).
    pub fn keep_alive(mut self, resource: Box<dyn std::any::Any + Send + Sync>) -> Self {
        self.keep.push(resource);
        self
    }

    /// Sets up collectives in shared memory (a collective: every rank of the communicator
    /// calls it, and they must all be on this host). Communicators split from this one get
    /// them too. `wait` says how their waits poll and sleep.
    ///
    /// # Errors
    /// Segment errors (e.g. a /dev/shm that is too small) and communication errors.
    pub fn enable_shared_memory(&self, slot_bytes: usize, wait: WaitPolicy) -> Result<()> {
        self.inner.exec.run_inline(|| self.inner.setup_native(slot_bytes, wait, true))
    }

    /// On a communicator spanning hosts alike (several ranks on each), sets up collectives
    /// in shared memory among the ranks of each host, for the host phases of the
    /// hierarchical algorithms; elsewhere it does nothing. A collective: every rank calls
    /// it. A host whose segment cannot be made (no room in /dev/shm) runs those phases over
    /// the shared-memory transport instead, and its first rank says why once; the selector
    /// prices them as shared-memory collectives on every rank alike. Communicators split
    /// from this one get shared-memory collectives where their ranks allow.
    ///
    /// # Errors
    /// [`Error::Internal`] when the communicator is already shared (call it right after
    /// [`CpuBackend::new`]); communication errors.
    pub fn with_host_shared_memory(mut self, slot_bytes: usize, wait: WaitPolicy) -> Result<Self> {
        self.share_host_memory(slot_bytes, wait)?;
        Ok(self)
    }

    /// [`with_host_shared_memory`](Self::with_host_shared_memory) in place: on an error the
    /// communicator is poisoned with it (and still knows the setting, for its children).
    fn share_host_memory(&mut self, slot_bytes: usize, wait: WaitPolicy) -> Result<()> {
        let inner = Arc::get_mut(&mut self.inner)
            .ok_or_else(|| Error::Internal("with_host_shared_memory on a communicator already in use".into()))?;
        // Kept for the splits, whatever this communicator's layout.
        let _ = inner.native_setup.set((slot_bytes, wait));
        if inner.host_groups.is_none() {
            return Ok(());
        }
        inner.selector.set_host_collectives(Some(slot_bytes));
        self.inner.exec.run_inline(|| self.inner.setup_host_native(slot_bytes, wait))
    }
}

impl Inner {
    fn timeout(&self, opts: &CallOptions) -> Duration {
        opts.timeout_or(self.cfg.timeout)
    }

    /// Fails with the communicator's failure once it is poisoned.
    #[inline]
    fn check_poisoned(&self) -> Result<()> {
        // Every call looks; only a poisoned communicator takes the lock.
        if self.poisoned.load(Ordering::Acquire) {
            return self.poisoned_error();
        }
        Ok(())
    }

    /// The failure that poisoned the communicator: the lock is taken only then.
    #[cold]
    fn poisoned_error(&self) -> Result<()> {
        relock(&self.state).poisoned.check()
    }

    /// The next collective sequence number. Only the thread that owns the executor calls it
    /// (the executor's hand-offs order the increments), so no lock is needed.
    fn next_seq(&self) -> Result<u64> {
        self.check_poisoned()?;
        Ok(self.seq.fetch_add(1, Ordering::Relaxed))
    }

    fn peers(&self) -> Vec<usize> {
        self.ranks.iter().copied().filter(|&r| r != self.ranks[self.rank]).collect()
    }

    /// Marks the communicator failed with `e` at stage `at` (the first stage this rank will
    /// not complete) and tells the peers.
    fn poison(&self, e: &Error, at: Stage) {
        {
            let mut st = relock(&self.state);
            // A revoke replaces an earlier failure (and is told to the peers even so).
            let first = match e {
                Error::Revoked { .. } => st.poisoned.revoke(e.clone()),
                _ => st.poisoned.set(e.clone()),
            };
            if !first {
                return;
            }
            self.poisoned.store(true, Ordering::Release);
        }
        if let (Error::PeerLost { rank, .. }, Some(l)) = (e, self.lineage.get()) {
            // Transport ranks are the launcher's slots on the world it started.
            if let Some(&peer) = self.ranks.get(*rank) {
                l.report_lost(peer);
            }
        }
        self.transport.notify_failure(self.comm_id, &self.peers(), at, e);
    }

    /// See [`Backend::revoke`]: every wait on the communicator, here and at every peer, ends
    /// with [`Error::Revoked`], whatever its stage.
    fn revoke(&self, reason: &str) {
        let e = Error::Revoked { rank: self.rank, reason: reason.to_string() };
        // The notice must reach every rank, also those this one never exchanged a frame with
        // (transports that connect on demand connect now; a peer that is gone is skipped).
        // Ranks that learn it from this one tell only those they are connected to.
        let deadline = Instant::now() + Duration::from_secs(2);
        for p in self.peers() {
            let _ = self.transport.reach(p, deadline);
        }
        self.poison(&e, Stage::Setup);
        self.transport.abort(self.comm_id, &e.to_string());
    }

    /// Runs `op`, whose buffers are in device memory, on host temporaries: device inputs are
    /// copied in first, outputs copied back after (`staging/`). A copy that fails
    /// poisons the communicator and tells the peers, so they fail instead of waiting.
    fn execute_staged(&self, op: &Op, opts: &CallOptions) -> Result<Completion> {
        let fail = |e: Error| {
            self.poison(&e, self.next_stage());
            e
        };
        let force = self.cfg.cpu.force_staging;
        let staged_here = |d: Device| force || d != Device::Cpu;
        // Large all_reduce and broadcast: chunks, with the copies overlapping the collectives.
        if let Some(r) = staging::pipelined::run(op, staged_here, self.name, |chunk| self.execute_host(&chunk, opts)) {
            return r.map_err(|e| match e {
                // A collective's own failure has already poisoned the communicator (and a
                // refused argument must not).
                e @ (Error::Mismatch { .. }
                | Error::Timeout { .. }
                | Error::PeerLost { .. }
                | Error::Aborted { .. }
                | Error::InvalidArgument(_)) => e,
                e => fail(e),
            });
        }
        let (host, staged) = staging::stage(op.clone(), staged_here, self.name).map_err(fail)?;
        let done = self.execute_host(&host, opts)?;
        staged.finish(&done.received).map_err(fail)?;
        Ok(done)
    }

    /// The stage of the next collective (this rank completed every one before it).
    fn next_stage(&self) -> Stage {
        Stage::Collective(self.seq.load(Ordering::Relaxed))
    }

    fn ctx(&self, fp: Fingerprint, opts: &CallOptions) -> Ctx<'_> {
        Ctx {
            transport: &*self.transport,
            comm_id: self.comm_id,
            ranks: &self.ranks,
            rank: self.rank,
            fp,
            clock: Clock::new(self.timeout(opts)),
            tally: self.native.get().map(|n| n as &dyn FrameTally),
            waits: self.waits.enabled().then_some(&*self.waits),
            hosts: self.host_groups.as_ref(),
            host_native: self.host_native.get().map(|n| n as &dyn HostPhases),
        }
    }

    /// Sets up the shared-memory collectives. Internal: it takes no sequence number the
    /// user would see (its frames carry the reserved sequence number `u64::MAX`). With
    /// `required`, failing to create the segment is an error; otherwise every rank goes on
    /// with the ordinary algorithms and rank 0 says why once.
    fn setup_native(&self, slot_bytes: usize, wait: WaitPolicy, required: bool) -> Result<()> {
        self.check_poisoned()?;
        let fp = setup_fingerprint(slot_bytes, Algorithm::SharedMemory);
        let ctx = self.ctx(fp, &CallOptions::default());
        match ShmCollectives::establish(&ctx, slot_bytes, wait, self.selector.single_copy()) {
            Ok(Some(n)) => {
                let _ = self.native.set(n);
                let _ = self.native_setup.set((slot_bytes, wait));
                Ok(())
            }
            Ok(None) if !required => {
                // Every rank learned that the segment could not be made; rank 0 said why.
                Ok(())
            }
            Ok(None) => {
                let e = Error::Aborted {
                    reason: "rank 0 could not create the shared-memory segment (see its error)".into(),
                };
                self.poison(&e, Stage::Setup);
                Err(e)
            }
            Err(e) if !required && matches!(e, Error::Io { .. }) && self.rank == 0 => {
                tracing::warn!(
                    "no shared-memory collectives for a communicator of {} ranks ({e}); \
                     it uses the ordinary algorithms",
                    self.ranks.len()
                );
                Ok(())
            }
            Err(e) => {
                self.poison(&e, Stage::Setup);
                Err(e)
            }
        }
    }

    /// Sets up the shared-memory collectives of this rank's host (see
    /// [`CpuBackend::with_host_shared_memory`]): a collective of the host's ranks, run on
    /// every host at once. Internal, like [`Inner::setup_native`].
    fn setup_host_native(&self, slot_bytes: usize, wait: WaitPolicy) -> Result<()> {
        let Some(g) = self.host_groups.as_ref() else { return Ok(()) };
        self.check_poisoned()?;
        let fp = setup_fingerprint(slot_bytes, Algorithm::Hierarchical);
        let on_host: Vec<usize> = g.local.iter().map(|&r| self.ranks[r]).collect();
        let ctx = Ctx {
            ranks: &on_host,
            rank: g.local_index,
            tally: None,
            waits: None,
            hosts: None,
            ..self.ctx(fp, &CallOptions::default())
        };
        // The host phases move blocks through the slots only: no single copy to probe for.
        match ShmCollectives::establish(&ctx, slot_bytes, wait, false) {
            Ok(Some(n)) => {
                let _ = self.host_native.set(n);
                Ok(())
            }
            // Every rank of the host learned that the segment could not be made; its first
            // rank says why.
            Ok(None) => Ok(()),
            Err(e) if matches!(e, Error::Io { .. }) && g.local_index == 0 => {
                tracing::warn!(
                    "no shared-memory collectives among the {} ranks of this host ({e}); the hierarchical \
                     algorithms run their phases inside it over the shared-memory transport",
                    g.local.len()
                );
                Ok(())
            }
            Err(e) => {
                self.poison(&e, Stage::Setup);
                Err(e)
            }
        }
    }

    /// Runs a queued operation on a lane's worker thread (or an async batch's sends on the
    /// caller's), a panic inside it (a bug) included: that becomes the operation's
    /// [`Error::Internal`] and aborts the communicator on every rank, instead of ending the
    /// worker with the operation's waiter, the queue and every later call left waiting.
    fn execute_queued(&self, op: &Op, opts: &CallOptions) -> Result<Completion> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.execute(op, opts))) {
            Ok(r) => r,
            Err(payload) => Err(self.panicked(op.kind(), crate::sync::panic_message(&*payload))),
        }
    }

    /// Runs a blocking call's operation on the caller's thread, in its turn. A panic inside
    /// it (a bug) goes on to the caller, and aborts the communicator on every rank on its
    /// way (the peers would otherwise wait for this rank until their deadline).
    fn execute_blocking(&self, lane: &Executor<Job>, op: &Op, opts: &CallOptions) -> Result<Completion> {
        lane.run_inline_or(
            || self.execute(op, opts),
            || {
                self.panicked(op.kind(), "see the panic's own message");
            },
        )
    }

    /// The error of an operation that panicked (`what`: the panic's message), after
    /// aborting the communicator with it.
    #[cold]
    fn panicked(&self, kind: OpKind, what: &str) -> Error {
        let e = Error::Internal(format!(
            "{kind} panicked inside oxccl on rank {} ({what}); this is a bug in oxccl, please report it. \
             The communicator is aborted on every rank",
            self.rank
        ));
        self.abort(&e, &e.to_string());
        e
    }

    /// Fails the communicator with `e` whatever its stage: every wait of every peer on it
    /// ends, with `reason` given to the transport's own waits.
    fn abort(&self, e: &Error, reason: &str) {
        self.poison(e, Stage::Setup);
        self.transport.abort(self.comm_id, reason);
    }

    /// Runs one operation on the calling thread.
    fn execute(&self, op: &Op, opts: &CallOptions) -> Result<Completion> {
        #[cfg(test)]
        if self.panic_next.swap(false, Ordering::Relaxed) {
            panic!("injected by a test");
        }
        let mut on_device = false;
        op.for_each_buffer(|b| on_device |= b.device != Device::Cpu);
        if on_device || self.cfg.cpu.force_staging {
            return self.execute_staged(op, opts);
        }
        self.execute_host(op, opts)
    }

    /// Runs `op`, whose buffers are all in host memory.
    fn execute_host(&self, op: &Op, opts: &CallOptions) -> Result<Completion> {
        let kind = op.kind();
        // Refused before a sequence number is taken: the communicator stays in step.
        let forced = opts.forced_algorithm(kind, &self.cfg.algorithms)?;
        let native = self.native.get().filter(|n| n.supports(op));
        if forced == Algorithm::SharedMemory && native.is_none() {
            return Err(Error::invalid(format!(
                "algorithm `shared_memory` needs a `cpu` communicator whose ranks are all on one host; \
                 this `{}` communicator has none",
                self.name
            )));
        }
        if forced == Algorithm::Hierarchical && self.host_groups.is_none() {
            return Err(Error::invalid(format!(
                "algorithm `hierarchical` needs a `cpu` communicator spanning several hosts with the same number \
                 of ranks, at least 2, on each; this `{}` communicator's {} ranks are not",
                self.name,
                self.ranks.len()
            )));
        }
        // Point-to-point operations involve only some ranks: they take no collective
        // sequence number (their frames are matched by tag, not by sequence).
        let seq = if matches!(op, Op::Batch(_)) {
            self.check_poisoned()?;
            0
        } else {
            self.next_seq()?
        };
        let (failed_seq, e) = if let Op::Batch(ops) = op {
            let started = Instant::now();
            let p = P2pCtx {
                transport: &*self.transport,
                comm_id: self.comm_id,
                ranks: &self.ranks,
                rank: self.rank,
                seq,
                started,
                deadline: started + self.timeout(opts),
                waits: self.waits.enabled().then_some(&*self.waits),
            };
            // SAFETY: `op` came through `Backend::submit`, whose contract the submitter upholds.
            match unsafe { p.run(ops) } {
                Ok(c) => return Ok(c),
                Err(e) => (None, e),
            }
        } else {
            let native_slot = native.and(self.native_setup.get().map(|s| s.0));
            let algo = self.selector.choose(kind, op.message_bytes(), forced, native_slot);
            let ctx = self.ctx(op.fingerprint(seq, algo), opts);
            let r = match native {
                // A world of one runs no algorithm, whichever was chosen.
                // SAFETY: `op` came through `Backend::submit`, whose contract the submitter
                // upholds.
                _ if self.ranks.len() == 1 => unsafe { dispatch::run_alone(op) },
                // SAFETY: as above.
                Some(n) if algo == Algorithm::SharedMemory => unsafe { n.run(&ctx, op) },
                // SAFETY: as above.
                _ => unsafe { dispatch::run(&ctx, op, algo) },
            };
            // The result is looked at, not moved on: a success is made here, in the caller's
            // slot (copying the algorithm's 80-byte result, just written, stalled on store
            // forwarding).
            match r {
                Ok(()) => return Ok(Completion::default()),
                Err(e) => (Some(seq), e),
            }
        };
        Err(self.failed(failed_seq, e))
    }

    /// The error of an operation that failed while it ran (`seq`: its sequence number, `None`
    /// for a batch), after poisoning the communicator with it.
    #[cold]
    fn failed(&self, seq: Option<u64>, e: Error) -> Error {
        // Arguments were checked before the sequence number was taken; an argument error from
        // inside a running operation is a broken invariant, and the ranks are out of step.
        let e = match e {
            Error::InvalidArgument(m) => Error::Internal(m),
            e => e,
        };
        // A batch took no sequence number: this rank completed every collective before the
        // next one.
        let at = seq.map_or_else(|| self.next_stage(), Stage::Collective);
        self.poison(&e, at);
        // An operation that a revoke ended (here: its waits were aborted) reports the revoke.
        relock(&self.state).poisoned.revoked().cloned().unwrap_or(e)
    }

    /// A lane's worker: runs its queued jobs in order (the collectives' lane, `exec`, or the
    /// point-to-point lane, `p2p`: the receives of async batches).
    fn worker_loop(&self, lane: &Executor<Job>) {
        while let Some(job) = lane.next_job() {
            let r = self.execute_queued(&job.op, &job.opts);
            job.slot.complete(r);
            lane.finish_job();
        }
    }

    /// Submits a batch of sends and receives: the sends now, on this thread; the receives
    /// on the point-to-point lane (waited for here when `mode` is blocking).
    fn submit_p2p(self: &Arc<Self>, ops: &[P2p], mode: Mode, opts: &CallOptions) -> Result<Arc<dyn Pending>> {
        let (sends, recvs): (Vec<P2p>, Vec<P2p>) = ops.iter().partition(|p| matches!(p, P2p::Send { .. }));
        if !sends.is_empty() {
            // Outside both lanes: sends wait for nothing.
            self.execute_queued(&Op::Batch(sends), opts)?;
        }
        if recvs.is_empty() {
            return Ok(CompletionSlot::done(Ok(Completion::default())));
        }
        let op = Op::Batch(recvs);
        if mode == Mode::Blocking {
            return Ok(CompletionSlot::done(self.execute_blocking(&self.p2p, &op, opts)));
        }
        self.queue(|i| &i.p2p, "p2p-", Job { op, opts: *opts, slot: Arc::default() })
    }

    /// Queues `job` on a lane (`lane` picks it), starting the lane's worker thread
    /// (`oxccl-{name}-{tag}r{rank}`) on first use; returns the job's slot.
    fn queue(self: &Arc<Self>, lane: fn(&Inner) -> &Executor<Job>, tag: &str, job: Job) -> Result<Arc<dyn Pending>> {
        let slot = Arc::clone(&job.slot);
        lane(self).push(job, || {
            let inner = Arc::clone(self);
            std::thread::Builder::new()
                .name(format!("oxccl-{}-{tag}r{}", self.name, self.rank))
                .spawn(move || inner.worker_loop(lane(&inner)))
                .map_err(|e| Error::io("starting the communicator's worker thread", &e))
        })?;
        Ok(slot)
    }

    fn split(&self, color: Option<u32>, key: i64, opts: &CallOptions) -> Result<Option<CpuBackend>> {
        let seq = self.next_seq()?;
        let n = self.ranks.len();
        // Bruck: ⌈log2 n⌉ rounds. The ring's n − 1 steps are a chain of hand-offs that at 256
        // ranks on 2 CPUs took over the 60 s timeout (every rank must be scheduled per step).
        let fp = Fingerprint::of_split(seq, Algorithm::Bruck);
        let ctx = self.ctx(fp, opts);
        let mut table = vec![0i64; 2 * n];
        table[2 * self.rank] = color.map_or(-1, i64::from);
        table[2 * self.rank + 1] = key;
        let r = all_gather::bruck::run(&ctx, bytemuck::cast_slice_mut(&mut table), 16);
        if let Err(e) = r {
            self.poison(&e, Stage::Collective(seq));
            return Err(e);
        }
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, usize)> =
            (0..n).filter(|&i| table[2 * i] == i64::from(color)).map(|i| (table[2 * i + 1], i)).collect();
        members.sort_unstable();
        let ranks: Arc<[usize]> = members.iter().map(|&(_, i)| self.ranks[i]).collect();
        let rank = members
            .iter()
            .position(|&(_, i)| i == self.rank)
            .ok_or_else(|| Error::invalid("split: this rank is missing from its own color group (internal error)"))?;
        let id = derive_comm_id(self.comm_id, seq, u64::from(color));
        self.child(id, ranks, rank, false).map(Some)
    }

    /// A communicator over the same transport with id `id`, whose rank i is transport rank
    /// `ranks[i]` (this one being `rank`), priced and set up as this one (shared memory where
    /// its ranks allow: a collective among them).
    ///
    /// `keep_failed`: a set-up that fails (a member died since the members agreed, as in a
    /// shrink) leaves the child poisoned with the failure instead of failing the call, so
    /// that every survivor holds a communicator, whose first call fails and which can be
    /// agreed on and shrunk again. (A member whose set-up finished first holds a healthy
    /// child whose first call needing the dead rank fails: the same next step.)
    fn child(&self, id: u64, ranks: Arc<[usize]>, rank: usize, keep_failed: bool) -> Result<CpuBackend> {
        let mut child = CpuBackend::new(self.name, Arc::clone(&self.transport), id, ranks, rank, self.cfg.clone())?
            .with_machine(Arc::clone(self.selector.profile()), self.selector.crowd())?;
        if let Some(&(slot, wait)) = self.native_setup.get() {
            // Shared memory where the child's ranks allow: all of it on one host, the host
            // phases of `hierarchical` where it spans hosts alike. Where /dev/shm has no
            // room left, the child uses the ordinary algorithms.
            let host = |t: &usize| self.transport.host_of(*t);
            let first = child.inner.ranks.first().map(host);
            let made = if child.inner.ranks.iter().all(|t| Some(host(t)) == first) {
                child.inner.setup_native(slot, wait, false)
            } else {
                child.share_host_memory(slot, wait)
            };
            match made {
                Ok(()) => {}
                Err(e) if keep_failed && child.inner.poisoned.load(Ordering::Acquire) => {
                    // Its children set up shared memory as every other survivor's do.
                    let _ = child.inner.native_setup.set((slot, wait));
                    tracing::debug!("the shrunk communicator failed while it was set up: {e}");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(child)
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        self.inner.name
    }

    fn rank(&self) -> usize {
        self.inner.rank
    }

    fn world_size(&self) -> usize {
        self.inner.ranks.len()
    }

    fn timeout(&self) -> Duration {
        self.inner.cfg.timeout
    }

    unsafe fn submit(&self, op: Op, mode: Mode, opts: &CallOptions) -> Result<Arc<dyn Pending>> {
        self.inner.check_poisoned()?;
        if let Op::Batch(ops) = &op {
            return self.inner.submit_p2p(ops, mode, opts);
        }
        match mode {
            Mode::Blocking => Ok(CompletionSlot::done(self.inner.execute_blocking(&self.inner.exec, &op, opts))),
            Mode::Async => self.inner.queue(|i| &i.exec, "", Job { op, opts: *opts, slot: Arc::default() }),
        }
    }

    fn algorithm_for(&self, op: OpKind, bytes: usize, opts: &CallOptions) -> Result<Option<Algorithm>> {
        let inner = &self.inner;
        let forced = opts.forced_algorithm(op, &inner.cfg.algorithms)?;
        let native_slot = inner.native_setup.get().map(|s| s.0).filter(|_| {
            // Whether the shared-memory collectives run `op` depends on the operation only
            // through its kind and the communicator (see `ShmCollectives::supports`).
            inner.native.get().is_some_and(|n| n.supports_kind(op))
        });
        Ok(Some(inner.selector.choose(op, bytes, forced, native_slot)))
    }

    unsafe fn run_blocking(&self, op: &Op, opts: &CallOptions) -> Result<Completion> {
        self.inner.check_poisoned()?;
        if let Op::Batch(ops) = op {
            // The receives' turn comes on the point-to-point lane, after those posted before.
            let pending = self.inner.submit_p2p(ops, Mode::Blocking, opts)?;
            return pending
                .wait(None)
                .unwrap_or_else(|| Err(Error::Internal("a blocking batch did not complete".into())));
        }
        self.inner.execute_blocking(&self.inner.exec, op, opts)
    }

    fn probe(&self, peer: usize, tag: u32) -> Result<Option<MessageInfo>> {
        self.inner.check_poisoned()?;
        let started = Instant::now();
        let p = P2pCtx {
            transport: &*self.inner.transport,
            comm_id: self.inner.comm_id,
            ranks: &self.inner.ranks,
            rank: self.inner.rank,
            seq: 0,
            started,
            deadline: started,
            waits: None,
        };
        p.probe(peer, tag)
    }

    fn split(&self, color: Option<u32>, key: i64, opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        self.inner.check_poisoned()?;
        let r = self.inner.exec.run_inline(|| self.inner.split(color, key, opts))?;
        Ok(r.map(|b| Arc::new(b) as Arc<dyn Backend>))
    }

    fn check_device(&self, device: Device) -> Result<()> {
        if device == Device::Cpu {
            return Ok(());
        }
        // Device buffers are staged through host memory where their runtime can copy.
        staging::copier_for(device, self.inner.name).map(drop).map_err(|e| {
            let why = e.reason();
            Error::invalid(format!(
                "the {} backend stages {device} buffers through host memory, but cannot copy them here ({why}); \
                 use a GPU backend (OXCCL_BACKEND=nccl or rccl), or copy to the host",
                self.inner.name
            ))
        })
    }

    fn peer_waits(&self) -> Option<Arc<PeerWaits>> {
        Some(Arc::clone(&self.inner.waits))
    }

    fn waiting_on(&self) -> Option<usize> {
        let by_frames = self.inner.transport.waiting_on(self.inner.comm_id);
        by_frames
            .and_then(|t| self.inner.ranks.iter().position(|&r| r == t))
            .or_else(|| self.inner.native.get().and_then(ShmCollectives::waiting_on))
    }

    fn abort(&self, reason: &str) {
        let e = Error::Aborted { reason: format!("rank {} called abort: {reason}", self.inner.rank) };
        self.inner.abort(&e, reason);
    }

    fn revoke(&self, reason: &str) -> Result<()> {
        self.inner.revoke(reason);
        Ok(())
    }

    fn agree(&self, flag: u64, opts: &CallOptions) -> Result<Agreement> {
        self.inner.agree(flag, opts)
    }

    fn shrink(&self, exclude: &[usize], opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        Ok(self.inner.shrink(exclude, opts)?.map(|b| Arc::new(b) as Arc<dyn Backend>))
    }

    fn grow(&self, joiners: usize, opts: &CallOptions) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(self.inner.grow(joiners, opts)?))
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        for lane in [&self.inner.exec, &self.inner.p2p] {
            if let Some(w) = lane.shut_down() {
                // The worker drains its queue (every operation has a deadline) and exits; a
                // panic inside it has already been reported through the operation's slot.
                let _ = w.join();
            }
        }
        self.inner.transport.release(self.inner.comm_id, &self.inner.peers());
    }
}

mod recovery;

#[cfg(test)]
mod tests;
