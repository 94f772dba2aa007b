//! The C ABI of `nccl.h`: result codes, the opaque communicator, the unique id, the data
//! types and reduction operators, and the versioned `ncclConfig_t`.
//!
//! Every value here is taken from NVIDIA/nccl `src/nccl.h.in` (the template `nccl.h` is made
//! from), checked in the tags `v2.14.3-1` (the oldest release we support) and `v2.30.7-1`,
//! and in the `nccl.h` of the PyPI wheel `nvidia-nccl-cu12` 2.32.3. RCCL ships the same
//! header with HIP types (ROCm/rccl `src/nccl.h.in`, tags `rocm-5.5.0` to `rocm-6.2.2`, and
//! ROCm/rocm-systems `projects/rccl/src/nccl.h.in`): the result codes, data types, reduction
//! operators, unique id and config prefix have the same values and layout.
//!
//! C enums travel as `int` (every enumerator of these enums fits in one, and the headers
//! keep `ncclRedOp_t` that size on purpose, see `ncclMaxRedOp`), so each is a transparent
//! newtype over [`c_int`]: a value the library returns that we have no name for is kept, not
//! undefined behaviour.

// The whole set of nccl.h values this file mirrors, also those the engine does not use
// (they are checked against the header, and tests use them).
#![allow(dead_code)]

use std::ffi::{c_int, c_uint};
use std::fmt;
use std::marker::{PhantomData, PhantomPinned};

use crate::dtype::DType;
use crate::reduce_op::ReduceOp;
use crate::xccl::library::version::Version;

/// `ncclResult_t`: what every NCCL call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub(crate) struct NcclResult(pub(crate) c_int);

impl NcclResult {
    /// `ncclSuccess = 0` (nccl.h.in, all versions).
    pub(crate) const SUCCESS: NcclResult = NcclResult(0);
    /// `ncclUnhandledCudaError = 1` (RCCL: an unhandled HIP error).
    pub(crate) const UNHANDLED_CUDA_ERROR: NcclResult = NcclResult(1);
    /// `ncclSystemError = 2`.
    pub(crate) const SYSTEM_ERROR: NcclResult = NcclResult(2);
    /// `ncclInternalError = 3`.
    pub(crate) const INTERNAL_ERROR: NcclResult = NcclResult(3);
    /// `ncclInvalidArgument = 4`.
    pub(crate) const INVALID_ARGUMENT: NcclResult = NcclResult(4);
    /// `ncclInvalidUsage = 5`.
    pub(crate) const INVALID_USAGE: NcclResult = NcclResult(5);
    /// `ncclRemoteError = 6` (since NCCL 2.13.4).
    pub(crate) const REMOTE_ERROR: NcclResult = NcclResult(6);
    /// `ncclInProgress = 7` (since NCCL 2.14.3): a non-blocking communicator's call has been
    /// accepted and is still running; poll `ncclCommGetAsyncError`.
    pub(crate) const IN_PROGRESS: NcclResult = NcclResult(7);
    /// `ncclTimeout = 8` (since NCCL 2.30.3; RCCL in ROCm/rocm-systems).
    pub(crate) const TIMEOUT: NcclResult = NcclResult(8);

    /// Whether this is `ncclSuccess`.
    pub(crate) const fn is_success(self) -> bool {
        self.0 == NcclResult::SUCCESS.0
    }

    /// The enumerator's name in `nccl.h` (`ncclInvalidUsage`), or `None` for a code this
    /// header does not define (a newer library's).
    pub(crate) const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "ncclSuccess",
            1 => "ncclUnhandledCudaError",
            2 => "ncclSystemError",
            3 => "ncclInternalError",
            4 => "ncclInvalidArgument",
            5 => "ncclInvalidUsage",
            6 => "ncclRemoteError",
            7 => "ncclInProgress",
            8 => "ncclTimeout",
            _ => return None,
        })
    }
}

