//! Reaching a runtime without holding it, for the double of the NCCL API, whose `extern "C"`
//! functions get no context pointer:
//! - every live stream of every runtime, by handle number ([`enqueue_anywhere`]): stream
//!   handles are process-wide unique numbers (`handle.rs`), so a handle names one stream of
//!   one runtime;
//! - the device current on the calling thread, in the runtime that last made one current on
//!   it ([`CurrentDevice`]), for `ncclCommCuDevice` and `ncclMemAlloc`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use super::codes::{fail, DEINITIALIZED, INVALID_HANDLE, INVALID_VALUE};
use super::memory::{Memory, Owner};
use super::stream::{Closure, Stream, Work};
use super::{current, handle};
use crate::error::Result;
use crate::sync::relock;
use crate::xccl::runtime::RawStream;

/// Every live stream from `stream_create`, of every runtime, by handle number. Entries are
/// weak: a stream lives as long as its runtime keeps it; the runtime removes its entries when
/// it destroys a stream or drops.
static STREAMS: LazyLock<Mutex<HashMap<usize, Weak<Stream>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Makes `stream` reachable through [`enqueue_anywhere`].
pub(super) fn register(stream: &Arc<Stream>) {
    relock(&STREAMS).insert(stream.id, Arc::downgrade(stream));
}

/// The legacy default stream of each runtime and device, once made.
type Defaults = HashMap<(u64, u32), Weak<Stream>>;
static DEFAULTS: LazyLock<Mutex<Defaults>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Makes `stream` reachable as `runtime`'s default stream (null) of `device` through
/// [`enqueue_anywhere`], from threads on which `runtime` made `device` current.
pub(super) fn register_default(runtime: u64, device: u32, stream: &Arc<Stream>) {
    relock(&DEFAULTS).insert((runtime, device), Arc::downgrade(stream));
}

/// Forgets `runtime`'s default streams (its runtime is dropping).
pub(super) fn unregister_default(runtime: u64) {
    relock(&DEFAULTS).retain(|&(r, _), _| r != runtime);
}

/// Forgets the stream numbered `id` (destroyed, or its runtime dropping).
pub(super) fn unregister(id: usize) {
    relock(&STREAMS).remove(&id);
}

/// Whether `stream` is a live stream of some runtime (null: whether the calling thread's
/// runtime has a default stream).
pub(crate) fn stream_is_live(stream: RawStream) -> bool {
    lookup(stream, "stream_is_live").is_ok()
}

/// The live stream `raw` stands for: null is the default stream of the runtime that last
/// made a device current on the calling thread (as CUDA's legacy stream is the current
/// context's).
///
/// # Errors
/// An unknown handle; null when no live runtime made a device current on this thread, or
/// its default stream was not made yet.
fn lookup(raw: RawStream, call: &str) -> Result<Arc<Stream>> {
    if raw == RawStream::DEFAULT {
        let runtime = LAST.try_with(|l| l.try_borrow().ok().and_then(|l| l.as_ref().map(|l| l.runtime))).ok().flatten();
        return runtime
            .and_then(|r| relock(&DEFAULTS).get(&(r, current::get(r))).and_then(Weak::upgrade))
            .ok_or_else(|| fail(INVALID_HANDLE, call, "no runtime's default stream is in use on this thread"));
    }
    let id = handle::from_raw(raw.0);
    relock(&STREAMS)
        .get(&id)
        .and_then(Weak::upgrade)
        .ok_or_else(|| fail(INVALID_HANDLE, call, format!("{id:#x} is not a live stream of any runtime")))
}

/// Queues `job` on `stream`, whichever runtime it belongs to, as
/// [`HostRuntime::enqueue`](super::HostRuntime::enqueue) does.
///
/// # Errors
/// The null default stream, an unknown or destroyed stream, or the stream's sticky error.
pub(crate) fn enqueue_anywhere(stream: RawStream, job: Closure) -> Result<()> {
    lookup(stream, "enqueue_anywhere")?.push(Work::Run(job), "enqueue_anywhere")
}

thread_local! {
    /// The runtime that last made a device current on this thread.
    static LAST: RefCell<Option<Latest>> = const { RefCell::new(None) };
}

/// A runtime, as the thread-local remembers it.
#[derive(Debug, Clone)]
struct Latest {
    /// The runtime's number.
    runtime: u64,
    /// Its allocations (weak: the runtime may drop).
    memory: Weak<Memory>,
}

/// Remembers that `runtime` made a device current on the calling thread.
pub(super) fn note(runtime: u64, memory: &Arc<Memory>) {
    let _ = LAST.try_with(|last| {
        if let Ok(mut last) = last.try_borrow_mut() {
            *last = Some(Latest { runtime, memory: Arc::downgrade(memory) });
        }
    });
}

/// Forgets `runtime` as the calling thread's latest (it is dropping).
pub(super) fn forget(runtime: u64) {
    let _ = LAST.try_with(|last| {
        if let Ok(mut last) = last.try_borrow_mut() {
            if last.as_ref().is_some_and(|l| l.runtime == runtime) {
                *last = None;
            }
        }
    });
}

/// The device current on the calling thread, in the runtime that last made a device current
/// on it (`set_current`, and every call taking a device ordinal, do), as the CUDA runtime
/// keeps one current device per thread. What NCCL's calls without a device argument use.
#[derive(Debug, Clone)]
pub(crate) struct CurrentDevice {
    /// The device.
    device: u32,
    /// The runtime's allocations.
    memory: Weak<Memory>,
}

impl CurrentDevice {
    /// The calling thread's current device, or `None` when no live runtime made one current
    /// on this thread.
    pub(crate) fn get() -> Option<CurrentDevice> {
        let latest = LAST.try_with(|last| last.try_borrow().ok().and_then(|l| l.clone())).ok().flatten()?;
        latest.memory.upgrade()?;
        Some(CurrentDevice { device: current::get(latest.runtime), memory: latest.memory })
    }

    /// The device's ordinal.
    pub(crate) fn device(&self) -> u32 {
        self.device
    }

    /// The runtime's memory, while it lives.
    ///
    /// # Errors
    /// The runtime was dropped.
    fn memory(&self, call: &str) -> Result<Arc<Memory>> {
        self.memory.upgrade().ok_or_else(|| fail(DEINITIALIZED, call, "the runtime was dropped"))
    }

    /// Allocates `bytes` of device memory on this device, as
    /// [`alloc`](crate::xccl::runtime::DeviceRuntime::alloc) does.
    ///
    /// # Errors
    /// The runtime was dropped, or the allocation failed.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<u64> {
        Ok(self.memory("alloc")?.alloc(Owner::Device(self.device), bytes, "alloc")? as u64)
    }

    /// Frees memory from [`alloc`](Self::alloc) on this device.
    ///
    /// # Safety
    /// As [`free`](crate::xccl::runtime::DeviceRuntime::free): freed once, and no queued work
    /// uses it.
    ///
    /// # Errors
    /// The runtime was dropped, or `ptr` is not a live allocation of this device.
    pub(crate) unsafe fn free(&self, ptr: u64) -> Result<()> {
        let addr = usize::try_from(ptr)
            .map_err(|_| fail(INVALID_VALUE, "free", format!("{ptr:#x} is not a live allocation")))?;
        self.memory("free")?.free(Owner::Device(self.device), addr, "free")
    }
}
