//! The `local` backend: N ranks as threads of one process, running the CPU algorithms over
//! the in-memory transport. For tests, simulation and single-process multi-rank programs.
//! (`oxccl::local::run` starts the threads and hands each its communicator.)

use std::sync::Arc;

use crate::config::ResolvedConfig;
use crate::cpu::engine::{CpuBackend, WORLD_COMM_ID};
use crate::cpu::selector::profile::Profile;
use crate::cpu::setup::receive_poll;
use crate::cpu::transport::memory::MemoryHub;
use crate::cpu::transport::shm::wait;
use crate::error::{Error, Result};

/// The backend's name.
pub const NAME: &str = "local";

/// Creates the `n` ranks of a new in-process world (rank i at index i).
///
/// # Errors
/// [`Error::InvalidArgument`] when `n` is 0.
pub fn world(cfg: &ResolvedConfig, n: usize) -> Result<Vec<CpuBackend>> {
    named_world(cfg, n, NAME)
}

/// [`world`] whose backends report `name` (tests that wrap them say so).
///
/// # Errors
/// As [`world`].
pub fn named_world(cfg: &ResolvedConfig, n: usize, name: &'static str) -> Result<Vec<CpuBackend>> {
    Ok(world_on_hub(cfg, n, name)?.1)
}

/// [`named_world`] and the hub its ranks share (tests kill ranks through it).
pub(crate) fn world_on_hub(
    cfg: &ResolvedConfig,
    n: usize,
    name: &'static str,
) -> Result<(Arc<MemoryHub>, Vec<CpuBackend>)> {
    if n == 0 {
        return Err(Error::invalid("a world needs at least one rank"));
    }
    let ranks: Arc<[usize]> = (0..n).collect();
    // One process: every rank reads the same profile, and its threads share its CPUs.
    let cpus = wait::allowed_cpus().len();
    let crowd = wait::crowd(n, cpus);
    // Receivers look for their frames before they sleep, as over TCP.
    let policy = wait::WaitPolicy::for_host(n, cpus, cfg.cpu.spin, cfg.cpu.yield_for);
    let hub = MemoryHub::polling(n, receive_poll(&policy), policy.yield_for);
    let profile = Arc::new(match &cfg.cpu.tune_file {
        Some(path) => Profile::load(path)?,
        None => Profile::default(),
    });
    let world = (0..n)
        .map(|r| {
            let t = Arc::new(hub.endpoint(r)?);
            CpuBackend::new(name, t, WORLD_COMM_ID, Arc::clone(&ranks), r, cfg.clone())?
                .with_machine(Arc::clone(&profile), crowd)
        })
        .collect::<Result<Vec<CpuBackend>>>()?;
    Ok((hub, world))
}
