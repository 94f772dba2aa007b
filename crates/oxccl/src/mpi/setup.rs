//! MPI's life cycle: initialised once (`MPI_Init_thread`, asking for
//! [`MpiConfig::thread_level`](super::MpiConfig)), finalised once, when the last
//! communicator of the `mpi` backend is gone (every communicator holds an `Arc<Runtime>`).
//! MPI cannot be initialised again in the same process afterwards; a later `init` says so.
//!
//! When MPI grants less than `MPI_THREAD_MULTIPLE`, every MPI call oxccl makes is serialised
//! behind one process-wide lock ([`Runtime::lock`]), and a note says so once on stderr.
//! When the process had already initialised MPI itself, oxccl uses that MPI and leaves
//! finalising to its owner.
//!
//! Communicators that are dropped go to a graveyard: their MPI communicator is freed only
//! once every peer has said it left too (so that a late notice from a peer can never land in
//! a new communicator that reuses the context id), or at finalisation.
//!
//! [`init_process`] and [`init_with`] create this process's rank of the world: the
//! [`Runtime`] (`runtime.rs`), then a duplicate of `MPI_COMM_WORLD`, as an [`MpiBackend`]
//! (`backend.rs`).

use crate::sync::relock;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, Weak};

use mpi::ffi;

use super::backend::{from_comm, MpiBackend};
use super::check::{check, library_version};
use super::comm::Comm;
use super::cuda;
use super::dtype::UserOps;
use super::graveyard;
use super::runtime::Runtime;
use crate::config::{MpiConfig, ResolvedConfig, ThreadLevel};
use crate::error::{Error, Result};

fn level_of(v: c_int) -> ThreadLevel {
    // SAFETY: reading the rsmpi shim's constants.
    unsafe {
        if v == ffi::RSMPI_THREAD_MULTIPLE {
            ThreadLevel::Multiple
        } else if v == ffi::RSMPI_THREAD_SERIALIZED {
            ThreadLevel::Serialized
        } else if v == ffi::RSMPI_THREAD_FUNNELED {
            ThreadLevel::Funneled
        } else {
            ThreadLevel::Single
        }
    }
}

fn level_value(l: ThreadLevel) -> c_int {
    // SAFETY: reading the rsmpi shim's constants.
    unsafe {
        match l {
            ThreadLevel::Single => ffi::RSMPI_THREAD_SINGLE,
            ThreadLevel::Funneled => ffi::RSMPI_THREAD_FUNNELED,
            ThreadLevel::Serialized => ffi::RSMPI_THREAD_SERIALIZED,
            ThreadLevel::Multiple => ffi::RSMPI_THREAD_MULTIPLE,
        }
    }
}

enum Lifecycle {
    Never,
    Live(Weak<Runtime>),
    Finalized,
}

static SLOT: Mutex<Lifecycle> = Mutex::new(Lifecycle::Never);

/// `MPI_IN_PLACE` of the library named by `version` (it is a macro, not a symbol).
pub(crate) fn in_place_of(version: &str) -> Option<usize> {
    if version.contains("Open MPI") {
        Some(1)
    } else if ["MPICH", "Intel(R) MPI", "MVAPICH", "CRAY MPICH"].iter().any(|n| version.contains(n)) {
        Some(usize::MAX)
    } else {
        None
    }
}

