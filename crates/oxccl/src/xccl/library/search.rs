//! Where the NCCL and RCCL libraries are looked for, in order.
//!
//! The environment comes in as a plain [`SearchEnv`] (built from the process by
//! [`SearchEnv::from_process`]) so that tests can describe any machine.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::xccl::dl::Candidate;

/// Which library: NVIDIA's NCCL or AMD's RCCL (which exports the same `nccl*` API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Flavor {
    /// NCCL, `libnccl.so.2`: the `nccl` backend.
    Nccl,
    /// RCCL, `librccl.so.1`: the `rccl` backend.
    Rccl,
}

impl Flavor {
    /// The backend's name in oxccl (`nccl`, `rccl`), as [`Error::BackendUnavailable`]
    /// reports it.
    ///
    /// [`Error::BackendUnavailable`]: crate::Error::BackendUnavailable
    pub(crate) const fn backend(self) -> &'static str {
        match self {
            Flavor::Nccl => "nccl",
            Flavor::Rccl => "rccl",
        }
    }

    /// The library's versioned file name (its soname), which the loader finds on its search
    /// path.
    pub(crate) const fn soname(self) -> &'static str {
        match self {
            Flavor::Nccl => "libnccl.so.2",
            Flavor::Rccl => "librccl.so.1",
        }
    }

    /// The unversioned development link name.
    pub(crate) const fn link_name(self) -> &'static str {
        match self {
            Flavor::Nccl => "libnccl.so",
            Flavor::Rccl => "librccl.so",
        }
    }

    /// What to do when no usable library was found.
    pub(crate) const fn install_hint(self) -> &'static str {
        match self {
            Flavor::Nccl => {
                "install NCCL 2.14 or newer: `pip install nvidia-nccl-cu12` in the active Python environment \
                 (or nvidia-nccl-cu11 for CUDA 11), your distribution's libnccl2 package, or NVIDIA's archive with \
                 NCCL_HOME set to where it was unpacked; or add the directory holding libnccl.so.2 to LD_LIBRARY_PATH"
            }
            Flavor::Rccl => {
                "install RCCL from ROCm 5.5 or newer (the rccl package) and set ROCM_PATH if ROCm is not in /opt/rocm; \
                 or add the directory holding librccl.so.1 to LD_LIBRARY_PATH"
            }
        }
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavor::Nccl => "NCCL",
            Flavor::Rccl => "RCCL",
        })
    }
}

/// The ROCm installation used when `ROCM_PATH` is not set.
pub(crate) const DEFAULT_ROCM_PATH: &str = "/opt/rocm";

/// Everything the search looks at. Empty environment variables count as unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SearchEnv {
    /// A library the user named (a file, or a directory holding the library). When set it is
    /// the only candidate: a user who names a library wants that one, or an error about it.
    pub(crate) explicit: Option<PathBuf>,
    /// `$NCCL_HOME`: an NCCL installation (its `lib/` and `lib64/` are searched).
    pub(crate) nccl_home: Option<PathBuf>,
    /// `$CUDA_HOME`: a CUDA toolkit (`lib64/`, where NVIDIA's packages may put NCCL).
    pub(crate) cuda_home: Option<PathBuf>,
    /// `$VIRTUAL_ENV`: an active Python virtual environment (the `nvidia-nccl-cu*` wheels put
    /// `libnccl.so.2` under `lib/python3*/site-packages/nvidia/nccl/lib`).
    pub(crate) virtual_env: Option<PathBuf>,
    /// `$CONDA_PREFIX`: an active conda environment (searched like a virtual environment).
    pub(crate) conda_prefix: Option<PathBuf>,
    /// `$ROCM_PATH`: the ROCm installation ([`DEFAULT_ROCM_PATH`] when unset).
    pub(crate) rocm_path: Option<PathBuf>,
}

/// A non-empty environment variable.
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

