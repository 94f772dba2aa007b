//! The error codes the double reports. They are the CUDA driver API's numbers for the same
//! conditions, so a message from the double reads like one from the real runtime.

use std::fmt;

use crate::error::Error;

/// An argument is out of range or inconsistent (`CUDA_ERROR_INVALID_VALUE`).
pub(crate) const INVALID_VALUE: i64 = 1;
/// An allocation failed (`CUDA_ERROR_OUT_OF_MEMORY`).
pub(crate) const OUT_OF_MEMORY: i64 = 2;
/// The runtime is shutting down (`CUDA_ERROR_DEINITIALIZED`).
pub(crate) const DEINITIALIZED: i64 = 4;
/// A device ordinal out of range (`CUDA_ERROR_INVALID_DEVICE`).
pub(crate) const INVALID_DEVICE: i64 = 101;
/// The operating system refused something (a worker thread) (`CUDA_ERROR_OPERATING_SYSTEM`).
pub(crate) const OPERATING_SYSTEM: i64 = 304;
/// A stream or event handle the runtime does not know (`CUDA_ERROR_INVALID_HANDLE`).
pub(crate) const INVALID_HANDLE: i64 = 400;
/// Queued work touched memory that was no longer allocated (`CUDA_ERROR_ILLEGAL_ADDRESS`).
pub(crate) const ILLEGAL_ADDRESS: i64 = 700;
/// Queued work failed (`CUDA_ERROR_LAUNCH_FAILED`); the code of a failed job that reported
/// no code of its own.
pub(crate) const LAUNCH_FAILED: i64 = 719;

/// An [`Error::Backend`] with `code`, its message prefixed with the call that failed.
pub(crate) fn fail(code: i64, call: &str, what: impl fmt::Display) -> Error {
    Error::Backend { code, message: format!("host runtime {call}: {what}") }
}

/// The code and the text of `e`, to wrap it in a message of our own: a backend error keeps
/// its code, anything else gets `code`.
pub(crate) fn split(e: Error, code: i64) -> (i64, String) {
    match e {
        Error::Backend { code, message } => (code, message),
        other => (code, other.to_string()),
    }
}
