//! The device runtimes: what the GPU backends need from CUDA or HIP, behind one trait.
//!
//! [`DeviceRuntime`] is the small set of calls the `nccl`/`rccl` engine makes: how many
//! devices there are, making one current, which device a pointer belongs to, allocation,
//! copies, streams and events. Implementations:
//! - `cuda/`: the CUDA *driver* API (`libcuda.so.1`), through a table of our own;
//! - `hip/`: HIP (`libamdhip64.so`), through the same kind of table;
//! - `host/`: a double for tests, host memory posing as device memory, with streams that
//!   run their work in order on a thread.
//!
//! Handles are raw (`CUstream`/`hipStream_t`, `CUevent`/`hipEvent_t`, device addresses as
//! `u64`): the engine owns their lifetimes, and a foreign stream (PyTorch's current stream)
//! is just another handle.

use std::ffi::c_void;
use std::fmt;

use crate::error::Result;

pub(crate) mod cuda;
pub(crate) mod hip;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod host;

/// Which vendor's runtime.
#[allow(dead_code)] // `Host` is made by the test double only
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Vendor {
    /// NVIDIA CUDA.
    Cuda,
    /// AMD HIP (ROCm).
    Hip,
    /// The host double (tests).
    Host,
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Vendor::Cuda => "CUDA",
            Vendor::Hip => "HIP",
            Vendor::Host => "host double",
        })
    }
}

/// A stream handle (`CUstream`, `hipStream_t`, or the double's). Null is the runtime's
/// legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RawStream(pub(crate) *mut c_void);

/// An event handle (`CUevent`, `hipEvent_t`, or the double's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RawEvent(pub(crate) *mut c_void);

// SAFETY: stream and event handles are opaque values that the vendor runtimes accept from
// any thread (CUDA and HIP streams and events are not tied to the thread that made them; the
// calls taking them are thread-safe). The double's handles point to objects behind locks.
unsafe impl Send for RawStream {}
// SAFETY: as above.
unsafe impl Sync for RawStream {}
// SAFETY: as above.
unsafe impl Send for RawEvent {}
// SAFETY: as above.
unsafe impl Sync for RawEvent {}

impl RawStream {
    /// The legacy default stream.
    pub(crate) const DEFAULT: RawStream = RawStream(std::ptr::null_mut());
}

/// The direction of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyKind {
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory.
    DeviceToHost,
    /// Device memory to device memory (the same device).
    DeviceToDevice,
}

/// Where a pointer's memory lives, as the runtime sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Residence {
    /// Device memory of the device with this ordinal (managed memory counts as the device's).
    Device(u32),
    /// Host memory (pageable, or pinned and registered with the runtime).
    Host,
}

/// What a runtime says about one of its devices (`oxccl info`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct DeviceInfo {
    /// Its model (`NVIDIA H100 80GB HBM3`).
    pub(crate) name: Option<String>,
    /// Its memory, bytes.
    pub(crate) memory_bytes: Option<u64>,
    /// Its PCI address, lower case (`0000:3b:00.0`), as sysfs names it.
    pub(crate) pci_bus_id: Option<String>,
    /// Whether the driver supports dma-buf for its memory (GPUDirect RDMA without a
    /// peer-memory module); `None` where the runtime cannot say.
    pub(crate) dma_buf: Option<bool>,
}

/// The text a driver writes into a caller's buffer (`cuDeviceGetName`, `hipDeviceGetPCIBusId`,
/// ...): `fill` gets a buffer and its length, and returns the call's result.
///
/// # Errors
/// `fill`'s error.
pub(crate) fn c_text(fill: impl FnOnce(*mut std::ffi::c_char, std::ffi::c_int) -> Result<()>) -> Result<String> {
    let mut buf = [0 as std::ffi::c_char; 256];
    fill(buf.as_mut_ptr(), buf.len() as std::ffi::c_int)?;
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated within the buffer (its last byte is 0).
    Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// The calling thread's current device for a while: [`enter`] makes one current, and
/// dropping this makes the thread's previous one current again, as NCCL does around its
/// calls (PyTorch reads its current device back, so a library must not change it).
pub(crate) struct Entered<'a> {
    rt: &'a dyn DeviceRuntime,
    prev: usize,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.rt.restore(self.prev) {
            tracing::debug!("restoring the caller's current device: {e}");
        }
    }
}

/// Makes `device` current on the calling thread until the returned guard is dropped.
///
/// # Errors
/// The runtime's errors.
pub(crate) fn enter(rt: &dyn DeviceRuntime, device: u32) -> Result<Entered<'_>> {
    let prev = rt.current_token()?;
    rt.set_current(device)?;
    Ok(Entered { rt, prev })
}

