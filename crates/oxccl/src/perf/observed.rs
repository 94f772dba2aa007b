//! [`Observed`]: the backend decorator every communicator runs through. It records each
//! operation in the communicator's flight recorder and writes the recorder's dump when an
//! operation fails in a way that a job's other ranks will want explained (a timeout, a
//! mismatch, a lost peer, an abort).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{signal, FlightRecorder, PerfSettings, Profiler};
use crate::algorithm::Algorithm;
use crate::backend::{Backend, CallOptions, Completion, MessageInfo, Mode, Op, Pending};
use crate::clock::{self, Tick};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::op_kind::OpKind;

/// A backend whose operations are recorded.
pub(crate) struct Observed {
    inner: Arc<dyn Backend>,
    recorder: Arc<FlightRecorder>,
    dir: Arc<PathBuf>,
    profiler: Option<Arc<Profiler>>,
}

impl Observed {
    /// Wraps `inner`, with a flight recorder of `settings.flight_records` operations that
    /// dumps into `settings.dump_dir()` (and on `SIGUSR1`).
    pub(crate) fn new(inner: Arc<dyn Backend>, settings: &PerfSettings) -> Observed {
        let recorder =
            Arc::new(FlightRecorder::new(settings.flight_records, inner.rank(), inner.world_size(), inner.name()));
        let dir = Arc::new(settings.dump_dir());
        let backend = Arc::downgrade(&inner);
        recorder.set_waiting_probe(Box::new(move || backend.upgrade()?.waiting_on()));
        if settings.flight_records > 0 {
            signal::watch(&recorder, &dir);
        }
        let profiler = settings.profile.enabled().then(|| {
            let p = Arc::new(Profiler::new(
                inner.rank(),
                inner.world_size(),
                recorder.comm(),
                &settings.profile,
                inner.peer_waits(),
            ));
            signal::finish_at_exit(&p);
            p
        });
        Observed { inner, recorder, dir, profiler }
    }

    /// The communicator's flight recorder.
    pub(crate) fn recorder(&self) -> &Arc<FlightRecorder> {
        &self.recorder
    }

    /// The communicator's profiler, when `OXCCL_PROFILE` asks for one.
    pub(crate) fn profiler(&self) -> Option<&Arc<Profiler>> {
        self.profiler.as_ref()
    }

    /// What the profiler needs of an operation at its submission.
    fn profile_start(&self, op: &Op, opts: &CallOptions) -> Option<(&Arc<Profiler>, Started)> {
        let p = self.profiler.as_ref()?;
        let bytes = op.message_bytes();
        // Only a trace shows the algorithm: the statistics do not pay for the choice.
        let algorithm = if p.traces() { self.inner.algorithm_for(op.kind(), bytes, opts).ok().flatten() } else { None };
        let started = Started {
            fp: op.fingerprint(p.next_seq(), Algorithm::Auto),
            bytes: bytes as u64,
            algorithm,
            at: clock::now(),
        };
        Some((p, started))
    }

    /// Records the end of operation `seq` (failed with `error`, if any) for the profiler,
    /// when it saw the start, and the flight recorder.
    fn ended(&self, profiled: Option<(&Arc<Profiler>, Started)>, seq: u64, error: Option<&Error>) {
        if let Some((p, s)) = profiled {
            s.end(p, error.is_none());
        }
        finish(&self.recorder, &self.dir, seq, error);
    }
}

/// An operation the profiler saw start.
struct Started {
    fp: crate::fingerprint::Fingerprint,
    bytes: u64,
    algorithm: Option<Algorithm>,
    at: Tick,
}

impl Started {
    fn end(self, profiler: &Profiler, ok: bool) {
        profiler.record(self.fp, self.bytes, self.algorithm, self.at, clock::now(), ok);
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        if let Some(p) = &self.profiler {
            p.finish();
        }
    }
}

/// The rank an error names as the one this rank waited on or heard from.
fn peer_of(e: &Error) -> Option<usize> {
    match e {
        Error::Timeout { peer, .. } => *peer,
        Error::Mismatch { peer, .. } => Some(*peer),
        Error::PeerLost { rank, .. } => Some(*rank),
        _ => None,
    }
}

/// Records the end of operation `seq`, and dumps the recorder on the communicator's first
/// failure that involves its peers (bad arguments are refused before anything is recorded
/// as running, and explain themselves).
fn finish(recorder: &FlightRecorder, dir: &std::path::Path, seq: u64, result: Option<&Error>) {
    recorder.end(seq, result.map(|e| (e, peer_of(e))));
    if let Some(e) = result {
        let explains = matches!(
            e,
            Error::Timeout { .. }
                | Error::Mismatch { .. }
                | Error::PeerLost { .. }
                | Error::Aborted { .. }
                | Error::Internal(_)
                | Error::Backend { .. }
                | Error::Io { .. }
        );
        if explains && recorder.first_failure() {
            recorder.report(dir, &e.to_string());
        }
    }
}

