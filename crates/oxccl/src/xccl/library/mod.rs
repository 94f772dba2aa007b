//! The NCCL library, loaded at run time: its function table, its version, and turning its
//! result codes into oxccl errors.
//!
//! Rooms:
//! - [`types`]: the C ABI of `nccl.h` (result codes, ids, data types, operators, config);
//! - [`version`]: version codes, the oldest supported release, when optional calls appeared;
//! - [`table`]: the typed function pointers, resolved by name;
//! - [`search`]: where NCCL and RCCL are looked for.
//!
//! NCCL and RCCL export the same `nccl*` names with the same ABI, so one [`Library`] serves
//! both; [`Flavor`] says which was asked for.

pub(crate) mod search;
pub(crate) mod table;
pub(crate) mod types;
pub(crate) mod version;

#[cfg(test)]
mod tests;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) use search::{Flavor, SearchEnv};
pub(crate) use table::Table;
pub(crate) use types::{NcclComm, NcclResult};
pub(crate) use version::{Version, MIN_SUPPORTED};

use crate::error::Error;
use crate::xccl::dl::{Candidate, Opened};
use table::GetVersionFn;

/// A loaded NCCL (or RCCL) that has every required function and is recent enough.
#[derive(Debug, Clone)]
pub(crate) struct Library {
    /// The functions (keeping the library loaded).
    pub(crate) table: Table,
    /// What `ncclGetVersion` reported.
    pub(crate) version: Version,
    /// The candidate that loaded (a full path, or a file name the loader resolved).
    pub(crate) path: PathBuf,
    /// NCCL or RCCL.
    pub(crate) flavor: Flavor,
}

/// Whether a call on a non-blocking communicator has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// `ncclSuccess`: done.
    Done,
    /// `ncclInProgress`: accepted and still running; poll `ncclCommGetAsyncError`.
    InProgress,
}

impl Library {
    /// Loads `flavor` from the first of `env`'s [candidates](SearchEnv::candidates) that
    /// opens, has every required function and is at least [`MIN_SUPPORTED`].
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] (backend `nccl` or `rccl`) naming every path tried and
    /// what was wrong with each (not found, lacks functions, too old), and how to install
    /// the library.
    pub(crate) fn load(flavor: Flavor, env: &SearchEnv) -> Result<Library, Error> {
        Library::load_from(flavor, &env.candidates(flavor))
    }

    /// As [`load`](Self::load), from the given candidates.
    ///
    /// # Errors
    /// As [`load`](Self::load); with no candidates, says so.
    pub(crate) fn load_from(flavor: Flavor, candidates: &[Candidate]) -> Result<Library, Error> {
        Opened::first(candidates, |opened| accept(flavor, opened)).map_err(|tried| Error::BackendUnavailable {
            backend: flavor.backend().to_string(),
            why: format!("no usable {flavor} library; tried {tried}. To fix: {}", flavor.install_hint()),
        })
    }

    /// A library made of `table` (a test double's functions), checked as a loaded one is:
    /// its `ncclGetVersion` must work and report at least [`MIN_SUPPORTED`].
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] with the version problem.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn from_table(table: Table, flavor: Flavor, path: impl Into<PathBuf>) -> Result<Library, Error> {
        let path = path.into();
        Library::checked(table, flavor, path.clone()).map_err(|why| Error::BackendUnavailable {
            backend: flavor.backend().to_string(),
            why: format!("{}: {why}. To fix: {}", path.display(), flavor.install_hint()),
        })
    }

    /// The library if its version is supported.
    fn checked(table: Table, flavor: Flavor, path: PathBuf) -> Result<Library, String> {
        let version = query_version(table.get_version)?;
        if version < MIN_SUPPORTED {
            return Err(too_old(flavor, version));
        }
        Ok(Library { table, version, path, flavor })
    }

    /// One line for diagnostics: `NCCL 2.21.5 (/usr/lib/x86_64-linux-gnu/libnccl.so.2)`.
    pub(crate) fn describe(&self) -> String {
        format!("{} {} ({})", self.flavor, self.version, self.path.display())
    }

    /// `Ok` for `ncclSuccess`; otherwise the error of [`error`](Self::error).
    ///
    /// # Errors
    /// [`Error::Backend`] for any other result, `ncclInProgress` included (use
    /// [`check_progress`](Self::check_progress) where that is expected).
    pub(crate) fn check(&self, call: &str, result: NcclResult, comm: NcclComm) -> Result<(), Error> {
        if result.is_success() {
            Ok(())
        } else {
            Err(self.error(call, result, comm))
        }
    }

    /// As [`check`](Self::check), for calls on a non-blocking communicator, where
    /// `ncclInProgress` means "accepted, still running".
    ///
    /// # Errors
    /// [`Error::Backend`] for any result other than `ncclSuccess` and `ncclInProgress`.
    pub(crate) fn check_progress(&self, call: &str, result: NcclResult, comm: NcclComm) -> Result<Progress, Error> {
        match result {
            NcclResult::SUCCESS => Ok(Progress::Done),
            NcclResult::IN_PROGRESS => Ok(Progress::InProgress),
            _ => Err(self.error(call, result, comm)),
        }
    }

    /// [`Error::Backend`] for `result` of `call`: the code, and the message
    /// `"{call}: {ncclGetErrorString}; NCCL's last error: {ncclGetLastError}"` (the last part
    /// when NCCL has one). `comm` may be null: NCCL ignores it and keeps one last error per
    /// process, so under concurrent failures it may belong to another call.
    pub(crate) fn error(&self, call: &str, result: NcclResult, comm: NcclComm) -> Error {
        // SAFETY: `get_error_string` is the library's ncclGetErrorString (the table's
        // contract), which takes any value (unknown ones give "unknown result code") and
        // returns a pointer to a static string.
        let what = unsafe { owned_c_str((self.table.get_error_string)(result)) }
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| result.to_string());
        // SAFETY: `get_last_error` is the library's ncclGetLastError, which accepts any
        // communicator (null included: the header says it is unused) and returns its static,
        // NUL-terminated last-error buffer, copied here at once.
        let last = unsafe { owned_c_str((self.table.get_last_error)(comm)) };
        let message = match last.filter(|l| !l.trim().is_empty()) {
            Some(last) => format!("{call}: {what}; {}'s last error: {}", self.flavor, last.trim_end()),
            None => format!("{call}: {what}"),
        };
        Error::Backend { code: i64::from(result.0), message }
    }
}

