//! Tests of the NCCL library room: version codes, the C layouts, the search order, loading
//! real libraries that are missing or not NCCL, and the lookup seam with fake functions.
//!
//! `real_libnccl_*` run against a real `libnccl.so.2` only when `OXCCL_TEST_LIBNCCL` (and
//! `OXCCL_TEST_LIBNCCL_OLD` for one older than 2.14) names it; they pass trivially otherwise.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::search::{Flavor, SearchEnv};
use super::table::{Table, RCCL_ALL_TO_ALL, REQUIRED};
use super::types::{
    NcclComm, NcclConfig, NcclDataType, NcclRedOp, NcclResult, NcclUniqueId, NCCL_CONFIG_MAGIC, NCCL_UNIQUE_ID_BYTES,
};
use super::version::{optional_since, Version, MIN_SUPPORTED, OPTIONAL_SINCE};
use super::{Library, Progress};
use crate::dtype::DType;
use crate::error::Error;
use crate::reduce_op::ReduceOp;
use crate::xccl::dl::Candidate;

// ---------------------------------------------------------------------------------------
// Helpers

/// A directory under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("oxccl-library-{}-{n}-{tag}", std::process::id()));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// Creates `rel` (and its parents) as a directory inside.
    fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.0.join(rel);
        std::fs::create_dir_all(&p).expect("create a directory");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The paths of `candidates`, as strings.
fn paths(candidates: &[Candidate]) -> Vec<String> {
    candidates.iter().map(|c| c.path.display().to_string()).collect()
}

/// The `why` of a `BackendUnavailable` for `backend`; fails the test on anything else.
fn unavailable_why(result: Result<Library, Error>, backend: &str) -> String {
    match result {
        Err(Error::BackendUnavailable { backend: b, why }) => {
            assert_eq!(b, backend, "{why}");
            why
        }
        Err(other) => panic!("expected BackendUnavailable, got {other:?}"),
        Ok(lib) => panic!("expected BackendUnavailable, loaded {}", lib.describe()),
    }
}

// ---------------------------------------------------------------------------------------
// Fake NCCL functions for the lookup seam. Only the ones with the right signature are ever
// called (ncclGetVersion, ncclGetErrorString, ncclGetLastError); every other entry gets
// `fake_unused`, whose address is stored in the table but never called.

/// Writes `code` through `version`.
///
/// # Safety
/// `version` is valid for a write.
unsafe fn write_version(version: *mut c_int, code: c_int) -> NcclResult {
    // SAFETY: the caller's contract (the library calls ncclGetVersion with a valid pointer).
    unsafe { *version = code };
    NcclResult::SUCCESS
}

unsafe extern "C" fn fake_version_2_21_5(version: *mut c_int) -> NcclResult {
    // SAFETY: ncclGetVersion is always called with a valid pointer (query_version does).
    unsafe { write_version(version, 22105) }
}

unsafe extern "C" fn fake_version_2_14_0(version: *mut c_int) -> NcclResult {
    // SAFETY: as above.
    unsafe { write_version(version, 21400) }
}

unsafe extern "C" fn fake_version_2_12_10(version: *mut c_int) -> NcclResult {
    // SAFETY: as above.
    unsafe { write_version(version, 21210) }
}

unsafe extern "C" fn fake_version_fails(_version: *mut c_int) -> NcclResult {
    NcclResult::INTERNAL_ERROR
}

unsafe extern "C" fn fake_error_string(result: NcclResult) -> *const c_char {
    match result {
        NcclResult::UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)".as_ptr(),
        NcclResult::INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)".as_ptr(),
        _ => std::ptr::null(),
    }
}

unsafe extern "C" fn fake_last_error(_comm: NcclComm) -> *const c_char {
    c"Cuda failure 'out of memory'\n".as_ptr()
}

unsafe extern "C" fn fake_no_last_error(_comm: NcclComm) -> *const c_char {
    c"".as_ptr()
}

unsafe extern "C" fn fake_unused() -> NcclResult {
    NcclResult::INTERNAL_ERROR
}

