//! ULFM's functions, found at run time with `dlsym` in the objects the process has loaded
//! (the MPI library the binary is linked against), so that oxccl builds and links against an
//! MPI without them (Open MPI 4.1) and uses them where the MPI that runs has them. Nothing
//! here is a link-time reference.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

use mpi::ffi;

use super::classes::{self, Classes};
use crate::mpi::check::{library_text, library_version};

/// `int MPIX_Comm_revoke(MPI_Comm comm)`, also `MPIX_Comm_failure_ack`.
type CommFn = unsafe extern "C" fn(ffi::MPI_Comm) -> c_int;
/// `int MPIX_Comm_agree(MPI_Comm comm, int *flag)`.
type AgreeFn = unsafe extern "C" fn(ffi::MPI_Comm, *mut c_int) -> c_int;
/// `int MPIX_Comm_iagree(MPI_Comm comm, int *flag, MPI_Request *request)`.
type IagreeFn = unsafe extern "C" fn(ffi::MPI_Comm, *mut c_int, *mut ffi::MPI_Request) -> c_int;
/// `int MPIX_Comm_shrink(MPI_Comm comm, MPI_Comm *newcomm)`.
type ShrinkFn = unsafe extern "C" fn(ffi::MPI_Comm, *mut ffi::MPI_Comm) -> c_int;
/// `int MPIX_Comm_failure_get_acked(MPI_Comm comm, MPI_Group *failedgrp)`.
type GetAckedFn = unsafe extern "C" fn(ffi::MPI_Comm, *mut ffi::MPI_Group) -> c_int;

/// ULFM's functions that recovery needs; `MPIX_Comm_iagree` is used where exported too.
pub(crate) const REQUIRED: [&str; 5] =
    ["MPIX_Comm_revoke", "MPIX_Comm_agree", "MPIX_Comm_shrink", "MPIX_Comm_failure_ack", "MPIX_Comm_failure_get_acked"];

/// The loaded MPI's ULFM, with its error classes.
pub(crate) struct Ulfm {
    /// `MPIX_Comm_revoke`.
    pub(crate) revoke: CommFn,
    /// `MPIX_Comm_agree` (blocking; used where `iagree` is missing).
    pub(crate) agree: AgreeFn,
    /// `MPIX_Comm_iagree` (Open MPI 5), which lets an agreement end at a deadline.
    pub(crate) iagree: Option<IagreeFn>,
    /// `MPIX_Comm_shrink`.
    pub(crate) shrink: ShrinkFn,
    /// `MPIX_Comm_failure_ack`.
    pub(crate) failure_ack: CommFn,
    /// `MPIX_Comm_failure_get_acked`.
    pub(crate) failure_get_acked: GetAckedFn,
    /// The MPI's values of ULFM's error classes.
    pub(crate) classes: Classes,
}

/// The address of `name` in the loaded objects; null when none exports it.
fn lookup(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only searches the objects
    // already loaded; it has no other effect.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// Whether a loaded object exports `name`.
pub(crate) fn exported(name: &str) -> bool {
    std::ffi::CString::new(name).is_ok_and(|c| !lookup(&c).is_null())
}

/// Which of [`REQUIRED`] the loaded objects do not export.
pub(crate) fn missing() -> Vec<&'static str> {
    REQUIRED.into_iter().filter(|name| !exported(name)).collect()
}

/// `name`'s address as a function pointer of type `F`, `None` when not exported.
///
/// # Safety
/// `F` must be an `unsafe extern "C" fn` type whose signature is the C prototype of `name`.
unsafe fn function<F: Copy>(name: &CStr) -> Option<F> {
    let p = lookup(name);
    if p.is_null() {
        return None;
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: `p` is the address of the function `name` in a loaded object, and the caller
    // guarantees that `F` is a function-pointer type with its prototype; function pointers
    // and data pointers have the same size and representation on the platforms MPI runs on
    // (POSIX requires it of dlsym's result).
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// Resolves every function; `Err` says why recovery cannot run (what is missing, or why
/// this MPI's ULFM cannot be used), for [`super::unavailable`]'s sentence.
fn load() -> Result<Ulfm, String> {
    let first = library_version();
    let absent = missing();
    if !absent.is_empty() {
        return Err(format!(
            "{first} does not export {} (ULFM: an Open MPI 5 built with it does, run with `mpiexec --with-ft ulfm`)",
            absent.join(", ")
        ));
    }
    let classes = classes::usable(&library_text())?;
    // SAFETY: each type is the prototype of its function in the MPI headers (Open MPI's
    // mpiext_ftmpi_c.h, MPICH's mpi_proto.h: the same signatures), with rsmpi's bindings of
    // the same library's MPI_Comm, MPI_Group and MPI_Request.
    unsafe {
        let missing_one = || "a ULFM function vanished between two lookups".to_string();
        Ok(Ulfm {
            revoke: function::<CommFn>(c"MPIX_Comm_revoke").ok_or_else(missing_one)?,
            agree: function::<AgreeFn>(c"MPIX_Comm_agree").ok_or_else(missing_one)?,
            iagree: function::<IagreeFn>(c"MPIX_Comm_iagree"),
            shrink: function::<ShrinkFn>(c"MPIX_Comm_shrink").ok_or_else(missing_one)?,
            failure_ack: function::<CommFn>(c"MPIX_Comm_failure_ack").ok_or_else(missing_one)?,
            failure_get_acked: function::<GetAckedFn>(c"MPIX_Comm_failure_get_acked").ok_or_else(missing_one)?,
            classes,
        })
    }
}

static LOADED: OnceLock<Result<Ulfm, String>> = OnceLock::new();

/// The loaded MPI's ULFM (resolved once per process), or why it cannot be used.
pub(crate) fn ulfm() -> Result<&'static Ulfm, &'static str> {
    LOADED.get_or_init(load).as_ref().map_err(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symbol_nobody_exports_is_missing() {
        assert!(!exported("MPIX_Comm_surely_not_a_function"));
        assert!(exported("malloc"));
        assert!(!exported("with\0nul"));
        // SAFETY: the type is never called; `malloc` exists, the other does not.
        unsafe {
            assert!(function::<CommFn>(c"MPIX_Comm_surely_not_a_function").is_none());
            assert!(function::<CommFn>(c"malloc").is_some());
        }
    }
}