impl fmt::Display for NcclResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "ncclResult_t {}", self.0),
        }
    }
}

/// What `ncclComm_t` points to: `struct ncclComm`, opaque to users (nccl.h.in:
/// `typedef struct ncclComm* ncclComm_t;`). Not constructible, not `Send`/`Sync`/`Unpin`.
#[repr(C)]
pub(crate) struct NcclCommOpaque {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `ncclComm_t`: a communicator handle. Null is "no communicator" (`NCCL_COMM_NULL`).
pub(crate) type NcclComm = *mut NcclCommOpaque;

/// `NCCL_UNIQUE_ID_BYTES = 128` (nccl.h.in, all versions; RCCL the same).
pub(crate) const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: `typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;`.
///
/// Made by `ncclGetUniqueId` on one rank and handed to every rank (through the store), which
/// pass it **by value** to `ncclCommInitRankConfig`. `u8` has the size and alignment of C's
/// `char`, so the layout is the header's.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct NcclUniqueId {
    /// The opaque bytes (a bootstrap address and a magic, in NCCL's own format).
    pub(crate) internal: [u8; NCCL_UNIQUE_ID_BYTES],
}

impl NcclUniqueId {
    /// An all-zero id, to be filled by `ncclGetUniqueId` or [`from_bytes`](Self::from_bytes).
    pub(crate) const fn zeroed() -> NcclUniqueId {
        NcclUniqueId { internal: [0; NCCL_UNIQUE_ID_BYTES] }
    }

    /// The id's bytes, to send to the other ranks.
    pub(crate) const fn as_bytes(&self) -> &[u8; NCCL_UNIQUE_ID_BYTES] {
        &self.internal
    }

    /// The id received from another rank.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `bytes` is not exactly
    /// 128 bytes long (a truncated or foreign message).
    pub(crate) fn from_bytes(bytes: &[u8]) -> crate::error::Result<NcclUniqueId> {
        let internal: [u8; NCCL_UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            crate::error::Error::invalid(format!(
                "an NCCL unique id is {NCCL_UNIQUE_ID_BYTES} bytes, got {}; did every rank run the same oxccl?",
                bytes.len()
            ))
        })?;
        Ok(NcclUniqueId { internal })
    }
}

impl fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The first bytes are enough to tell ids apart in a log.
        f.write_str("NcclUniqueId(")?;
        for b in &self.internal[..16] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…)")
    }
}

/// `ncclDataType_t`: the element type of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub(crate) struct NcclDataType(pub(crate) c_int);

impl NcclDataType {
    /// `ncclInt8 = 0` (alias `ncclChar`).
    pub(crate) const INT8: NcclDataType = NcclDataType(0);
    /// `ncclUint8 = 1`.
    pub(crate) const UINT8: NcclDataType = NcclDataType(1);
    /// `ncclInt32 = 2` (alias `ncclInt`).
    pub(crate) const INT32: NcclDataType = NcclDataType(2);
    /// `ncclUint32 = 3`.
    pub(crate) const UINT32: NcclDataType = NcclDataType(3);
    /// `ncclInt64 = 4`.
    pub(crate) const INT64: NcclDataType = NcclDataType(4);
    /// `ncclUint64 = 5`.
    pub(crate) const UINT64: NcclDataType = NcclDataType(5);
    /// `ncclFloat16 = 6` (alias `ncclHalf`).
    pub(crate) const FLOAT16: NcclDataType = NcclDataType(6);
    /// `ncclFloat32 = 7` (alias `ncclFloat`).
    pub(crate) const FLOAT32: NcclDataType = NcclDataType(7);
    /// `ncclFloat64 = 8` (alias `ncclDouble`).
    pub(crate) const FLOAT64: NcclDataType = NcclDataType(8);
    /// `ncclBfloat16 = 9`. NCCL declares it only when built with CUDA 11 or newer
    /// (`__CUDA_BF16_TYPES_EXIST__`); a library built without it answers
    /// `ncclInvalidArgument`. RCCL has had it at 9 since ROCm 3.3.
    pub(crate) const BFLOAT16: NcclDataType = NcclDataType(9);

