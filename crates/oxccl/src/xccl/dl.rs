//! Opening a shared library at run time from an ordered list of candidates, and looking up
//! its symbols. Every failed try is remembered, so a library that cannot be found is
//! reported with every path tried and why each failed.

use std::ffi::{c_void, CStr};
use std::fmt;
use std::path::PathBuf;

/// One place to look for a library: a file name (searched by the dynamic loader: the
/// `LD_LIBRARY_PATH`, the ld.so cache, the system directories) or a full path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// What is handed to `dlopen`.
    pub(crate) path: PathBuf,
    /// Where the candidate came from (`$NCCL_HOME/lib`, `the loader's search path`), for
    /// the report.
    pub(crate) origin: String,
}

impl Candidate {
    /// A candidate `path` found through `origin`.
    pub(crate) fn new(path: impl Into<PathBuf>, origin: impl Into<String>) -> Candidate {
        Candidate { path: path.into(), origin: origin.into() }
    }
}

/// Every candidate tried, and why none would do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tried(pub(crate) Vec<String>);

impl Tried {
    /// Adds a line for a failed try.
    pub(crate) fn push(&mut self, candidate: &Candidate, why: impl fmt::Display) {
        self.0.push(format!("{} ({}): {why}", candidate.path.display(), candidate.origin));
    }
}

impl fmt::Display for Tried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no candidates");
        }
        f.write_str(&self.0.join("; "))
    }
}

/// An opened shared library; symbols looked up in it stay valid as long as it lives.
pub(crate) struct Opened {
    lib: libloading::Library,
    /// The candidate that opened.
    pub(crate) path: PathBuf,
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened").field("path", &self.path).finish()
    }
}

impl Opened {
    /// Opens `candidate`.
    ///
    /// # Errors
    /// The loader's message (file not found, wrong architecture, a dependency missing).
    pub(crate) fn open(candidate: &Candidate) -> Result<Opened, String> {
        // SAFETY: opening a library runs its initialisers. The candidates are the vendor
        // libraries this module is written for (NCCL, RCCL, the CUDA driver, HIP), whose
        // initialisers only set up their own state; opening them is how their users (PyTorch,
        // cudarc, nccl-tests) load them too.
        let lib = unsafe { libloading::Library::new(&candidate.path) }.map_err(|e| e.to_string())?;
        Ok(Opened { lib, path: candidate.path.clone() })
    }

    /// Opens the first candidate that the loader accepts and that `accept` approves (it
    /// checks the library's symbols or version; its error is recorded and the search goes
    /// on).
    ///
    /// # Errors
    /// Every candidate tried, with the reason each was rejected.
    pub(crate) fn first<T>(
        candidates: &[Candidate],
        mut accept: impl FnMut(Opened) -> Result<T, String>,
    ) -> Result<T, Tried> {
        let mut tried = Tried::default();
        for c in candidates {
            match Opened::open(c).and_then(&mut accept) {
                Ok(t) => return Ok(t),
                Err(why) => tried.push(c, why),
            }
        }
        Err(tried)
    }

    /// The address of `name`, or `None` when the library does not export it.
    pub(crate) fn symbol(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: the symbol is read as an untyped address, which is what `dlsym` returns;
        // giving it a type is the caller's business (the function tables check each
        // signature against the vendor's header).
        let sym = unsafe { self.lib.get::<*mut c_void>(name.to_bytes_with_nul()) }.ok()?;
        let addr = *sym;
        (!addr.is_null()).then_some(addr)
    }
}

/// Looks names up in a library for a table of its functions, and remembers the required
/// ones that are missing (so a table can name everything it lacks). The NCCL/RCCL, CUDA and
/// HIP tables are built with it through [`resolve_fields!`].
pub(crate) struct Resolver<'a> {
    lookup: &'a mut dyn FnMut(&CStr) -> Option<*mut c_void>,
    /// The required names the lookup had no address for, in the order asked.
    pub(crate) missing: Vec<String>,
}