/// A fake library: every required function (with `version` as ncclGetVersion), the named
/// optional ones, and overrides by name (`None` removes a name).
struct Fake {
    version: *mut c_void,
    last_error: *mut c_void,
    optional: Vec<&'static CStr>,
    overrides: Vec<(&'static CStr, Option<*mut c_void>)>,
}

impl Fake {
    fn new(version: unsafe extern "C" fn(*mut c_int) -> NcclResult) -> Fake {
        Fake {
            version: version as *mut c_void,
            last_error: fake_last_error as *mut c_void,
            optional: Vec::new(),
            overrides: Vec::new(),
        }
    }

    fn lookup(&self, name: &CStr) -> Option<*mut c_void> {
        if let Some((_, addr)) = self.overrides.iter().find(|(n, _)| *n == name) {
            return *addr;
        }
        if name == c"ncclGetVersion" {
            Some(self.version)
        } else if name == c"ncclGetErrorString" {
            Some(fake_error_string as *mut c_void)
        } else if name == c"ncclGetLastError" {
            Some(self.last_error)
        } else if REQUIRED.contains(&name) || self.optional.contains(&name) {
            Some(fake_unused as *mut c_void)
        } else {
            None
        }
    }

    fn table(&self) -> Result<Table, String> {
        // SAFETY: the entries that are called (ncclGetVersion, ncclGetErrorString,
        // ncclGetLastError) have nccl.h's signatures; the others are never called.
        unsafe { Table::resolve(&mut |name| self.lookup(name)) }
    }
}

// ---------------------------------------------------------------------------------------
// Versions

#[test]
fn version_codes_before_2_9_decode_as_thousands() {
    assert_eq!(Version::from_code(2804), Ok(Version::new(2, 8, 4)));
    assert_eq!(Version::from_code(2708), Ok(Version::new(2, 7, 8)));
    assert_eq!(Version::from_code(2406), Ok(Version::new(2, 4, 6)));
}

#[test]
fn version_codes_from_2_9_decode_as_ten_thousands() {
    assert_eq!(Version::from_code(20906), Ok(Version::new(2, 9, 6)));
    assert_eq!(Version::from_code(21403), Ok(Version::new(2, 14, 3)));
    assert_eq!(Version::from_code(22105), Ok(Version::new(2, 21, 5)));
    assert_eq!(Version::from_code(23203), Ok(Version::new(2, 32, 3)));
    assert_eq!(Version::from_code(30000), Ok(Version::new(3, 0, 0)));
}

#[test]
fn version_code_round_trips_for_real_releases() {
    for v in [Version::new(2, 8, 4), Version::new(2, 9, 6), Version::new(2, 14, 3), Version::new(2, 30, 7)] {
        let code = c_int::try_from(v.code()).expect("small");
        assert_eq!(Version::from_code(code), Ok(v));
    }
    assert_eq!(Version::new(2, 14, 0).code(), 21400);
    assert_eq!(Version::new(2, 8, 4).code(), 2804);
}

#[test]
fn version_rejects_codes_no_library_writes() {
    for code in [0, -1, c_int::MIN] {
        let err = Version::from_code(code).expect_err("not a version");
        assert!(err.contains(&code.to_string()), "{err}");
    }
}

#[test]
fn versions_order_by_major_minor_patch_and_display_dotted() {
    assert!(Version::new(2, 12, 10) < MIN_SUPPORTED);
    assert!(Version::new(2, 14, 0) >= MIN_SUPPORTED);
    assert!(Version::new(2, 9, 9) < Version::new(2, 10, 0));
    assert!(Version::new(2, 30, 1) > Version::new(2, 4, 99));
    assert!(Version::new(3, 0, 0) > Version::new(2, 99, 99));
    assert_eq!(Version::new(2, 21, 5).to_string(), "2.21.5");
    assert_eq!(MIN_SUPPORTED.to_string(), "2.14.0");
}

#[test]
fn optional_since_names_every_optional_table_entry() {
    let table = {
        let mut fake = Fake::new(fake_version_2_21_5);
        fake.optional = OPTIONAL_SINCE.iter().map(|(n, _)| *n).collect();
        fake.table().expect("complete")
    };
    // Every optional name the table knows has a release, and all of them resolved.
    assert_eq!(table.optional_present().len(), OPTIONAL_SINCE.len());
    for name in table.optional_present() {
        let c = std::ffi::CString::new(name).expect("no NUL");
        assert!(optional_since(&c).is_some_and(|v| v > Version::new(2, 10, 0)), "{name}");
    }
    assert_eq!(optional_since(c"ncclCommSplit"), Some(Version::new(2, 18, 1)));
    assert_eq!(optional_since(c"ncclCommShrink"), Some(Version::new(2, 27, 3)));
    assert_eq!(optional_since(c"ncclCommGrow"), Some(Version::new(2, 29, 2)));
    assert_eq!(optional_since(c"ncclCommGetUniqueId"), Some(Version::new(2, 29, 2)));
    assert_eq!(optional_since(c"ncclAllReduce"), None);
}

// ---------------------------------------------------------------------------------------
// The C types

#[test]
fn unique_id_and_config_have_the_c_layout() {
    assert_eq!(size_of::<NcclUniqueId>(), NCCL_UNIQUE_ID_BYTES);
    assert_eq!(align_of::<NcclUniqueId>(), 1);
    // ncclConfig_v21400 on an LP64 target: size_t, unsigned, unsigned, int, tail padding.
    assert_eq!(size_of::<NcclConfig>(), 24);
    assert_eq!(align_of::<NcclConfig>(), align_of::<usize>());
    assert_eq!(offset_of!(NcclConfig, size), 0);
    assert_eq!(offset_of!(NcclConfig, magic), 8);
    assert_eq!(offset_of!(NcclConfig, version), 12);
    assert_eq!(offset_of!(NcclConfig, blocking), 16);
    assert_eq!(size_of::<NcclResult>(), size_of::<c_int>());
    assert_eq!(size_of::<NcclDataType>(), size_of::<c_int>());
    assert_eq!(size_of::<NcclRedOp>(), size_of::<c_int>());
}

#[test]
fn config_initializer_matches_nccl_2_14() {
    let c = NcclConfig::initializer();
    assert_eq!(c.size, 24);
    assert_eq!(c.magic, 0xcafe_beef);
    assert_eq!(c.magic, NCCL_CONFIG_MAGIC);
    assert_eq!(c.version, 21400);
    assert_eq!(c.blocking, 1);
    assert_eq!(NcclConfig::with_blocking(false).blocking, 0);
    assert_eq!(NcclConfig::with_blocking(true), c);
    // The only difference between the two is `blocking`.
    let nb = NcclConfig::with_blocking(false);
    assert_eq!((nb.size, nb.magic, nb.version), (c.size, c.magic, c.version));
}

#[test]
fn every_dtype_maps_to_its_nccl_value() {
    let expected = [
        (DType::I8, 0),
        (DType::U8, 1),
        (DType::I32, 2),
        (DType::U32, 3),
        (DType::I64, 4),
        (DType::U64, 5),
        (DType::F16, 6),
        (DType::F32, 7),
        (DType::F64, 8),
        (DType::BF16, 9),
    ];
    assert_eq!(expected.len(), DType::ALL.len());
    for (dtype, value) in expected {
        assert_eq!(NcclDataType::from_dtype(dtype), NcclDataType(value), "{dtype}");
    }
}

#[test]
fn every_reduce_op_maps_to_its_nccl_value() {
    let expected =
        [(ReduceOp::Sum, 0), (ReduceOp::Prod, 1), (ReduceOp::Max, 2), (ReduceOp::Min, 3), (ReduceOp::Avg, 4)];
    assert_eq!(expected.len(), ReduceOp::ALL.len());
    for (op, value) in expected {
        assert_eq!(NcclRedOp::from_reduce_op(op), NcclRedOp(value), "{op}");
        assert!(value < NcclRedOp::NUM_OPS);
    }
}

#[test]
fn result_codes_are_named() {
    assert_eq!(NcclResult::SUCCESS.to_string(), "ncclSuccess");
    assert_eq!(NcclResult::IN_PROGRESS.to_string(), "ncclInProgress");
    assert_eq!(NcclResult(8).to_string(), "ncclTimeout");
    assert_eq!(NcclResult(42).to_string(), "ncclResult_t 42");
    assert!(NcclResult::SUCCESS.is_success() && !NcclResult::REMOTE_ERROR.is_success());
}

#[test]
fn unique_id_from_bytes_checks_the_length() {
    let mut bytes = [0u8; NCCL_UNIQUE_ID_BYTES];
    bytes[0] = 7;
    bytes[127] = 9;
    let id = NcclUniqueId::from_bytes(&bytes).expect("128 bytes");
    assert_eq!(id.as_bytes(), &bytes);
    let err = NcclUniqueId::from_bytes(&bytes[..100]).expect_err("too short");
    assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("128") && m.contains("100")), "{err}");
}

