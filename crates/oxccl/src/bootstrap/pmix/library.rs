//! The C ABI of PMIx that [`super::Pmix`] uses, and the table of `PMIx_*` functions loaded
//! from `libpmix` with `dlopen` at run time.
//!
//! Every type, constant and signature here is OpenPMIx 4.2's (`pmix_common.h`, `pmix.h` of
//! Debian 12's `libpmix-dev` 4.2.2); the layouts were also measured with a C program against
//! those headers (`sizeof`, `offsetof`) and are asserted below. PMIx 3's headers declare the
//! same layouts for what we use (the value union's largest member, `pmix_envar_t`, exists
//! since 3.0), and a PMIx 3 library is accepted: its only difference that matters here is
//! that it does not export `PMIx_Value_destruct`, which is then done by hand for the value
//! types we read (see [`Library::release`]).
//!
//! The library is opened `RTLD_NOW | RTLD_GLOBAL` (PMIx loads plugins of its own, which
//! may expect its symbols to be global) and never closed: PMIx keeps a progress thread and
//! callbacks into its own code for as long as the process lives. This is our own small
//! `dlopen` code: the bootstrap is below the backends and may not use theirs.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `pmix_status_t` (`typedef int`).
pub(crate) type Status = c_int;
/// `pmix_rank_t` (`typedef uint32_t`).
pub(crate) type Rank = u32;
/// `pmix_data_type_t` (`typedef uint16_t`).
pub(crate) type DataType = u16;
/// `pmix_scope_t` (`typedef uint8_t`).
pub(crate) type Scope = u8;

/// `PMIX_MAX_NSLEN`: a namespace is at most this many bytes (plus its NUL).
pub(crate) const MAX_NSLEN: usize = 255;
/// `PMIX_MAX_KEYLEN`: a key is at most this many bytes (plus its NUL).
pub(crate) const MAX_KEYLEN: usize = 511;

/// `PMIX_SUCCESS`.
pub(crate) const SUCCESS: Status = 0;
/// `PMIX_ERR_TIMEOUT`: a `PMIX_TIMEOUT` expired.
pub(crate) const ERR_TIMEOUT: Status = -24;
/// `PMIX_ERR_NOT_FOUND`: the key is not there.
pub(crate) const ERR_NOT_FOUND: Status = -46;
/// `PMIX_ERR_PARTIAL_SUCCESS`: what ORTE answers a fence that a process of the job left
/// (it exited) before reaching it.
pub(crate) const ERR_PARTIAL_SUCCESS: Status = -52;

/// `PMIX_RANK_UNDEF` (`UINT32_MAX`).
pub(crate) const RANK_UNDEF: Rank = u32::MAX;
/// `PMIX_RANK_WILDCARD` (`UINT32_MAX-1`): every process of a namespace; job-level
/// information is stored under it.
pub(crate) const RANK_WILDCARD: Rank = u32::MAX - 1;

/// `PMIX_GLOBAL`: share with every process, on this node and the others.
pub(crate) const GLOBAL: Scope = 3;

/// `PMIX_UNDEF`.
pub(crate) const UNDEF: DataType = 0;
/// `PMIX_BOOL` (`bool flag`).
pub(crate) const BOOL: DataType = 1;
/// `PMIX_BYTE` (`uint8_t byte`).
pub(crate) const BYTE: DataType = 2;
/// `PMIX_STRING` (`char *string`, NUL-terminated).
pub(crate) const STRING: DataType = 3;
/// `PMIX_SIZE` (`size_t size`).
pub(crate) const SIZE: DataType = 4;
/// `PMIX_INT` (`int integer`).
pub(crate) const INT: DataType = 6;
/// `PMIX_INT8`.
pub(crate) const INT8: DataType = 7;
/// `PMIX_INT16`.
pub(crate) const INT16: DataType = 8;
/// `PMIX_INT32`.
pub(crate) const INT32: DataType = 9;
/// `PMIX_INT64`.
pub(crate) const INT64: DataType = 10;
/// `PMIX_UINT` (`unsigned int uint`).
pub(crate) const UINT: DataType = 11;
/// `PMIX_UINT8`.
pub(crate) const UINT8: DataType = 12;
/// `PMIX_UINT16`.
pub(crate) const UINT16: DataType = 13;
/// `PMIX_UINT32`.
pub(crate) const UINT32: DataType = 14;
/// `PMIX_UINT64`.
pub(crate) const UINT64: DataType = 15;
/// `PMIX_BYTE_OBJECT` (`pmix_byte_object_t bo`).
pub(crate) const BYTE_OBJECT: DataType = 27;
/// `PMIX_PROC_RANK` (`pmix_rank_t rank`).
pub(crate) const PROC_RANK: DataType = 40;

