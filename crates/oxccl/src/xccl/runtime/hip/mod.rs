//! The HIP runtime of the `rccl` backend (`libamdhip64.so`), through a table of our own
//! ([`table`]) loaded at run time, mirroring the CUDA one (`../cuda/`).
//!
//! HIP keeps the current device per thread (`hipSetDevice`), like the CUDA runtime API;
//! every call that names a device sets it first.
//!
//! # Pointer attributes across ROCm versions
//! `hipPointerGetAttributes` fills the same struct in ROCm 5 and 6, but the numbering of
//! its memory type changed: ROCm 5 has `hipMemoryTypeHost = 0, Device = 1, Array = 2,
//! Unified = 3`, ROCm 6 has `Unregistered = 0, Host = 1, Device = 2, Managed = 3, Array =
//! 10, Unified = 11` (ROCm/HIP `include/hip/hip_runtime_api.h`, 5.7 and 6.0). The runtime's
//! version (`hipRuntimeGetVersion`, `major * 10_000_000 + minor * 100_000 + patch`) picks
//! the numbering; ROCm 5 answers `hipErrorInvalidValue` for memory it does not know, ROCm 6
//! `Unregistered`: both mean host memory.

pub(crate) mod table;
#[cfg(test)]
mod tests;

use std::ffi::{c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::table::*;
use super::{c_text, CopyKind, DeviceInfo, DeviceRuntime, RawEvent, RawStream, Residence, Vendor};
use crate::error::{Error, Result};
use crate::xccl::dl::{Candidate, Opened};

/// The first HIP runtime version with ROCm 6's memory-type numbering.
const ROCM6: c_int = 60_000_000;

/// HIP, initialized.
pub(crate) struct HipRuntime {
    t: HipTable,
    path: PathBuf,
    /// `hipRuntimeGetVersion`.
    version: c_int,
}

/// Where HIP is looked for: `$ROCM_PATH/lib` (`/opt/rocm/lib` when unset), then the
/// loader's search path.
pub(crate) fn candidates(rocm_path: Option<&Path>) -> Vec<Candidate> {
    let (root, origin) = match rocm_path {
        Some(p) => (p.to_path_buf(), "$ROCM_PATH/lib"),
        None => (PathBuf::from("/opt/rocm"), "/opt/rocm/lib (ROCM_PATH unset)"),
    };
    vec![
        Candidate::new(root.join("lib").join("libamdhip64.so"), origin),
        Candidate::new("libamdhip64.so.6", "the loader's search path"),
        Candidate::new("libamdhip64.so.5", "the loader's search path"),
        Candidate::new("libamdhip64.so", "the loader's search path"),
    ]
}

/// Where memory with `attr`'s type lives, for a HIP runtime of `version`.
fn residence_of(attr: &HipPointerAttribute, version: c_int) -> Residence {
    let device = || Residence::Device(u32::try_from(attr.device).unwrap_or(0));
    if version >= ROCM6 {
        match attr.memory_type {
            0 | 1 => Residence::Host,
            _ => device(),
        }
    } else {
        match attr.memory_type {
            0 => Residence::Host,
            _ => device(),
        }
    }
}

impl HipRuntime {
    /// Loads and initializes HIP from the first candidate that works.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] (backend `rccl`) naming every path tried and why each
    /// failed.
    pub(crate) fn load(rocm_path: Option<PathBuf>) -> Result<HipRuntime> {
        Self::load_from(&candidates(rocm_path.as_deref()))
    }

    /// As [`load`](Self::load), from the given candidates.
    ///
    /// # Errors
    /// As for [`load`](Self::load).
    pub(crate) fn load_from(candidates: &[Candidate]) -> Result<HipRuntime> {
        Opened::first(candidates, |opened| {
            let lib = Arc::new(opened);
            let path = lib.path.clone();
            let table = HipTable::from_library(lib)?;
            HipRuntime::from_table(table, path).map_err(|e| e.to_string())
        })
        .map_err(|tried| Error::BackendUnavailable {
            backend: "rccl".into(),
            why: format!(
                "no usable HIP runtime; tried {tried}. To fix: install ROCm (it provides libamdhip64.so) and set \
                 ROCM_PATH, check that a GPU is visible (rocm-smi, HIP_VISIBLE_DEVICES)"
            ),
        })
    }

    /// A runtime over `table`: runs `hipInit(0)` and reads the runtime's version.
    ///
    /// # Errors
    /// [`Error::Backend`] with HIP's error when `hipInit` fails.
    pub(crate) fn from_table(table: HipTable, path: impl Into<PathBuf>) -> Result<HipRuntime> {
        let mut rt = HipRuntime { t: table, path: path.into(), version: 0 };
        // SAFETY: hipInit takes flags, which must be 0.
        rt.check("hipInit", unsafe { (rt.t.init)(0) })?;
        let mut version = 0;
        // SAFETY: writes one int through a valid pointer.
        rt.check("hipRuntimeGetVersion", unsafe { (rt.t.runtime_get_version)(&mut version) })?;
        rt.version = version;
        Ok(rt)
    }

    /// `Ok` for `hipSuccess`, else [`Error::Backend`] `"{call}: {name}: {description}"`.
    fn check(&self, call: &str, code: HipError) -> Result<()> {
        if code == HIP_SUCCESS {
            return Ok(());
        }
        let text = |f: ErrorTextFn| {
            // SAFETY: both calls take any code and return a static NUL-terminated string
            // (or null).
            let p = unsafe { f(code) };
            // SAFETY: non-null, static, NUL-terminated.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        let what = match (text(self.t.get_error_name), text(self.t.get_error_string)) {
            (Some(n), Some(s)) => format!("{n}: {s}"),
            (Some(n), None) => n,
            _ => format!("HIP error {code}"),
        };
        Err(Error::Backend { code: i64::from(code), message: format!("{call}: {what}") })
    }

    fn device_int(device: u32) -> Result<c_int> {
        c_int::try_from(device).map_err(|_| Error::invalid(format!("HIP device {device} is out of range")))
    }
}

impl DeviceRuntime for HipRuntime {
    fn vendor(&self) -> Vendor {
        Vendor::Hip
    }

    fn describe(&self) -> String {
        let v = self.version;
        format!("HIP {}.{}.{} ({})", v / 10_000_000, (v / 100_000) % 100, v % 100_000, self.path.display())
    }

    fn device_count(&self) -> Result<u32> {
        let mut n: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        match unsafe { (self.t.get_device_count)(&mut n) } {
            HIP_ERROR_NO_DEVICE => Ok(0),
            code => self.check("hipGetDeviceCount", code).map(|()| u32::try_from(n).unwrap_or(0)),
        }
    }

    fn set_current(&self, device: u32) -> Result<()> {
        // SAFETY: takes any int (an invalid one is an error).
        self.check("hipSetDevice", unsafe { (self.t.set_device)(Self::device_int(device)?) })
    }

    fn current_token(&self) -> Result<usize> {
        let Some(get) = self.t.get_device else { return Ok(usize::MAX) };
        let mut d: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("hipGetDevice", unsafe { get(&mut d) })?;
        Ok(usize::try_from(d).unwrap_or(0))
    }

    fn restore(&self, token: usize) -> Result<()> {
        // usize::MAX: the library cannot say, so nothing is restored.
        match u32::try_from(token) {
            Ok(d) if token != usize::MAX => self.set_current(d),
            _ => Ok(()),
        }
    }

    fn residence(&self, ptr: *const c_void) -> Result<Residence> {
        let mut attr = HipPointerAttribute::zeroed();
        // SAFETY: fills one hipPointerAttribute_t (our repr(C) copy of it) through a valid
        // pointer; any address may be asked about.
        match unsafe { (self.t.pointer_get_attributes)(&mut attr, ptr) } {
            HIP_ERROR_INVALID_VALUE => Ok(Residence::Host),
            code => self.check("hipPointerGetAttributes", code).map(|()| residence_of(&attr, self.version)),
        }
    }

    fn alloc(&self, device: u32, bytes: usize) -> Result<u64> {
        let _cur = super::enter(self, device)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer through a valid pointer (at least one byte asked).
        self.check("hipMalloc", unsafe { (self.t.malloc)(&mut p, bytes.max(1)) })?;
        Ok(p as u64)
    }

    unsafe fn free(&self, device: u32, ptr: u64) -> Result<()> {
        let _cur = super::enter(self, device)?;
        // SAFETY: `ptr` came from hipMalloc and is freed once (our contract).
        self.check("hipFree", unsafe { (self.t.free)(ptr as *mut c_void) })
    }

    fn host_alloc(&self, bytes: usize) -> Result<*mut u8> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer through a valid pointer; portable, not write-combined.
        self.check("hipHostMalloc", unsafe { (self.t.host_malloc)(&mut p, bytes.max(1), HIP_HOST_MALLOC_PORTABLE) })?;
        Ok(p.cast())
    }

    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()> {
        // SAFETY: `ptr` came from hipHostMalloc and is freed once (our contract).
        self.check("hipHostFree", unsafe { (self.t.host_free)(ptr.cast()) })
    }

    fn device_info(&self, device: u32) -> Result<DeviceInfo> {
        let dev =
            c_int::try_from(device).map_err(|_| Error::invalid(format!("HIP device {device} is out of range")))?;
        let text = |f: Option<DeviceTextFn>, call: &str| -> Result<Option<String>> {
            // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into the buffer.
            f.map(|f| c_text(|buf, len| self.check(call, unsafe { f(buf, len, dev) }))).transpose()
        };
        let name = text(self.t.device_name, "hipDeviceGetName")?;
        let pci_bus_id = text(self.t.device_pci_bus_id, "hipDeviceGetPCIBusId")?.map(|b| b.to_ascii_lowercase());
        let memory_bytes = match self.t.device_total_mem {
            Some(f) => {
                let mut b: usize = 0;
                // SAFETY: writes one size_t through a valid pointer.
                self.check("hipDeviceTotalMem", unsafe { f(&mut b, dev) })?;
                Some(b as u64)
            }
            None => None,
        };
        Ok(DeviceInfo { name, memory_bytes, pci_bus_id, dma_buf: None })
    }

    fn can_access_peer(&self, device: u32, peer: u32) -> Result<Option<bool>> {
        let ord = |d: u32| c_int::try_from(d).map_err(|_| Error::invalid(format!("HIP device {d} is out of range")));
        let (a, b) = (ord(device)?, ord(peer)?);
        let Some(f) = self.t.device_can_access_peer else { return Ok(None) };
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("hipDeviceCanAccessPeer", unsafe { f(&mut v, a, b) })?;
        Ok(Some(v != 0))
    }

    unsafe fn host_register(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        let Some((register, _)) = self.t.host_register else {
            return Err(Error::Backend { code: -1, message: "this HIP runtime lacks hipHostRegister".into() });
        };
        // SAFETY: the caller gives mapped host memory that stays mapped until unregistered.
        self.check("hipHostRegister", unsafe { register(ptr.cast(), bytes, HIP_HOST_REGISTER_PORTABLE) })
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()> {
        let Some((_, unregister)) = self.t.host_register else {
            return Err(Error::Backend { code: -1, message: "this HIP runtime lacks hipHostUnregister".into() });
        };
        // SAFETY: `ptr` was registered and nothing queued uses it (our contract).
        self.check("hipHostUnregister", unsafe { unregister(ptr.cast()) })
    }

    fn stream_create(&self, device: u32) -> Result<RawStream> {
        let _cur = super::enter(self, device)?;
        let mut s: Handle = std::ptr::null_mut();
        // SAFETY: writes one hipStream_t through a valid pointer.
        self.check("hipStreamCreateWithFlags", unsafe { (self.t.stream_create)(&mut s, HIP_STREAM_NON_BLOCKING) })?;
        Ok(RawStream(s))
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        // SAFETY: a stream of this runtime, destroyed once (our contract).
        self.check("hipStreamDestroy", unsafe { (self.t.stream_destroy)(stream.0) })
    }

    fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        // SAFETY: a stream of this runtime, or null (the current device's default stream).
        self.check("hipStreamSynchronize", unsafe { (self.t.stream_synchronize)(stream.0) })
    }

    unsafe fn copy_async(&self, dst: u64, src: u64, bytes: usize, kind: CopyKind, stream: RawStream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let kind = match kind {
            CopyKind::HostToDevice => HIP_MEMCPY_HOST_TO_DEVICE,
            CopyKind::DeviceToHost => HIP_MEMCPY_DEVICE_TO_HOST,
            CopyKind::DeviceToDevice => HIP_MEMCPY_DEVICE_TO_DEVICE,
        };
        // SAFETY: ranges valid for `bytes` of the kinds named until the stream runs the copy
        // (our contract).
        self.check("hipMemcpyAsync", unsafe {
            (self.t.memcpy_async)(dst as *mut c_void, src as *const c_void, bytes, kind, stream.0)
        })
    }

    fn event_create(&self, device: u32) -> Result<RawEvent> {
        let _cur = super::enter(self, device)?;
        let mut e: Handle = std::ptr::null_mut();
        // SAFETY: writes one hipEvent_t through a valid pointer.
        self.check("hipEventCreateWithFlags", unsafe { (self.t.event_create)(&mut e, HIP_EVENT_DISABLE_TIMING) })?;
        Ok(RawEvent(e))
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()> {
        // SAFETY: an event of this runtime, destroyed once (our contract).
        self.check("hipEventDestroy", unsafe { (self.t.event_destroy)(event.0) })
    }

    fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        // SAFETY: handles of this runtime.
        self.check("hipEventRecord", unsafe { (self.t.event_record)(event.0, stream.0) })
    }

    fn event_query(&self, event: RawEvent) -> Result<bool> {
        // SAFETY: an event of this runtime.
        match unsafe { (self.t.event_query)(event.0) } {
            HIP_SUCCESS => Ok(true),
            HIP_ERROR_NOT_READY => Ok(false),
            code => self.check("hipEventQuery", code).map(|()| true),
        }
    }

    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        // SAFETY: handles of this runtime; flags must be 0.
        self.check("hipStreamWaitEvent", unsafe { (self.t.stream_wait_event)(stream.0, event.0, 0) })
    }
}
