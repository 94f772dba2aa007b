//! The typed, safe front door: collectives on [`Buffer`]s: host slices and vectors, device buffers.
//!
//! Every argument is checked here, before anything is sent, so every backend refuses bad
//! input with the same [`Error::InvalidArgument`] and the communicator stays usable.
//! Naming: the short name is the form users reach for first (`all_reduce` in place,
//! `all_gather` out of place); the other form carries `_into` (out of place) or `_in_place`.

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::backend::{Backend, Completion, MessageInfo, Op, P2p, RawBuf, RawBufMut};
use crate::backend::{CallOptions, Stream, StreamOrder};
use crate::error::{Error, Result};
use crate::perf::{FlightRecorder, Observed, PerfSettings, ProfileReport, Profiler};
use crate::reduce_op::ReduceOp;
mod batch;
mod checks;
mod owned;
mod scope;
pub mod work;

pub use crate::backend::buffer::{Buffer, BufferMut};
pub use batch::Batch;
pub use owned::OwnedWork;
pub use work::{Scope, Work};

/// One rank's handle on a group of ranks that communicate.
///
/// Cloning is cheap and gives another handle on the same communicator; the
/// `with_*` methods return such a handle with different per-call options.
/// Operations on one communicator run in the order they are issued, and every rank must
/// issue the same collectives in the same order (as with NCCL and MPI).
#[derive(Clone)]
pub struct Communicator {
    /// The backend, in the decorator that records its operations: a concrete type, so that
    /// the decorator's part of every call is compiled into the call (one dynamic call, to
    /// the backend itself, instead of two).
    backend: Arc<Observed>,
    opts: CallOptions,
    /// The flight recorder the backend (an [`Observed`] decorator) feeds.
    recorder: Arc<FlightRecorder>,
    /// Its profiler, when `OXCCL_PROFILE` asks for one.
    profiler: Option<Arc<Profiler>>,
    /// What the communicator's children (splits, groups) are observed with.
    perf: Arc<PerfSettings>,
    /// The backend's rank and world size, which never change: asked once, not through two
    /// dynamic calls on every call's path.
    rank: usize,
    world_size: usize,
    /// Whether the backend takes host buffers (`check_device(Device::Cpu)`, a property of
    /// the backend): a host call's device check is then one comparison.
    takes_host: bool,
}

#[cfg(test)]
impl Communicator {
    /// The backend behind the front door (tests reach its internals through it).
    pub(crate) fn backend_for_tests(&self) -> &Arc<Observed> {
        &self.backend
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("backend", &self.backend.name())
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .field("opts", &self.opts)
            .finish()
    }
}

pub(crate) fn raw<B: Buffer + ?Sized>(b: &B) -> RawBuf {
    b.as_raw()
}

pub(crate) fn raw_mut<B: BufferMut + ?Sized>(b: &mut B) -> RawBufMut {
    b.as_raw_mut()
}

/// What a completed receive from any source says: its sender and element count.
pub(crate) fn recv_any_result(c: &Completion, tag: u32, dtype: crate::dtype::DType) -> Result<MessageInfo> {
    match (c.sources.first(), c.received.first()) {
        (Some(&source), Some(&count)) => Ok(MessageInfo { source, tag, dtype, count }),
        _ => Err(Error::Internal("a receive from any source completed without saying its sender".into())),
    }
}

impl Communicator {
    /// Wraps a backend (for backend implementers; users get communicators from
    /// [`Config`](crate::Config) or [`local`](crate::local)).
    /// Its flight recorder follows `OXCCL_FR_SIZE` and `OXCCL_FR_DIR`, the profiler
    /// `OXCCL_PROFILE` and the log `OXCCL_LOG` where they are valid (the defaults otherwise;
    /// [`Config`](crate::Config) refuses invalid values).
    pub fn from_backend(backend: Arc<dyn Backend>) -> Communicator {
        let log = crate::config::registry::LOG.from_env().ok().flatten();
        let log = log.and_then(|l| crate::config::log_directives(&l).ok()).unwrap_or_else(|| "oxccl=warn".into());
        crate::perf::log::install(&log);
        Communicator::observed(backend, Arc::new(PerfSettings::from_env_or_default()))
    }

