//! The host double of the device runtime: host memory posing as device memory, streams that
//! run their work in order on threads, and events between them. The GPU engine's tests run
//! against it where CI has no GPU; the double of the NCCL table queues its collectives on
//! its streams as closures ([`HostRuntime::enqueue`]).
//!
//! - Devices are numbers below the count given to [`HostRuntime::new`]; the current device
//!   is per thread and per runtime (`current.rs`).
//! - Memory (`memory.rs`): device and pinned allocations are real heap blocks in a registry
//!   by address range, so [`residence`](DeviceRuntime::residence) knows any address inside
//!   one, a bad `free` is an error rather than undefined behaviour, copies are checked
//!   against what their kind says, and whatever is still allocated is freed with the runtime.
//! - Streams (`stream.rs`) each have a worker thread; a failing job breaks its stream for
//!   good, as a sticky CUDA error does. The legacy default stream (null) is one more stream,
//!   made on first use, serving the calling thread's current device.
//! - Events (`event.rs`) fire when their stream reaches their record; one never recorded
//!   counts as fired.
//! - [`HostRuntime::stall`] (`stall.rs`) makes a stream hang until the test lets it go.
//! - `anywhere.rs` reaches streams and the current device without holding the runtime
//!   ([`enqueue_anywhere`], [`CurrentDevice`]): the NCCL double's `extern "C"` functions
//!   have no other way to find them.
//!
//! # Handles
//! A [`RawStream`] or [`RawEvent`] of the double is a number posing as a pointer
//! (`handle.rs`): one process-wide counter numbers every stream and event of every runtime,
//! and the handle is a pointer with that address and no provenance. The runtime keeps its
//! live streams and events in hash maps by number and looks every handle up there. The
//! pointer is never dereferenced, so no handle can cause undefined behaviour; numbers are
//! never reused, so a destroyed handle, another runtime's, an event passed as a stream and a
//! made-up value are all unknown and reported as [`codes::INVALID_HANDLE`].
//! A lookup is one hash under one mutex.
//!
//! # Dropping
//! Dropping the runtime wakes every blocking wait of its own jobs (stalls, waits on events),
//! stops every worker after the job it is running (jobs still queued are dropped unrun),
//! joins the workers, and then frees all memory still allocated. A closure queued with
//! [`enqueue`](HostRuntime::enqueue) that blocks on something outside the runtime must be
//! woken by whoever queued it (the NCCL double aborts its communicators first): the drop
//! waits for the closure to return. A runtime dropped on one of its own workers (a closure
//! held its last reference) does not join that worker, which ends on its own after the
//! closure; the runtime's memory is freed at once all the same, so such a closure must not
//! touch device memory after letting go of the runtime.

// A test double: the `testing` feature builds it for other crates' tests, which use only
// part of it; the unit tests use the rest.
#![cfg_attr(not(test), allow(dead_code))]

mod anywhere;
pub(crate) mod codes;
mod current;
mod event;
mod handle;
mod memory;
mod stall;
mod stream;
#[cfg(test)]
mod tests;
mod wake;

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use self::codes::{fail, DEINITIALIZED, INVALID_DEVICE, INVALID_HANDLE, INVALID_VALUE};
use self::event::{Event, Point};
use self::memory::{Memory, Owner, Transfer};
use self::stall::Gate;
use self::stream::{Stream, Work};
use self::wake::{Waited, Wake};
use super::{CopyKind, DeviceInfo, DeviceRuntime, RawEvent, RawStream, Residence, Vendor};
use crate::error::{Error, Result};
use crate::sync::relock;

#[cfg(any(test, feature = "testing"))]
pub(crate) use self::anywhere::{enqueue_anywhere, stream_is_live, CurrentDevice};
pub(crate) use self::stall::StallGuard;
pub(crate) use self::stream::Closure;

/// Numbers runtimes, to key the per-thread current device.
static NEXT_RUNTIME: AtomicU64 = AtomicU64::new(1);

/// A stream's worker thread, kept to be joined.
struct Worker {
    /// The stream it runs.
    stream: Arc<Stream>,
    /// The thread.
    thread: JoinHandle<()>,
}

/// The runtime's streams.
#[derive(Default)]
struct Streams {
    /// The live streams from `stream_create`, by handle number.
    live: HashMap<usize, Arc<Stream>>,
    /// The legacy default stream of each device (CUDA's is per context), once used.
    default: HashMap<u32, Arc<Stream>>,
    /// Every worker not yet joined: of live streams, of the default stream, and of
    /// destroyed streams still running their last jobs.
    workers: Vec<Worker>,
}

