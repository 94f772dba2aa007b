//! The HIP functions the engine calls, resolved by name from `libamdhip64.so` (or from any
//! lookup: tests build a table of fake functions).
//!
//! Signatures and constants are ROCm's `hip/hip_runtime_api.h` (ROCm/HIP, `include/hip/`;
//! the values below are the same in ROCm 5.x and 6.x except the memory types, see
//! [`HipMemoryType`](super::HipMemoryType)). `hipError_t`, `hipMemcpyKind` and the flags are
//! C enums or `#define`s of `int`/`unsigned` size.

// The whole set of hip_runtime_api.h values this file mirrors, also those the engine does not use
// (they are checked against the header, and tests use them).
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Arc;

use crate::xccl::dl::{resolve_fields, Opened, Resolver};

/// `hipError_t`.
pub(crate) type HipError = c_int;
/// `hipStream_t`, `hipEvent_t`: pointers to opaque structs.
pub(crate) type Handle = *mut c_void;

/// `hipSuccess`.
pub(crate) const HIP_SUCCESS: HipError = 0;
/// `hipErrorInvalidValue` (ROCm 5 answers it for pointers HIP does not know).
pub(crate) const HIP_ERROR_INVALID_VALUE: HipError = 1;
/// `hipErrorNoDevice`.
pub(crate) const HIP_ERROR_NO_DEVICE: HipError = 100;
/// `hipErrorNotReady`: `hipEventQuery` before the event fired.
pub(crate) const HIP_ERROR_NOT_READY: HipError = 600;
/// `hipHostMallocPortable`. The only flag we pass: not `hipHostMallocWriteCombined` (0x4).
pub(crate) const HIP_HOST_MALLOC_PORTABLE: c_uint = 0x1;
/// `hipHostRegisterPortable`: registered memory usable from every device.
pub(crate) const HIP_HOST_REGISTER_PORTABLE: c_uint = 0x1;
/// `hipHostMallocWriteCombined` (never passed; named for the test that checks so).
pub(crate) const HIP_HOST_MALLOC_WRITE_COMBINED: c_uint = 0x4;
/// `hipStreamNonBlocking`.
pub(crate) const HIP_STREAM_NON_BLOCKING: c_uint = 0x01;
/// `hipEventDisableTiming`.
pub(crate) const HIP_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `hipMemcpyHostToDevice`.
pub(crate) const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `hipMemcpyDeviceToHost`.
pub(crate) const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `hipMemcpyDeviceToDevice`.
pub(crate) const HIP_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// `hipPointerAttribute_t`: `{ hipMemoryType type; int device; void* devicePointer; void*
/// hostPointer; int isManaged; unsigned allocationFlags; }` (the first field is named
/// `memoryType` in ROCm 5 and `type` in 6; same place, same size).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct HipPointerAttribute {
    /// `hipMemoryType`, numbered per ROCm version (see `HipMemoryType`).
    pub(crate) memory_type: c_int,
    /// The device the memory belongs to.
    pub(crate) device: c_int,
    pub(crate) device_pointer: *mut c_void,
    pub(crate) host_pointer: *mut c_void,
    pub(crate) is_managed: c_int,
    pub(crate) allocation_flags: c_uint,
}

impl HipPointerAttribute {
    /// All zeros, to be filled by `hipPointerGetAttributes`.
    pub(crate) const fn zeroed() -> HipPointerAttribute {
        HipPointerAttribute {
            memory_type: 0,
            device: 0,
            device_pointer: std::ptr::null_mut(),
            host_pointer: std::ptr::null_mut(),
            is_managed: 0,
            allocation_flags: 0,
        }
    }
}

