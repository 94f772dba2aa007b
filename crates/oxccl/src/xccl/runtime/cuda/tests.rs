//! The CUDA runtime against a fake driver (extern "C" functions keeping their state per test
//! thread), and the loader against libraries that are missing or are not the driver.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use super::table::*;
use super::*;

#[derive(Default)]
struct Fake {
    init: CuResult,
    retains: Vec<CuDevice>,
    current: usize,
    host_flags: Vec<c_uint>,
    registered: Vec<(usize, usize, c_uint)>,
    alloc_bytes: Vec<usize>,
    event_ready: bool,
    /// The memory type `cuPointerGetAttribute` reports, or None for INVALID_VALUE.
    kind: Option<c_uint>,
    ordinal: c_int,
    devices: c_int,
}

thread_local! {
    static FAKE: RefCell<Fake> = RefCell::new(Fake { devices: 2, ..Fake::default() });
}

fn with<R>(f: impl FnOnce(&mut Fake) -> R) -> R {
    FAKE.with(|x| f(&mut x.borrow_mut()))
}

unsafe extern "C" fn init(_: c_uint) -> CuResult {
    with(|f| f.init)
}
unsafe extern "C" fn version(out: *mut c_int) -> CuResult {
    // SAFETY: the runtime passes a valid pointer.
    unsafe { *out = 13000 };
    CUDA_SUCCESS
}
unsafe extern "C" fn count(out: *mut c_int) -> CuResult {
    let n = with(|f| f.devices);
    if n == 0 {
        return CUDA_ERROR_NO_DEVICE;
    }
    // SAFETY: a valid pointer.
    unsafe { *out = n };
    CUDA_SUCCESS
}
unsafe extern "C" fn device_get(out: *mut CuDevice, ordinal: c_int) -> CuResult {
    if ordinal >= with(|f| f.devices) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    // SAFETY: a valid pointer.
    unsafe { *out = ordinal };
    CUDA_SUCCESS
}
unsafe extern "C" fn retain(ctx: *mut Handle, dev: CuDevice) -> CuResult {
    with(|f| f.retains.push(dev));
    // SAFETY: a valid pointer; a made-up non-null context per device.
    unsafe { *ctx = (0x1000 + dev as usize) as Handle };
    CUDA_SUCCESS
}
unsafe extern "C" fn release(_: CuDevice) -> CuResult {
    CUDA_SUCCESS
}
unsafe extern "C" fn set_current(ctx: Handle) -> CuResult {
    with(|f| f.current = ctx as usize);
    CUDA_SUCCESS
}
unsafe extern "C" fn get_current(out: *mut Handle) -> CuResult {
    // SAFETY: a valid pointer.
    unsafe { *out = with(|f| f.current) as Handle };
    CUDA_SUCCESS
}
unsafe extern "C" fn mem_alloc(p: *mut CuDevicePtr, bytes: usize) -> CuResult {
    with(|f| f.alloc_bytes.push(bytes));
    // SAFETY: a valid pointer.
    unsafe { *p = 0xd000 };
    CUDA_SUCCESS
}
unsafe extern "C" fn mem_free(_: CuDevicePtr) -> CuResult {
    CUDA_SUCCESS
}
unsafe extern "C" fn host_alloc(p: *mut *mut c_void, _: usize, flags: c_uint) -> CuResult {
    with(|f| f.host_flags.push(flags));
    // SAFETY: a valid pointer.
    unsafe { *p = 0x5000 as *mut c_void };
    CUDA_SUCCESS
}
unsafe extern "C" fn free_host(_: *mut c_void) -> CuResult {
    CUDA_SUCCESS
}
unsafe extern "C" fn device_name(out: *mut c_char, len: c_int, dev: CuDevice) -> CuResult {
    let name = format!("Fake GPU {dev}\0");
    // SAFETY: the runtime passes a buffer of `len` bytes; the name is shorter.
    unsafe { std::ptr::copy_nonoverlapping(name.as_ptr().cast::<c_char>(), out, name.len().min(len as usize)) };
    CUDA_SUCCESS
}
unsafe extern "C" fn pci_bus_id(out: *mut c_char, len: c_int, dev: CuDevice) -> CuResult {
    let id = format!("0000:3B:0{dev}.0\0");
    // SAFETY: as above.
    unsafe { std::ptr::copy_nonoverlapping(id.as_ptr().cast::<c_char>(), out, id.len().min(len as usize)) };
    CUDA_SUCCESS
}
unsafe extern "C" fn total_mem(bytes: *mut usize, _: CuDevice) -> CuResult {
    // SAFETY: a valid pointer.
    unsafe { *bytes = 80 << 30 };
    CUDA_SUCCESS
}
unsafe extern "C" fn device_attribute(out: *mut c_int, attrib: c_int, dev: CuDevice) -> CuResult {
    if attrib != CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED || dev == 1 {
        return CUDA_ERROR_INVALID_VALUE; // an older driver for device 1: cannot say
    }
    // SAFETY: a valid pointer.
    unsafe { *out = 1 };
    CUDA_SUCCESS
}
unsafe extern "C" fn can_access_peer(out: *mut c_int, a: CuDevice, b: CuDevice) -> CuResult {
    // SAFETY: a valid pointer.
    unsafe { *out = c_int::from(a == 0 && b == 1) };
    CUDA_SUCCESS
}
unsafe extern "C" fn host_register(p: *mut c_void, bytes: usize, flags: c_uint) -> CuResult {
    with(|f| f.registered.push((p as usize, bytes, flags)));
    CUDA_SUCCESS
}
unsafe extern "C" fn htod(_: CuDevicePtr, _: *const c_void, _: usize, _: Handle) -> CuResult {
    CUDA_SUCCESS
}
unsafe extern "C" fn dtoh(_: *mut c_void, _: CuDevicePtr, _: usize, _: Handle) -> CuResult {
    CUDA_SUCCESS
}
unsafe extern "C" fn dtod(_: CuDevicePtr, _: CuDevicePtr, _: usize, _: Handle) -> CuResult {
    CUDA_SUCCESS
}
unsafe extern "C" fn create(out: *mut Handle, _: c_uint) -> CuResult {
    // SAFETY: a valid pointer.
    unsafe { *out = 0x7000 as Handle };
    CUDA_SUCCESS
}
unsafe extern "C" fn handle_ok(_: Handle) -> CuResult {
    CUDA_SUCCESS
}
unsafe extern "C" fn query(_: Handle) -> CuResult {
    if with(|f| f.event_ready) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_NOT_READY
    }
}
unsafe extern "C" fn record(_: Handle, _: Handle) -> CuResult {
    CUDA_SUCCESS
}
unsafe extern "C" fn wait(_: Handle, _: Handle, _: c_uint) -> CuResult {
    CUDA_SUCCESS
}
unsafe extern "C" fn attribute(data: *mut c_void, attr: c_int, _: CuDevicePtr) -> CuResult {
    let (kind, ordinal) = with(|f| (f.kind, f.ordinal));
    let Some(kind) = kind else { return CUDA_ERROR_INVALID_VALUE };
    // SAFETY: the runtime passes a pointer to the attribute's type.
    unsafe {
        match attr {
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE => *data.cast::<c_uint>() = kind,
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => *data.cast::<c_int>() = ordinal,
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
    }
    CUDA_SUCCESS
}
unsafe extern "C" fn error_name(code: CuResult, out: *mut *const c_char) -> CuResult {
    let s: &'static CStr = match code {
        100 => c"CUDA_ERROR_NO_DEVICE",
        2 => c"CUDA_ERROR_OUT_OF_MEMORY",
        _ => return CUDA_ERROR_INVALID_VALUE,
    };
    // SAFETY: a valid pointer; a static string.
    unsafe { *out = s.as_ptr() };
    CUDA_SUCCESS
}
unsafe extern "C" fn error_string(code: CuResult, out: *mut *const c_char) -> CuResult {
    let s: &'static CStr = match code {
        100 => c"no CUDA-capable device is detected",
        2 => c"out of memory",
        _ => return CUDA_ERROR_INVALID_VALUE,
    };
    // SAFETY: a valid pointer; a static string.
    unsafe { *out = s.as_ptr() };
    CUDA_SUCCESS
}

