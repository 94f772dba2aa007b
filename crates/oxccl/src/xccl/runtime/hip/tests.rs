//! The HIP runtime against a fake HIP (extern "C" functions keeping their state per test
//! thread), and the loader against libraries that are missing or are not HIP.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use super::table::*;
use super::*;

#[derive(Default)]
struct Fake {
    version: c_int,
    current: c_int,
    host_flags: Vec<c_uint>,
    registered: Vec<(usize, usize, c_uint)>,
    malloc_bytes: Vec<usize>,
    copies: Vec<c_int>,
    event_ready: bool,
    /// (result, memory type, device) of `hipPointerGetAttributes`.
    attr: (HipError, c_int, c_int),
}

thread_local! {
    static FAKE: RefCell<Fake> = RefCell::new(Fake { version: 60_032_830, ..Fake::default() });
}

fn with<R>(f: impl FnOnce(&mut Fake) -> R) -> R {
    FAKE.with(|x| f(&mut x.borrow_mut()))
}

unsafe extern "C" fn init(_: c_uint) -> HipError {
    HIP_SUCCESS
}
unsafe extern "C" fn version(out: *mut c_int) -> HipError {
    // SAFETY: a valid pointer.
    unsafe { *out = with(|f| f.version) };
    HIP_SUCCESS
}
unsafe extern "C" fn count(out: *mut c_int) -> HipError {
    // SAFETY: a valid pointer.
    unsafe { *out = 2 };
    HIP_SUCCESS
}
unsafe extern "C" fn set_device(d: c_int) -> HipError {
    if !(0..2).contains(&d) {
        return 101;
    }
    with(|f| f.current = d);
    HIP_SUCCESS
}
unsafe extern "C" fn malloc(p: *mut *mut c_void, bytes: usize) -> HipError {
    with(|f| f.malloc_bytes.push(bytes));
    // SAFETY: a valid pointer.
    unsafe { *p = 0xd000 as *mut c_void };
    HIP_SUCCESS
}
unsafe extern "C" fn free(_: *mut c_void) -> HipError {
    HIP_SUCCESS
}
unsafe extern "C" fn host_malloc(p: *mut *mut c_void, _: usize, flags: c_uint) -> HipError {
    with(|f| f.host_flags.push(flags));
    // SAFETY: a valid pointer.
    unsafe { *p = 0x5000 as *mut c_void };
    HIP_SUCCESS
}
unsafe extern "C" fn host_register(p: *mut c_void, bytes: usize, flags: c_uint) -> HipError {
    with(|f| f.registered.push((p as usize, bytes, flags)));
    0
}
unsafe extern "C" fn memcpy_async(_: *mut c_void, _: *const c_void, _: usize, kind: c_int, _: Handle) -> HipError {
    with(|f| f.copies.push(kind));
    HIP_SUCCESS
}
unsafe extern "C" fn create(out: *mut Handle, _: c_uint) -> HipError {
    // SAFETY: a valid pointer.
    unsafe { *out = 0x7000 as Handle };
    HIP_SUCCESS
}
unsafe extern "C" fn handle_ok(_: Handle) -> HipError {
    HIP_SUCCESS
}
unsafe extern "C" fn query(_: Handle) -> HipError {
    if with(|f| f.event_ready) {
        HIP_SUCCESS
    } else {
        HIP_ERROR_NOT_READY
    }
}
unsafe extern "C" fn record(_: Handle, _: Handle) -> HipError {
    HIP_SUCCESS
}
unsafe extern "C" fn wait(_: Handle, _: Handle, _: c_uint) -> HipError {
    HIP_SUCCESS
}
unsafe extern "C" fn attributes(a: *mut HipPointerAttribute, _: *const c_void) -> HipError {
    let (r, kind, device) = with(|f| f.attr);
    if r == HIP_SUCCESS {
        // SAFETY: a valid pointer to the struct.
        unsafe {
            (*a).memory_type = kind;
            (*a).device = device;
        }
    }
    r
}
unsafe extern "C" fn error_name(code: HipError) -> *const c_char {
    match code {
        2 => c"hipErrorOutOfMemory".as_ptr(),
        _ => std::ptr::null(),
    }
}
unsafe extern "C" fn error_string(code: HipError) -> *const c_char {
    match code {
        2 => c"out of memory".as_ptr(),
        _ => std::ptr::null(),
    }
}

fn fake(without: &[&str]) -> std::result::Result<HipTable, String> {
    let f: &[(&str, *mut c_void)] = &[
        ("hipInit", init as *mut c_void),
        ("hipRuntimeGetVersion", version as *mut c_void),
        ("hipGetDeviceCount", count as *mut c_void),
        ("hipSetDevice", set_device as *mut c_void),
        ("hipMalloc", malloc as *mut c_void),
        ("hipFree", free as *mut c_void),
        ("hipHostMalloc", host_malloc as *mut c_void),
        ("hipHostFree", free as *mut c_void),
        ("hipHostRegister", host_register as *mut c_void),
        ("hipHostUnregister", free as *mut c_void),
        ("hipMemcpyAsync", memcpy_async as *mut c_void),
        ("hipStreamCreateWithFlags", create as *mut c_void),
        ("hipStreamDestroy", handle_ok as *mut c_void),
        ("hipStreamSynchronize", handle_ok as *mut c_void),
        ("hipStreamWaitEvent", wait as *mut c_void),
        ("hipEventCreateWithFlags", create as *mut c_void),
        ("hipEventDestroy", handle_ok as *mut c_void),
        ("hipEventRecord", record as *mut c_void),
        ("hipEventQuery", query as *mut c_void),
        ("hipPointerGetAttributes", attributes as *mut c_void),
        ("hipGetErrorName", error_name as *mut c_void),
        ("hipGetErrorString", error_string as *mut c_void),
    ];
    let mut lookup = |name: &CStr| {
        let n = name.to_str().ok()?;
        if without.contains(&n) {
            return None;
        }
        f.iter().find(|(k, _)| *k == n).map(|(_, a)| *a)
    };
    // SAFETY: every address is a function above with the signature the header declares for
    // its name (the aliases in table.rs).
    unsafe { HipTable::resolve(&mut lookup) }
}

