//! The CUDA driver functions the engine calls, resolved by name from `libcuda.so.1` (or from
//! any lookup: tests build a table of fake functions).
//!
//! Signatures and constants are `cuda.h`'s (the CUDA driver API; checked against the header
//! of CUDA 11.6, `#define CUDA_VERSION 11060`, whose declarations these are unchanged in
//! 12.x and 13.x). Where `cuda.h` maps a name to a versioned symbol (`#define cuMemAlloc
//! cuMemAlloc_v2`, `cuStreamDestroy_v2`, `cuEventDestroy_v2`, `cuDevicePrimaryCtxRelease_v2`,
//! `cuMemcpy*Async_v2`), the versioned symbol is the one resolved, as a program compiled
//! against the header would. The per-thread-default-stream variants (`_ptsz`) are not used:
//! a null stream is the legacy default stream, as in PyTorch.

// The whole set of cuda.h values this file mirrors, also those the engine does not use
// (they are checked against the header, and tests use them).
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Arc;

use crate::xccl::dl::{resolve_fields, Opened, Resolver};

/// `CUresult`.
pub(crate) type CuResult = c_int;
/// `CUdevice` (`typedef int CUdevice_v1`).
pub(crate) type CuDevice = c_int;
/// `CUdeviceptr` (`unsigned long long` on 64-bit targets).
pub(crate) type CuDevicePtr = u64;
/// `CUcontext`, `CUstream`, `CUevent`: pointers to opaque structs.
pub(crate) type Handle = *mut c_void;

/// `CUDA_SUCCESS`.
pub(crate) const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_INVALID_VALUE`: also what `cuPointerGetAttribute` answers for memory the
/// driver does not know (plain host memory).
pub(crate) const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
/// `CUDA_ERROR_NO_DEVICE`.
pub(crate) const CUDA_ERROR_NO_DEVICE: CuResult = 100;
/// `CUDA_ERROR_INVALID_DEVICE`.
pub(crate) const CUDA_ERROR_INVALID_DEVICE: CuResult = 101;
/// `CU_MEMHOSTREGISTER_PORTABLE`: registered memory usable from every context.
pub(crate) const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x01;
/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (CUDA 11.7+ drivers answer it).
pub(crate) const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;
/// `CUDA_ERROR_NOT_READY`: `cuEventQuery` before the event fired.
pub(crate) const CUDA_ERROR_NOT_READY: CuResult = 600;
/// `CU_MEMHOSTALLOC_PORTABLE`: pinned memory usable from every context. The only flag we
/// pass: not `CU_MEMHOSTALLOC_WRITECOMBINED` (0x04), which makes CPU reads slow.
pub(crate) const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
/// `CU_MEMHOSTALLOC_WRITECOMBINED` (never passed; named for the test that checks so).
pub(crate) const CU_MEMHOSTALLOC_WRITECOMBINED: c_uint = 0x04;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronization with the legacy default stream.
pub(crate) const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_EVENT_DISABLE_TIMING`: cheaper to record and query.
pub(crate) const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (answers a `CUmemorytype`, an `unsigned int`).
pub(crate) const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` (answers an `int`).
pub(crate) const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CU_MEMORYTYPE_HOST`.
pub(crate) const CU_MEMORYTYPE_HOST: c_uint = 0x01;
/// `CU_MEMORYTYPE_DEVICE`.
pub(crate) const CU_MEMORYTYPE_DEVICE: c_uint = 0x02;
/// `CU_MEMORYTYPE_ARRAY`.
pub(crate) const CU_MEMORYTYPE_ARRAY: c_uint = 0x03;
/// `CU_MEMORYTYPE_UNIFIED`.
pub(crate) const CU_MEMORYTYPE_UNIFIED: c_uint = 0x04;

