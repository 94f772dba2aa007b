//! Choosing a backend: by name, or on `auto` the available one with the highest priority,
//! with the reason each skipped backend was unavailable.

use crate::backend::{cpu, local};
use crate::communicator::Communicator;
use crate::config::{BackendChoice, ResolvedConfig};
use crate::error::{Error, Result};

/// Every backend name oxccl knows, built into this binary or not.
pub const KNOWN: [&str; 5] = ["nccl", "rccl", "mpi", "cpu", "local"];

/// A backend that can be created.
pub trait BackendFactory: Sync {
    /// The backend's name.
    fn name(&self) -> &'static str;
    /// Higher wins on `auto`.
    fn priority(&self) -> u32;
    /// `Ok` when the backend can run here, else why not.
    fn availability(&self) -> std::result::Result<(), String>;
    /// Creates `n` communicators of one world inside this process.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] when the backend cannot host several ranks in one process.
    fn create_world(&self, cfg: &ResolvedConfig, n: usize) -> Result<Vec<Communicator>>;
    /// Creates this process's communicator of the world the environment describes.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] when the backend cannot serve this launch.
    fn create_process(&self, cfg: &ResolvedConfig) -> Result<Communicator>;
}

struct LocalFactory;

/// World size requested by a launcher, if any (`WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`,
/// `PMI_SIZE`, `SLURM_NTASKS`).
fn launcher_world_size() -> Option<(String, usize)> {
    ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"]
        .into_iter()
        .find_map(|k| std::env::var(k).ok().and_then(|v| v.trim().parse().ok()).map(|n| (k.to_string(), n)))
}

impl BackendFactory for LocalFactory {
    fn name(&self) -> &'static str {
        local::NAME
    }

    fn priority(&self) -> u32 {
        10
    }

    fn availability(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn create_world(&self, cfg: &ResolvedConfig, n: usize) -> Result<Vec<Communicator>> {
        local::world(cfg, n)
    }

    fn create_process(&self, cfg: &ResolvedConfig) -> Result<Communicator> {
        match launcher_world_size() {
            Some((var, n)) if n > 1 => Err(Error::BackendUnavailable {
                backend: local::NAME.into(),
                why: format!(
                    "{var}={n} asks for {n} processes, but `local` runs every rank as a thread of one \
                     process; use oxccl::local::run / Config::init_world, or a multi-process backend"
                ),
            }),
            _ => local::world(cfg, 1)?
                .pop()
                .ok_or_else(|| Error::invalid("a world of one rank came back empty (internal error)")),
        }
    }
}

struct CpuFactory;

impl BackendFactory for CpuFactory {
    fn name(&self) -> &'static str {
        cpu::NAME
    }

    fn priority(&self) -> u32 {
        50
    }

    fn availability(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn create_world(&self, cfg: &ResolvedConfig, n: usize) -> Result<Vec<Communicator>> {
        cpu::init_world(cfg, n)
    }

    fn create_process(&self, cfg: &ResolvedConfig) -> Result<Communicator> {
        cpu::init_process(cfg)
    }
}

#[cfg(not(feature = "mpi"))]
static FACTORIES: [&dyn BackendFactory; 2] = [&CpuFactory, &LocalFactory];
#[cfg(feature = "mpi")]
static FACTORIES: [&dyn BackendFactory; 3] = [&CpuFactory, &LocalFactory, &crate::backend::mpi::MpiFactory];

/// The backends built into this binary, highest priority first.
pub fn factories() -> Vec<&'static dyn BackendFactory> {
    let mut v: Vec<_> = FACTORIES.to_vec();
    v.sort_by_key(|f| std::cmp::Reverse(f.priority()));
    v
}

/// Each known backend with `Ok` when it can run here or the reason it cannot.
pub fn status() -> Vec<(&'static str, std::result::Result<(), String>)> {
    KNOWN.iter().map(|&name| (name, availability(name))).collect()
}

