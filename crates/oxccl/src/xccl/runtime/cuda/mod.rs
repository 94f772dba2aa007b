//! The CUDA runtime of the `nccl` backend: the CUDA *driver* API (`libcuda.so.1`) through a
//! table of our own ([`table`]), loaded at run time.
//!
//! Why not cudarc: its 0.19 panics when the library or a symbol is missing (we must answer
//! `BackendUnavailable`), it cannot wrap a foreign stream (PyTorch's), and its default pinned
//! allocation is write-combined (slow for CPU reads). The driver API is what every CUDA
//! install has (the runtime library `libcudart` is not guaranteed), and its handles are the
//! runtime API's: a `CUstream` is a `cudaStream_t`, so PyTorch's current stream can be passed
//! with `Stream::from_raw`. cudarc's *types* are still accepted as buffers (cargo feature
//! `cudarc`).
//!
//! Contexts: each device's *primary* context (the one the runtime API and PyTorch use) is
//! retained once, on first use, and released when the runtime is dropped; every call that
//! names a device makes its primary context current on the calling thread first.

pub(crate) mod table;
#[cfg(test)]
mod tests;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use self::table::*;
use super::{c_text, CopyKind, DeviceInfo, DeviceRuntime, RawEvent, RawStream, Residence, Vendor};
use crate::error::{Error, Result};
use crate::sync::relock;
use crate::xccl::dl::{Candidate, Opened};

/// The CUDA driver, initialized.
pub(crate) struct CudaRuntime {
    t: CudaTable,
    /// Where it was loaded from.
    path: PathBuf,
    /// `cuDriverGetVersion` (e.g. 13000 for CUDA 13.0).
    version: c_int,
    /// The retained primary context of each device, once used.
    contexts: Mutex<Vec<Option<usize>>>,
    /// The device last made current (-1: none yet), for calls that name none.
    home: std::sync::atomic::AtomicI64,
}

/// Where the driver is looked for: the loader's search path (the driver is installed with
/// the kernel module, not with a toolkit).
pub(crate) fn candidates() -> Vec<Candidate> {
    vec![
        Candidate::new("libcuda.so.1", "the loader's search path"),
        Candidate::new("libcuda.so", "the loader's search path"),
    ]
}

impl CudaRuntime {
    /// Loads and initializes the driver from the first candidate that works.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] (backend `nccl`) naming every path tried and why each
    /// failed (not found, lacks functions, `cuInit` failed: no device, a driver too old).
    pub(crate) fn load() -> Result<CudaRuntime> {
        Self::load_from(&candidates())
    }

    /// As [`load`](Self::load), from the given candidates.
    ///
    /// # Errors
    /// As for [`load`](Self::load).
    pub(crate) fn load_from(candidates: &[Candidate]) -> Result<CudaRuntime> {
        Opened::first(candidates, |opened| {
            let lib = Arc::new(opened);
            let path = lib.path.clone();
            let table = CudaTable::from_library(lib)?;
            CudaRuntime::from_table(table, path).map_err(|e| e.to_string())
        })
        .map_err(|tried| Error::BackendUnavailable {
            backend: "nccl".into(),
            why: format!(
                "no usable CUDA driver; tried {tried}. To fix: install the NVIDIA driver (it provides libcuda.so.1), \
                 check that a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)"
            ),
        })
    }

    /// A runtime over `table` (a loaded driver, or test functions): runs `cuInit(0)` and
    /// reads the driver's version.
    ///
    /// # Errors
    /// [`Error::Backend`] with the driver's error when `cuInit` fails.
    pub(crate) fn from_table(table: CudaTable, path: impl Into<PathBuf>) -> Result<CudaRuntime> {
        let mut rt = CudaRuntime {
            t: table,
            path: path.into(),
            version: 0,
            contexts: Mutex::new(Vec::new()),
            home: std::sync::atomic::AtomicI64::new(-1),
        };
        // SAFETY: cuInit takes flags, which must be 0.
        rt.check("cuInit", unsafe { (rt.t.init)(0) })?;
        let mut version = 0;
        // SAFETY: writes one int through a valid pointer.
        rt.check("cuDriverGetVersion", unsafe { (rt.t.driver_get_version)(&mut version) })?;
        rt.version = version;
        Ok(rt)
    }

