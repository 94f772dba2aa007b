//! Choosing a backend: by name, or on `auto` the available one with the highest priority,
//! with the reason each skipped backend was unavailable. The list of backends built into
//! this binary is here, and only here.

use std::sync::Arc;

use crate::backend::factory::{BackendFactory, KNOWN};
use crate::backend::Backend;
use crate::config::{BackendChoice, ResolvedConfig};
use crate::cpu::factory::{CpuFactory, LocalFactory};
use crate::error::{Error, Result};
use crate::xccl::factory as xccl;

#[cfg(not(feature = "mpi"))]
static FACTORIES: [&dyn BackendFactory; 4] = [&CpuFactory, &LocalFactory, &xccl::NCCL, &xccl::RCCL];
#[cfg(feature = "mpi")]
static FACTORIES: [&dyn BackendFactory; 5] =
    [&CpuFactory, &LocalFactory, &xccl::NCCL, &xccl::RCCL, &crate::mpi::MpiFactory];

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

/// Lets the host backends load a GPU runtime when they first meet its device buffers (a
/// buffer the application made with its own framework, before oxccl loaded the runtime).
/// Nothing here loads a runtime: a process whose buffers all live in host memory never does.
pub(crate) fn install_staging_loader() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        crate::staging::install_loader(Box::new(crate::xccl::factory::staging_copy));
    });
}

/// Creates `n` in-process ranks on the configured backend.
pub(crate) fn init_world(cfg: &ResolvedConfig, n: usize) -> Result<Vec<Arc<dyn Backend>>> {
    install_staging_loader();
    first_available(cfg, |f| f.create_world(cfg, n))
}

/// Creates this process's rank on the configured backend.
pub(crate) fn init_process(cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>> {
    install_staging_loader();
    first_available(cfg, |f| f.create_process(cfg))
}

/// The factory of a communicator made through a store (a caller's, or the job's for a
/// newcomer): `auto` means `cpu` here; a named backend must be available.
fn store_factory(cfg: &ResolvedConfig) -> Result<&'static dyn BackendFactory> {
    Ok(match &cfg.backend {
        BackendChoice::Auto => &CpuFactory,
        named => candidates(named)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::Internal("a named, available backend has no factory".into()))?,
    })
}

/// Joins a running job as a newcomer on the configured backend (`auto` means `cpu`: only
/// it can grow).
pub(crate) fn join_process(cfg: &ResolvedConfig) -> Result<Arc<dyn Backend>> {
    install_staging_loader();
    let factory = store_factory(cfg)?;
    factory.join_process(cfg)
}

/// Creates rank `rank` of `n` processes meeting through the caller's store on the
/// configured backend: `auto` means `cpu` here (a framework that wants its device tensors on
/// NCCL asks for `nccl` by name, for the device it names, when it first meets one); a named
/// backend must be able to run here and to be made this way.
pub(crate) fn init_rendezvous(
    cfg: &ResolvedConfig,
    rank: usize,
    n: usize,
    rdv: &dyn crate::bootstrap::Rendezvous,
    secret: &str,
) -> Result<Arc<dyn Backend>> {
    install_staging_loader();
    let factory = store_factory(cfg)?;
    factory.create_rendezvous(cfg, rank, n, rdv, secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn named_unknown_and_unavailable_backends_explain_themselves() {
        let e = Config::new().backend("warp").init_world(2).unwrap_err().to_string();
        assert!(e.contains("warp") && e.contains("local"), "{e}");
        // No GPU here (CI): the nccl and rccl backends say what they looked for.
        for (name, lib) in [("nccl", "libcuda.so.1"), ("rccl", "libamdhip64.so")] {
            match Config::new().backend(name).init_world(2) {
                Err(e @ Error::BackendUnavailable { .. }) => {
                    let m = e.to_string();
                    assert!(m.contains(name) && m.contains(lib), "{m}");
                }
                Err(e) => panic!("{name}: {e}"),
                Ok(_) => {} // a GPU host
            }
        }
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