/// `CUresult cuInit(unsigned int Flags)`.
pub(crate) type InitFn = unsafe extern "C" fn(flags: c_uint) -> CuResult;
/// `CUresult cuDriverGetVersion(int*)` and `cuDeviceGetCount(int*)`.
pub(crate) type IntOutFn = unsafe extern "C" fn(out: *mut c_int) -> CuResult;
/// `CUresult cuDeviceGet(CUdevice* device, int ordinal)`.
pub(crate) type DeviceGetFn = unsafe extern "C" fn(device: *mut CuDevice, ordinal: c_int) -> CuResult;
/// `CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev)`.
pub(crate) type PrimaryCtxRetainFn = unsafe extern "C" fn(ctx: *mut Handle, dev: CuDevice) -> CuResult;
/// `CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)`.
pub(crate) type PrimaryCtxReleaseFn = unsafe extern "C" fn(dev: CuDevice) -> CuResult;
/// `CUresult cuCtxSetCurrent(CUcontext)`, `cuStreamDestroy_v2(CUstream)`,
/// `cuStreamSynchronize(CUstream)`, `cuEventDestroy_v2(CUevent)`, `cuEventQuery(CUevent)`.
pub(crate) type HandleFn = unsafe extern "C" fn(h: Handle) -> CuResult;
/// `CUresult cuCtxGetCurrent(CUcontext* pctx)`.
pub(crate) type HandleOutFn = unsafe extern "C" fn(out: *mut Handle) -> CuResult;
/// `CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize)`.
pub(crate) type MemAllocFn = unsafe extern "C" fn(dptr: *mut CuDevicePtr, bytes: usize) -> CuResult;
/// `CUresult cuMemFree_v2(CUdeviceptr dptr)`.
pub(crate) type MemFreeFn = unsafe extern "C" fn(dptr: CuDevicePtr) -> CuResult;
/// `CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags)`.
pub(crate) type MemHostAllocFn = unsafe extern "C" fn(pp: *mut *mut c_void, bytes: usize, flags: c_uint) -> CuResult;
/// `CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags)`.
pub(crate) type MemHostRegisterFn = unsafe extern "C" fn(p: *mut c_void, bytes: usize, flags: c_uint) -> CuResult;
/// `CUresult cuDeviceGetName(char* name, int len, CUdevice dev)` and
/// `cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev)`.
pub(crate) type DeviceTextFn = unsafe extern "C" fn(out: *mut c_char, len: c_int, dev: CuDevice) -> CuResult;
/// `CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev)`.
pub(crate) type DeviceTotalMemFn = unsafe extern "C" fn(bytes: *mut usize, dev: CuDevice) -> CuResult;
/// `CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev)`.
pub(crate) type DeviceGetAttributeFn = unsafe extern "C" fn(out: *mut c_int, attrib: c_int, dev: CuDevice) -> CuResult;
/// `CUresult cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev)`.
pub(crate) type CanAccessPeerFn = unsafe extern "C" fn(out: *mut c_int, dev: CuDevice, peer: CuDevice) -> CuResult;
/// `CUresult cuMemFreeHost(void* p)` and `cuMemHostUnregister(void* p)`.
pub(crate) type MemFreeHostFn = unsafe extern "C" fn(p: *mut c_void) -> CuResult;
/// `CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t, CUstream)`.
pub(crate) type HtoDFn =
    unsafe extern "C" fn(dst: CuDevicePtr, src: *const c_void, bytes: usize, s: Handle) -> CuResult;
/// `CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t, CUstream)`.
pub(crate) type DtoHFn = unsafe extern "C" fn(dst: *mut c_void, src: CuDevicePtr, bytes: usize, s: Handle) -> CuResult;
/// `CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t, CUstream)`.
pub(crate) type DtoDFn = unsafe extern "C" fn(dst: CuDevicePtr, src: CuDevicePtr, bytes: usize, s: Handle) -> CuResult;
/// `CUresult cuStreamCreate(CUstream*, unsigned int Flags)` and
/// `cuEventCreate(CUevent*, unsigned int Flags)`.
pub(crate) type CreateFn = unsafe extern "C" fn(out: *mut Handle, flags: c_uint) -> CuResult;
/// `CUresult cuEventRecord(CUevent, CUstream)`.
pub(crate) type EventRecordFn = unsafe extern "C" fn(e: Handle, s: Handle) -> CuResult;
/// `CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned int Flags)`.
pub(crate) type StreamWaitEventFn = unsafe extern "C" fn(s: Handle, e: Handle, flags: c_uint) -> CuResult;
/// `CUresult cuPointerGetAttribute(void* data, CUpointer_attribute, CUdeviceptr ptr)`.
pub(crate) type PointerGetAttributeFn =
    unsafe extern "C" fn(data: *mut c_void, attribute: c_int, ptr: CuDevicePtr) -> CuResult;
/// `CUresult cuGetErrorName(CUresult, const char**)` and `cuGetErrorString`.
pub(crate) type ErrorTextFn = unsafe extern "C" fn(error: CuResult, text: *mut *const c_char) -> CuResult;

