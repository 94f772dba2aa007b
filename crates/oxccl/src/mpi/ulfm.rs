//! Recovery (revoke, agree, shrink, grow) on the `mpi` backend: MPI's own form of it is ULFM
//! (`MPIX_Comm_revoke`, `MPIX_Comm_agree`, `MPIX_Comm_shrink`, `MPIX_Comm_failure_ack`), which
//! only some MPIs export (Open MPI 5 built with ULFM; not Open MPI 4.1). This backend does not
//! call them: its calls answer [`Error::BackendUnavailable`] naming what the loaded MPI lacks
//! (or, where it has them, that oxccl does not use them yet), so the user knows to run
//! recovery on the `cpu` backend.

use crate::error::Error;

/// ULFM's functions that recovery would need.
pub(crate) const ULFM: [&str; 4] = ["MPIX_Comm_revoke", "MPIX_Comm_agree", "MPIX_Comm_shrink", "MPIX_Comm_failure_ack"];

/// Which of [`ULFM`] the loaded objects do not export.
pub(crate) fn missing() -> Vec<&'static str> {
    ULFM.into_iter().filter(|name| !exported(name)).collect()
}

/// Whether a loaded object exports `name`.
fn exported(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else { return false };
    // SAFETY: dlsym with RTLD_DEFAULT and a valid C string only searches the loaded objects;
    // the address is compared with null and never called.
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) }.is_null()
}

/// The error of `call` (`revoke`, `agree`, `shrink`, `grow`) on `library` (the MPI's
/// version line), given the ULFM functions it lacks.
pub(crate) fn unavailable(call: &str, library: &str, missing: &[&str]) -> Error {
    let why = if missing.is_empty() {
        format!(
            "{call} is not available on the mpi backend: {library} exports ULFM ({}), but oxccl does not use it \
             yet; run recovery on the cpu backend (OXCCL_BACKEND=cpu)",
            ULFM.join(", ")
        )
    } else {
        format!(
            "{call} needs ULFM, and {library} does not export {} (an Open MPI 5 built with ULFM does); run \
             recovery on the cpu backend (OXCCL_BACKEND=cpu)",
            missing.join(", ")
        )
    };
    Error::BackendUnavailable { backend: "mpi".into(), why }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_names_what_is_missing_or_says_it_is_not_used() {
        let e = unavailable("shrink", "Open MPI v4.1.4", &["MPIX_Comm_revoke", "MPIX_Comm_shrink"]).to_string();
        assert!(e.contains("shrink needs ULFM") && e.contains("MPIX_Comm_revoke, MPIX_Comm_shrink"), "{e}");
        assert!(e.contains("Open MPI v4.1.4") && e.contains("OXCCL_BACKEND=cpu"), "{e}");
        let e = unavailable("agree", "Open MPI v5.0.3", &[]).to_string();
        assert!(e.contains("exports ULFM") && e.contains("does not use it yet"), "{e}");
    }

    #[test]
    fn a_symbol_nobody_exports_is_missing() {
        assert!(!exported("MPIX_Comm_surely_not_a_function"));
        assert!(exported("malloc"));
    }
}
