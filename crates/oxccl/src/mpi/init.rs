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

use crate::sync::relock;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use mpi::ffi;

use super::cuda::{self, CudaSupport};
use super::dtype::UserOps;
use crate::config::{MpiConfig, ThreadLevel};
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

/// MPI, initialised; dropped (finalised) with the last communicator.
pub(crate) struct Runtime {
    /// The thread level MPI granted.
    pub level: ThreadLevel,
    serialized: bool,
    /// The value of `MPI_IN_PLACE` of this library (`(void*)1` for Open MPI, `(void*)-1` for
    /// MPICH and its derivatives); `None` when unknown: in-place forms then use temporaries.
    pub in_place: Option<usize>,
    /// The largest tag (`MPI_TAG_UB`).
    pub tag_ub: i32,
    /// The user operations.
    pub ops: UserOps,
    /// Device-pointer support.
    pub cuda: CudaSupport,
    /// `MPI_Get_library_version`, first line.
    pub library: String,
    /// The configuration MPI was initialised with.
    pub cfg: MpiConfig,
    /// Whether oxccl initialised MPI (and so finalises it).
    owns: bool,
}

static SERIAL: Mutex<()> = Mutex::new(());

enum Slot {
    Never,
    Live(Weak<Runtime>),
    Finalized,
}

static SLOT: Mutex<Slot> = Mutex::new(Slot::Never);

impl Runtime {
    /// Held around MPI calls: the process-wide lock when MPI is not thread-multiple.
    pub(crate) fn lock(&self) -> Option<MutexGuard<'static, ()>> {
        self.serialized.then(|| relock(&SERIAL))
    }

    /// `MPI_COMM_WORLD`'s handle.
    pub(crate) fn world() -> ffi::MPI_Comm {
        // SAFETY: reading the rsmpi shim's constant.
        unsafe { ffi::RSMPI_COMM_WORLD }
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
        Slot::Live(w) => {
            if let Some(rt) = w.upgrade() {
                return Ok(rt);
            }
            return Err(finalized());
        }
        Slot::Finalized => return Err(finalized()),
        Slot::Never => {}
    }
    let (mut inited, mut fin): (c_int, c_int) = (0, 0);
    // SAFETY: MPI_Initialized and MPI_Finalized may be called at any time.
    unsafe {
        ffi::MPI_Initialized(&mut inited);
        ffi::MPI_Finalized(&mut fin);
    }
    if fin != 0 {
        *slot = Slot::Finalized;
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
    *slot = Slot::Live(Arc::downgrade(&rt));
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
        super::graveyard::bury_all();
        self.ops.free();
        if self.owns {
            // SAFETY: the last communicator is gone; nothing of oxccl uses MPI any more.
            unsafe { ffi::MPI_Finalize() };
        }
        *slot = Slot::Finalized;
    }
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
