//! Tests of the NCCL library room: version codes and the C layouts.

use std::ffi::c_int;
use std::mem::{align_of, offset_of, size_of};

use super::types::{
    NcclConfig, NcclDataType, NcclRedOp, NcclResult, NcclUniqueId, NCCL_CONFIG_MAGIC, NCCL_UNIQUE_ID_BYTES,
};
use super::version::{optional_since, Version, MIN_SUPPORTED};
use crate::dtype::DType;
use crate::error::Error;
use crate::reduce_op::ReduceOp;

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
