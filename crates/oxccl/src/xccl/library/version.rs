//! NCCL versions: decoding `ncclGetVersion`'s integer, the oldest version we accept, and the
//! release in which each optional function appeared.
//!
//! RCCL reports the NCCL version it is based on (ROCm 5.5: 2.15.5, ROCm 6.2: 2.20.5), in the
//! same encoding, so the same rules apply to it.

use std::ffi::{c_int, c_uint, CStr};
use std::fmt;

/// A library version, `major.minor.patch`. Ordered by major, then minor, then patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Version {
    /// Major version (2 for every NCCL so far).
    pub(crate) major: u32,
    /// Minor version.
    pub(crate) minor: u32,
    /// Patch level.
    pub(crate) patch: u32,
}

/// The oldest NCCL we load: 2.14.0 (the first release is 2.14.3).
///
/// 2.14 is where everything the engine's life cycle rests on appeared together (NVIDIA/nccl
/// `src/nccl.h.in`, tag `v2.14.3-1`): `ncclCommInitRankConfig` with `ncclConfig_t.blocking`
/// (non-blocking creation, so a rank that never shows up is a timeout we control instead of
/// a thread stuck in NCCL), the `ncclInProgress` result that non-blocking calls answer, and
/// `ncclCommFinalize` (flush, then destroy without blocking). `ncclGetLastError` (2.13) and
/// `ncclRemoteError` (2.13) come with it. For RCCL this means ROCm 5.5 (RCCL 2.15.5) or
/// newer.
pub(crate) const MIN_SUPPORTED: Version = Version::new(2, 14, 0);

/// The release in which each optional function of the table first appeared in NVIDIA's
/// `nccl.h` (the first tag of NVIDIA/nccl whose `src/nccl.h.in` declares it). Presence is
/// decided by looking the symbol up, never by version: RCCL had `ncclGather`, `ncclScatter`
/// and `ncclAllToAll` long before NCCL did, and a library may be built without some.
#[cfg_attr(not(test), allow(dead_code))] // documentation in code; the tests check the table against it
pub(crate) const OPTIONAL_SINCE: [(&CStr, Version); 13] = [
    (c"ncclRedOpCreatePreMulSum", Version::new(2, 11, 4)),
    (c"ncclRedOpDestroy", Version::new(2, 11, 4)),
    (c"ncclCommSplit", Version::new(2, 18, 1)),
    (c"ncclMemAlloc", Version::new(2, 19, 1)),
    (c"ncclMemFree", Version::new(2, 19, 1)),
    (c"ncclCommRegister", Version::new(2, 19, 1)),
    (c"ncclCommDeregister", Version::new(2, 19, 1)),
    (c"ncclCommShrink", Version::new(2, 27, 3)),
    (c"ncclAlltoAll", Version::new(2, 28, 3)),
    (c"ncclGather", Version::new(2, 28, 3)),
    (c"ncclScatter", Version::new(2, 28, 3)),
    (c"ncclCommGetUniqueId", Version::new(2, 29, 2)),
    (c"ncclCommGrow", Version::new(2, 29, 2)),
];

/// The NCCL release that introduced the optional function `name`, if it is one of the
/// table's (for messages such as "ncclCommSplit needs NCCL 2.18.1 or newer").
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn optional_since(name: &CStr) -> Option<Version> {
    OPTIONAL_SINCE.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
}

impl Version {
    /// `major.minor.patch`.
    pub(crate) const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version { major, minor, patch }
    }

    /// Decodes the integer `ncclGetVersion` writes (`NCCL_VERSION_CODE`).
    ///
    /// The header's `NCCL_VERSION(X,Y,Z)` is `X*1000 + Y*100 + Z` up to 2.8 and
    /// `X*10000 + Y*100 + Z` from 2.9 on, so a code below 10000 is of the first kind (2.8.4 is
    /// 2804) and any other of the second (2.9.6 is 20906, 2.21.5 is 22105).
    ///
    /// # Errors
    /// A code that no NCCL writes (zero or negative), with the code in the message.
    pub(crate) fn from_code(code: c_int) -> Result<Version, String> {
        let c = u32::try_from(code).ok().filter(|&c| c > 0).ok_or_else(|| {
            format!("ncclGetVersion returned {code}, which is not a version code (expected e.g. 22105 for 2.21.5)")
        })?;
        Ok(if c < 10_000 {
            Version::new(c / 1000, (c % 1000) / 100, c % 100)
        } else {
            Version::new(c / 10_000, (c % 10_000) / 100, c % 100)
        })
    }

    /// The `NCCL_VERSION(major, minor, patch)` code of this version (the inverse of
    /// [`from_code`](Self::from_code) for real versions: patch and, from 2.9 on, minor below
    /// 100).
    pub(crate) const fn code(self) -> c_uint {
        if self.major <= 2 && self.minor <= 8 {
            self.major * 1000 + self.minor * 100 + self.patch
        } else {
            self.major * 10_000 + self.minor * 100 + self.patch
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}