/// `PMIX_TIMEOUT` (`int`, seconds; 0 is infinite).
pub(crate) const ATTR_TIMEOUT: &CStr = c"pmix.timeout";
/// `PMIX_IMMEDIATE` (`bool`): answer from what the local server holds now, without asking
/// the host (no wait, no direct modex from another node).
pub(crate) const ATTR_IMMEDIATE: &CStr = c"pmix.immediate";
/// `PMIX_COLLECT_DATA` (`bool`): a fence that brings every process's data along.
pub(crate) const ATTR_COLLECT_DATA: &CStr = c"pmix.collect";
/// `PMIX_JOB_SIZE` (`uint32_t`, job level): processes in the job.
pub(crate) const KEY_JOB_SIZE: &CStr = c"pmix.job.size";
/// `PMIX_LOCAL_SIZE` (`uint32_t`, job level): processes of the job on this node.
pub(crate) const KEY_LOCAL_SIZE: &CStr = c"pmix.local.size";
/// `PMIX_LOCAL_RANK` (`uint16_t`, per process): rank among the job's processes on its node.
pub(crate) const KEY_LOCAL_RANK: &CStr = c"pmix.lrank";

/// `pmix_proc_t`: `{ pmix_nspace_t nspace; pmix_rank_t rank; }`.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Proc {
    /// `char nspace[PMIX_MAX_NSLEN+1]`, NUL-terminated.
    pub(crate) nspace: [c_char; MAX_NSLEN + 1],
    /// The rank in that namespace.
    pub(crate) rank: Rank,
}

impl Proc {
    /// `PMIX_PROC_STATIC_INIT`: an empty namespace, `PMIX_RANK_UNDEF`.
    pub(crate) const fn undefined() -> Proc {
        Proc { nspace: [0; MAX_NSLEN + 1], rank: RANK_UNDEF }
    }

    /// The same namespace with another rank (`PMIX_LOAD_PROCID`).
    pub(crate) const fn with_rank(&self, rank: Rank) -> Proc {
        Proc { nspace: self.nspace, rank }
    }

    /// The namespace as text (up to its NUL; all of it when PMIx filled every byte).
    pub(crate) fn namespace(&self) -> String {
        let bytes: Vec<u8> = self.nspace.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl fmt::Debug for Proc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.namespace(), self.rank)
    }
}

/// `pmix_byte_object_t`: `{ char *bytes; size_t size; }`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct ByteObject {
    /// The bytes (not NUL-terminated).
    pub(crate) bytes: *mut c_char,
    /// How many.
    pub(crate) size: usize,
}

/// `pmix_envar_t`: `{ char *envar; char *value; char separator; }`, the largest member of
/// the value union (it sets the union's size, 24 bytes on LP64).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct Envar {
    envar: *mut c_char,
    value: *mut c_char,
    separator: c_char,
}