    /// The driver's name for `code` and its description.
    fn describe_code(&self, code: CuResult) -> String {
        let text = |f: ErrorTextFn| {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: writes a pointer to a static NUL-terminated string (or fails for an
            // unknown code, leaving it null).
            let r = unsafe { f(code, &mut p) };
            if r != CUDA_SUCCESS || p.is_null() {
                return None;
            }
            // SAFETY: non-null, static, NUL-terminated (cuda.h's contract for these calls).
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        match (text(self.t.get_error_name), text(self.t.get_error_string)) {
            (Some(n), Some(s)) => format!("{n}: {s}"),
            (Some(n), None) => n,
            _ => format!("CUDA error {code}"),
        }
    }

    /// `Ok` for `CUDA_SUCCESS`, else [`Error::Backend`] `"{call}: {name}: {description}"`.
    fn check(&self, call: &str, code: CuResult) -> Result<()> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(Error::Backend { code: i64::from(code), message: format!("{call}: {}", self.describe_code(code)) })
        }
    }

    /// The `CUdevice` of ordinal `device`.
    fn cu_device(&self, device: u32) -> Result<CuDevice> {
        let ordinal =
            c_int::try_from(device).map_err(|_| Error::invalid(format!("CUDA device {device} is out of range")))?;
        let mut dev: CuDevice = 0;
        // SAFETY: writes one CUdevice through a valid pointer.
        self.check("cuDeviceGet", unsafe { (self.t.device_get)(&mut dev, ordinal) })?;
        Ok(dev)
    }

    /// The primary context of `device`, retained on first use.
    fn context(&self, device: u32) -> Result<Handle> {
        let mut ctxs = relock(&self.contexts);
        if let Some(Some(c)) = ctxs.get(device as usize) {
            return Ok(*c as Handle);
        }
        let ordinal =
            c_int::try_from(device).map_err(|_| Error::invalid(format!("CUDA device {device} is out of range")))?;
        let mut dev: CuDevice = 0;
        // SAFETY: writes one CUdevice through a valid pointer.
        self.check("cuDeviceGet", unsafe { (self.t.device_get)(&mut dev, ordinal) })?;
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: writes one CUcontext through a valid pointer; released in Drop.
        self.check("cuDevicePrimaryCtxRetain", unsafe { (self.t.primary_ctx_retain)(&mut ctx, dev) })?;
        if ctxs.len() <= device as usize {
            ctxs.resize(device as usize + 1, None);
        }
        ctxs[device as usize] = Some(ctx as usize);
        Ok(ctx)
    }

    /// Makes some context current when the thread has none (for calls that need one but
    /// name no device), until the guard drops: the device this process last used through
    /// this runtime (the rank's, once the engine exists), device 0 only when none was.
    /// Never the first context on GPU 0 for every rank of a node.
    fn ensure_context(&self) -> Result<Option<super::Entered<'_>>> {
        if self.current_token()? != 0 {
            return Ok(None);
        }
        let home = u32::try_from(self.home.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(0);
        super::enter(self, home).map(Some)
    }
}

impl Drop for CudaRuntime {
    fn drop(&mut self) {
        for (i, c) in relock(&self.contexts).iter().enumerate() {
            if c.is_some() {
                // SAFETY: each retained primary context is released once, here.
                let _ = unsafe { (self.t.primary_ctx_release)(i as CuDevice) };
            }
        }
    }
}

impl DeviceRuntime for CudaRuntime {
    fn vendor(&self) -> Vendor {
        Vendor::Cuda
    }

    fn describe(&self) -> String {
        format!("the CUDA driver {}.{} ({})", self.version / 1000, (self.version % 1000) / 10, self.path.display())
    }

    fn device_count(&self) -> Result<u32> {
        let mut n: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        match unsafe { (self.t.device_get_count)(&mut n) } {
            CUDA_ERROR_NO_DEVICE => Ok(0),
            code => self.check("cuDeviceGetCount", code).map(|()| u32::try_from(n).unwrap_or(0)),
        }
    }