// ---------------------------------------------------------------------------------------
// Where libraries are looked for

#[test]
fn nccl_candidates_follow_the_documented_order() {
    let env = SearchEnv {
        nccl_home: Some("/opt/nccl".into()),
        cuda_home: Some("/usr/local/cuda".into()),
        rocm_path: Some("/opt/rocm-6.2".into()),
        ..SearchEnv::default()
    };
    let c = env.candidates(Flavor::Nccl);
    assert_eq!(
        paths(&c),
        [
            "/opt/nccl/lib/libnccl.so.2",
            "/opt/nccl/lib64/libnccl.so.2",
            "/usr/local/cuda/lib64/libnccl.so.2",
            "libnccl.so.2",
            "libnccl.so",
        ]
    );
    assert_eq!(c[0].origin, "$NCCL_HOME/lib");
    assert_eq!(c[1].origin, "$NCCL_HOME/lib64");
    assert_eq!(c[2].origin, "$CUDA_HOME/lib64");
    assert_eq!(c[3].origin, "the loader's search path");
}

#[test]
fn candidates_without_environment_are_the_loader_names_and_opt_rocm() {
    let env = SearchEnv::default();
    assert_eq!(paths(&env.candidates(Flavor::Nccl)), ["libnccl.so.2", "libnccl.so"]);
    let rccl = env.candidates(Flavor::Rccl);
    assert_eq!(paths(&rccl), ["/opt/rocm/lib/librccl.so.1", "librccl.so.1", "librccl.so"]);
    assert!(rccl[0].origin.contains("ROCM_PATH is not set"), "{}", rccl[0].origin);
}