    /// Wraps a backend in the decorator that records its operations.
    pub(crate) fn observed(backend: Arc<dyn Backend>, perf: Arc<PerfSettings>) -> Communicator {
        let observed = Observed::new(backend, &perf);
        let recorder = Arc::clone(observed.recorder());
        let profiler = observed.profiler().cloned();
        let (rank, world_size) = (observed.rank(), observed.world_size());
        let takes_host = observed.check_device(crate::device::Device::Cpu).is_ok();
        Communicator {
            backend: Arc::new(observed),
            opts: CallOptions::default(),
            recorder,
            profiler,
            perf,
            rank,
            world_size,
            takes_host,
        }
    }

    /// This communicator's flight recorder: its last operations (`OXCCL_FR_SIZE`), their
    /// state and times. It writes its dump by itself when an operation times out,
    /// mismatches, loses a peer or is aborted, and on `SIGUSR1`.
    pub fn flight_recorder(&self) -> &Arc<FlightRecorder> {
        &self.recorder
    }

    /// The profiler's statistics so far (count, mean, p50, p99, algbw, busbw per operation
    /// and size), when `OXCCL_PROFILE` turned it on; `None` otherwise.
    pub fn profile(&self) -> Option<ProfileReport> {
        self.profiler.as_ref().map(|p| p.report())
    }

    /// Writes the flight recorder's dump now, into `OXCCL_FR_DIR` (default: the system's
    /// temporary directory), and returns its path.
    ///
    /// # Errors
    /// [`Error::Io`] naming what could not be written.
    pub fn dump_flight_recorder(&self, reason: &str) -> Result<std::path::PathBuf> {
        self.recorder.dump_to(&self.perf.dump_dir(), reason)
    }

    /// This rank, in `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The algorithm this communicator would run for an operation of kind `op` on `bytes`,
    /// with its options ([`Communicator::with_algorithm`], `OXCCL_ALGO`): `bytes` as the
    /// operation measures its message (the per-rank buffer of all_reduce, reduce and
    /// broadcast; the input block of all_gather and gather; the whole input of
    /// reduce_scatter and all_to_all; the output of scatter). `None` where the backend's
    /// library chooses (`mpi`, `nccl`, `rccl`). The `cpu` backend's choice comes from its
    /// cost model ([`tuning`](crate::tuning)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the forced algorithm cannot run `op`.
    pub fn algorithm_for(&self, op: crate::op_kind::OpKind, bytes: usize) -> Result<Option<Algorithm>> {
        self.backend.algorithm_for(op, bytes, &self.opts)
    }

