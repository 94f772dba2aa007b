//! How one communicator of the `mpi` backend runs: the MPI communicator and the queue of
//! operations in submission order ([`Shared`], whose data is in `state.rs`). The side channel
//! that makes MPI's failures look like oxccl's is `side.rs`; what becomes of a dropped
//! communicator, `graveyard.rs`.
//!
//! Everything is non-blocking: an operation is posted with MPI's `I*` calls and advanced
//! by polling ([`Shared::poll`], from `wait`/`is_completed`; no thread per operation), so
//! every wait can honour its deadline and an `abort()` from another thread.
//!
//! ## Operations
//!
//! A collective first sends its fingerprint to every peer (an `FP` side message) and waits
//! for theirs (unless [`MpiConfig::fingerprint`](super::MpiConfig) is off); any difference
//! ends it with [`Error::Mismatch`] before anything is posted. It is then posted once every
//! earlier operation of the communicator has posted, so that all ranks post their
//! collectives in the same order. A batch of point-to-point messages sends a header (`HDR`)
//! ahead of each send and waits for the header of each receive before posting
//! `MPI_Irecv`. A `split` exchanges colours and keys within its fingerprints, then calls
//! `MPI_Comm_split`. Every poll first receives the side messages that have arrived (into a
//! per-peer stash), tests the outbox and drains the graveyard.
//!
//! ## Failures
//!
//! A timeout, mismatch, lost peer or MPI error poisons the communicator: later calls return
//! [`Error::Aborted`], and the peers are told (an `ABORT` or `FAIL` side message). Requests
//! of an abandoned operation cannot be taken back from MPI (non-blocking collectives cannot
//! be cancelled; receives are cancelled): they stay in the communicator with their
//! temporaries until finalisation (through the graveyard once the communicator is dropped).
//! **Known hazard**: if a peer still joins an abandoned collective later (it had not yet seen
//! the failure notice), MPI may complete it into the user's buffer after the caller got its
//! error back; the notice races with that peer's next call only.
//!
//! Where the MPI has ULFM (`ulfm/`), its error classes become oxccl's: a process failure is
//! [`Error::PeerLost`] naming the failed rank, a revoked communicator [`Error::Revoked`]
//! (which replaces an earlier failure, as on the cpu backend, and is not relayed: MPI revokes
//! the communicator at every rank). `agree` and `shrink` work on a poisoned communicator.
//!
//! Dropping a communicator abandons its queued operations, sends `LEFT` to every peer and
//! hands the MPI communicator to the graveyard, which frees it once every peer has left.

use crate::sync::relock;
use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mpi::ffi;

use super::backoff::Backoff;
use super::check::check;
use super::comm::Comm;
use super::graveyard;
use super::ops::{self, Posted};
use super::runtime::Runtime;
use super::side::{self, Msg, WORDS};
use super::state::{Abandoned, Active, Body, Cell, Progress, RecvSpec, Shared, State};
use crate::algorithm::Algorithm;
use crate::backend::CallOptions;
use crate::backend::{Completion, MessageInfo, Op, P2p, RawBuf, RawBufMut};
use crate::config::ResolvedConfig;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, OpKind};
use crate::staging::{self, Staged};

/// Polls `shared` until `cell` completes or `timeout` (None: until the operation's own
/// deadline, which the poll enforces) passes.
pub(crate) fn wait_cell(shared: &Shared, cell: &Cell, timeout: Option<Duration>) -> Option<Result<Completion>> {
    let until = timeout.map(|t| Instant::now() + t);
    let mut b = Backoff::new();
    loop {
        if let Some(r) = cell.result() {
            return Some(r);
        }
        shared.poll();
        if let Some(r) = cell.result() {
            return Some(r);
        }
        if until.is_some_and(|u| Instant::now() >= u) {
            return None;
        }
        b.snooze();
    }
}

fn overlap(a: &RawBuf, b: &RawBufMut) -> bool {
    let (x, y) = (a.ptr as usize, b.ptr as usize);
    a.bytes() > 0 && b.bytes() > 0 && x < y + b.bytes() && y < x + a.bytes()
}