/// What the GPU engine needs from a vendor runtime. Every call that takes a device ordinal
/// makes that device current on the calling thread for the call (the way the runtime APIs
/// work: the current device is per thread) and the caller's current one again after it;
/// only [`set_current`](Self::set_current) changes it for good.
///
/// Errors are [`Error::Backend`](crate::Error::Backend) carrying the runtime's code and
/// its error string, prefixed with the call that failed.
pub(crate) trait DeviceRuntime: Send + Sync + 'static {
    /// The vendor.
    fn vendor(&self) -> Vendor;

    /// One line for diagnostics: the library's path and the driver's version.
    fn describe(&self) -> String;

    /// How many devices the process can see (after `CUDA_VISIBLE_DEVICES` and the like).
    ///
    /// # Errors
    /// The runtime's error (for example no driver, or no device).
    fn device_count(&self) -> Result<u32>;

    /// Makes `device` current on the calling thread (CUDA: its primary context).
    ///
    /// # Errors
    /// An ordinal out of range, or the runtime's error.
    fn set_current(&self, device: u32) -> Result<()>;

    /// The calling thread's current context or device, as a token for
    /// [`restore`](Self::restore) (what [`enter`] saves).
    ///
    /// # Errors
    /// The runtime's error.
    fn current_token(&self) -> Result<usize>;

    /// Makes what `token` names current again on the calling thread (CUDA: the context, or
    /// none for 0).
    ///
    /// # Errors
    /// The runtime's error.
    fn restore(&self, token: usize) -> Result<()>;

    /// Where the memory at `ptr` lives. Pointers the runtime does not know are host memory.
    ///
    /// # Errors
    /// The runtime's error for anything other than "not a pointer I know".
    fn residence(&self, ptr: *const c_void) -> Result<Residence>;

    /// Allocates `bytes` of device memory on `device` (at least one byte is allocated, so
    /// the address is valid and distinct even for `bytes == 0`).
    ///
    /// # Errors
    /// Out of memory, or the runtime's error.
    fn alloc(&self, device: u32, bytes: usize) -> Result<u64>;

    /// Frees memory from [`alloc`](Self::alloc).
    ///
    /// # Safety
    /// `ptr` came from `alloc` on `device`, is freed once, and no queued work uses it.
    ///
    /// # Errors
    /// The runtime's error.
    unsafe fn free(&self, device: u32, ptr: u64) -> Result<()>;

    /// Allocates `bytes` of pinned host memory, readable and writable by the CPU at full
    /// speed (not write-combined) and usable for asynchronous copies.
    ///
    /// # Errors
    /// Out of memory, or the runtime's error.
    #[allow(dead_code)] // for staging through pinned memory; the double's tests use it
    fn host_alloc(&self, bytes: usize) -> Result<*mut u8>;

    /// Frees memory from [`host_alloc`](Self::host_alloc).
    ///
    /// # Safety
    /// `ptr` came from `host_alloc`, is freed once, and no queued work uses it.
    ///
    /// # Errors
    /// The runtime's error.
    #[allow(dead_code)]
    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()>;

    /// Page-locks `bytes` of host memory at `ptr` (page aligned) and registers it with the
    /// runtime, so copies from and to it run at full speed and asynchronously
    /// (`cuMemHostRegister`, `hipHostRegister`; portable to every context).
    ///
    /// # Safety
    /// `ptr..ptr + bytes` is mapped host memory that stays mapped until
    /// [`host_unregister`](Self::host_unregister).
    ///
    /// # Errors
    /// The runtime's error (the memlock limit, a range already registered), or a driver that
    /// lacks the call.
    unsafe fn host_register(&self, ptr: *mut u8, bytes: usize) -> Result<()>;

    /// Undoes [`host_register`](Self::host_register).
    ///
    /// # Safety
    /// `ptr` was registered and no queued work uses it.
    ///
    /// # Errors
    /// The runtime's error.
    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()>;

    /// What the runtime says about `device`: each part the driver answers (a driver that
    /// lacks a query leaves its part `None`).
    ///
    /// # Errors
    /// An ordinal out of range, or the runtime's error.
    fn device_info(&self, device: u32) -> Result<DeviceInfo>;

    /// Whether `device` can access `peer`'s memory directly (peer-to-peer over NVLink or
    /// PCIe); `None` where the runtime cannot say.
    ///
    /// # Errors
    /// An ordinal out of range, or the runtime's error.
    fn can_access_peer(&self, device: u32, peer: u32) -> Result<Option<bool>>;

    /// Creates a stream on `device` that does not synchronize with the legacy default stream.
    ///
    /// # Errors
    /// The runtime's error.
    fn stream_create(&self, device: u32) -> Result<RawStream>;

    /// Destroys a stream from [`stream_create`](Self::stream_create) (work already queued
    /// on it still completes).
    ///
    /// # Safety
    /// `stream` came from `stream_create` and is destroyed once; nobody uses it afterwards.
    ///
    /// # Errors
    /// The runtime's error.
    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()>;

    /// Blocks until everything queued on `stream` has run.
    ///
    /// # Errors
    /// The runtime's error, including an error of earlier queued work.
    fn stream_synchronize(&self, stream: RawStream) -> Result<()>;

    /// Queues a copy of `bytes` bytes from `src` to `dst` on `stream`.
    ///
    /// # Safety
    /// Both ranges are valid memory of the kind `kind` says, and stay valid and untouched
    /// by others until the copy has run (a host source may be read, and a host destination
    /// written, at any time until `stream` reaches the copy).
    ///
    /// # Errors
    /// The runtime's error.
    unsafe fn copy_async(&self, dst: u64, src: u64, bytes: usize, kind: CopyKind, stream: RawStream) -> Result<()>;

    /// Creates an event on `device` (without timing, which makes recording it cheap).
    ///
    /// # Errors
    /// The runtime's error.
    fn event_create(&self, device: u32) -> Result<RawEvent>;

    /// Destroys an event from [`event_create`](Self::event_create).
    ///
    /// # Safety
    /// `event` came from `event_create` and is destroyed once; nobody uses it afterwards.
    ///
    /// # Errors
    /// The runtime's error.
    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()>;

    /// Records `event` on `stream`: it fires when the stream reaches this point.
    ///
    /// # Errors
    /// The runtime's error.
    fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()>;

    /// Whether `event` has fired (an event never recorded has).
    ///
    /// # Errors
    /// The runtime's error, including an error of the work before the event.
    fn event_query(&self, event: RawEvent) -> Result<bool>;

    /// Makes later work on `stream` wait until `event` has fired, without blocking the host.
    ///
    /// # Errors
    /// The runtime's error.
    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()>;
}