impl Streams {
    /// Joins the workers of destroyed streams that have finished.
    fn reap(&mut self) {
        let (done, running): (Vec<Worker>, Vec<Worker>) =
            std::mem::take(&mut self.workers).into_iter().partition(|w| w.thread.is_finished());
        self.workers = running;
        for w in done {
            // A finished thread joins at once; a panic in it was already caught per job.
            let _ = w.thread.join();
        }
    }
}

/// What a runtime holds right now, for tests that check the engine leaks nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Census {
    /// Live device allocations.
    pub(crate) device_allocations: usize,
    /// Live pinned host allocations.
    pub(crate) pinned_allocations: usize,
    /// Live streams from `stream_create` (the default stream not counted).
    pub(crate) streams: usize,
    /// Live events.
    pub(crate) events: usize,
}

/// The host double of a device runtime (see the module documentation).
pub(crate) struct HostRuntime {
    /// This runtime's number (keys the per-thread current device).
    id: u64,
    /// How many fake devices.
    devices: u32,
    /// The vendor it reports: [`Vendor::Host`], or the one it poses as (devices named
    /// `rocm:N` when posing as HIP).
    vendor: Vendor,
    /// The allocations.
    memory: Arc<Memory>,
    /// The hub every blocking wait sleeps on.
    wake: Arc<Wake>,
    /// The streams.
    streams: Mutex<Streams>,
    /// The live events, by handle number.
    events: Mutex<HashMap<usize, Arc<Event>>>,
    /// Host memory registered with `host_register`: address, bytes.
    registered: Mutex<HashMap<usize, usize>>,
}

impl std::fmt::Debug for HostRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRuntime").field("devices", &self.devices).field("census", &self.census()).finish()
    }
}

impl HostRuntime {
    /// A runtime with `devices` fake devices.
    pub(crate) fn new(devices: u32) -> HostRuntime {
        HostRuntime::posing_as(devices, Vendor::Host)
    }

    /// A runtime with `devices` fake devices reporting `vendor` (so the `rccl` path, whose
    /// buffers are `rocm:N`, runs on the double too).
    pub(crate) fn posing_as(devices: u32, vendor: Vendor) -> HostRuntime {
        HostRuntime {
            id: NEXT_RUNTIME.fetch_add(1, Ordering::Relaxed),
            devices,
            vendor,
            memory: Arc::new(Memory::default()),
            wake: Arc::new(Wake::default()),
            streams: Mutex::new(Streams::default()),
            events: Mutex::new(HashMap::new()),
            registered: Mutex::new(HashMap::new()),
        }
    }

    /// The calling thread's current device (0 until [`set_current`](DeviceRuntime::set_current)).
    pub(crate) fn current_device(&self) -> u32 {
        current::get(self.id)
    }

    /// What the runtime holds right now.
    pub(crate) fn census(&self) -> Census {
        let (device_allocations, pinned_allocations) = self.memory.census();
        Census {
            device_allocations,
            pinned_allocations,
            streams: relock(&self.streams).live.len(),
            events: relock(&self.events).len(),
        }
    }

    /// Queues `job` on `stream`: it runs when the stream reaches it, on the stream's worker.
    /// An error it returns breaks the stream (see the module documentation); so does a panic,
    /// reported as an internal error.
    ///
    /// # Errors
    /// An unknown stream, or the stream's sticky error when it is already broken (the job is
    /// dropped unrun).
    pub(crate) fn enqueue(&self, stream: RawStream, job: Closure) -> Result<()> {
        self.stream(stream, "enqueue")?.push(Work::Run(job), "enqueue")
    }

    /// Blocks until `event` has fired (`Ok(true)`; at once for an event never recorded) or
    /// `timeout` has passed (`Ok(false)`).
    ///
    /// # Errors
    /// An unknown event, or the error of the stream the event was recorded on, when it broke
    /// before reaching the record.
    pub(crate) fn event_wait(&self, event: RawEvent, timeout: Duration) -> Result<bool> {
        let Some(point) = self.event(event, "event_wait")?.last() else { return Ok(true) };
        match self.wake.wait_for(Instant::now().checked_add(timeout), || point.outcome()) {
            Waited::Ready(outcome) => outcome.map(|()| true),
            Waited::TimedOut => Ok(false),
            Waited::Stopping => Err(fail(DEINITIALIZED, "event_wait", "the runtime is being dropped")),
        }
    }

    /// Makes `stream` hang: queues a job that blocks until the returned guard is released or
    /// dropped (or the runtime drops). Later work on the stream waits behind it.
    ///
    /// # Errors
    /// An unknown stream, or its sticky error.
    pub(crate) fn stall(&self, stream: RawStream) -> Result<StallGuard> {
        let gate = Arc::new(Gate::default());
        self.stream(stream, "stall")?.push(Work::Stall(Arc::clone(&gate)), "stall")?;
        Ok(StallGuard::new(gate, Arc::clone(&self.wake)))
    }

