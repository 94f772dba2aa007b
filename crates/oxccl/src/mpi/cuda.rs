//! Device buffers on the `mpi` backend: detecting a CUDA-aware MPI, and staging through
//! host memory where MPI cannot take device pointers.
//!
//! * **Detection**: Open MPI exports `MPIX_Query_cuda_support()` (from `mpi-ext.h`) when it
//!   was built with CUDA; it returns 1 when the library can take device pointers *at run
//!   time*. oxccl looks the symbol up in the already loaded libraries (`dlsym(RTLD_DEFAULT)`),
//!   so the build never needs `mpi-ext.h`. [`MpiConfig::cuda_aware`](super::MpiConfig)
//!   overrides the answer (`yes`: trust the library, e.g. MVAPICH2-GDR or a Cray MPICH with
//!   `MPICH_GPU_SUPPORT_ENABLED=1`, which have no such query; `no`: always stage).
//! * **Staging** ([`crate::staging`], shared with the `cpu` backend): device inputs
//!   are copied into pinned host temporaries before the operation is posted, device outputs
//!   received into them and copied back once it has completed. Host memory "stages" with
//!   `memcpy`, which is how the path is tested without a GPU (`OXCCL_MPI_FORCE_STAGING=1`
//!   stages every buffer).
//! * A CUDA-aware MPI gets device pointers directly only for operations that need no work
//!   on the host (data movement, and integer/f32/f64 `Sum`/`Prod`/integer `Min`/`Max`
//!   reductions without `Avg`, without overlapping input and output); the others are staged.

use std::ffi::{c_int, CString};

/// What was found out about the MPI library's device-pointer support.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaSupport {
    /// Device pointers may be handed to MPI.
    Yes(String),
    /// They may not; device buffers are staged through host memory.
    No(String),
}

impl CudaSupport {
    /// Whether device pointers may go to MPI directly.
    pub fn is_aware(&self) -> bool {
        matches!(self, CudaSupport::Yes(_))
    }
}

/// The signature of `MPIX_Query_cuda_support`.
pub type QueryFn = unsafe extern "C" fn() -> c_int;

/// Decides the support from the configured mode and a symbol lookup.
pub fn detect(mode: crate::config::CudaAware, lookup: impl Fn(&str) -> Option<QueryFn>) -> CudaSupport {
    use crate::config::CudaAware;
    match mode {
        CudaAware::Yes => CudaSupport::Yes("OXCCL_MPI_CUDA_AWARE=yes (not checked with the library)".into()),
        CudaAware::No => CudaSupport::No("OXCCL_MPI_CUDA_AWARE=no".into()),
        CudaAware::Auto => match lookup("MPIX_Query_cuda_support") {
            None => CudaSupport::No(
                "the MPI library has no MPIX_Query_cuda_support (not an Open MPI built with CUDA); \
                 device buffers are staged through host memory"
                    .into(),
            ),
            // SAFETY: the symbol is Open MPI's `int MPIX_Query_cuda_support(void)`, which
            // takes nothing and only reads the library's state.
            Some(f) => match unsafe { f() } {
                1 => CudaSupport::Yes("MPIX_Query_cuda_support() = 1".into()),
                v => CudaSupport::No(format!(
                    "MPIX_Query_cuda_support() = {v}: this Open MPI was built with CUDA support but it is \
                     not enabled at run time; device buffers are staged through host memory"
                )),
            },
        },
    }
}

/// Looks `name` up in the libraries already loaded into the process.
pub fn lookup_loaded(name: &str) -> Option<QueryFn> {
    let c = CString::new(name).ok()?;
    // SAFETY: dlsym with RTLD_DEFAULT and a valid C string only searches the loaded objects.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // SAFETY: the only symbol looked up here is `int MPIX_Query_cuda_support(void)`.
        Some(unsafe { std::mem::transmute::<*mut libc::c_void, QueryFn>(p) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CudaAware;

    unsafe extern "C" fn yes() -> c_int {
        1
    }
    unsafe extern "C" fn no() -> c_int {
        0
    }

    #[test]
    fn detection() {
        assert!(detect(CudaAware::Auto, |_| Some(yes as QueryFn)).is_aware());
        let d = detect(CudaAware::Auto, |_| Some(no as QueryFn));
        assert!(matches!(&d, CudaSupport::No(w) if w.contains("= 0")), "{d:?}");
        let d = detect(CudaAware::Auto, |_| None);
        assert!(matches!(&d, CudaSupport::No(w) if w.contains("MPIX_Query_cuda_support")), "{d:?}");
        assert!(detect(CudaAware::Yes, |_| None).is_aware());
        assert!(!detect(CudaAware::No, |_| Some(yes as QueryFn)).is_aware());
        // The real lookup: this test binary has no MPI extension symbol.
        assert!(lookup_loaded("MPIX_Query_cuda_support_surely_absent").is_none());
    }
}