/// The union `data` of `pmix_value_t`, with the members we read or write; the others are
/// pointers or scalars no larger than [`Envar`], which stands for them in the size.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) union ValueData {
    /// `bool flag` (`PMIX_BOOL`).
    pub(crate) flag: bool,
    /// `uint8_t byte`, `uint8` (`PMIX_BYTE`, `PMIX_UINT8`).
    pub(crate) uint8: u8,
    /// `int8_t int8`.
    pub(crate) int8: i8,
    /// `uint16_t uint16`.
    pub(crate) uint16: u16,
    /// `int16_t int16`.
    pub(crate) int16: i16,
    /// `uint32_t uint32`, `pmix_rank_t rank`, `unsigned int uint`.
    pub(crate) uint32: u32,
    /// `int integer`, `int32_t int32`.
    pub(crate) int32: i32,
    /// `uint64_t uint64`.
    pub(crate) uint64: u64,
    /// `int64_t int64`.
    pub(crate) int64: i64,
    /// `size_t size`.
    pub(crate) size: usize,
    /// `char *string` (`PMIX_STRING`).
    pub(crate) string: *mut c_char,
    /// `pmix_byte_object_t bo` (`PMIX_BYTE_OBJECT`).
    pub(crate) bo: ByteObject,
    /// `void *ptr` and every other pointer member.
    pub(crate) ptr: *mut c_void,
    /// `pmix_envar_t envar`, for the union's size.
    envar: Envar,
}

/// `pmix_value_t`: `{ pmix_data_type_t type; union { ... } data; }`.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Value {
    /// Which member of `data` is meant (`PMIX_*` data type).
    pub(crate) kind: DataType,
    /// The value.
    pub(crate) data: ValueData,
}

impl Value {
    /// A byte object pointing at `bytes`, which must outlive every use of the value (PMIx
    /// copies it in `PMIx_Put`).
    pub(crate) fn bytes(bytes: &[u8]) -> Value {
        Value {
            kind: BYTE_OBJECT,
            data: ValueData { bo: ByteObject { bytes: bytes.as_ptr().cast_mut().cast(), size: bytes.len() } },
        }
    }

    /// The value as an unsigned number, when it is one of PMIx's integer types and not
    /// negative.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        // SAFETY: each arm reads the union member that `kind` says is set (the member
        // names follow pmix_common.h's union); every member is plain data of the size read.
        unsafe {
            match self.kind {
                UINT8 | BYTE => Some(u64::from(self.data.uint8)),
                UINT16 => Some(u64::from(self.data.uint16)),
                UINT32 | UINT | PROC_RANK => Some(u64::from(self.data.uint32)),
                UINT64 => Some(self.data.uint64),
                SIZE => Some(self.data.size as u64),
                INT8 => u64::try_from(self.data.int8).ok(),
                INT16 => u64::try_from(self.data.int16).ok(),
                INT | INT32 => u64::try_from(self.data.int32).ok(),
                INT64 => u64::try_from(self.data.int64).ok(),
                _ => None,
            }
        }
    }
}

/// `pmix_info_t`: `{ pmix_key_t key; pmix_info_directives_t flags; pmix_value_t value; }`.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Info {
    /// `char key[PMIX_MAX_KEYLEN+1]`, NUL-terminated.
    pub(crate) key: [c_char; MAX_KEYLEN + 1],
    /// `pmix_info_directives_t` (`uint32_t`): `PMIX_INFO_REQD` and the like; 0 here.
    pub(crate) flags: u32,
    /// The value.
    pub(crate) value: Value,
}

impl Info {
    /// An attribute `key` with `value` (`PMIX_INFO_LOAD` for the scalar types we pass; the
    /// value owns nothing, so there is nothing for `PMIX_INFO_DESTRUCT` to free).
    fn new(key: &CStr, value: Value) -> Info {
        let mut k = [0 as c_char; MAX_KEYLEN + 1];
        for (d, &s) in k.iter_mut().zip(key.to_bytes().iter().take(MAX_KEYLEN)) {
            *d = s as c_char;
        }
        Info { key: k, flags: 0, value }
    }

    /// `PMIX_TIMEOUT` of `seconds` (an `int`; 0 would mean no timeout).
    pub(crate) fn timeout(seconds: c_int) -> Info {
        Info::new(ATTR_TIMEOUT, Value { kind: INT, data: ValueData { int32: seconds } })
    }

    /// `PMIX_IMMEDIATE` set.
    pub(crate) fn immediate() -> Info {
        Info::new(ATTR_IMMEDIATE, Value { kind: BOOL, data: ValueData { flag: true } })
    }