impl<'a> Resolver<'a> {
    /// A resolver over `lookup` (a name to its address; `None` or null when absent).
    pub(crate) fn new(lookup: &'a mut dyn FnMut(&CStr) -> Option<*mut c_void>) -> Resolver<'a> {
        Resolver { lookup, missing: Vec::new() }
    }

    /// The function `name` as an `F`, or `None` when the lookup has no (non-null) address.
    ///
    /// # Safety
    /// `F` is the function pointer type the library's header declares for `name`, and an
    /// address the lookup gives for `name` is such a function, callable while the caller
    /// keeps the library loaded.
    pub(crate) unsafe fn optional<F: Copy>(&mut self, name: &CStr) -> Option<F> {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
        let addr = (self.lookup)(name).filter(|a| !a.is_null())?;
        // SAFETY: `F` is a function pointer type (the assertion above checks its size; the
        // caller's contract its type), `addr` is non-null, and the caller guarantees that
        // the address is a function of that type. Reading a pointer-sized value as another
        // is what `transmute_copy` does for pointer-to-function-pointer casts.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&addr) })
    }

    /// As [`optional`](Self::optional), remembering `name` when it is missing.
    ///
    /// # Safety
    /// As for [`optional`](Self::optional).
    pub(crate) unsafe fn required<F: Copy>(&mut self, name: &CStr) -> Option<F> {
        // SAFETY: passed on from our caller.
        let f = unsafe { self.optional(name) };
        if f.is_none() {
            self.missing.push(name.to_string_lossy().into_owned());
        }
        f
    }
}

/// Builds a function table `$table` from a [`Resolver`], field by field: the required
/// fields are listed once (each with its symbol), the optional ones with the expression that
/// finds them, and `library` starts as `None`. `Err("lacks A, B")` names every required
/// function that is missing. Its expressions call the resolver's unsafe methods: use it
/// inside an `unsafe` block whose `SAFETY` argues that every field's type is its symbol's
/// signature in the library's header.
macro_rules! resolve_fields {
    ($r:ident, $table:ident; required { $($req:ident = $rname:expr),* $(,)? } optional { $($opt:ident = $oexpr:expr),* $(,)? }) => {{
        $( let $req = $r.required($rname); )*
        $( let $opt = $oexpr; )*
        match ($($req,)*) {
            ($(Some($req),)*) => Ok($table { $($req,)* $($opt,)* library: None }),
            _ => Err(format!("lacks {}", $r.missing.join(", "))),
        }
    }};
}
pub(crate) use resolve_fields;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failed_candidate_is_reported_with_its_origin() {
        let cands = [
            Candidate::new("/nonexistent/libnccl.so.2", "$NCCL_HOME/lib"),
            Candidate::new("liboxccl-surely-missing.so.7", "the loader's search path"),
        ];
        let err = Opened::first(&cands, |_| Ok(())).expect_err("nothing to open");
        assert_eq!(err.0.len(), 2, "{err}");
        let text = err.to_string();
        assert!(text.contains("/nonexistent/libnccl.so.2 ($NCCL_HOME/lib): "), "{text}");
        assert!(text.contains("liboxccl-surely-missing.so.7 (the loader's search path): "), "{text}");
    }

    #[test]
    fn a_rejected_library_is_reported_and_the_search_goes_on() {
        // libc is always there; the first try is rejected by the check, the second accepted.
        let libc = Candidate::new("libc.so.6", "test");
        let mut seen = 0;
        let got = Opened::first(&[libc.clone(), libc], |lib| {
            seen += 1;
            if seen == 1 {
                Err("not the one".to_string())
            } else {
                Ok(lib.symbol(c"getpid").is_some() && lib.symbol(c"oxccl_no_such_symbol").is_none())
            }
        });
        assert_eq!(got, Ok(true));
    }
}