    /// Checks a device ordinal.
    ///
    /// # Errors
    /// The ordinal is out of range.
    fn check_device(&self, device: u32, call: &str) -> Result<()> {
        if device < self.devices {
            Ok(())
        } else {
            Err(fail(INVALID_DEVICE, call, format!("device {device} does not exist ({} devices)", self.devices)))
        }
    }

    /// The stream a handle stands for (for null, the calling thread's current device's
    /// default stream, made on first use).
    ///
    /// # Errors
    /// An unknown handle; for the default stream, a worker thread that cannot start.
    fn stream(&self, raw: RawStream, call: &str) -> Result<Arc<Stream>> {
        let mut streams = relock(&self.streams);
        if raw == RawStream::DEFAULT {
            let device = self.current_device();
            if let Some(s) = streams.default.get(&device) {
                return Ok(Arc::clone(s));
            }
            let (stream, thread) = Stream::spawn(0, None, Arc::clone(&self.wake), call)?;
            anywhere::register_default(self.id, device, &stream);
            streams.default.insert(device, Arc::clone(&stream));
            streams.workers.push(Worker { stream: Arc::clone(&stream), thread });
            return Ok(stream);
        }
        streams.live.get(&handle::from_raw(raw.0)).cloned().ok_or_else(|| {
            fail(INVALID_HANDLE, call, format!("{:#x} is not a live stream of this runtime", handle::from_raw(raw.0)))
        })
    }

    /// The event a handle stands for.
    ///
    /// # Errors
    /// An unknown handle.
    fn event(&self, raw: RawEvent, call: &str) -> Result<Arc<Event>> {
        let id = handle::from_raw(raw.0);
        relock(&self.events)
            .get(&id)
            .cloned()
            .ok_or_else(|| fail(INVALID_HANDLE, call, format!("{id:#x} is not a live event of this runtime")))
    }

    /// The device work on `stream` belongs to: its own, or the calling thread's current
    /// device for the default stream.
    fn device_of(&self, stream: &Stream) -> u32 {
        stream.device.unwrap_or_else(|| self.current_device())
    }
}

impl DeviceRuntime for HostRuntime {
    fn vendor(&self) -> Vendor {
        self.vendor
    }

    fn describe(&self) -> String {
        format!("host double: {} fake device(s), host memory posing as device memory", self.devices)
    }

    fn device_count(&self) -> Result<u32> {
        Ok(self.devices)
    }

    fn set_current(&self, device: u32) -> Result<()> {
        self.check_device(device, "set_current")?;
        current::set(self.id, device)?;
        anywhere::note(self.id, &self.memory);
        Ok(())
    }

    fn current_token(&self) -> Result<usize> {
        Ok(current::get(self.id) as usize)
    }

    fn restore(&self, token: usize) -> Result<()> {
        current::set(self.id, u32::try_from(token).unwrap_or(0))
    }

    fn residence(&self, ptr: *const c_void) -> Result<Residence> {
        Ok(match self.memory.owner_of(ptr.addr()) {
            Some(Owner::Device(d)) => Residence::Device(d),
            Some(Owner::Pinned) | None => Residence::Host,
        })
    }

    fn alloc(&self, device: u32, bytes: usize) -> Result<u64> {
        let _cur = super::enter(self, device)?;
        let addr = self.memory.alloc(Owner::Device(device), bytes, "alloc")?;
        // usize is at most 64 bits on every target Rust supports.
        Ok(addr as u64)
    }

    unsafe fn free(&self, device: u32, ptr: u64) -> Result<()> {
        let _cur = super::enter(self, device)?;
        let addr = usize::try_from(ptr)
            .map_err(|_| fail(INVALID_VALUE, "free", format!("{ptr:#x} is not a live allocation")))?;
        self.memory.free(Owner::Device(device), addr, "free")
    }

    fn device_info(&self, device: u32) -> Result<DeviceInfo> {
        self.check_device(device, "device_info")?;
        Ok(DeviceInfo {
            name: Some(format!("host double device {device}")),
            memory_bytes: Some(1 << 30),
            pci_bus_id: Some(format!("0000:{:02x}:00.0", device + 1)),
            dma_buf: Some(false),
        })
    }

    fn can_access_peer(&self, device: u32, peer: u32) -> Result<Option<bool>> {
        self.check_device(device, "can_access_peer")?;
        self.check_device(peer, "can_access_peer")?;
        Ok(Some(device != peer))
    }