#[test]
fn rccl_candidates_use_rocm_path() {
    let env =
        SearchEnv { rocm_path: Some("/opt/rocm-6.2.0".into()), nccl_home: Some("/x".into()), ..SearchEnv::default() };
    let c = env.candidates(Flavor::Rccl);
    assert_eq!(paths(&c), ["/opt/rocm-6.2.0/lib/librccl.so.1", "librccl.so.1", "librccl.so"]);
    assert_eq!(c[0].origin, "$ROCM_PATH/lib");
}

#[test]
fn duplicate_paths_keep_their_first_origin() {
    // NCCL_HOME and CUDA_HOME both pointing at the toolkit (NVIDIA's packages put NCCL there);
    // the trailing slash does not make a different path.
    let env = SearchEnv {
        nccl_home: Some("/usr/local/cuda".into()),
        cuda_home: Some("/usr/local/cuda/".into()),
        ..SearchEnv::default()
    };
    let c = env.candidates(Flavor::Nccl);
    assert_eq!(
        paths(&c),
        ["/usr/local/cuda/lib/libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2", "libnccl.so.2", "libnccl.so"]
    );
    assert_eq!(c[1].origin, "$NCCL_HOME/lib64");
}

#[test]
fn an_explicit_library_is_the_only_candidate() {
    let env = SearchEnv {
        explicit: Some("/somewhere/libnccl-custom.so".into()),
        nccl_home: Some("/opt/nccl".into()),
        ..SearchEnv::default()
    };
    let c = env.candidates(Flavor::Nccl);
    assert_eq!(paths(&c), ["/somewhere/libnccl-custom.so"]);
    assert_eq!(c[0].origin, "the library named in the configuration");

    // A directory stands for the library file in it.
    let dir = TempDir::new("explicit-dir");
    let env = SearchEnv { explicit: Some(dir.path().to_path_buf()), ..SearchEnv::default() };
    assert_eq!(env.candidates(Flavor::Rccl)[0].path, dir.path().join("librccl.so.1"));
}