    /// `PMIX_COLLECT_DATA` set to `collect`.
    pub(crate) fn collect_data(collect: bool) -> Info {
        Info::new(ATTR_COLLECT_DATA, Value { kind: BOOL, data: ValueData { flag: collect } })
    }
}

// The layouts of the OpenPMIx 4.2.2 headers on LP64 Linux, as gcc lays them out
// (sizeof/offsetof measured against pmix_common.h).
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Proc>() == 260 && align_of::<Proc>() == 4);
    assert!(offset_of!(Proc, rank) == 256);
    assert!(size_of::<ByteObject>() == 16);
    assert!(size_of::<ValueData>() == 24);
    assert!(size_of::<Value>() == 32 && align_of::<Value>() == 8);
    assert!(offset_of!(Value, data) == 8);
    assert!(size_of::<Info>() == 552 && align_of::<Info>() == 8);
    assert!(offset_of!(Info, flags) == 512 && offset_of!(Info, value) == 520);
};

/// `pmix_status_t PMIx_Init(pmix_proc_t *proc, pmix_info_t info[], size_t ninfo);`
pub(crate) type InitFn = unsafe extern "C" fn(proc_: *mut Proc, info: *mut Info, ninfo: usize) -> Status;
/// `pmix_status_t PMIx_Finalize(const pmix_info_t info[], size_t ninfo);`
pub(crate) type FinalizeFn = unsafe extern "C" fn(info: *const Info, ninfo: usize) -> Status;
/// `pmix_status_t PMIx_Put(pmix_scope_t scope, const char key[], pmix_value_t *val);`
pub(crate) type PutFn = unsafe extern "C" fn(scope: Scope, key: *const c_char, val: *mut Value) -> Status;
/// `pmix_status_t PMIx_Commit(void);`
pub(crate) type CommitFn = unsafe extern "C" fn() -> Status;
/// `pmix_status_t PMIx_Fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t
/// info[], size_t ninfo);`
pub(crate) type FenceFn =
    unsafe extern "C" fn(procs: *const Proc, nprocs: usize, info: *const Info, ninfo: usize) -> Status;
/// `pmix_status_t PMIx_Get(const pmix_proc_t *proc, const char key[], const pmix_info_t
/// info[], size_t ninfo, pmix_value_t **val);`
pub(crate) type GetFn = unsafe extern "C" fn(
    proc_: *const Proc,
    key: *const c_char,
    info: *const Info,
    ninfo: usize,
    val: *mut *mut Value,
) -> Status;
/// `void PMIx_Value_destruct(pmix_value_t *val);` (exported since PMIx 4).
pub(crate) type ValueDestructFn = unsafe extern "C" fn(val: *mut Value);
/// `const char* PMIx_Error_string(pmix_status_t status);`
pub(crate) type ErrorStringFn = unsafe extern "C" fn(status: Status) -> *const c_char;
/// `const char* PMIx_Get_version(void);`
pub(crate) type GetVersionFn = unsafe extern "C" fn() -> *const c_char;

/// One place to look for `libpmix`: what is handed to `dlopen`, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// A file name (searched by the dynamic loader) or a path.
    pub(crate) path: PathBuf,
    /// Where the candidate came from, for the report.
    pub(crate) origin: &'static str,
}

/// The candidates, in order: `explicit` (`OXCCL_PMIX_LIBRARY`: a file, or a folder holding
/// `libpmix.so.2` or `libpmix.so`) alone when given, else `libpmix.so.2` and `libpmix.so`
/// through the loader's search path.
pub(crate) fn candidates(explicit: Option<&Path>) -> Vec<Candidate> {
    const ORIGIN: &str = "OXCCL_PMIX_LIBRARY";
    const SEARCH: &str = "the loader's search path";
    match explicit {
        Some(p) if p.is_dir() => vec![
            Candidate { path: p.join("libpmix.so.2"), origin: ORIGIN },
            Candidate { path: p.join("libpmix.so"), origin: ORIGIN },
        ],
        Some(p) => vec![Candidate { path: p.to_path_buf(), origin: ORIGIN }],
        None => vec![
            Candidate { path: "libpmix.so.2".into(), origin: SEARCH },
            Candidate { path: "libpmix.so".into(), origin: SEARCH },
        ],
    }
}