/// A submitted operation whose end is recorded when a wait sees it.
struct ObservedPending {
    inner: Arc<dyn Pending>,
    recorder: Arc<FlightRecorder>,
    dir: Arc<PathBuf>,
    seq: u64,
    recorded: AtomicBool,
    profiled: std::sync::Mutex<Option<(Arc<Profiler>, Started)>>,
}

impl Pending for ObservedPending {
    fn wait(&self, timeout: Option<Duration>) -> Option<Result<Completion>> {
        let r = self.inner.wait(timeout)?;
        if !self.recorded.swap(true, Ordering::AcqRel) {
            if let Some((p, s)) = crate::sync::relock(&self.profiled).take() {
                s.end(&p, r.is_ok());
            }
            finish(&self.recorder, &self.dir, self.seq, r.as_ref().err());
        }
        Some(r)
    }

    fn is_completed(&self) -> bool {
        self.inner.is_completed()
    }
}

impl Backend for Observed {
    fn name(&self) -> &'static str {
        self.inner.name()
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

    fn device(&self) -> Device {
        self.inner.device()
    }

    fn check_device(&self, device: Device) -> Result<()> {
        self.inner.check_device(device)
    }

    unsafe fn submit(&self, op: Op, mode: Mode, opts: &CallOptions) -> Result<Arc<dyn Pending>> {
        let profiled = self.profile_start(&op, opts);
        let seq = self.recorder.begin(&op);
        // SAFETY: forwarded from this function's contract.
        match unsafe { self.inner.submit(op, mode, opts) } {
            Ok(inner) => Ok(Arc::new(ObservedPending {
                inner,
                recorder: Arc::clone(&self.recorder),
                dir: Arc::clone(&self.dir),
                seq,
                recorded: AtomicBool::new(false),
                profiled: std::sync::Mutex::new(profiled.map(|(p, s)| (Arc::clone(p), s))),
            })),
            Err(e) => {
                self.ended(profiled, seq, Some(&e));
                Err(e)
            }
        }
    }

    fn algorithm_for(&self, op: OpKind, bytes: usize, opts: &CallOptions) -> Result<Option<Algorithm>> {
        self.inner.algorithm_for(op, bytes, opts)
    }

    #[inline]
    unsafe fn run_blocking(&self, op: &Op, opts: &CallOptions) -> Result<Completion> {
        let profiled = self.profile_start(op, opts);
        let seq = self.recorder.begin(op);
        // SAFETY: forwarded from this function's contract.
        match unsafe { self.inner.run_blocking(op, opts) } {
            // A success is remade rather than moved on (a copy of the 80-byte result, just
            // written, stalls on store forwarding).
            Ok(c) => {
                self.ended(profiled, seq, None);
                Ok(c)
            }
            Err(e) => {
                self.ended(profiled, seq, Some(&e));
                Err(e)
            }
        }
    }

    fn probe(&self, peer: usize, tag: u32) -> Result<Option<MessageInfo>> {
        self.inner.probe(peer, tag)
    }

    fn split(&self, color: Option<u32>, key: i64, opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        // The front door wraps the new communicator's backend in its own `Observed`.
        self.inner.split(color, key, opts)
    }

    fn waiting_on(&self) -> Option<usize> {
        self.inner.waiting_on()
    }

    fn revoke(&self, reason: &str) -> Result<()> {
        self.inner.revoke(reason)
    }

    fn agree(&self, flag: u64, opts: &CallOptions) -> Result<crate::backend::Agreement> {
        self.inner.agree(flag, opts)
    }

    fn shrink(&self, exclude: &[usize], opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        // The front door wraps the new communicator's backend in its own `Observed`.
        self.inner.shrink(exclude, opts)
    }

    fn grow(&self, joiners: usize, opts: &CallOptions) -> Result<Arc<dyn Backend>> {
        // As shrink: the front door observes the new communicator itself.
        self.inner.grow(joiners, opts)
    }

    fn peer_waits(&self) -> Option<Arc<crate::backend::peer_waits::PeerWaits>> {
        self.inner.peer_waits()
    }

    fn abort(&self, reason: &str) {
        self.inner.abort(reason);
        if self.recorder.first_failure() {
            self.recorder.report(&self.dir, &format!("aborted: {reason}"));
        }
    }
}