fn availability(name: &str) -> std::result::Result<(), String> {
    match FACTORIES.iter().find(|f| f.name() == name) {
        Some(f) => f.availability(),
        None => Err(match name {
            "mpi" => "this build of oxccl has no MPI backend (the `mpi` cargo feature)".into(),
            n => format!("this build of oxccl does not contain the `{n}` backend"),
        }),
    }
}

/// The factories to try for `choice`, or why none can be tried.
fn candidates(choice: &BackendChoice) -> Result<Vec<&'static dyn BackendFactory>> {
    match choice {
        BackendChoice::Named(name) => {
            if !KNOWN.contains(&name.as_str()) {
                return Err(Error::Config(format!(
                    "unknown backend `{name}`; expected auto or one of {}",
                    KNOWN.join(", ")
                )));
            }
            availability(name).map_err(|why| Error::BackendUnavailable { backend: name.clone(), why })?;
            Ok(factories().into_iter().filter(|f| f.name() == name).collect())
        }
        BackendChoice::Auto => Ok(factories().into_iter().filter(|f| f.availability().is_ok()).collect()),
    }
}

fn auto_failure(skipped: Vec<String>) -> Error {
    let mut why: Vec<String> = status().into_iter().filter_map(|(n, s)| s.err().map(|e| format!("{n}: {e}"))).collect();
    why.extend(skipped);
    Error::BackendUnavailable { backend: "auto".into(), why: why.join("; ") }
}

/// `create` on the first candidate backend that is available: under `auto` an unavailable
/// one is skipped (and named in the error if none is left); a named backend's error stands.
fn first_available<T>(cfg: &ResolvedConfig, create: impl Fn(&dyn BackendFactory) -> Result<T>) -> Result<T> {
    let mut skipped = Vec::new();
    for f in candidates(&cfg.backend)? {
        match create(f) {
            Ok(c) => return Ok(c),
            Err(e @ Error::BackendUnavailable { .. }) if cfg.backend == BackendChoice::Auto => {
                skipped.push(format!("{}: {e}", f.name()))
            }
            Err(e) => return Err(e),
        }
    }
    Err(auto_failure(skipped))
}

/// Creates `n` in-process communicators on the configured backend.
pub(crate) fn init_world(cfg: &ResolvedConfig, n: usize) -> Result<Vec<Communicator>> {
    first_available(cfg, |f| f.create_world(cfg, n))
}

/// Creates this process's communicator on the configured backend.
pub(crate) fn init_process(cfg: &ResolvedConfig) -> Result<Communicator> {
    first_available(cfg, |f| f.create_process(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn named_unknown_and_unavailable_backends_explain_themselves() {
        let e = Config::new().backend("warp").init_world(2).unwrap_err().to_string();
        assert!(e.contains("warp") && e.contains("local"), "{e}");
        let e = Config::new().backend("nccl").init_world(2).unwrap_err();
        assert!(matches!(e, Error::BackendUnavailable { ref backend, .. } if backend == "nccl"), "{e}");
        let e = Config::new().backend("mpi").init_world(2).unwrap_err().to_string();
        assert!(e.contains("mpi") && e.contains("feature"), "{e}");
    }

    #[test]
    fn auto_picks_the_highest_priority_backend() {
        let comms = Config::new().backend("auto").init_world(3).unwrap();
        assert_eq!(comms.len(), 3);
        assert!(comms.iter().enumerate().all(|(i, c)| c.rank() == i && c.backend() == "cpu"));
        let comms = Config::new().backend("local").init_world(2).unwrap();
        assert!(comms.iter().all(|c| c.backend() == "local"));
        assert!(Config::new().backend("local").init_world(0).is_err());
    }

    #[test]
    fn status_lists_every_known_backend() {
        let s = status();
        assert_eq!(s.len(), KNOWN.len());
        assert!(s.iter().any(|(n, r)| *n == "local" && r.is_ok()));
    }
}