/// The `PMIx_*` functions of one loaded library.
#[derive(Clone, Copy)]
pub(crate) struct Library {
    pub(crate) init: InitFn,
    pub(crate) finalize: FinalizeFn,
    pub(crate) put: PutFn,
    pub(crate) commit: CommitFn,
    pub(crate) fence: FenceFn,
    pub(crate) get: GetFn,
    pub(crate) error_string: ErrorStringFn,
    /// Missing in PMIx 3 (a macro there).
    value_destruct: Option<ValueDestructFn>,
    get_version: Option<GetVersionFn>,
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library").field("value_destruct", &self.value_destruct.is_some()).finish_non_exhaustive()
    }
}

/// A loaded library: its table, the path that opened, and its version line.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    /// The functions.
    pub(crate) lib: Library,
    /// The candidate that opened.
    pub(crate) path: PathBuf,
    /// `PMIx_Get_version()` (`OpenPMIx 4.2.2 (PMIx Standard: 4.2, ...)`), or a note that
    /// the library does not say.
    pub(crate) version: String,
}

/// The loader's last error message (`dlerror`), or a generic one.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message in thread-local storage
    // (glibc, musl), valid until the next dl* call on this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "the loader gave no reason".to_string();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

/// Opens `path` (`RTLD_NOW | RTLD_GLOBAL`); the handle is never closed.
fn open(path: &Path) -> Result<*mut c_void, String> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "the path contains a NUL byte".to_string())?;
    // SAFETY: `c` is a NUL-terminated path. Opening runs the library's initialisers: the
    // candidates are PMIx client libraries, whose initialisers only set up their own state
    // (MPI libraries and launchers load the same library the same way).
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        Err(dl_error())
    } else {
        Ok(h)
    }
}

/// The address of `name` in `handle`, or `None`.
fn symbol(handle: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `handle` is a live handle from `dlopen` (never closed) and `name` is
    // NUL-terminated; the address is only read, typed later by the caller.
    let a = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!a.is_null()).then_some(a)
}

/// Reads the address of `name` as a function pointer of type `F`, or records it as missing.
///
/// # Safety
/// `F` is the function pointer type that PMIx's header declares for `name` (the types of
/// this file, each with its C prototype), callable while the library stays loaded (it is
/// never closed).
unsafe fn typed<F: Copy>(handle: *mut c_void, name: &CStr, missing: &mut Vec<String>) -> Option<F> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    match symbol(handle, name) {
        // SAFETY: a non-null address of the function `name`, whose type `F` is (the
        // caller's contract), and `F` is pointer-sized (checked above): reading the
        // address as `F` is the pointer-to-function cast C does.
        Some(a) => Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&a) }),
        None => {
            missing.push(name.to_string_lossy().into_owned());
            None
        }
    }
}

impl Library {
    /// The table of the library open at `handle`.
    ///
    /// # Errors
    /// The required functions the library does not export.
    fn resolve(handle: *mut c_void) -> Result<Library, String> {
        let mut missing = Vec::new();
        let m = &mut missing;
        // SAFETY: here and in every `typed` call below, the type is the prototype of pmix.h
        // written next to its alias above, and the handle stays open for the life of the
        // process.
        let init = unsafe { typed::<InitFn>(handle, c"PMIx_Init", m) };
        // SAFETY: as above.
        let finalize = unsafe { typed::<FinalizeFn>(handle, c"PMIx_Finalize", m) };
        // SAFETY: as above.
        let put = unsafe { typed::<PutFn>(handle, c"PMIx_Put", m) };
        // SAFETY: as above.
        let commit = unsafe { typed::<CommitFn>(handle, c"PMIx_Commit", m) };
        // SAFETY: as above.
        let fence = unsafe { typed::<FenceFn>(handle, c"PMIx_Fence", m) };
        // SAFETY: as above.
        let get = unsafe { typed::<GetFn>(handle, c"PMIx_Get", m) };
        // SAFETY: as above.
        let error_string = unsafe { typed::<ErrorStringFn>(handle, c"PMIx_Error_string", m) };
        let mut optional = Vec::new();
        // SAFETY: as above (optional: PMIx 3 has a macro instead).
        let value_destruct = unsafe { typed::<ValueDestructFn>(handle, c"PMIx_Value_destruct", &mut optional) };
        // SAFETY: as above.
        let get_version = unsafe { typed::<GetVersionFn>(handle, c"PMIx_Get_version", &mut optional) };
        match (init, finalize, put, commit, fence, get, error_string) {
            (Some(init), Some(finalize), Some(put), Some(commit), Some(fence), Some(get), Some(error_string)) => {
                Ok(Library { init, finalize, put, commit, fence, get, error_string, value_destruct, get_version })
            }
            _ => Err(format!("not a PMIx client library: it does not export {}", missing.join(", "))),
        }
    }