    fn set_current(&self, device: u32) -> Result<()> {
        let ctx = self.context(device)?;
        self.home.store(i64::from(device), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: a retained primary context.
        self.check("cuCtxSetCurrent", unsafe { (self.t.ctx_set_current)(ctx) })
    }

    fn current_token(&self) -> Result<usize> {
        let mut cur: Handle = std::ptr::null_mut();
        // SAFETY: writes one CUcontext through a valid pointer.
        self.check("cuCtxGetCurrent", unsafe { (self.t.ctx_get_current)(&mut cur) })?;
        Ok(cur as usize)
    }

    fn restore(&self, token: usize) -> Result<()> {
        // SAFETY: a context that was current on this thread (a retained primary context or
        // the caller's own, still alive: a context cannot be destroyed while current), or
        // null, which unbinds.
        self.check("cuCtxSetCurrent", unsafe { (self.t.ctx_set_current)(token as Handle) })
    }

    fn residence(&self, ptr: *const c_void) -> Result<Residence> {
        let _cur = self.ensure_context()?;
        let mut kind: c_uint = 0;
        // SAFETY: writes one CUmemorytype (unsigned int) through a valid pointer; any
        // address may be asked about.
        let r = unsafe {
            (self.t.pointer_get_attribute)(
                (&mut kind as *mut c_uint).cast(),
                CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr as u64,
            )
        };
        if r == CUDA_ERROR_INVALID_VALUE {
            return Ok(Residence::Host);
        }
        self.check("cuPointerGetAttribute", r)?;
        if kind == CU_MEMORYTYPE_HOST {
            return Ok(Residence::Host);
        }
        let mut ordinal: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        let r = unsafe {
            (self.t.pointer_get_attribute)(
                (&mut ordinal as *mut c_int).cast(),
                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr as u64,
            )
        };
        self.check("cuPointerGetAttribute", r)?;
        match kind {
            CU_MEMORYTYPE_DEVICE | CU_MEMORYTYPE_ARRAY | CU_MEMORYTYPE_UNIFIED => {
                Ok(Residence::Device(u32::try_from(ordinal).unwrap_or(0)))
            }
            other => {
                Err(Error::Backend { code: 0, message: format!("cuPointerGetAttribute: unknown memory type {other}") })
            }
        }
    }

    fn alloc(&self, device: u32, bytes: usize) -> Result<u64> {
        let _cur = super::enter(self, device)?;
        let mut p: CuDevicePtr = 0;
        // SAFETY: writes one CUdeviceptr through a valid pointer (at least one byte asked).
        self.check("cuMemAlloc_v2", unsafe { (self.t.mem_alloc)(&mut p, bytes.max(1)) })?;
        Ok(p)
    }

    unsafe fn free(&self, device: u32, ptr: u64) -> Result<()> {
        let _cur = super::enter(self, device)?;
        // SAFETY: `ptr` came from cuMemAlloc on this device and is freed once (our contract).
        self.check("cuMemFree_v2", unsafe { (self.t.mem_free)(ptr) })
    }

    fn host_alloc(&self, bytes: usize) -> Result<*mut u8> {
        let _cur = self.ensure_context()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer through a valid pointer; portable, not write-combined.
        self.check("cuMemHostAlloc", unsafe {
            (self.t.mem_host_alloc)(&mut p, bytes.max(1), CU_MEMHOSTALLOC_PORTABLE)
        })?;
        Ok(p.cast())
    }

    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()> {
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once (our contract).
        self.check("cuMemFreeHost", unsafe { (self.t.mem_free_host)(ptr.cast()) })
    }

    fn device_info(&self, device: u32) -> Result<DeviceInfo> {
        let dev = self.cu_device(device)?;
        let text = |f: Option<DeviceTextFn>, call: &str| -> Result<Option<String>> {
            // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into the buffer.
            f.map(|f| c_text(|buf, len| self.check(call, unsafe { f(buf, len, dev) }))).transpose()
        };
        let name = text(self.t.device_name, "cuDeviceGetName")?;
        let pci_bus_id = text(self.t.device_pci_bus_id, "cuDeviceGetPCIBusId")?.map(|b| b.to_ascii_lowercase());
        let memory_bytes = match self.t.device_total_mem {
            Some(f) => {
                let mut b: usize = 0;
                // SAFETY: writes one size_t through a valid pointer.
                self.check("cuDeviceTotalMem_v2", unsafe { f(&mut b, dev) })?;
                Some(b as u64)
            }
            None => None,
        };
        let dma_buf = self.t.device_get_attribute.and_then(|f| {
            let mut v: c_int = 0;
            // SAFETY: writes one int; an older driver answers CUDA_ERROR_INVALID_VALUE, which
            // means "cannot say".
            (unsafe { f(&mut v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) } == CUDA_SUCCESS).then_some(v != 0)
        });
        Ok(DeviceInfo { name, memory_bytes, pci_bus_id, dma_buf })
    }

    fn can_access_peer(&self, device: u32, peer: u32) -> Result<Option<bool>> {
        let (a, b) = (self.cu_device(device)?, self.cu_device(peer)?);
        let Some(f) = self.t.device_can_access_peer else { return Ok(None) };
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDeviceCanAccessPeer", unsafe { f(&mut v, a, b) })?;
        Ok(Some(v != 0))
    }

    unsafe fn host_register(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        let _cur = self.ensure_context()?;
        let Some((register, _)) = self.t.mem_host_register else {
            return Err(Error::Backend { code: -1, message: "this CUDA driver lacks cuMemHostRegister_v2".into() });
        };
        // SAFETY: the caller gives mapped host memory that stays mapped until unregistered.
        self.check("cuMemHostRegister_v2", unsafe { register(ptr.cast(), bytes, CU_MEMHOSTREGISTER_PORTABLE) })
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()> {
        let Some((_, unregister)) = self.t.mem_host_register else {
            return Err(Error::Backend { code: -1, message: "this CUDA driver lacks cuMemHostUnregister".into() });
        };
        // SAFETY: `ptr` was registered and nothing queued uses it (our contract).
        self.check("cuMemHostUnregister", unsafe { unregister(ptr.cast()) })
    }

    fn stream_create(&self, device: u32) -> Result<RawStream> {
        let _cur = super::enter(self, device)?;
        let mut s: Handle = std::ptr::null_mut();
        // SAFETY: writes one CUstream through a valid pointer.
        self.check("cuStreamCreate", unsafe { (self.t.stream_create)(&mut s, CU_STREAM_NON_BLOCKING) })?;
        Ok(RawStream(s))
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        // SAFETY: a stream from cuStreamCreate, destroyed once (our contract).
        self.check("cuStreamDestroy_v2", unsafe { (self.t.stream_destroy)(stream.0) })
    }

    fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        // SAFETY: a stream handle of this driver (or null: the current context's legacy
        // default stream).
        self.check("cuStreamSynchronize", unsafe { (self.t.stream_synchronize)(stream.0) })
    }

    unsafe fn copy_async(&self, dst: u64, src: u64, bytes: usize, kind: CopyKind, stream: RawStream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let (call, r) = match kind {
            CopyKind::HostToDevice => {
                // SAFETY: ranges valid for `bytes` of the kinds named, until the stream runs
                // the copy (our contract).
                let r = unsafe { (self.t.memcpy_htod_async)(dst, src as *const c_void, bytes, stream.0) };
                ("cuMemcpyHtoDAsync_v2", r)
            }
            CopyKind::DeviceToHost => {
                // SAFETY: as above.
                let r = unsafe { (self.t.memcpy_dtoh_async)(dst as *mut c_void, src, bytes, stream.0) };
                ("cuMemcpyDtoHAsync_v2", r)
            }
            CopyKind::DeviceToDevice => {
                // SAFETY: as above.
                let r = unsafe { (self.t.memcpy_dtod_async)(dst, src, bytes, stream.0) };
                ("cuMemcpyDtoDAsync_v2", r)
            }
        };
        self.check(call, r)
    }

    fn event_create(&self, device: u32) -> Result<RawEvent> {
        let _cur = super::enter(self, device)?;
        let mut e: Handle = std::ptr::null_mut();
        // SAFETY: writes one CUevent through a valid pointer.
        self.check("cuEventCreate", unsafe { (self.t.event_create)(&mut e, CU_EVENT_DISABLE_TIMING) })?;
        Ok(RawEvent(e))
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()> {
        // SAFETY: an event from cuEventCreate, destroyed once (our contract).
        self.check("cuEventDestroy_v2", unsafe { (self.t.event_destroy)(event.0) })
    }

    fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        // SAFETY: handles of this driver (the caller's stream is one by `Stream::from_raw`'s
        // contract).
        self.check("cuEventRecord", unsafe { (self.t.event_record)(event.0, stream.0) })
    }

    fn event_query(&self, event: RawEvent) -> Result<bool> {
        // SAFETY: an event of this driver.
        match unsafe { (self.t.event_query)(event.0) } {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            code => self.check("cuEventQuery", code).map(|()| true),
        }
    }

    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        // SAFETY: handles of this driver; flags must be 0.
        self.check("cuStreamWaitEvent", unsafe { (self.t.stream_wait_event)(stream.0, event.0, 0) })
    }
}