/// The fake driver's functions by name, leaving out `without`.
fn fake(without: &[&str]) -> std::result::Result<CudaTable, String> {
    let f: &[(&str, *mut c_void)] = &[
        ("cuInit", init as *mut c_void),
        ("cuDriverGetVersion", version as *mut c_void),
        ("cuDeviceGetCount", count as *mut c_void),
        ("cuDeviceGet", device_get as *mut c_void),
        ("cuDevicePrimaryCtxRetain", retain as *mut c_void),
        ("cuDevicePrimaryCtxRelease_v2", release as *mut c_void),
        ("cuCtxSetCurrent", set_current as *mut c_void),
        ("cuCtxGetCurrent", get_current as *mut c_void),
        ("cuMemAlloc_v2", mem_alloc as *mut c_void),
        ("cuMemFree_v2", mem_free as *mut c_void),
        ("cuMemHostAlloc", host_alloc as *mut c_void),
        ("cuMemFreeHost", free_host as *mut c_void),
        ("cuMemHostRegister_v2", host_register as *mut c_void),
        ("cuMemHostUnregister", free_host as *mut c_void),
        ("cuDeviceGetName", device_name as *mut c_void),
        ("cuDeviceGetPCIBusId", pci_bus_id as *mut c_void),
        ("cuDeviceTotalMem_v2", total_mem as *mut c_void),
        ("cuDeviceGetAttribute", device_attribute as *mut c_void),
        ("cuDeviceCanAccessPeer", can_access_peer as *mut c_void),
        ("cuMemcpyHtoDAsync_v2", htod as *mut c_void),
        ("cuMemcpyDtoHAsync_v2", dtoh as *mut c_void),
        ("cuMemcpyDtoDAsync_v2", dtod as *mut c_void),
        ("cuStreamCreate", create as *mut c_void),
        ("cuStreamDestroy_v2", handle_ok as *mut c_void),
        ("cuStreamSynchronize", handle_ok as *mut c_void),
        ("cuStreamWaitEvent", wait as *mut c_void),
        ("cuEventCreate", create as *mut c_void),
        ("cuEventDestroy_v2", handle_ok as *mut c_void),
        ("cuEventRecord", record as *mut c_void),
        ("cuEventQuery", query as *mut c_void),
        ("cuPointerGetAttribute", attribute as *mut c_void),
        ("cuGetErrorName", error_name as *mut c_void),
        ("cuGetErrorString", error_string as *mut c_void),
    ];
    let mut lookup = |name: &CStr| {
        let n = name.to_str().ok()?;
        if without.contains(&n) {
            return None;
        }
        f.iter().find(|(k, _)| *k == n).map(|(_, a)| *a)
    };
    // SAFETY: every address is a function above with the signature cuda.h declares for its
    // name (the aliases in table.rs).
    unsafe { CudaTable::resolve(&mut lookup) }
}