    /// The NCCL type of oxccl's `dtype`. Every [`DType`] has one.
    pub(crate) const fn from_dtype(dtype: DType) -> NcclDataType {
        match dtype {
            DType::I8 => NcclDataType::INT8,
            DType::U8 => NcclDataType::UINT8,
            DType::I32 => NcclDataType::INT32,
            DType::U32 => NcclDataType::UINT32,
            DType::I64 => NcclDataType::INT64,
            DType::U64 => NcclDataType::UINT64,
            DType::F16 => NcclDataType::FLOAT16,
            DType::BF16 => NcclDataType::BFLOAT16,
            DType::F32 => NcclDataType::FLOAT32,
            DType::F64 => NcclDataType::FLOAT64,
        }
    }
}

/// `ncclRedOp_t`: a reduction operator. Values from `ncclNumOps` (5) up are operators made
/// at run time by `ncclRedOpCreatePreMulSum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub(crate) struct NcclRedOp(pub(crate) c_int);

impl NcclRedOp {
    /// `ncclSum = 0`.
    pub(crate) const SUM: NcclRedOp = NcclRedOp(0);
    /// `ncclProd = 1`.
    pub(crate) const PROD: NcclRedOp = NcclRedOp(1);
    /// `ncclMax = 2` (note: before `ncclMin`, unlike oxccl's [`ReduceOp`] tags).
    pub(crate) const MAX: NcclRedOp = NcclRedOp(2);
    /// `ncclMin = 3`.
    pub(crate) const MIN: NcclRedOp = NcclRedOp(3);
    /// `ncclAvg = 4` (since NCCL 2.10.3).
    pub(crate) const AVG: NcclRedOp = NcclRedOp(4);
    /// `ncclNumOps = 5`: the number of built-in operators, and the first value of operators
    /// created at run time.
    pub(crate) const NUM_OPS: c_int = 5;

    /// The NCCL operator of oxccl's `op`. Every [`ReduceOp`] has one (NCCL's `ncclAvg`
    /// divides integer sums with truncation, which is what [`ReduceOp::Avg`] promises); a
    /// new `ReduceOp` variant will not compile here until its NCCL form is decided.
    pub(crate) const fn from_reduce_op(op: ReduceOp) -> NcclRedOp {
        match op {
            ReduceOp::Sum => NcclRedOp::SUM,
            ReduceOp::Prod => NcclRedOp::PROD,
            ReduceOp::Min => NcclRedOp::MIN,
            ReduceOp::Max => NcclRedOp::MAX,
            ReduceOp::Avg => NcclRedOp::AVG,
        }
    }
}

/// `ncclScalarResidence_t`: where the scalar of `ncclRedOpCreatePreMulSum` lives (since NCCL
/// 2.11.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub(crate) struct NcclScalarResidence(pub(crate) c_int);

impl NcclScalarResidence {
    /// `ncclScalarDevice = 0`: in device memory, read while the collective runs.
    pub(crate) const DEVICE: NcclScalarResidence = NcclScalarResidence(0);
    /// `ncclScalarHostImmediate = 1`: in host memory, read before the create call returns.
    pub(crate) const HOST_IMMEDIATE: NcclScalarResidence = NcclScalarResidence(1);
}

/// The `magic` of every `ncclConfig_t` (`NCCL_CONFIG_INITIALIZER`: `0xcafebeef`, named
/// `NCCL_API_MAGIC` since NCCL 2.29.2; RCCL the same). A config without it is refused with
/// `ncclInvalidArgument`.
pub(crate) const NCCL_CONFIG_MAGIC: c_uint = 0xcafe_beef;