    /// The backend's name (`local`, `cpu`, `nccl`, `rccl`, `mpi`).
    pub fn backend(&self) -> &'static str {
        self.backend.name()
    }

    /// Where this rank's collectives run: [`Device::Cpu`](crate::Device::Cpu) for the host
    /// backends, the GPU for `nccl`/`rccl` (allocate device buffers there, e.g. with
    /// [`Gpu::of`](crate::Gpu::of)).
    pub fn device(&self) -> crate::device::Device {
        self.backend.device()
    }

    /// The deadline this handle's calls use.
    pub fn timeout(&self) -> Duration {
        self.opts.timeout.unwrap_or_else(|| self.backend.timeout())
    }

    /// A handle whose calls use `algo` (`Auto`: the configured default). Calls of an operation
    /// `algo` cannot run fail with [`Error::InvalidArgument`]; see [`Algorithm::for_op`].
    pub fn with_algorithm(&self, algo: Algorithm) -> Communicator {
        Communicator { opts: CallOptions { algorithm: algo, ..self.opts }, ..self.clone() }
    }

    /// A handle whose calls wait at most `timeout` before failing with [`Error::Timeout`].
    pub fn with_timeout(&self, timeout: Duration) -> Communicator {
        Communicator { opts: CallOptions { timeout: Some(timeout), ..self.opts }, ..self.clone() }
    }

    /// A handle whose GPU operations are ordered after the work already queued on `stream`
    /// (the communicator's own stream waits for it on the device; the host never blocks).
    /// Host backends ignore it.
    pub fn with_stream(&self, stream: Stream) -> Communicator {
        let opts = CallOptions { stream: Some(StreamOrder::After(stream)), ..self.opts };
        Communicator { opts, ..self.clone() }
    }

    /// A handle whose GPU operations are queued on `stream` itself: no extra
    /// synchronization, and later work on `stream` sees their results. Blocking calls still
    /// wait for completion; async ones complete when the stream reaches them. Host backends
    /// ignore it.
    pub fn on_stream(&self, stream: Stream) -> Communicator {
        let opts = CallOptions { stream: Some(StreamOrder::On(stream)), ..self.opts };
        Communicator { opts, ..self.clone() }
    }

    /// Aborts the communicator from any thread: every wait on it returns [`Error::Aborted`]
    /// and the peers are told, so their waits end too. The communicator stays unusable.
    pub fn abort(&self, reason: &str) {
        self.backend.abort(reason);
    }

    /// Runs a checked operation to completion.
    fn run(&self, op: Op) -> Result<Completion> {
        self.check_opts(op.kind())?;
        self.check_devices(&op)?;
        // SAFETY: every caller builds `op` from borrows that outlive this call, and
        // `run_blocking` returns only once the operation has completed.
        unsafe { self.backend.run_blocking(&op, &self.opts) }
    }

    // ---- blocking collectives

    /// All-reduce in place: every rank's `buf` becomes the element-wise reduction of all ranks' `buf`.
    ///
    /// # Errors
    /// Communication errors ([`Error::Timeout`], [`Error::Mismatch`], [`Error::PeerLost`],
    /// [`Error::Aborted`]).
    pub fn all_reduce<B: BufferMut + ?Sized>(&self, buf: &mut B, op: ReduceOp) -> Result<()> {
        let o = raw_mut(buf);
        self.run(self.op_all_reduce(o.as_const(), o, op)?).map(drop)
    }

    /// All-reduce out of place: `output` becomes the reduction of all ranks' `input`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the lengths differ; communication errors.
    pub fn all_reduce_into<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized>(
        &self,
        input: &I,
        output: &mut O,
        op: ReduceOp,
    ) -> Result<()> {
        self.run(self.op_all_reduce(raw(input), raw_mut(output), op)?).map(drop)
    }

    /// Reduce in place to `root`: the root's `buf` becomes the reduction; the others' `buf`
    /// are left unchanged.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a root out of range; communication errors.
    pub fn reduce<B: BufferMut + ?Sized>(&self, buf: &mut B, op: ReduceOp, root: usize) -> Result<()> {
        let o = raw_mut(buf);
        self.run(self.op_reduce(o.as_const(), Some(o), op, root)?).map(drop)
    }

    /// Reduce out of place: the root's `output` becomes the reduction of all `input`s.
    /// `output` is required at the root; at the other ranks an `output`, if passed, is
    /// neither read nor written (it keeps its contents).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a root out of range, a missing or wrongly sized output
    /// at the root; communication errors.
    pub fn reduce_into<B: BufferMut + ?Sized>(
        &self,
        input: &B,
        output: Option<&mut B>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.run(self.op_reduce(raw(input), output.map(|o| raw_mut(o)), op, root)?).map(drop)
    }

    /// Broadcast in place: every rank's `buf` becomes the root's `buf`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a root out of range; communication errors.
    pub fn broadcast<B: BufferMut + ?Sized>(&self, buf: &mut B, root: usize) -> Result<()> {
        let o = raw_mut(buf);
        self.run(self.op_broadcast(Some(o.as_const()), o, root)?).map(drop)
    }

    /// Broadcast out of place: every rank's `output` becomes the root's `input`
    /// (`input` is required at the root; at the other ranks an `input`, if passed, is not
    /// read).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a root out of range or a missing/wrongly sized input at
    /// the root; communication errors.
    pub fn broadcast_into<B: BufferMut + ?Sized>(&self, input: Option<&B>, output: &mut B, root: usize) -> Result<()> {
        self.run(self.op_broadcast(input.map(|i| raw(i)), raw_mut(output), root)?).map(drop)
    }

    /// All-gather: `output` (world_size × `input.len()`) receives every rank's `input` in rank order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `output` has the wrong length; communication errors.
    pub fn all_gather<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized>(
        &self,
        input: &I,
        output: &mut O,
    ) -> Result<()> {
        self.run(self.op_all_gather(raw(input), raw_mut(output))?).map(drop)
    }

    /// All-gather in place: block `rank` of `buf` is this rank's input; on return every block
    /// holds its rank's input.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `buf.len()` does not divide by the world size.
    pub fn all_gather_in_place<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        self.run(self.op_all_gather_in_place(raw_mut(buf))?).map(drop)
    }

    /// All-gather with per-rank counts: rank i contributes `counts[i]` elements; `output`
    /// (the sum of `counts`) receives them concatenated in rank order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `counts` has not one entry per rank or a length disagrees.
    pub fn all_gather_v<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized>(
        &self,
        input: &I,
        output: &mut O,
        counts: &[usize],
    ) -> Result<()> {
        self.run(self.op_all_gather_v(raw(input), raw_mut(output), counts)?).map(drop)
    }

    /// Reduce-scatter: `input` is world_size blocks of `output.len()`; rank i's `output`
    /// becomes block i of the element-wise reduction of all ranks' `input`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `input.len() != world_size * output.len()`.
    pub fn reduce_scatter<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized>(
        &self,
        input: &I,
        output: &mut O,
        op: ReduceOp,
    ) -> Result<()> {
        self.run(self.op_reduce_scatter(raw(input), raw_mut(output), op)?).map(drop)
    }

    /// Reduce-scatter in place: on return block `rank` of `buf` holds the reduced block; the
    /// other blocks hold unspecified partial results.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `buf.len()` does not divide by the world size.
    pub fn reduce_scatter_in_place<B: BufferMut + ?Sized>(&self, buf: &mut B, op: ReduceOp) -> Result<()> {
        self.run(self.op_reduce_scatter_in_place(raw_mut(buf), op)?).map(drop)
    }

    /// All-to-all: `input` and `output` are world_size equal blocks; block j of this rank's
    /// input goes to rank j, and block i of the output comes from rank i.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the lengths differ or do not divide by the world size.
    pub fn all_to_all<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized>(
        &self,
        input: &I,
        output: &mut O,
    ) -> Result<()> {
        self.run(self.op_all_to_all(raw(input), raw_mut(output))?).map(drop)
    }

    /// All-to-all in place on world_size equal blocks of `buf`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `buf.len()` does not divide by the world size.
    pub fn all_to_all_in_place<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        let o = raw_mut(buf);
        self.run(self.op_all_to_all(o.as_const(), o)?).map(drop)
    }

    /// All-to-all with per-pair counts: `send_counts[j]` elements of `input` (blocks in rank
    /// order) go to rank j; `recv_counts[i]` elements come from rank i into `output`. Rank j's
    /// `recv_counts[i]` must equal rank i's `send_counts[j]` ([`Error::Mismatch`] otherwise).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when counts and lengths disagree; communication errors.
    pub fn all_to_all_v<I: Buffer + ?Sized, O: BufferMut<Elem = I::Elem> + ?Sized>(
        &self,
        input: &I,
        send_counts: &[usize],
        output: &mut O,
        recv_counts: &[usize],
    ) -> Result<()> {
        self.run(self.op_all_to_all_v(raw(input), send_counts, raw_mut(output), recv_counts)?).map(drop)
    }

    /// Gather to `root`: the root's `output` (world_size × `input.len()`, required at the root)
    /// receives every rank's `input` in rank order. At the other ranks an `output`, if
    /// passed, is neither read nor written (it keeps its contents).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a root out of range or a missing/wrongly sized output.
    pub fn gather<B: BufferMut + ?Sized>(&self, input: &B, output: Option<&mut B>, root: usize) -> Result<()> {
        self.run(self.op_gather(raw(input), output.map(|o| raw_mut(o)), root)?).map(drop)
    }

    /// Scatter from `root`: rank i's `output` becomes block i of the root's `input`
    /// (world_size × `output.len()`, required at the root; at the other ranks an `input`, if
    /// passed, is not read).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a root out of range or a missing/wrongly sized input.
    pub fn scatter<B: BufferMut + ?Sized>(&self, input: Option<&B>, output: &mut B, root: usize) -> Result<()> {
        self.run(self.op_scatter(input.map(|i| raw(i)), raw_mut(output), root)?).map(drop)
    }

    /// Waits until every rank has called `barrier`.
    ///
    /// # Errors
    /// Communication errors.
    pub fn barrier(&self) -> Result<()> {
        self.run(Op::Barrier).map(drop)
    }

    // ---- point-to-point

    /// Sends `buf` to `peer` with `tag`. Returns once the data is handed to the transport
    /// (it does not wait for the matching receive).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a peer out of range; communication errors.
    pub fn send<B: Buffer + ?Sized>(&self, buf: &B, peer: usize, tag: u32) -> Result<()> {
        self.p2p_peer("send", peer)?;
        self.run(Op::Batch(vec![P2p::Send { buf: raw(buf), peer, tag }])).map(drop)
    }

    /// Receives the next message from `peer` with `tag` into `buf` and returns its element
    /// count (at most `buf.len()`).
    ///
    /// # Errors
    /// [`Error::Mismatch`] when the message has another dtype or does not fit;
    /// [`Error::InvalidArgument`] for a peer out of range; communication errors.
    pub fn recv<B: BufferMut + ?Sized>(&self, buf: &mut B, peer: usize, tag: u32) -> Result<usize> {
        self.p2p_peer("recv", peer)?;
        let c = self.run(Op::Batch(vec![P2p::Recv { buf: raw_mut(buf), peer, tag }]))?;
        Ok(c.received.first().copied().unwrap_or(0))
    }

    /// Receives the next message with `tag` from whichever rank sends one (like
    /// `MPI_ANY_SOURCE`, gloo's `recvFromAny` and `torch.distributed.recv` without `src`)
    /// into `buf`, and says who sent it and how many elements came. Messages from one
    /// sender are received in the order they were sent; when several senders have one
    /// waiting, the senders are served in turn.
    ///
    /// # Errors
    /// [`Error::Mismatch`] when the message has another dtype or does not fit;
    /// [`Error::PeerLost`] (or [`Error::Aborted`] naming it) when any rank died or failed
    /// before a message came: it may have been the sender, as under MPI's fault-tolerance
    /// rules; [`Error::Timeout`] (naming no rank) when nothing came in time;
    /// [`Error::InvalidArgument`] on `nccl`/`rccl`, which have no receive from any source.
    pub fn recv_any<B: BufferMut + ?Sized>(&self, buf: &mut B, tag: u32) -> Result<MessageInfo> {
        let dtype = buf.as_raw_mut().dtype;
        let c = self.run(Op::Batch(vec![P2p::RecvAny { buf: raw_mut(buf), tag }]))?;
        recv_any_result(&c, tag, dtype)
    }

    /// The first message from `peer` with `tag` not yet received, if one has arrived
    /// (its dtype and element count), without receiving it. Never blocks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a peer out of range; [`Error::PeerLost`] when the peer
    /// is gone and nothing is queued; [`Error::Aborted`].
    pub fn probe(&self, peer: usize, tag: u32) -> Result<Option<MessageInfo>> {
        self.p2p_peer("probe", peer)?;
        self.backend.probe(peer, tag)
    }

    // ---- groups

    /// Splits the communicator (collective over all its ranks): ranks passing the same
    /// `Some(color)` form a new communicator, ranked by `(key, old rank)`; ranks passing
    /// `None` take no part and get `Ok(None)`. Like `ncclCommSplit` and `MPI_Comm_split`.
    ///
    /// # Errors
    /// Communication errors of the exchange.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let b = self.backend.split(color, key, &self.opts)?;
        Ok(b.map(|backend| Communicator { opts: self.opts, ..Communicator::observed(backend, Arc::clone(&self.perf)) }))
    }

    /// Revokes the communicator (ULFM's `MPIX_Comm_revoke`), from any rank and any thread:
    /// every pending and later call on it, on every live rank, returns [`Error::Revoked`]
    /// naming this rank and `reason`, also in the middle of a large collective. Unlike
    /// [`Communicator::abort`], the ranks can then [`shrink`](Communicator::shrink) it (or
    /// [`agree`](Communicator::agree) on it). A rank that finds a peer dead revokes so that
    /// the others, waiting elsewhere, stop too.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] on backends that cannot revoke.
    pub fn revoke(&self, reason: &str) -> Result<()> {
        self.backend.revoke(reason)
    }

    /// Fault-tolerant agreement (ULFM's `MPIX_Comm_agree`): every live rank calls it with a
    /// flag; each gets the bitwise AND of the flags of the live ranks and the ranks found
    /// dead, identical on every survivor even when ranks die during the call. A training loop
    /// uses it to decide together "did every survivor finish step k?". It works on a
    /// communicator that failed (after a lost peer), and calls are numbered apart from the
    /// collectives: every rank calls `agree` and `shrink` in the same order.
    ///
    /// # Errors
    /// A timeout ([`Config::timeout`](crate::Config::timeout)) when a live rank does not
    /// call it; [`Error::BackendUnavailable`] on backends without one.
    pub fn agree(&self, flag: u64) -> Result<crate::backend::Agreement> {
        self.backend.agree(flag, &self.opts)
    }

    /// After a failure: a new communicator of the survivors, in the old rank order, without
    /// the ranks agreed dead (found by a fault-tolerant agreement, so every survivor gets the
    /// same membership, also when a rank dies during the call). Every live rank calls it; it
    /// works on a communicator that failed.
    ///
    /// # Errors
    /// As [`Communicator::agree`].
    pub fn shrink(&self) -> Result<Communicator> {
        self.shrink_excluding(&[])?
            .ok_or_else(|| Error::Internal("shrink: this rank is missing from the survivors".into()))
    }

    /// A planned removal (a straggler, a host being drained): a new communicator without
    /// `ranks` and without the ranks agreed dead. Every live rank calls it with the same
    /// list; the ranks listed get `Ok(None)`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a rank out of range or listed twice, every rank listed,
    /// or lists that differ between ranks (on every rank); as [`Communicator::agree`].
    pub fn shrink_excluding(&self, ranks: &[usize]) -> Result<Option<Communicator>> {
        let b = self.backend.shrink(ranks, &self.opts)?;
        Ok(b.map(|backend| Communicator { opts: self.opts, ..Communicator::observed(backend, Arc::clone(&self.perf)) }))
    }

    /// A communicator of the members and `joiners` newcomers (ULFM has none; NCCL's
    /// `ncclCommGrow`): the newcomers call [`oxccl::join`](crate::join) and meet the members
    /// through the job's rendezvous store; the members keep their ranks and the newcomers
    /// follow in the order they reached the store. Every member calls it with the same
    /// `joiners`, on a communicator made by [`init`](crate::init) (or shrunk or grown from
    /// one); this one stays usable. [`agree`](Communicator::agree) says when newcomers wait
    /// ([`Agreement::joiners`](crate::Agreement::joiners): how many).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no newcomers, or members that passed different
    /// numbers; [`Error::PeerLost`] when a member is dead (shrink first);
    /// [`Error::Store`] when a newcomer does not come in time;
    /// [`Error::BackendUnavailable`] on backends that cannot grow, and for communicators
    /// made without a store (split off, or by `init_rendezvous`).
    pub fn grow(&self, joiners: usize) -> Result<Communicator> {
        let backend = self.backend.grow(joiners, &self.opts)?;
        Ok(Communicator { opts: self.opts, ..Communicator::observed(backend, Arc::clone(&self.perf)) })
    }

    /// Creates a communicator of `ranks` (collective over all ranks, which must pass the same
    /// list); `ranks[i]` becomes rank i of the new communicator. Ranks not listed get `Ok(None)`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `ranks` is empty, repeats a rank or names one that does
    /// not exist; communication errors.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<Communicator>> {
        if ranks.is_empty() {
            return Err(Error::invalid("new_group: the group has no ranks"));
        }
        let mut seen = vec![false; self.world_size()];
        for &r in ranks {
            self.check_rank("new_group", "rank", r)?;
            if std::mem::replace(&mut seen[r], true) {
                return Err(Error::invalid(format!("new_group: rank {r} is listed twice")));
            }
        }
        let pos = ranks.iter().position(|&r| r == self.rank());
        self.split(pos.map(|_| 0), pos.map_or(0, |p| p as i64))
    }
}