/// The live runtime, initialising MPI on first use.
///
/// # Errors
/// [`Error::BackendUnavailable`] when MPI was already finalised in this process or does
/// not initialise; MPI's errors.
pub(crate) fn acquire(cfg: &MpiConfig) -> Result<Arc<Runtime>> {
    let mut slot = relock(&SLOT);
    match &*slot {
        Lifecycle::Live(w) => {
            if let Some(rt) = w.upgrade() {
                return Ok(rt);
            }
            return Err(finalized());
        }
        Lifecycle::Finalized => return Err(finalized()),
        Lifecycle::Never => {}
    }
    let (mut inited, mut fin): (c_int, c_int) = (0, 0);
    // SAFETY: MPI_Initialized and MPI_Finalized may be called at any time.
    unsafe {
        ffi::MPI_Initialized(&mut inited);
        ffi::MPI_Finalized(&mut fin);
    }
    if fin != 0 {
        *slot = Lifecycle::Finalized;
        return Err(finalized());
    }
    let owns = inited == 0;
    let mut provided: c_int = 0;
    if owns {
        for (k, v) in &cfg.tuning_env {
            std::env::set_var(k, v);
        }
        // SAFETY: MPI is not initialised (checked above, under SLOT's lock); null argc/argv
        // is allowed since MPI-2.
        let rc = unsafe {
            ffi::MPI_Init_thread(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                level_value(cfg.thread_level),
                &mut provided,
            )
        };
        if rc != 0 {
            return Err(Error::BackendUnavailable {
                backend: "mpi".into(),
                why: format!("MPI_Init_thread failed (code {rc})"),
            });
        }
    } else {
        // SAFETY: MPI is initialised.
        unsafe { ffi::MPI_Query_thread(&mut provided) };
    }
    let level = level_of(provided);
    check(
        // SAFETY: MPI is initialised; errors on the world communicator now return codes.
        unsafe { ffi::MPI_Comm_set_errhandler(Runtime::world(), ffi::RSMPI_ERRORS_RETURN) },
        "MPI_Comm_set_errhandler",
    )?;
    let library = library_version();
    let serialized = level < ThreadLevel::Multiple;
    if serialized {
        // Said once per job: by MPI's own rank 0 (no launcher variables needed).
        let mut world_rank: c_int = 0;
        // SAFETY: MPI is initialised and the world communicator is valid; on an error the
        // rank stays 0 and the note is printed, which is harmless.
        unsafe { ffi::MPI_Comm_rank(Runtime::world(), &mut world_rank) };
        if world_rank == 0 {
            tracing::warn!(
                "MPI granted {} (asked for {}); the mpi backend serialises every MPI call behind one \
                 process-wide lock, so communicators used from several threads wait for each other{}",
                level.name(),
                cfg.thread_level.name(),
                if level < ThreadLevel::Serialized {
                    "; with less than MPI_THREAD_SERIALIZED, use oxccl from the thread that initialised it only"
                } else {
                    ""
                }
            );
        }
    }
    let mut tag_ub: c_int = 32767;
    let mut attr: *mut c_int = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: MPI_TAG_UB is a predefined attribute of MPI_COMM_WORLD whose value is a
    // pointer to an int owned by MPI.
    unsafe {
        if ffi::MPI_Comm_get_attr(
            Runtime::world(),
            ffi::MPI_TAG_UB as c_int,
            (&mut attr as *mut *mut c_int).cast::<c_void>(),
            &mut flag,
        ) == 0
            && flag != 0
            && !attr.is_null()
        {
            tag_ub = *attr;
        }
    }
    let ops = UserOps::create()?;
    let cuda = cuda::detect(cfg.cuda_aware, cuda::lookup_loaded);
    let rt = Arc::new(Runtime {
        level,
        serialized,
        in_place: in_place_of(&library),
        tag_ub,
        ops,
        cuda,
        library,
        cfg: cfg.clone(),
        owns,
    });
    *slot = Lifecycle::Live(Arc::downgrade(&rt));
    Ok(rt)
}

fn finalized() -> Error {
    Error::BackendUnavailable {
        backend: "mpi".into(),
        why: "MPI was already finalised in this process (after its last communicator was dropped), and MPI \
              cannot be initialised twice; keep one communicator alive for the life of the program"
            .into(),
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let mut slot = relock(&SLOT);
        let _serial = self.lock();
        graveyard::bury_all();
        self.ops.free();
        if self.owns {
            // SAFETY: the last communicator is gone; nothing of oxccl uses MPI any more.
            unsafe { ffi::MPI_Finalize() };
        }
        *slot = Lifecycle::Finalized;
    }
}

/// Creates this process's rank of (a duplicate of) `MPI_COMM_WORLD` with the resolved
/// `mpi` settings (`cfg.mpi`: the builder's, else the `OXCCL_MPI_*` variables).
///
/// # Errors
/// [`Error::BackendUnavailable`] when MPI does not initialise (or was finalised
/// already); MPI's errors.
pub fn init_process(cfg: &ResolvedConfig) -> Result<MpiBackend> {
    init_with(cfg, &cfg.mpi)
}

/// [`init_process`] with an explicit [`MpiConfig`] (used when this call initialises MPI;
/// later communicators share the first one's MPI).
///
/// # Errors
/// As [`init_process`].
pub fn init_with(cfg: &ResolvedConfig, mpi_cfg: &MpiConfig) -> Result<MpiBackend> {
    let rt = acquire(mpi_cfg)?;
    // SAFETY: a zeroed handle is overwritten by MPI_Comm_dup.
    let mut comm: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
    {
        let _g = rt.lock();
        // SAFETY: MPI is initialised; duplicating the world gives oxccl its own context.
        check(unsafe { ffi::MPI_Comm_dup(Runtime::world(), &mut comm) }, "MPI_Comm_dup")?;
        // SAFETY: `comm` was just created.
        check(unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler")?;
    }
    from_comm(rt, Comm(comm), cfg.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_constants() {
        assert_eq!(in_place_of("Open MPI v4.1.4, package: Debian OpenMPI"), Some(1));
        assert_eq!(in_place_of("MPICH Version: 4.0"), Some(usize::MAX));
        assert_eq!(in_place_of("SomeOtherMPI 1.0"), None);
    }
}