#[test]
fn the_struct_and_constants_match_the_header() {
    // hipPointerAttribute_t: int, int, void*, void*, int, unsigned -> 32 bytes on 64-bit.
    assert_eq!(std::mem::size_of::<HipPointerAttribute>(), 32);
    assert_eq!(std::mem::offset_of!(HipPointerAttribute, device_pointer), 8);
    assert_eq!(std::mem::offset_of!(HipPointerAttribute, allocation_flags), 28);
    assert_eq!((HIP_MEMCPY_HOST_TO_DEVICE, HIP_MEMCPY_DEVICE_TO_HOST, HIP_MEMCPY_DEVICE_TO_DEVICE), (1, 2, 3));
    assert_eq!((HIP_ERROR_NOT_READY, HIP_ERROR_NO_DEVICE), (600, 100));
}

#[test]
fn loading_reports_every_path_and_missing_symbols() {
    let cands = candidates(Some(Path::new("/nonexistent/rocm")));
    assert_eq!(cands[0].path, Path::new("/nonexistent/rocm/lib/libamdhip64.so"));
    let e = HipRuntime::load_from(&[cands[0].clone(), Candidate::new("libc.so.6", "not HIP")]).err().expect("none");
    let msg = e.to_string();
    assert!(matches!(e, Error::BackendUnavailable { ref backend, .. } if backend == "rccl"), "{msg}");
    assert!(msg.contains("/nonexistent/rocm/lib/libamdhip64.so") && msg.contains("lacks hipInit"), "{msg}");
    assert_eq!(fake(&["hipMalloc"]).err().as_deref(), Some("lacks hipMalloc"));
}

#[test]
fn devices_memory_copies_events_and_both_memory_type_numberings() {
    let rt = HipRuntime::from_table(fake(&[]).expect("table"), "/fake/libamdhip64.so").expect("runtime");
    assert!(rt.describe().starts_with("HIP 6.0.32830"), "{}", rt.describe());
    assert_eq!(rt.device_count().unwrap(), 2);
    rt.set_current(1).unwrap();
    assert_eq!(with(|f| f.current), 1);
    assert!(rt.set_current(7).is_err());
    assert_eq!(rt.alloc(0, 0).unwrap(), 0xd000);
    assert_eq!(with(|f| f.malloc_bytes.clone()), vec![1], "at least one byte");
    rt.host_alloc(10).unwrap();
    let flags = with(|f| f.host_flags.clone());
    assert!(flags == vec![HIP_HOST_MALLOC_PORTABLE] && flags[0] & HIP_HOST_MALLOC_WRITE_COMBINED == 0);
    // SAFETY: the fake only records the calls.
    unsafe {
        rt.host_register(0x7000 as *mut u8, 4096).unwrap();
        rt.host_unregister(0x7000 as *mut u8).unwrap();
    }
    assert_eq!(with(|f| f.registered.clone()), vec![(0x7000, 4096, HIP_HOST_REGISTER_PORTABLE)]);
    // SAFETY: made-up addresses the fake never dereferences.
    unsafe {
        rt.copy_async(1, 2, 8, CopyKind::HostToDevice, RawStream::DEFAULT).unwrap();
        rt.copy_async(1, 2, 8, CopyKind::DeviceToHost, RawStream::DEFAULT).unwrap();
        rt.copy_async(1, 2, 8, CopyKind::DeviceToDevice, RawStream::DEFAULT).unwrap();
        rt.copy_async(1, 2, 0, CopyKind::DeviceToDevice, RawStream::DEFAULT).unwrap();
    }
    assert_eq!(with(|f| f.copies.clone()), vec![1, 2, 3], "empty copies are skipped");
    let e = rt.event_create(0).unwrap();
    assert!(!rt.event_query(e).unwrap());
    with(|f| f.event_ready = true);
    assert!(rt.event_query(e).unwrap());
    // ROCm 6 numbering: 0 unregistered and 1 host are host memory, 2 device.
    let p = std::ptr::null::<c_void>();
    for (kind, want) in
        [(0, Residence::Host), (1, Residence::Host), (2, Residence::Device(1)), (3, Residence::Device(1))]
    {
        with(|f| f.attr = (HIP_SUCCESS, kind, 1));
        assert_eq!(rt.residence(p).unwrap(), want, "ROCm 6 type {kind}");
    }
    with(|f| f.attr = (HIP_ERROR_INVALID_VALUE, 0, 0));
    assert_eq!(rt.residence(p).unwrap(), Residence::Host);
    // ROCm 5 numbering: 0 host, 1 device.
    with(|f| f.version = 50_731_921);
    let rt5 = HipRuntime::from_table(fake(&[]).expect("table"), "/fake/libamdhip64.so.5").expect("runtime");
    for (kind, want) in [(0, Residence::Host), (1, Residence::Device(0)), (3, Residence::Device(0))] {
        with(|f| f.attr = (HIP_SUCCESS, kind, 0));
        assert_eq!(rt5.residence(p).unwrap(), want, "ROCm 5 type {kind}");
    }
    // Errors carry HIP's words.
    assert_eq!(
        rt.check("hipMalloc", 2).unwrap_err().to_string(),
        "backend error 2: hipMalloc: hipErrorOutOfMemory: out of memory"
    );
}