/// Whether `op` needs host-side work on its buffers (user operations, widening, `Avg`,
/// temporaries for overlapping buffers): a CUDA-aware MPI gets device pointers directly
/// only when it does not.
fn host_work(op: &Op) -> bool {
    use super::dtype::needs_host_work;
    match op {
        Op::AllReduce { input, output, op } | Op::ReduceScatter { input, output, op } => {
            needs_host_work(output.dtype, *op) || overlap(input, output)
        }
        Op::Reduce { input, output, op, .. } => {
            needs_host_work(input.dtype, *op) || output.is_some_and(|o| overlap(input, &o))
        }
        Op::Broadcast { input, output, .. } => input.is_some_and(|i| i.ptr != output.ptr.cast_const()),
        Op::AllGather { input, output }
        | Op::AllGatherV { input, output, .. }
        | Op::AllToAll { input, output }
        | Op::AllToAllV { input, output, .. } => overlap(input, output),
        Op::Gather { input, output, .. } => output.is_some_and(|o| overlap(input, &o)),
        Op::Scatter { input, output, .. } => input.is_some_and(|i| overlap(&i, output)),
        Op::Barrier | Op::Batch(_) => false,
    }
}

impl Shared {
    pub(crate) fn new(rt: Arc<Runtime>, comm: Comm, rank: usize, n: usize, cfg: ResolvedConfig) -> Shared {
        let state = State { stash: (0..n).map(|_| VecDeque::new()).collect(), ..State::default() };
        Shared { rt, comm, rank, n, cfg, recovery: super::ulfm::Recovery::default(), state: Mutex::new(state) }
    }

    fn lock(&self) -> (Option<MutexGuard<'static, ()>>, MutexGuard<'_, State>) {
        let g = self.rt.lock();
        (g, relock(&self.state))
    }

    fn data_tag(&self, tag: u32) -> c_int {
        let ub = u64::try_from(self.rt.tag_ub.max(1)).unwrap_or(1);
        // 1..=tag_ub; tags above MPI_TAG_UB wrap (messages stay ordered per tag).
        c_int::try_from(1 + u64::from(tag) % ub).unwrap_or(1)
    }

    fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.n).filter(move |&p| p != self.rank)
    }

    /// The first header with `tag` from any rank (as `MPI_ANY_SOURCE` matches, through the
    /// headers that announce every message), with its sender, taken from its stash; the
    /// ranks are looked at from one that moves on with each batch (`seq`), so that a steady
    /// sender does not starve the others. A rank that left (dropped the communicator after
    /// its last send) is passed over; `Err(rank)` when nothing matches and every other rank
    /// has left, so that nothing can come.
    fn take_any(&self, st: &mut State, tag: u32, seq: u64) -> std::result::Result<Option<(usize, Msg)>, usize> {
        let first = (seq % self.n as u64) as usize;
        let (mut left, mut first_left) = (0, None);
        for p in (0..self.n).map(|i| (first + i) % self.n) {
            match side::take(&mut st.stash[p], |m| side::is_hdr(m, tag)) {
                Ok(Some(m)) => return Ok(Some((p, m))),
                Ok(None) => {}
                Err(()) => {
                    left += 1;
                    first_left.get_or_insert(p);
                }
            }
        }
        match first_left {
            Some(p) if self.n > 1 && left == self.n - 1 => Err(p),
            _ => Ok(None),
        }
    }

    /// Receives every side message that has arrived; notices poison at once.
    fn drain_side(&self, st: &mut State) -> Result<()> {
        while let Some((src, m)) = side::recv(self.comm)? {
            let Some(src) = usize::try_from(src).ok().filter(|&s| s < self.n) else { continue };
            match side::decode_notice(src, &m) {
                Some(e) => self.poison(st, e, false),
                None => st.stash[src].push_back(m),
            }
        }
        Ok(())
    }

    /// Marks the communicator failed with `e`: queued operations fail, peers are told
    /// (when `notify`).
    ///
    /// A revoke ([`Error::Revoked`]) replaces an earlier failure and is not relayed: the
    /// revoking rank tells its peers itself ([`Shared::revoke_here`]) and MPI revokes the
    /// communicator everywhere.
    fn poison(&self, st: &mut State, e: Error, notify: bool) {
        let revoked = matches!(e, Error::Revoked { .. });
        let first = if revoked { st.poisoned.revoke(e.clone()) } else { st.poisoned.set(e.clone()) };
        if !first {
            return;
        }
        let aborted = match st.poisoned.check() {
            Err(a) => a,
            Ok(()) => Error::Aborted { reason: e.to_string() },
        };
        for a in std::mem::take(&mut st.queue) {
            self.abandon(st, a, aborted.clone());
        }
        if notify && !revoked {
            let msg = side::notice_msg(&e);
            for p in self.peers() {
                let _ = st.outbox.send(self.comm, p, msg);
            }
        }
    }

    fn abandon(&self, st: &mut State, mut a: Active, e: Error) {
        ops::cancel_receives(&mut a.posted, a.recv_from);
        a.cell.complete(Err(e));
        if !a.posted.reqs.is_empty() {
            st.abandoned.push(Abandoned { _posted: a.posted, _staged: a.staged });
        }
    }

    /// ULFM's error classes as oxccl's errors (see `ulfm/mod.rs`).
    fn classify(&self, e: Error) -> Error {
        super::ulfm::classify(self, e)
    }

    /// The local half of a revoke: a `REVOKE` notice to every peer (before MPI revokes the
    /// communicator, so that a peer that receives it in time can name this rank and the
    /// reason), then the communicator poisoned with [`Error::Revoked`]: every wait here ends.
    pub(crate) fn revoke_here(&self, reason: &str) {
        let (_g, mut st) = self.lock();
        let msg = side::revoke_msg(self.rank, reason);
        for p in self.peers() {
            let _ = st.outbox.send(self.comm, p, msg);
        }
        let e = Error::Revoked { rank: self.rank, reason: reason.to_string() };
        self.poison(&mut st, e, false);
    }

    fn lost(&self, peer: usize, fp: &Fingerprint) -> Error {
        Error::PeerLost {
            rank: peer,
            detail: format!(
                "rank {peer} dropped its communicator (or stopped using it) before joining {} #{}",
                fp.op, fp.seq
            ),
        }
    }

    fn fp_for(&self, a: &Active, peer: usize, sending: bool) -> Fingerprint {
        let mut fp = a.fp;
        if let Body::Coll(Op::AllToAllV { send_counts, recv_counts, .. }) = &a.body {
            let v = if sending { send_counts } else { recv_counts };
            fp.count = v.get(peer).copied().unwrap_or(0) as u64;
        }
        fp
    }

    /// Starts `op`.
    ///
    /// # Safety
    /// `Backend::submit`'s contract.
    pub(crate) unsafe fn submit(&self, op: Op, opts: &CallOptions) -> Result<Arc<Cell>> {
        let kind = op.kind();
        let forced = opts.forced_algorithm(kind, &self.cfg.algorithms)?;
        ops::check_limits(&op)?;
        let timeout = opts.timeout_or(self.cfg.timeout);
        let (_g, mut st) = self.lock();
        st.poisoned.check()?;
        let is_coll = !matches!(op, Op::Batch(_));
        let direct = self.rt.cuda.is_aware() && !host_work(&op);
        let force = self.rt.cfg.force_staging;
        let (op, staged) = staging::stage(op, |d| force || (d != Device::Cpu && !direct), "mpi")?;
        let seq = st.seq;
        if is_coll {
            st.seq += 1;
        }
        let started = Instant::now();
        let cell = Arc::new(Cell::default());
        let mut a = Active {
            cell: Arc::clone(&cell),
            body: Body::Batch(Vec::new()),
            fp: op.fingerprint(seq, forced),
            started,
            deadline: started + timeout,
            stage: Progress::Running,
            exchanged: Vec::new(),
            posted: Posted::default(),
            staged,
            received: Vec::new(),
            sources: Vec::new(),
            recv_from: 0,
        };
        let r = match op {
            Op::Batch(ps) => self.start_batch(&mut st, &mut a, ps),
            op => {
                a.body = Body::Coll(op);
                if self.rt.cfg.fingerprint && self.n > 1 {
                    a.stage = Progress::Exchange(vec![None; self.n]);
                    self.peers().try_for_each(|p| {
                        let fp = self.fp_for(&a, p, true);
                        st.outbox.send(self.comm, p, side::fp_msg(&fp, 0, 0))
                    })
                } else {
                    a.stage = Progress::Ready;
                    Ok(())
                }
            }
        };
        match r {
            Ok(()) => st.queue.push_back(a),
            Err(e) => {
                let e = self.classify(e);
                self.abandon(&mut st, a, e.clone());
                self.poison(&mut st, e, true);
            }
        }
        self.progress(&mut st);
        Ok(cell)
    }

    /// Posts a batch's sends (header first) and prepares its receives.
    fn start_batch(&self, st: &mut State, a: &mut Active, ps: Vec<P2p>) -> Result<()> {
        let mut recvs = Vec::new();
        for p in ps {
            match p {
                P2p::Send { buf, peer, tag } => {
                    st.outbox.send(self.comm, peer, side::hdr_msg(tag, buf.dtype, buf.count, a.fp.seq))?;
                    // SAFETY: the submit contract keeps `buf` readable now.
                    let (copy, req) = unsafe { ops::post_send_buffered(self.comm.0, buf, peer, self.data_tag(tag))? };
                    st.outbox.push(copy, req);
                }
                P2p::Recv { buf, peer, tag } => recvs.push(RecvSpec { buf, peer: Some(peer), tag, got: false }),
                P2p::RecvAny { buf, tag } => recvs.push(RecvSpec { buf, peer: None, tag, got: false }),
            }
        }
        a.recv_from = a.posted.reqs.len();
        a.received = vec![0; recvs.len()];
        a.sources = recvs.iter().map(|r| r.peer.unwrap_or(usize::MAX)).collect();
        a.stage = if recvs.is_empty() { Progress::Running } else { Progress::Headers };
        a.body = Body::Batch(recvs);
        Ok(())
    }

    /// Advances every queued operation as far as it goes; deadlines are checked here.
    fn progress(&self, st: &mut State) {
        if let Err(e) = self.drain_side(st) {
            let e = self.classify(e);
            self.poison(st, e, true);
        }
        st.outbox.flush();
        graveyard::drain_grave();
        let mut queue = std::mem::take(&mut st.queue);
        let mut keep = VecDeque::with_capacity(queue.len());
        let mut may_post = true;
        let mut failed = None;
        while let Some(mut a) = queue.pop_front() {
            match self.advance(st, &mut a, may_post) {
                Ok(true) => {
                    let (received, sources) = (std::mem::take(&mut a.received), std::mem::take(&mut a.sources));
                    a.cell.complete(Ok(Completion { received, sources }));
                }
                Ok(false) => {
                    let now = Instant::now();
                    if now >= a.deadline {
                        let e = Error::Timeout {
                            op: a.fp.op,
                            seq: a.fp.seq,
                            peer: self.waiting_on(&a),
                            waited: now - a.started,
                        };
                        self.abandon(st, a, e.clone());
                        failed = Some(e);
                        break;
                    }
                    if !matches!(a.stage, Progress::Running) {
                        may_post = false;
                    }
                    keep.push_back(a);
                }
                Err(e) => {
                    // Arguments were checked before anything was sent: an argument error here
                    // is a broken invariant.
                    let e = match e {
                        Error::InvalidArgument(m) => Error::Internal(m),
                        e => self.classify(e),
                    };
                    self.abandon(st, a, e.clone());
                    failed = Some(e);
                    break;
                }
            }
        }
        keep.extend(queue);
        st.queue = keep;
        if let Some(e) = failed {
            self.poison(st, e, true);
        }
    }

    fn waiting_on(&self, a: &Active) -> Option<usize> {
        match &a.stage {
            Progress::Exchange(got) => (0..self.n).find(|&p| p != self.rank && got[p].is_none()),
            Progress::Headers => match &a.body {
                Body::Batch(r) => r.iter().find(|r| !r.got).and_then(|r| r.peer),
                _ => None,
            },
            Progress::Running => ops::waiting_on(&a.posted),
            Progress::Ready => None,
        }
    }

    fn advance(&self, st: &mut State, a: &mut Active, may_post: bool) -> Result<bool> {
        loop {
            match &mut a.stage {
                Progress::Exchange(got) => {
                    if !may_post {
                        return Ok(false);
                    }
                    let mut missing = false;
                    for (p, slot) in got.iter_mut().enumerate() {
                        if p == self.rank || slot.is_some() {
                            continue;
                        }
                        match side::take(&mut st.stash[p], side::is_fp) {
                            Ok(Some(m)) => *slot = Some(m),
                            Ok(None) => missing = true,
                            Err(()) => return Err(self.lost(p, &a.fp)),
                        }
                    }
                    if missing {
                        return Ok(false);
                    }
                    let msgs: Vec<Msg> = got.iter().map(|m| m.unwrap_or([0; WORDS])).collect();
                    for p in self.peers() {
                        let ours = self.fp_for(a, p, false);
                        let theirs = side::decode_fp(&msgs[p]).ok_or_else(|| {
                            Error::Internal(format!("rank {p} sent a malformed fingerprint {:?}", msgs[p]))
                        })?;
                        if ours != theirs {
                            return Err(Error::Mismatch { peer: p, ours, theirs });
                        }
                    }
                    a.exchanged = msgs;
                    a.stage = Progress::Ready;
                }
                Progress::Ready => {
                    if !may_post {
                        return Ok(false);
                    }
                    match &a.body {
                        Body::Coll(op) => {
                            // SAFETY: the submit contract keeps the buffers valid until completion.
                            a.posted = unsafe { ops::post_collective(&self.rt, self.comm.0, self.rank, self.n, op)? };
                        }
                        Body::Split { color, key } => {
                            let c = self.split_now(&a.exchanged, *color, *key)?;
                            *relock(&a.cell.split) = c;
                        }
                        Body::Batch(_) => {}
                    }
                    a.stage = Progress::Running;
                }
                Progress::Headers => {
                    if !may_post {
                        return Ok(false);
                    }
                    let Body::Batch(recvs) = &mut a.body else {
                        return Err(Error::Internal("headers stage without receives".into()));
                    };
                    for (i, r) in recvs.iter_mut().enumerate() {
                        if r.got {
                            continue;
                        }
                        let tag = r.tag;
                        let (peer, m) = match r.peer {
                            Some(peer) => match side::take(&mut st.stash[peer], |m| side::is_hdr(m, tag)) {
                                Ok(Some(m)) => (peer, m),
                                Ok(None) => return Ok(false),
                                Err(()) => return Err(self.lost(peer, &a.fp)),
                            },
                            None => match self.take_any(st, tag, a.fp.seq) {
                                Ok(Some(found)) => found,
                                Ok(None) => return Ok(false),
                                Err(peer) => return Err(self.lost(peer, &a.fp)),
                            },
                        };
                        r.peer = Some(peer);
                        let hdr = side::decode_hdr(&m);
                        let dtype = hdr.dtype;
                        let count = usize::try_from(hdr.count).unwrap_or(usize::MAX);
                        if dtype != Some(r.buf.dtype) || count > r.buf.count {
                            let ours = Fingerprint {
                                seq: a.fp.seq,
                                op: OpKind::Recv,
                                dtype: r.buf.dtype,
                                count: r.buf.count as u64,
                                root: None,
                                reduce: None,
                                algorithm: a.fp.algorithm,
                            };
                            let theirs = Fingerprint {
                                op: OpKind::Send,
                                dtype: dtype.unwrap_or(DType::U8),
                                count: hdr.count,
                                ..ours
                            };
                            return Err(Error::Mismatch { peer, ours, theirs });
                        }
                        // SAFETY: the submit contract keeps `r.buf` valid until completion;
                        // count <= its length.
                        unsafe {
                            ops::post_recv(&mut a.posted, self.comm.0, r.buf, count, peer, self.data_tag(r.tag))?
                        };
                        a.received[i] = count;
                        a.sources[i] = peer;
                        r.got = true;
                    }
                    a.stage = Progress::Running;
                }
                Progress::Running => {
                    if !ops::test_all(&mut a.posted)? {
                        return Ok(false);
                    }
                    a.posted.finish()?;
                    a.staged.finish(&a.received)?;
                    return Ok(true);
                }
            }
        }
    }

    /// `MPI_Comm_split` with colours and keys from the exchange (blocking: every rank has
    /// entered the split, as the exchange showed).
    fn split_now(&self, msgs: &[Msg], color: Option<u32>, key: i64) -> Result<Option<Comm>> {
        let entry = |r: usize| -> (Option<u32>, i64) {
            if r == self.rank {
                (color, key)
            } else {
                side::split_entry(&msgs[r])
            }
        };
        let all: Vec<(Option<u32>, i64)> = (0..self.n).map(entry).collect();
        let (mcolor, mkey) = match color {
            None => {
                // SAFETY: reading the rsmpi shim's constant.
                (unsafe { ffi::RSMPI_UNDEFINED }, 0)
            }
            Some(c) => {
                let mut colors: Vec<u32> = all.iter().filter_map(|e| e.0).collect();
                colors.sort_unstable();
                colors.dedup();
                let ci = colors.iter().position(|&x| x == c).unwrap_or(0);
                let mut members: Vec<(i64, usize)> =
                    (0..self.n).filter(|&r| all[r].0 == Some(c)).map(|r| (all[r].1, r)).collect();
                members.sort_unstable();
                let ki = members.iter().position(|&(_, r)| r == self.rank).unwrap_or(0);
                (c_int::try_from(ci).unwrap_or(0), c_int::try_from(ki).unwrap_or(0))
            }
        };
        // SAFETY: a zeroed handle is overwritten by MPI_Comm_split.
        let mut newcomm: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
        // SAFETY: collective over our communicator, which every rank has entered.
        check(unsafe { ffi::MPI_Comm_split(self.comm.0, mcolor, mkey, &mut newcomm) }, "MPI_Comm_split")?;
        if color.is_none() {
            return Ok(None);
        }
        // SAFETY: `newcomm` is a valid communicator just created.
        check(unsafe { ffi::MPI_Comm_set_errhandler(newcomm, ffi::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler")?;
        Ok(Some(Comm(newcomm)))
    }

    /// Polls: advances every operation (called from waits).
    pub(crate) fn poll(&self) {
        let (_g, mut st) = self.lock();
        self.progress(&mut st);
    }

    /// The collective `split`: exchange of colours and keys, then `MPI_Comm_split`.
    pub(crate) fn split(&self, color: Option<u32>, key: i64, opts: &CallOptions) -> Result<Option<Comm>> {
        let timeout = opts.timeout_or(self.cfg.timeout);
        let cell = {
            let (_g, mut st) = self.lock();
            st.poisoned.check()?;
            let seq = st.seq;
            st.seq += 1;
            let fp = Fingerprint::of_split(seq, Algorithm::Auto);
            let started = Instant::now();
            let cell = Arc::new(Cell::default());
            let a = Active {
                cell: Arc::clone(&cell),
                body: Body::Split { color, key },
                fp,
                started,
                deadline: started + timeout,
                stage: Progress::Exchange(vec![None; self.n]),
                exchanged: vec![[0; WORDS]; self.n],
                posted: Posted::default(),
                staged: Staged::default(),
                received: Vec::new(),
                sources: Vec::new(),
                recv_from: 0,
            };
            let msg = side::split_msg(&fp, color, key);
            match self.peers().try_for_each(|p| st.outbox.send(self.comm, p, msg)) {
                Ok(()) => st.queue.push_back(a),
                Err(e) => {
                    let e = self.classify(e);
                    self.abandon(&mut st, a, e.clone());
                    self.poison(&mut st, e, true);
                }
            }
            self.progress(&mut st);
            cell
        };
        wait_cell(self, &cell, None).unwrap_or_else(|| Err(Error::Internal("split still running".into())))?;
        let out = relock(&cell.split).take();
        Ok(out)
    }

    /// The first queued message from `peer` with `tag`.
    pub(crate) fn probe(&self, peer: usize, tag: u32) -> Result<Option<MessageInfo>> {
        let (_g, mut st) = self.lock();
        st.poisoned.check()?;
        if let Err(e) = self.drain_side(&mut st) {
            let e = self.classify(e);
            self.poison(&mut st, e.clone(), true);
            return Err(st.poisoned.revoked().cloned().unwrap_or(e));
        }
        match side::peek(&st.stash[peer], |m| side::is_hdr(m, tag)) {
            Ok(Some(m)) => {
                let hdr = side::decode_hdr(&m);
                Ok(Some(MessageInfo {
                    source: peer,
                    tag,
                    dtype: hdr.dtype.ok_or_else(|| Error::Internal(format!("rank {peer} sent a malformed header")))?,
                    count: usize::try_from(hdr.count).unwrap_or(usize::MAX),
                }))
            }
            Ok(None) => Ok(None),
            Err(()) => Err(Error::PeerLost {
                rank: peer,
                detail: format!("rank {peer} dropped its communicator and nothing from it with tag {tag} is queued"),
            }),
        }
    }

    /// Aborts: every wait ends with `Aborted`, peers are told.
    pub(crate) fn abort(&self, reason: &str) {
        let (_g, mut st) = self.lock();
        let e = Error::Aborted { reason: format!("rank {} called abort: {reason}", self.rank) };
        self.poison(&mut st, e, true);
    }

    /// The communicator's default deadline.
    pub(crate) fn timeout(&self) -> Duration {
        self.cfg.timeout
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _g = self.rt.lock();
        let mut st = relock(&self.state);
        for a in std::mem::take(&mut st.queue) {
            self.abandon(&mut st, a, Error::Aborted { reason: "the communicator was dropped".into() });
        }
        for p in self.peers() {
            let _ = st.outbox.send(self.comm, p, side::LEFT_MSG);
        }
        let _ = self.drain_side(&mut st);
        let waiting = (0..self.n).map(|p| p != self.rank && !side::has_left(&st.stash[p])).collect();
        let outbox = std::mem::take(&mut st.outbox);
        let abandoned = std::mem::take(&mut st.abandoned);
        let revoked = st.poisoned.revoked().is_some();
        graveyard::bury(self.comm, waiting, outbox, abandoned, revoked);
        drop(st);
        graveyard::drain_grave();
    }
}