#[test]
fn missing_libraries_and_symbols_are_backend_unavailable_naming_every_path() {
    let e = CudaRuntime::load_from(&[
        Candidate::new("/nonexistent/libcuda.so.1", "test"),
        Candidate::new("libc.so.6", "not the driver"),
    ])
    .err()
    .expect("nothing usable");
    let msg = e.to_string();
    assert!(matches!(e, Error::BackendUnavailable { ref backend, .. } if backend == "nccl"), "{msg}");
    assert!(msg.contains("/nonexistent/libcuda.so.1") && msg.contains("libc.so.6"), "{msg}");
    assert!(msg.contains("lacks cuInit"), "{msg}");
    let e = fake(&["cuMemAlloc_v2", "cuEventQuery"]).err().expect("lacks two");
    assert_eq!(e, "lacks cuMemAlloc_v2, cuEventQuery");
}

#[test]
fn a_failing_cuinit_is_reported_with_the_drivers_words() {
    with(|f| f.init = CUDA_ERROR_NO_DEVICE);
    let e = CudaRuntime::from_table(fake(&[]).expect("table"), "fake").err().expect("cuInit fails");
    with(|f| f.init = CUDA_SUCCESS);
    assert_eq!(e.to_string(), "backend error 100: cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected");
}

#[test]
fn contexts_allocations_events_and_pointers() {
    let rt = CudaRuntime::from_table(fake(&[]).expect("table"), "/fake/libcuda.so.1").expect("runtime");
    assert!(rt.describe().contains("13.0") && rt.describe().contains("/fake/libcuda.so.1"), "{}", rt.describe());
    assert_eq!(rt.device_count().unwrap(), 2);
    // Each device's primary context is retained once, however often it is made current.
    rt.set_current(1).unwrap();
    rt.set_current(1).unwrap();
    rt.set_current(0).unwrap();
    assert_eq!(with(|f| f.retains.clone()), vec![1, 0]);
    assert!(rt.set_current(5).is_err());
    // At least one byte is allocated; pinned memory is portable, never write-combined.
    assert_eq!(rt.alloc(0, 0).unwrap(), 0xd000);
    assert_eq!(with(|f| f.alloc_bytes.clone()), vec![1]);
    let p = rt.host_alloc(64).unwrap();
    let flags = with(|f| f.host_flags.clone());
    assert_eq!(flags, vec![CU_MEMHOSTALLOC_PORTABLE]);
    assert!(flags.iter().all(|f| f & CU_MEMHOSTALLOC_WRITECOMBINED == 0));
    // SAFETY: from host_alloc, freed once.
    unsafe { rt.host_free(p).unwrap() };
    // Host memory is registered portable (for the pinned pool), and unregistered.
    // SAFETY: the fake driver only records the call.
    unsafe {
        rt.host_register(0x7000 as *mut u8, 8192).unwrap();
        rt.host_unregister(0x7000 as *mut u8).unwrap();
    }
    assert_eq!(with(|f| f.registered.clone()), vec![(0x7000, 8192, CU_MEMHOSTREGISTER_PORTABLE)]);
    // A driver without the calls (they are optional) says so.
    let bare = CudaRuntime::from_table(fake(&["cuMemHostRegister_v2"]).expect("table"), "/fake").expect("runtime");
    // SAFETY: refused before any call.
    let e = unsafe { bare.host_register(0x7000 as *mut u8, 8192) }.unwrap_err();
    assert!(e.to_string().contains("lacks cuMemHostRegister_v2"), "{e}");
    // Device facts for `oxccl info`; a driver that cannot answer dma-buf says nothing.
    let d0 = rt.device_info(0).unwrap();
    assert_eq!(
        (d0.name.as_deref(), d0.memory_bytes, d0.pci_bus_id.as_deref(), d0.dma_buf),
        (Some("Fake GPU 0"), Some(80 << 30), Some("0000:3b:00.0"), Some(true))
    );
    assert_eq!(rt.device_info(1).unwrap().dma_buf, None);
    assert_eq!((rt.can_access_peer(0, 1).unwrap(), rt.can_access_peer(1, 0).unwrap()), (Some(true), Some(false)));
    let d = bare.device_info(0).unwrap();
    assert_eq!(d.name.as_deref(), Some("Fake GPU 0"), "the queries are there in `bare`");
    let none = CudaRuntime::from_table(fake(&["cuDeviceGetName", "cuDeviceCanAccessPeer"]).unwrap(), "/f").unwrap();
    assert_eq!((none.device_info(0).unwrap().name, none.can_access_peer(0, 1).unwrap()), (None, None));
    // Events: not ready, then ready.
    let e = rt.event_create(0).unwrap();
    assert!(!rt.event_query(e).unwrap());
    with(|f| f.event_ready = true);
    assert!(rt.event_query(e).unwrap());
    // Pointers: unknown to the driver is host memory; device memory names its ordinal.
    let x = 0u8;
    assert_eq!(rt.residence(&x as *const u8 as *const c_void).unwrap(), Residence::Host);
    with(|f| (f.kind, f.ordinal) = (Some(CU_MEMORYTYPE_DEVICE), 1));
    assert_eq!(rt.residence(0xd000 as *const c_void).unwrap(), Residence::Device(1));
    with(|f| f.kind = Some(CU_MEMORYTYPE_HOST));
    assert_eq!(rt.residence(0x5000 as *const c_void).unwrap(), Residence::Host);
    with(|f| f.devices = 0);
    assert_eq!(rt.device_count().unwrap(), 0, "CUDA_ERROR_NO_DEVICE counts as none");
}