    unsafe fn host_register(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        let mut r = relock(&self.registered);
        if r.contains_key(&(ptr as usize)) {
            return Err(Error::Backend {
                code: 712,
                message: "host_register: this memory is already registered".into(),
            });
        }
        r.insert(ptr as usize, bytes);
        Ok(())
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()> {
        match relock(&self.registered).remove(&(ptr as usize)) {
            Some(_) => Ok(()),
            None => Err(Error::Backend { code: 713, message: "host_unregister: this memory is not registered".into() }),
        }
    }

    fn host_alloc(&self, bytes: usize) -> Result<*mut u8> {
        let addr = self.memory.alloc(Owner::Pinned, bytes, "host_alloc")?;
        Ok(std::ptr::with_exposed_provenance_mut(addr))
    }

    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()> {
        self.memory.free(Owner::Pinned, ptr.addr(), "host_free")
    }

    fn stream_create(&self, device: u32) -> Result<RawStream> {
        let _cur = super::enter(self, device)?;
        let id = handle::next("stream_create")?;
        let (stream, thread) = Stream::spawn(id, Some(device), Arc::clone(&self.wake), "stream_create")?;
        let mut streams = relock(&self.streams);
        streams.reap();
        streams.live.insert(id, Arc::clone(&stream));
        anywhere::register(&stream);
        streams.workers.push(Worker { stream, thread });
        Ok(RawStream(handle::to_raw(id)))
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        if stream == RawStream::DEFAULT {
            return Err(fail(INVALID_HANDLE, "stream_destroy", "the default stream cannot be destroyed"));
        }
        let id = handle::from_raw(stream.0);
        let mut streams = relock(&self.streams);
        let Some(s) = streams.live.remove(&id) else {
            return Err(fail(
                INVALID_HANDLE,
                "stream_destroy",
                format!("{id:#x} is not a live stream of this runtime"),
            ));
        };
        anywhere::unregister(id);
        s.close();
        streams.reap();
        Ok(())
    }

    fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        self.stream(stream, "stream_synchronize")?.synchronize()
    }

    unsafe fn copy_async(&self, dst: u64, src: u64, bytes: usize, kind: CopyKind, stream: RawStream) -> Result<()> {
        let s = self.stream(stream, "copy_async")?;
        let transfer = Transfer::new(dst, src, bytes, kind, self.device_of(&s))?;
        self.memory.check(&transfer)?;
        s.push(Work::Copy(transfer, Arc::clone(&self.memory)), "copy_async")
    }

    fn event_create(&self, device: u32) -> Result<RawEvent> {
        let _cur = super::enter(self, device)?;
        let id = handle::next("event_create")?;
        relock(&self.events).insert(id, Arc::new(Event::new(device)));
        Ok(RawEvent(handle::to_raw(id)))
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()> {
        let id = handle::from_raw(event.0);
        match relock(&self.events).remove(&id) {
            Some(_) => Ok(()),
            None => Err(fail(INVALID_HANDLE, "event_destroy", format!("{id:#x} is not a live event of this runtime"))),
        }
    }

    fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        let e = self.event(event, "event_record")?;
        let s = self.stream(stream, "event_record")?;
        let device = self.device_of(&s);
        if e.device != device {
            return Err(fail(
                INVALID_HANDLE,
                "event_record",
                format!("the event is on device {}, {} on device {device}", e.device, s.name()),
            ));
        }
        let point = Point::pending();
        let queued = s.push(Work::Fire(Arc::clone(&point)), "event_record");
        if let Err(error) = &queued {
            // Like CUDA after a sticky error: the event reports the error too.
            point.fail(error.clone(), &self.wake);
        }
        e.record(point);
        queued
    }

    fn event_query(&self, event: RawEvent) -> Result<bool> {
        match self.event(event, "event_query")?.last() {
            None => Ok(true),
            Some(point) => point.outcome().map_or(Ok(false), |outcome| outcome.map(|()| true)),
        }
    }

    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        let s = self.stream(stream, "stream_wait_event")?;
        match self.event(event, "stream_wait_event")?.last() {
            Some(point) => s.push(Work::Wait(point), "stream_wait_event"),
            None => s.health(),
        }
    }
}

impl Drop for HostRuntime {
    fn drop(&mut self) {
        let workers = {
            let mut streams = relock(&self.streams);
            for &id in streams.live.keys() {
                anywhere::unregister(id);
            }
            streams.live.clear();
            streams.default.clear();
            anywhere::unregister_default(self.id);
            std::mem::take(&mut streams.workers)
        };
        // Streams first, so that a worker whose blocking job the hub wakes next finds its
        // stream stopping and runs nothing more.
        for w in &workers {
            w.stream.stop();
        }
        self.wake.stop();
        let me = std::thread::current().id();
        for w in workers {
            if w.thread.thread().id() == me {
                // Dropped by a closure on this very worker: it ends after the closure returns.
                continue;
            }
            // A worker's jobs run under `catch_unwind`, so its thread does not panic.
            let _ = w.thread.join();
        }
        current::forget(self.id);
        anywhere::forget(self.id);
        // The memory is freed when the last holder of `self.memory` is gone: now, or when a
        // worker that was not joined ends.
    }
}