    /// `PMIx_Error_string(status)` with the number: `TIMEOUT (-24)`.
    pub(crate) fn describe(&self, status: Status) -> String {
        // SAFETY: PMIx_Error_string takes any status and returns a pointer to a static
        // NUL-terminated string (or null for none), which is copied at once.
        let s = unsafe { (self.error_string)(status) };
        if s.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null and NUL-terminated (above).
        let text = unsafe { CStr::from_ptr(s) }.to_string_lossy();
        format!("{text} ({status})")
    }

    /// The library's version line.
    fn version(&self) -> String {
        let Some(f) = self.get_version else {
            return "version unknown (no PMIx_Get_version)".to_string();
        };
        // SAFETY: PMIx_Get_version needs no initialisation and returns a static
        // NUL-terminated string (or null), copied at once.
        let s = unsafe { f() };
        if s.is_null() {
            return "version unknown".to_string();
        }
        // SAFETY: non-null and NUL-terminated (above).
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    /// `PMIX_VALUE_RELEASE(value)`: frees what `PMIx_Get` returned, the value and what it
    /// points to. Without `PMIx_Value_destruct` (PMIx 3) the payloads of strings and byte
    /// objects (the only types we read that own memory) are freed by hand, as PMIx 3's
    /// `PMIX_VALUE_DESTRUCT` macro does.
    ///
    /// # Safety
    /// `value` is null or a value `PMIx_Get` of this library returned, not yet released and
    /// not used afterwards.
    pub(crate) unsafe fn release(&self, value: *mut Value) {
        if value.is_null() {
            return;
        }
        match self.value_destruct {
            // SAFETY: a live value PMIx allocated (the caller's contract).
            Some(destruct) => unsafe { destruct(value) },
            None => {
                // SAFETY: as above; the member read is the one `kind` says is set, and
                // PMIx allocated the payloads with malloc (pmix_malloc is malloc).
                unsafe {
                    match (*value).kind {
                        STRING => libc::free((*value).data.string.cast()),
                        BYTE_OBJECT => libc::free((*value).data.bo.bytes.cast()),
                        _ => {}
                    }
                }
            }
        }
        // SAFETY: PMIX_VALUE_RELEASE ends with pmix_free(value), which is libc's free: the
        // value itself was malloc'ed by PMIx_Get (PMIX_VALUE_CREATE).
        unsafe { libc::free(value.cast()) };
    }
}

/// Every candidate tried, and why none would do: `path (origin): why; ...`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tried(pub(crate) Vec<String>);

impl fmt::Display for Tried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no candidates");
        }
        f.write_str(&self.0.join("; "))
    }
}

/// Opens the first of `candidates` that loads and exports PMIx's client functions.
///
/// # Errors
/// Every candidate tried, with the reason each was rejected.
pub(crate) fn load(candidates: &[Candidate]) -> Result<Loaded, Tried> {
    let mut tried = Tried::default();
    for c in candidates {
        match open(&c.path).and_then(Library::resolve) {
            Ok(lib) => return Ok(Loaded { lib, path: c.path.clone(), version: lib.version() }),
            Err(why) => tried.0.push(format!("{} ({}): {why}", c.path.display(), c.origin)),
        }
    }
    Err(tried)
}