#[test]
fn python_environment_wheel_layout_is_found() {
    let venv = TempDir::new("venv");
    let wheel = venv.mkdir("lib/python3.11/site-packages/nvidia/nccl/lib");
    std::fs::write(wheel.join("libnccl.so.2"), b"not really a library").expect("write");
    venv.mkdir("lib/pkgconfig"); // not a Python directory: ignored
    let conda = TempDir::new("conda");
    conda.mkdir("lib/python3.10");
    conda.mkdir("lib/python3.12/site-packages");

    let env = SearchEnv {
        virtual_env: Some(venv.path().to_path_buf()),
        conda_prefix: Some(conda.path().to_path_buf()),
        ..SearchEnv::default()
    };
    let c = env.candidates(Flavor::Nccl);
    let site = "site-packages/nvidia/nccl/lib/libnccl.so.2";
    assert_eq!(
        paths(&c),
        [
            venv.path().join("lib/python3.11").join(site).display().to_string(),
            conda.path().join("lib/python3.10").join(site).display().to_string(),
            conda.path().join("lib/python3.12").join(site).display().to_string(),
            "libnccl.so.2".to_string(),
            "libnccl.so".to_string(),
        ]
    );
    assert_eq!(c[0].origin, "the nvidia-nccl wheel in $VIRTUAL_ENV");
    assert_eq!(c[1].origin, "the nvidia-nccl wheel in $CONDA_PREFIX");

    // The same environment named twice is searched once.
    let env = SearchEnv {
        virtual_env: Some(venv.path().to_path_buf()),
        conda_prefix: Some(venv.path().to_path_buf()),
        ..SearchEnv::default()
    };
    assert_eq!(env.candidates(Flavor::Nccl).len(), 3);
}

// ---------------------------------------------------------------------------------------
// Loading real files

#[test]
fn missing_libraries_report_every_candidate() {
    let nccl_home = TempDir::new("nccl-home");
    let cuda_home = TempDir::new("cuda-home");
    let venv = TempDir::new("venv-empty");
    venv.mkdir("lib/python3.11/site-packages");
    let env = SearchEnv {
        nccl_home: Some(nccl_home.path().to_path_buf()),
        cuda_home: Some(cuda_home.path().to_path_buf()),
        virtual_env: Some(venv.path().to_path_buf()),
        ..SearchEnv::default()
    };
    // The directories only: whether the loader's search path has an NCCL depends on the
    // machine.
    let in_dirs: Vec<Candidate> = env.candidates(Flavor::Nccl).into_iter().filter(|c| c.path.is_absolute()).collect();
    assert_eq!(in_dirs.len(), 4);
    let why = unavailable_why(Library::load_from(Flavor::Nccl, &in_dirs), "nccl");
    for c in &in_dirs {
        assert!(why.contains(&format!("{} ({}): ", c.path.display(), c.origin)), "{c:?} missing from: {why}");
    }
    assert!(why.contains("pip install nvidia-nccl-cu12") && why.contains("NCCL_HOME"), "{why}");

    // With the loader's names too, either a system NCCL loads from them or they are listed.
    match Library::load(Flavor::Nccl, &env) {
        Ok(lib) => assert!(!lib.path.is_absolute(), "{}", lib.describe()),
        Err(err) => {
            let why = unavailable_why(Err(err), "nccl");
            assert!(why.contains("libnccl.so.2 (the loader's search path): "), "{why}");
            assert!(why.contains("libnccl.so (the loader's search path): "), "{why}");
            assert!(why.contains(&nccl_home.path().display().to_string()), "{why}");
        }
    }
}

