//! The double's last error: [`fail`] sets it, `ncclGetLastError` and `ncclGetErrorString`
//! read it, and [`guard`] turns a panic in an `extern "C"` function into one.

use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{LazyLock, Mutex};

use crate::sync::relock;
use crate::xccl::library::types::{NcclComm, NcclResult};

/// Runs the body of an `extern "C"` function: a panic becomes `ncclInternalError` (with the
/// last error saying so) instead of unwinding into C.
pub(super) fn guard(call: &str, body: impl FnOnce() -> NcclResult) -> NcclResult {
    catch_unwind(AssertUnwindSafe(body))
        .unwrap_or_else(|_| fail(NcclResult::INTERNAL_ERROR, format!("{call}: the double panicked")))
}

/// Makes `message` the last error and returns `code` (for `return fail(...)`).
pub(super) fn fail(code: NcclResult, message: impl Display) -> NcclResult {
    set_last_error(&message.to_string());
    code
}

/// The most distinct last-error messages kept (each is kept for the life of the process, so
/// a pointer `ncclGetLastError` gave stays valid).
const MAX_MESSAGES: usize = 4096;

/// Every last-error message so far, interned for the life of the process.
static MESSAGES: LazyLock<Mutex<HashMap<String, &'static CStr>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The last error (one per process, as NCCL keeps it).
static LAST_ERROR: Mutex<&'static CStr> = Mutex::new(c"");

/// Makes `message` the last error.
pub(super) fn set_last_error(message: &str) {
    let interned = {
        let mut messages = relock(&MESSAGES);
        match messages.get(message) {
            Some(&c) => c,
            None if messages.len() >= MAX_MESSAGES => c"(the NCCL double has kept too many distinct errors)",
            None => {
                let c: &'static CStr =
                    Box::leak(CString::new(message.replace('\0', " ")).unwrap_or_default().into_boxed_c_str());
                messages.insert(message.to_string(), c);
                c
            }
        }
    };
    *relock(&LAST_ERROR) = interned;
    LAST_ON_THIS_THREAD.with(|l| l.set(interned));
}

thread_local! {
    /// The last error this thread caused: what a test reads, untouched by the tests that
    /// run beside it in the process (the process-wide one is NCCL's behaviour).
    static LAST_ON_THIS_THREAD: std::cell::Cell<&'static CStr> = const { std::cell::Cell::new(c"") };
}

/// The text of the last error this thread caused (for tests).
pub(super) fn last_error() -> String {
    LAST_ON_THIS_THREAD.with(|l| l.get().to_string_lossy().into_owned())
}

/// `const char* ncclGetLastError(ncclComm_t comm)`: the last error of the process (`comm` is
/// unused); the string stays valid for the life of the process.
///
/// # Safety
/// None needed: `comm` is not used.
pub(super) unsafe extern "C" fn nccl_get_last_error(_comm: NcclComm) -> *const c_char {
    catch_unwind(|| relock(&LAST_ERROR).as_ptr()).unwrap_or(c"".as_ptr())
}

/// `const char* ncclGetErrorString(ncclResult_t result)`: NCCL's text for each code.
///
/// # Safety
/// None needed.
pub(super) unsafe extern "C" fn nccl_get_error_string(result: NcclResult) -> *const c_char {
    let s: &'static CStr = match result {
        NcclResult::SUCCESS => c"no error",
        NcclResult::UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NcclResult::SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NcclResult::INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NcclResult::INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NcclResult::INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NcclResult::REMOTE_ERROR => c"remote process exited or there was a network error",
        NcclResult::IN_PROGRESS => c"NCCL operation in progress",
        NcclResult::TIMEOUT => c"operation timed out",
        _ => c"unknown result code",
    };
    s.as_ptr()
}
