//! MPI's own words, which every other file of the backend stands on: [`check`] (an MPI return
//! code as oxccl's error, with MPI's error string) and `MPI_Get_library_version`'s text.

use std::ffi::{c_char, c_int};

use mpi::ffi;

use crate::error::{Error, Result};

/// MPI's error string for `code`.
pub(crate) fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; 1024];
    let mut len: c_int = 0;
    // SAFETY: the buffer is larger than MPI_MAX_ERROR_STRING of every MPI implementation
    // (Open MPI: 256, MPICH: 1024).
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != 0 {
        return format!("MPI error code {code}");
    }
    let bytes: Vec<u8> = buf[..usize::try_from(len).unwrap_or(0).min(buf.len())].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// `Ok` when `rc` is `MPI_SUCCESS`, else [`Error::Backend`] with MPI's own error string.
pub(crate) fn check(rc: c_int, what: &str) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Backend { code: i64::from(rc), message: format!("{what}: {}", error_string(rc)) })
    }
}

/// `MPI_Get_library_version`'s first line (callable before MPI is initialised).
pub(crate) fn library_version() -> String {
    library_text().lines().next().unwrap_or("unknown MPI").trim().to_string()
}

/// `MPI_Get_library_version`'s whole text (MPICH names its device there); "unknown MPI"
/// when the call fails. Callable before MPI is initialised.
pub(crate) fn library_text() -> String {
    let mut buf = vec![0 as c_char; 8192];
    let mut len: c_int = 0;
    // SAFETY: the buffer exceeds MPI_MAX_LIBRARY_VERSION_STRING of every implementation.
    let rc = unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr(), &mut len) };
    if rc != 0 {
        return "unknown MPI".into();
    }
    // Open MPI counts the terminating NUL in `len`: the text ends at the first NUL.
    let bytes: Vec<u8> = buf[..usize::try_from(len).unwrap_or(0).min(buf.len())]
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if text.trim().is_empty() {
        "unknown MPI".into()
    } else {
        text
    }
}