/// Accepts an opened candidate as `flavor` if it has every required function and a
/// supported version; otherwise says what is wrong with it.
fn accept(flavor: Flavor, opened: Opened) -> Result<Library, String> {
    let lib = Arc::new(opened);
    let path = lib.path.clone();
    match Table::from_library(Arc::clone(&lib)) {
        Ok(table) => Library::checked(table, flavor, path),
        Err(lacks) => {
            // An old release is the usual reason for missing functions; say so when the
            // library can tell its version.
            let version = lib.symbol(c"ncclGetVersion").map(|addr| {
                // SAFETY: the library exports ncclGetVersion, declared in nccl.h (every
                // version) as `ncclResult_t ncclGetVersion(int*)`, which is `GetVersionFn`;
                // `lib` stays loaded while it is called below.
                let get_version = unsafe { std::mem::transmute::<*mut c_void, GetVersionFn>(addr) };
                query_version(get_version)
            });
            Err(match version {
                Some(Ok(v)) if v < MIN_SUPPORTED => format!("{}; it {lacks}", too_old(flavor, v)),
                Some(Ok(v)) => format!("{flavor} {v} {lacks}"),
                _ => format!("not {flavor}: it {lacks}"),
            })
        }
    }
}

/// Why a library of `version` is refused.
fn too_old(flavor: Flavor, version: Version) -> String {
    format!("{flavor} {version} is older than the oldest supported {MIN_SUPPORTED}")
}

/// Asks the library for its version.
fn query_version(get_version: GetVersionFn) -> Result<Version, String> {
    let mut code: c_int = 0;
    // SAFETY: `get_version` is a library's ncclGetVersion (the contract of `Table` and of
    // our caller), which writes one int through the valid pointer it is given.
    let result = unsafe { get_version(&mut code) };
    if !result.is_success() {
        return Err(format!("ncclGetVersion failed with {result}"));
    }
    Version::from_code(code)
}

/// Copies a C string the library returned; `None` for null.
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string that stays unchanged during the call.
unsafe fn owned_c_str(ptr: *const c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated, by the caller's contract.
    Some(unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned())
}