impl SearchEnv {
    /// The process's `NCCL_HOME`, `CUDA_HOME`, `VIRTUAL_ENV`, `CONDA_PREFIX` and `ROCM_PATH`,
    /// and no explicit library.
    pub(crate) fn from_process() -> SearchEnv {
        SearchEnv {
            explicit: None,
            nccl_home: env_path("NCCL_HOME"),
            cuda_home: env_path("CUDA_HOME"),
            virtual_env: env_path("VIRTUAL_ENV"),
            conda_prefix: env_path("CONDA_PREFIX"),
            rocm_path: env_path("ROCM_PATH"),
        }
    }

    /// The places to try for `flavor`, in order, without duplicates (the first origin of a
    /// path is kept):
    /// - the explicit library alone, when there is one;
    /// - NCCL: `$NCCL_HOME/lib`, `$NCCL_HOME/lib64`, `$CUDA_HOME/lib64`, then each
    ///   `lib/python3*/site-packages/nvidia/nccl/lib` of `$VIRTUAL_ENV` and `$CONDA_PREFIX`
    ///   (the `nvidia-nccl-cu*` wheels), then `libnccl.so.2` and `libnccl.so` on the loader's
    ///   search path;
    /// - RCCL: `$ROCM_PATH/lib` (`/opt/rocm/lib` when unset), then `librccl.so.1` and
    ///   `librccl.so` on the loader's search path.
    pub(crate) fn candidates(&self, flavor: Flavor) -> Vec<Candidate> {
        let soname = flavor.soname();
        let mut out = Vec::new();
        if let Some(path) = &self.explicit {
            let path = if path.is_dir() { path.join(soname) } else { path.clone() };
            out.push(Candidate::new(path, "the library named in the configuration"));
            return out;
        }
        match flavor {
            Flavor::Nccl => {
                if let Some(home) = &self.nccl_home {
                    out.push(Candidate::new(home.join("lib").join(soname), "$NCCL_HOME/lib"));
                    out.push(Candidate::new(home.join("lib64").join(soname), "$NCCL_HOME/lib64"));
                }
                if let Some(cuda) = &self.cuda_home {
                    out.push(Candidate::new(cuda.join("lib64").join(soname), "$CUDA_HOME/lib64"));
                }
                for (prefix, var) in [(&self.virtual_env, "$VIRTUAL_ENV"), (&self.conda_prefix, "$CONDA_PREFIX")] {
                    if let Some(prefix) = prefix {
                        for dir in python_nccl_dirs(prefix) {
                            let origin = format!("the nvidia-nccl wheel in {var}");
                            out.push(Candidate::new(dir.join(soname), origin));
                        }
                    }
                }
            }
            Flavor::Rccl => match &self.rocm_path {
                Some(rocm) => out.push(Candidate::new(rocm.join("lib").join(soname), "$ROCM_PATH/lib")),
                None => out.push(Candidate::new(
                    Path::new(DEFAULT_ROCM_PATH).join("lib").join(soname),
                    "/opt/rocm/lib (ROCM_PATH is not set)",
                )),
            },
        }
        out.push(Candidate::new(soname, "the loader's search path"));
        out.push(Candidate::new(flavor.link_name(), "the loader's search path"));
        dedup(out)
    }
}

/// The `lib/python3*/site-packages/nvidia/nccl/lib` directories of the Python environment at
/// `prefix`, sorted by name (a directory that cannot be read has none).
fn python_nccl_dirs(prefix: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
        return Vec::new();
    };
    let mut pythons: Vec<OsString> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|name| name.to_str().is_some_and(|n| n.starts_with("python3")))
        .collect();
    pythons.sort();
    pythons
        .into_iter()
        .map(|py| prefix.join("lib").join(py).join("site-packages").join("nvidia").join("nccl").join("lib"))
        .collect()
}

/// `candidates` without later repeats of a path.
fn dedup(candidates: Vec<Candidate>) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::with_capacity(candidates.len());
    for c in candidates {
        if !out.iter().any(|seen| seen.path == c.path) {
            out.push(c);
        }
    }
    out
}