#[test]
fn a_missing_rccl_names_rocm_path() {
    let rocm = TempDir::new("rocm");
    let env = SearchEnv { rocm_path: Some(rocm.path().to_path_buf()), ..SearchEnv::default() };
    let in_dirs: Vec<Candidate> = env.candidates(Flavor::Rccl).into_iter().filter(|c| c.path.is_absolute()).collect();
    let why = unavailable_why(Library::load_from(Flavor::Rccl, &in_dirs), "rccl");
    assert!(why.contains(&format!("{}/lib/librccl.so.1 ($ROCM_PATH/lib): ", rocm.path().display())), "{why}");
    assert!(why.contains("ROCm 5.5"), "{why}");
}

#[test]
fn no_candidates_is_reported() {
    let why = unavailable_why(Library::load_from(Flavor::Nccl, &[]), "nccl");
    assert!(why.contains("no candidates"), "{why}");
    assert!(why.contains("To fix:"), "{why}");
}

#[test]
fn a_library_that_is_not_nccl_is_rejected_naming_what_it_lacks() {
    for (lib, flavor) in [("libc.so.6", Flavor::Nccl), ("libm.so.6", Flavor::Rccl)] {
        let env = SearchEnv { explicit: Some(lib.into()), ..SearchEnv::default() };
        let why = unavailable_why(Library::load(flavor, &env), flavor.backend());
        assert!(
            why.contains(&format!("{lib} (the library named in the configuration): not {flavor}: it lacks ")),
            "{why}"
        );
        for name in REQUIRED {
            assert!(why.contains(name.to_str().expect("ASCII")), "{name:?} not named in: {why}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The lookup seam

#[test]
fn a_table_with_every_required_function_loads_and_lacks_the_optional_ones() {
    let table = Fake::new(fake_version_2_21_5).table().expect("every required function");
    assert!(table.comm_split.is_none() && table.comm_shrink.is_none() && table.all_to_all.is_none());
    assert!(table.comm_get_unique_id.is_none() && table.comm_grow.is_none());
    assert!(table.gather.is_none() && table.scatter.is_none());
    assert!(table.mem_alloc.is_none() && table.mem_free.is_none());
    assert!(table.comm_register.is_none() && table.comm_deregister.is_none());
    assert!(table.red_op_create_pre_mul_sum.is_none() && table.red_op_destroy.is_none());
    assert!(table.optional_present().is_empty());

    let lib = Library::from_table(table, Flavor::Nccl, "fake").expect("2.21.5 is supported");
    assert_eq!(lib.version, Version::new(2, 21, 5));
    assert_eq!(lib.describe(), "NCCL 2.21.5 (fake)");
}

#[test]
fn resolve_asks_for_exactly_the_required_and_optional_names() {
    let mut asked: Vec<String> = Vec::new();
    let mut lookup = |name: &CStr| {
        asked.push(name.to_string_lossy().into_owned());
        None
    };
    // SAFETY: the lookup gives no addresses at all.
    let err = unsafe { Table::resolve(&mut lookup) }.expect_err("empty");
    let required: Vec<String> = REQUIRED.iter().map(|n| n.to_string_lossy().into_owned()).collect();
    assert_eq!(err, format!("lacks {}", required.join(", ")));
    assert_eq!(asked[..required.len()], required[..]);
    let mut optional: Vec<String> = asked[required.len()..].to_vec();
    optional.sort();
    let mut expected: Vec<String> = OPTIONAL_SINCE.iter().map(|(n, _)| n.to_string_lossy().into_owned()).collect();
    expected.push(RCCL_ALL_TO_ALL.to_string_lossy().into_owned());
    expected.sort();
    assert_eq!(optional, expected);
}

#[test]
fn a_library_can_be_shared_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Library>();
    send_sync::<Table>();
}

#[test]
fn an_optional_function_present_is_some() {
    let mut fake = Fake::new(fake_version_2_21_5);
    fake.optional = vec![c"ncclCommSplit"];
    let table = fake.table().expect("complete");
    assert!(table.comm_split.is_some());
    assert!(table.comm_shrink.is_none() && table.mem_alloc.is_none());
    assert_eq!(table.optional_present(), ["ncclCommSplit"]);
}

#[test]
fn rccl_all_to_all_name_is_accepted_and_nccl_name_preferred() {
    let mut fake = Fake::new(fake_version_2_21_5);
    fake.optional = vec![RCCL_ALL_TO_ALL];
    assert!(fake.table().expect("complete").all_to_all.is_some());

    // Both names: NCCL's wins (told apart by address).
    let nccl_name = fake_version_2_12_10 as *mut c_void;
    fake.overrides = vec![(c"ncclAlltoAll", Some(nccl_name))];
    let got = fake.table().expect("complete").all_to_all.map(|f| f as *mut c_void);
    assert_eq!(got, Some(nccl_name));
}

#[test]
fn the_oldest_supported_version_is_accepted() {
    let table = Fake::new(fake_version_2_14_0).table().expect("complete");
    let lib = Library::from_table(table, Flavor::Rccl, "fake-rccl").expect("2.14.0 is supported");
    assert_eq!(lib.version, MIN_SUPPORTED);
    assert_eq!(lib.flavor, Flavor::Rccl);
}

#[test]
fn a_library_older_than_2_14_is_refused_naming_both_versions() {
    let table = Fake::new(fake_version_2_12_10).table().expect("complete");
    let why = unavailable_why(Library::from_table(table, Flavor::Nccl, "old-fake"), "nccl");
    assert!(why.contains("old-fake: NCCL 2.12.10 is older than the oldest supported 2.14.0"), "{why}");
}

#[test]
fn a_failing_get_version_is_reported() {
    let table = Fake::new(fake_version_fails).table().expect("complete");
    let why = unavailable_why(Library::from_table(table, Flavor::Nccl, "broken"), "nccl");
    assert!(why.contains("ncclGetVersion failed with ncclInternalError"), "{why}");
}

#[test]
fn missing_required_functions_are_all_named() {
    let mut fake = Fake::new(fake_version_2_21_5);
    fake.overrides = vec![
        (c"ncclGroupEnd", None),
        (c"ncclCommInitRankConfig", None),
        (c"ncclSend", Some(std::ptr::null_mut())), // a null address counts as missing
        (c"ncclCommFinalize", None),
    ];
    let err = fake.table().expect_err("incomplete");
    // In the table's order, whatever order they were removed in.
    assert_eq!(err, "lacks ncclCommInitRankConfig, ncclCommFinalize, ncclSend, ncclGroupEnd");
}

#[test]
fn errors_name_the_call_and_both_nccl_messages() {
    let lib = Library::from_table(Fake::new(fake_version_2_21_5).table().expect("complete"), Flavor::Nccl, "fake")
        .expect("supported");
    let comm: NcclComm = std::ptr::null_mut();
    assert_eq!(lib.check("ncclAllReduce", NcclResult::SUCCESS, comm), Ok(()));
    assert_eq!(
        lib.check("ncclAllReduce", NcclResult::UNHANDLED_CUDA_ERROR, comm),
        Err(Error::Backend {
            code: 1,
            message: "ncclAllReduce: unhandled cuda error (run with NCCL_DEBUG=INFO for details); \
                      NCCL's last error: Cuda failure 'out of memory'"
                .to_string(),
        })
    );
    // A code the library has no string for is named by us.
    let err = lib.check("ncclSend", NcclResult(42), comm).expect_err("failure");
    assert!(
        matches!(&err, Error::Backend { code: 42, message } if message.starts_with("ncclSend: ncclResult_t 42;")),
        "{err}"
    );

    // In progress is an error for `check`, a state for `check_progress`.
    assert!(lib.check("ncclCommInitRankConfig", NcclResult::IN_PROGRESS, comm).is_err());
    assert_eq!(lib.check_progress("ncclCommInitRankConfig", NcclResult::IN_PROGRESS, comm), Ok(Progress::InProgress));
    assert_eq!(lib.check_progress("ncclCommInitRankConfig", NcclResult::SUCCESS, comm), Ok(Progress::Done));
    assert!(matches!(
        lib.check_progress("ncclCommInitRankConfig", NcclResult::INVALID_USAGE, comm),
        Err(Error::Backend { code: 5, .. })
    ));
}

#[test]
fn an_empty_last_error_is_left_out() {
    let mut fake = Fake::new(fake_version_2_21_5);
    fake.last_error = fake_no_last_error as *mut c_void;
    let lib = Library::from_table(fake.table().expect("complete"), Flavor::Rccl, "fake").expect("supported");
    let err = lib.check("ncclGroupEnd", NcclResult::INVALID_USAGE, std::ptr::null_mut()).expect_err("failure");
    assert_eq!(
        err,
        Error::Backend {
            code: 5,
            message: "ncclGroupEnd: invalid usage (run with NCCL_DEBUG=WARN for details)".into()
        }
    );
}

// ---------------------------------------------------------------------------------------
// A real NCCL, when one is named

/// The library named by the environment variable `var`, if set.
fn named_library(var: &str) -> Option<PathBuf> {
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("{var} is not set; skipping (set it to the path of a libnccl.so.2)");
            None
        }
    }
}

#[test]
fn real_libnccl_loads_and_reports_its_version() {
    let Some(path) = named_library("OXCCL_TEST_LIBNCCL") else { return };
    let env = SearchEnv { explicit: Some(path.clone()), ..SearchEnv::default() };
    let lib = match Library::load(Flavor::Nccl, &env) {
        Ok(lib) => lib,
        Err(e) => panic!("{} did not load: {e}", path.display()),
    };
    assert!(lib.version >= MIN_SUPPORTED);
    eprintln!("loaded {}; optional functions: {:?}", lib.describe(), lib.table.optional_present());

    // ncclGetUniqueId needs no GPU: it sets up the bootstrap network (a listening socket).
    let mut id = NcclUniqueId::zeroed();
    // SAFETY: the library's ncclGetUniqueId, given a valid pointer to a 128-byte id.
    let result = unsafe { (lib.table.get_unique_id)(&mut id) };
    match lib.check("ncclGetUniqueId", result, std::ptr::null_mut()) {
        Ok(()) => {
            assert_ne!(id, NcclUniqueId::zeroed(), "ncclGetUniqueId succeeded but left the id empty");
            eprintln!("ncclGetUniqueId works: {id:?}");
        }
        Err(e) => eprintln!("ncclGetUniqueId failed here: {e}"),
    }
    // The error strings come from the real library.
    let err = lib.error("ncclAllReduce", NcclResult::UNHANDLED_CUDA_ERROR, std::ptr::null_mut());
    assert!(
        matches!(&err, Error::Backend { code: 1, message } if message.starts_with("ncclAllReduce: unhandled cuda error")),
        "{err}"
    );

    // Found where the wheel puts it inside an active virtual environment.
    #[cfg(unix)]
    {
        let venv = TempDir::new("venv-real");
        let dir = venv.mkdir("lib/python3.11/site-packages/nvidia/nccl/lib");
        std::os::unix::fs::symlink(&path, dir.join("libnccl.so.2")).expect("symlink");
        let env = SearchEnv { virtual_env: Some(venv.path().to_path_buf()), ..SearchEnv::default() };
        let found = match Library::load(Flavor::Nccl, &env) {
            Ok(found) => found,
            Err(e) => panic!("not found in the virtual environment: {e}"),
        };
        assert_eq!(found.path, dir.join("libnccl.so.2"));
        assert_eq!(found.version, lib.version);
    }
}

#[test]
fn real_libnccl_older_than_2_14_is_refused_naming_its_version() {
    let Some(path) = named_library("OXCCL_TEST_LIBNCCL_OLD") else { return };
    let env = SearchEnv { explicit: Some(path), ..SearchEnv::default() };
    let why = unavailable_why(Library::load(Flavor::Nccl, &env), "nccl");
    assert!(why.contains("is older than the oldest supported 2.14.0; it lacks ncclCommInitRankConfig"), "{why}");
    eprintln!("refused as expected: {why}");
}