/// `hipError_t hipInit(unsigned int flags)`.
pub(crate) type InitFn = unsafe extern "C" fn(flags: c_uint) -> HipError;
/// `hipError_t hipRuntimeGetVersion(int*)`, `hipGetDeviceCount(int*)`.
pub(crate) type IntOutFn = unsafe extern "C" fn(out: *mut c_int) -> HipError;
/// `hipError_t hipSetDevice(int deviceId)`.
pub(crate) type SetDeviceFn = unsafe extern "C" fn(device: c_int) -> HipError;
/// `hipError_t hipMalloc(void** ptr, size_t size)`.
pub(crate) type MallocFn = unsafe extern "C" fn(ptr: *mut *mut c_void, size: usize) -> HipError;
/// `hipError_t hipFree(void* ptr)` and `hipHostFree(void* ptr)`.
pub(crate) type FreeFn = unsafe extern "C" fn(ptr: *mut c_void) -> HipError;
/// `hipError_t hipHostRegister(void* hostPtr, size_t sizeBytes, unsigned int flags)`.
pub(crate) type HostRegisterFn = unsafe extern "C" fn(ptr: *mut c_void, size: usize, flags: c_uint) -> HipError;
/// `hipError_t hipDeviceGetName(char* name, int len, hipDevice_t device)` and
/// `hipDeviceGetPCIBusId(char* pciBusId, int len, int device)`.
pub(crate) type DeviceTextFn = unsafe extern "C" fn(out: *mut c_char, len: c_int, device: c_int) -> HipError;
/// `hipError_t hipDeviceTotalMem(size_t* bytes, hipDevice_t device)`.
pub(crate) type DeviceTotalMemFn = unsafe extern "C" fn(bytes: *mut usize, device: c_int) -> HipError;
/// `hipError_t hipDeviceCanAccessPeer(int* canAccessPeer, int deviceId, int peerDeviceId)`.
pub(crate) type CanAccessPeerFn = unsafe extern "C" fn(out: *mut c_int, device: c_int, peer: c_int) -> HipError;
/// `hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags)`.
pub(crate) type HostMallocFn = unsafe extern "C" fn(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> HipError;
/// `hipError_t hipMemcpyAsync(void* dst, const void* src, size_t sizeBytes, hipMemcpyKind
/// kind, hipStream_t stream)`.
pub(crate) type MemcpyAsyncFn =
    unsafe extern "C" fn(dst: *mut c_void, src: *const c_void, bytes: usize, kind: c_int, s: Handle) -> HipError;
/// `hipError_t hipStreamCreateWithFlags(hipStream_t*, unsigned int flags)` and
/// `hipEventCreateWithFlags(hipEvent_t*, unsigned flags)`.
pub(crate) type CreateFn = unsafe extern "C" fn(out: *mut Handle, flags: c_uint) -> HipError;
/// `hipError_t hipStreamDestroy(hipStream_t)`, `hipStreamSynchronize`, `hipEventDestroy`,
/// `hipEventQuery`.
pub(crate) type HandleFn = unsafe extern "C" fn(h: Handle) -> HipError;
/// `hipError_t hipEventRecord(hipEvent_t, hipStream_t)`.
pub(crate) type EventRecordFn = unsafe extern "C" fn(e: Handle, s: Handle) -> HipError;
/// `hipError_t hipStreamWaitEvent(hipStream_t, hipEvent_t, unsigned int flags)`.
pub(crate) type StreamWaitEventFn = unsafe extern "C" fn(s: Handle, e: Handle, flags: c_uint) -> HipError;
/// `hipError_t hipPointerGetAttributes(hipPointerAttribute_t*, const void* ptr)`.
pub(crate) type PointerGetAttributesFn =
    unsafe extern "C" fn(attributes: *mut HipPointerAttribute, ptr: *const c_void) -> HipError;
/// `const char* hipGetErrorName(hipError_t)` and `hipGetErrorString`.
pub(crate) type ErrorTextFn = unsafe extern "C" fn(error: HipError) -> *const c_char;

/// The HIP functions (all present in every ROCm since 5.0).
#[derive(Clone)]
pub(crate) struct HipTable {
    pub(crate) init: InitFn,
    pub(crate) runtime_get_version: IntOutFn,
    pub(crate) get_device_count: IntOutFn,
    pub(crate) set_device: SetDeviceFn,
    pub(crate) malloc: MallocFn,
    pub(crate) free: FreeFn,
    pub(crate) host_malloc: HostMallocFn,
    pub(crate) host_free: FreeFn,
    pub(crate) memcpy_async: MemcpyAsyncFn,
    pub(crate) stream_create: CreateFn,
    pub(crate) stream_destroy: HandleFn,
    pub(crate) stream_synchronize: HandleFn,
    pub(crate) stream_wait_event: StreamWaitEventFn,
    pub(crate) event_create: CreateFn,
    pub(crate) event_destroy: HandleFn,
    pub(crate) event_record: EventRecordFn,
    pub(crate) event_query: HandleFn,
    pub(crate) pointer_get_attributes: PointerGetAttributesFn,
    pub(crate) get_error_name: ErrorTextFn,
    pub(crate) get_error_string: ErrorTextFn,
    /// `hipHostRegister` and `hipHostUnregister`, where the library has them (optional so a
    /// table of test functions may leave them out).
    pub(crate) host_register: Option<(HostRegisterFn, FreeFn)>,
    /// `hipGetDevice` (optional, as above): without it the caller's device is not restored
    /// after a call that sets one.
    pub(crate) get_device: Option<IntOutFn>,
    /// The device queries `oxccl info` asks (optional, as above): `hipDeviceGetName`,
    /// `hipDeviceTotalMem`, `hipDeviceGetPCIBusId`, `hipDeviceCanAccessPeer`.
    pub(crate) device_name: Option<DeviceTextFn>,
    pub(crate) device_total_mem: Option<DeviceTotalMemFn>,
    pub(crate) device_pci_bus_id: Option<DeviceTextFn>,
    pub(crate) device_can_access_peer: Option<CanAccessPeerFn>,
    /// The library the pointers point into (`None` for a table of test functions).
    pub(crate) library: Option<Arc<Opened>>,
}

impl HipTable {
    /// Resolves every function through `lookup`.
    ///
    /// # Errors
    /// `lacks hipInit, hipMalloc`: every function that is missing.
    ///
    /// # Safety
    /// Every non-null address `lookup` returns for a name is that function with the
    /// signature `hip_runtime_api.h` declares for it, callable as long as the table lives.
    pub(crate) unsafe fn resolve(lookup: &mut dyn FnMut(&CStr) -> Option<*mut c_void>) -> Result<HipTable, String> {
        let mut r = Resolver::new(lookup);
        // SAFETY: each name is resolved into the field whose type is that name's signature
        // in the header (see the aliases above); the addresses are our caller's promise.
        unsafe {
            resolve_fields!(r, HipTable;
                required {
                    init = c"hipInit",
                    runtime_get_version = c"hipRuntimeGetVersion",
                    get_device_count = c"hipGetDeviceCount",
                    set_device = c"hipSetDevice",
                    malloc = c"hipMalloc",
                    free = c"hipFree",
                    host_malloc = c"hipHostMalloc",
                    host_free = c"hipHostFree",
                    memcpy_async = c"hipMemcpyAsync",
                    stream_create = c"hipStreamCreateWithFlags",
                    stream_destroy = c"hipStreamDestroy",
                    stream_synchronize = c"hipStreamSynchronize",
                    stream_wait_event = c"hipStreamWaitEvent",
                    event_create = c"hipEventCreateWithFlags",
                    event_destroy = c"hipEventDestroy",
                    event_record = c"hipEventRecord",
                    event_query = c"hipEventQuery",
                    pointer_get_attributes = c"hipPointerGetAttributes",
                    get_error_name = c"hipGetErrorName",
                    get_error_string = c"hipGetErrorString",
                }
                optional {
                    host_register = r.optional(c"hipHostRegister").zip(r.optional(c"hipHostUnregister")),
                    get_device = r.optional(c"hipGetDevice"),
                    device_name = r.optional(c"hipDeviceGetName"),
                    device_total_mem = r.optional(c"hipDeviceTotalMem"),
                    device_pci_bus_id = r.optional(c"hipDeviceGetPCIBusId"),
                    device_can_access_peer = r.optional(c"hipDeviceCanAccessPeer"),
                }
            )
        }
    }

    /// The table of an opened library.
    ///
    /// # Errors
    /// The functions it lacks.
    pub(crate) fn from_library(library: Arc<Opened>) -> Result<HipTable, String> {
        // SAFETY: the library was opened as HIP, which exports these names with the header's
        // signatures; the table keeps the library loaded.
        let mut t = unsafe { HipTable::resolve(&mut |name| library.symbol(name)) }?;
        t.library = Some(library);
        Ok(t)
    }
}
