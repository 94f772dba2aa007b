//! Tests of the NCCL library room: version codes, the C layouts and the search order.

use std::ffi::c_int;
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::search::{Flavor, SearchEnv};
use super::types::{
    NcclConfig, NcclDataType, NcclRedOp, NcclResult, NcclUniqueId, NCCL_CONFIG_MAGIC, NCCL_UNIQUE_ID_BYTES,
};
use super::version::{optional_since, Version, MIN_SUPPORTED};
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
fn optional_since_knows_the_optional_functions() {
    assert_eq!(optional_since(c"ncclCommSplit"), Some(Version::new(2, 18, 1)));
    assert_eq!(optional_since(c"ncclAlltoAll"), Some(Version::new(2, 28, 3)));
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