/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`, since NCCL 2.17.1): "not set, use NCCL's default" in
/// the initializers of 2.17 and later. NCCL 2.14 to 2.16 do not know it and refuse it for
/// `blocking`, which is why [`NcclConfig`] starts `blocking` at 1 as 2.14's initializer does.
pub(crate) const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// The layout version of [`NcclConfig`]: `ncclConfig_v21400`, the struct of NCCL 2.14.3.
pub(crate) const CONFIG_LAYOUT: Version = Version::new(2, 14, 0);

/// `ncclConfig_t` as NCCL 2.14 declares it (`typedef struct ncclConfig_v21400 { size_t size;
/// unsigned int magic; unsigned int version; int blocking; } ncclConfig_t;`).
///
/// The struct is versioned, and every later one only appends fields (2.17: `cgaClusterSize`,
/// `minCTAs`, `maxCTAs`, `netName`; 2.18: `splitShare`; 2.26: `trafficClass`; 2.27:
/// `commName` ... up to 2.32's 26 fields). The library reads a caller's config this way
/// (NVIDIA/nccl `src/init.cc`, `ncclCommInitRankConfig` in 2.14 to 2.16, `parseCommConfig`
/// from 2.17 on; ROCm/rccl `src/init.cc` the same):
/// 1. it starts from its own `NCCL_CONFIG_INITIALIZER` (every field "undefined");
/// 2. it copies `min(config.size, sizeof(its ncclConfig_t))` bytes from the caller's struct
///    over it, so fields beyond our `size` keep the library's defaults;
/// 3. it refuses the config (`ncclInvalidArgument`) unless `magic == 0xcafebeef`;
/// 4. it resets to defaults every field newer than the caller's `version`
///    (`version < NCCL_VERSION(2,17,0)` resets `cgaClusterSize`, `minCTAs`, `maxCTAs`,
///    `netName`, and so on for 2.25, 2.27, 2.28, 2.29, 2.30, 2.30.5). This is what makes our
///    4 trailing padding bytes, which the copy drops into `cgaClusterSize`, harmless.
///
/// So an old, short config is valid for every newer library as long as `size` is our size
/// and `version` is the layout's (21400), **not** the loaded library's version. The
/// `blocking` value must be 0 or 1 for 2.14 to 2.16 (they refuse anything else); note that
/// `NCCL_COMM_BLOCKING=1` in the environment overrides it (and from 2.17 on, `=0` too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct NcclConfig {
    /// `sizeof(ncclConfig_t)`: 24 on 64-bit targets.
    pub(crate) size: usize,
    /// [`NCCL_CONFIG_MAGIC`].
    pub(crate) magic: c_uint,
    /// The layout's `NCCL_VERSION` code: [`CONFIG_LAYOUT`] (21400).
    pub(crate) version: c_uint,
    /// 1: calls on the communicator block until done; 0: they may return `ncclInProgress`
    /// and finish in the background (poll `ncclCommGetAsyncError`).
    pub(crate) blocking: c_int,
    /// The C struct's tail padding, made an explicit zero so every byte NCCL copies is
    /// defined (it lands in `cgaClusterSize` of newer layouts and is reset there, see above).
    tail_padding: c_int,
}

impl NcclConfig {
    /// What NCCL 2.14's `NCCL_CONFIG_INITIALIZER` gives: our size, the magic, the layout
    /// version, and `blocking = 1` (2.14's default; the only other field of this layout).
    pub(crate) const fn initializer() -> NcclConfig {
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: NCCL_CONFIG_MAGIC,
            version: CONFIG_LAYOUT.code(),
            blocking: 1,
            tail_padding: 0,
        }
    }

    /// The initializer with `blocking` set: `false` makes a non-blocking communicator.
    pub(crate) const fn with_blocking(blocking: bool) -> NcclConfig {
        let mut config = NcclConfig::initializer();
        config.blocking = blocking as c_int;
        config
    }
}