/// The driver functions (all required: every driver since CUDA 11 has them).
#[derive(Clone)]
pub(crate) struct CudaTable {
    pub(crate) init: InitFn,
    pub(crate) driver_get_version: IntOutFn,
    pub(crate) device_get_count: IntOutFn,
    pub(crate) device_get: DeviceGetFn,
    pub(crate) primary_ctx_retain: PrimaryCtxRetainFn,
    pub(crate) primary_ctx_release: PrimaryCtxReleaseFn,
    pub(crate) ctx_set_current: HandleFn,
    pub(crate) ctx_get_current: HandleOutFn,
    pub(crate) mem_alloc: MemAllocFn,
    pub(crate) mem_free: MemFreeFn,
    pub(crate) mem_host_alloc: MemHostAllocFn,
    pub(crate) mem_free_host: MemFreeHostFn,
    pub(crate) memcpy_htod_async: HtoDFn,
    pub(crate) memcpy_dtoh_async: DtoHFn,
    pub(crate) memcpy_dtod_async: DtoDFn,
    pub(crate) stream_create: CreateFn,
    pub(crate) stream_destroy: HandleFn,
    pub(crate) stream_synchronize: HandleFn,
    pub(crate) stream_wait_event: StreamWaitEventFn,
    pub(crate) event_create: CreateFn,
    pub(crate) event_destroy: HandleFn,
    pub(crate) event_record: EventRecordFn,
    pub(crate) event_query: HandleFn,
    pub(crate) pointer_get_attribute: PointerGetAttributeFn,
    pub(crate) get_error_name: ErrorTextFn,
    pub(crate) get_error_string: ErrorTextFn,
    /// `cuMemHostRegister_v2` and `cuMemHostUnregister`, where the driver has them (every
    /// driver since CUDA 4; optional so a table of test functions may leave them out).
    pub(crate) mem_host_register: Option<(MemHostRegisterFn, MemFreeHostFn)>,
    /// The device queries `oxccl info` asks (optional, as above): `cuDeviceGetName`,
    /// `cuDeviceTotalMem_v2`, `cuDeviceGetPCIBusId`, `cuDeviceGetAttribute`,
    /// `cuDeviceCanAccessPeer`.
    pub(crate) device_name: Option<DeviceTextFn>,
    pub(crate) device_total_mem: Option<DeviceTotalMemFn>,
    pub(crate) device_pci_bus_id: Option<DeviceTextFn>,
    pub(crate) device_get_attribute: Option<DeviceGetAttributeFn>,
    pub(crate) device_can_access_peer: Option<CanAccessPeerFn>,
    /// The library the pointers point into (`None` for a table of test functions).
    pub(crate) library: Option<Arc<Opened>>,
}

impl CudaTable {
    /// Resolves every function through `lookup`.
    ///
    /// # Errors
    /// `lacks cuInit, cuMemAlloc_v2`: every function that is missing.
    ///
    /// # Safety
    /// Every non-null address `lookup` returns for a name is that function with the
    /// signature `cuda.h` declares for it, callable as long as the table lives.
    pub(crate) unsafe fn resolve(lookup: &mut dyn FnMut(&CStr) -> Option<*mut c_void>) -> Result<CudaTable, String> {
        let mut r = Resolver::new(lookup);
        // SAFETY: each name is resolved into the field whose type is that name's signature
        // in cuda.h (see the aliases above); the addresses are our caller's promise.
        unsafe {
            resolve_fields!(r, CudaTable;
                required {
                    init = c"cuInit",
                    driver_get_version = c"cuDriverGetVersion",
                    device_get_count = c"cuDeviceGetCount",
                    device_get = c"cuDeviceGet",
                    primary_ctx_retain = c"cuDevicePrimaryCtxRetain",
                    primary_ctx_release = c"cuDevicePrimaryCtxRelease_v2",
                    ctx_set_current = c"cuCtxSetCurrent",
                    ctx_get_current = c"cuCtxGetCurrent",
                    mem_alloc = c"cuMemAlloc_v2",
                    mem_free = c"cuMemFree_v2",
                    mem_host_alloc = c"cuMemHostAlloc",
                    mem_free_host = c"cuMemFreeHost",
                    memcpy_htod_async = c"cuMemcpyHtoDAsync_v2",
                    memcpy_dtoh_async = c"cuMemcpyDtoHAsync_v2",
                    memcpy_dtod_async = c"cuMemcpyDtoDAsync_v2",
                    stream_create = c"cuStreamCreate",
                    stream_destroy = c"cuStreamDestroy_v2",
                    stream_synchronize = c"cuStreamSynchronize",
                    stream_wait_event = c"cuStreamWaitEvent",
                    event_create = c"cuEventCreate",
                    event_destroy = c"cuEventDestroy_v2",
                    event_record = c"cuEventRecord",
                    event_query = c"cuEventQuery",
                    pointer_get_attribute = c"cuPointerGetAttribute",
                    get_error_name = c"cuGetErrorName",
                    get_error_string = c"cuGetErrorString",
                }
                optional {
                    mem_host_register =
                        r.optional(c"cuMemHostRegister_v2").zip(r.optional(c"cuMemHostUnregister")),
                    device_name = r.optional(c"cuDeviceGetName"),
                    device_total_mem = r.optional(c"cuDeviceTotalMem_v2"),
                    device_pci_bus_id = r.optional(c"cuDeviceGetPCIBusId"),
                    device_get_attribute = r.optional(c"cuDeviceGetAttribute"),
                    device_can_access_peer = r.optional(c"cuDeviceCanAccessPeer"),
                }
            )
        }
    }

    /// The table of an opened library.
    ///
    /// # Errors
    /// The functions it lacks.
    pub(crate) fn from_library(library: Arc<Opened>) -> Result<CudaTable, String> {
        // SAFETY: the library was opened as the CUDA driver, which exports these names with
        // cuda.h's signatures; the table keeps the library loaded.
        let mut t = unsafe { CudaTable::resolve(&mut |name| library.symbol(name)) }?;
        t.library = Some(library);
        Ok(t)
    }
}
