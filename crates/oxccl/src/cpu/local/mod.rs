//! The `local` backend: N ranks as threads of one process, running the CPU algorithms over
//! the in-memory transport. For tests, simulation and single-process multi-rank programs.
//! (`oxccl::local::run` starts the threads and hands each its communicator.)
//!
//! A local world can grow as a world of processes does (`cpu/grow/`): its ranks share an
//! in-process board instead of a store, and a grown world is a new hub, which its members
//! and newcomers meet at under the grow's prefix ([`Hubs`]). Newcomer threads come in
//! through an [`Entrance`].

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::config::ResolvedConfig;
use crate::cpu::engine::{CpuBackend, WORLD_COMM_ID};
use crate::cpu::grow::{self, Board, Lineage, MemoryBoard};
use crate::cpu::selector::profile::Profile;
use crate::cpu::setup::receive_poll;
use crate::cpu::transport::memory::{MemoryHub, MemoryTransport};
use crate::cpu::transport::shm::wait;
use crate::error::{Error, Result};
use crate::sync::relock;

/// The backend's name.
pub const NAME: &str = "local";

/// The board prefix of a local world (each world has its own board).
const WORLD_PREFIX: &str = "oxccl/local";

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

/// [`world`] and the entrance through which newcomer threads join it once its members call
/// `grow`.
///
/// # Errors
/// As [`world`].
pub fn growable_world(cfg: &ResolvedConfig, n: usize) -> Result<(Vec<CpuBackend>, Entrance)> {
    let (_, ranks) = world_on_hub(cfg, n, NAME)?;
    let lineage = ranks[0].lineage().ok_or_else(|| Error::Internal("a local world without a lineage".into()))?;
    let entrance = Entrance { lineage: lineage.newcomer(), timeout: cfg.timeout };
    Ok((ranks, entrance))
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
    let profile = Arc::new(match &cfg.cpu.tune_file {
        Some(path) => Profile::load(path)?,
        None => Profile::default(),
    });
    // One process: its threads share its CPUs.
    let machine = Machine { cfg: cfg.clone(), name, profile, cpus: wait::allowed_cpus().len() };
    let hub = machine.hub(n);
    let ranks: Arc<[usize]> = (0..n).collect();
    let world = (0..n).map(|r| machine.rank(hub.endpoint(r)?, &ranks, r)).collect::<Result<Vec<CpuBackend>>>()?;
    // The world's lineage: every rank's own, over one board and one set of grown hubs.
    let board: Arc<dyn Board> = Arc::new(MemoryBoard::default());
    let (machine, hubs) = (Arc::new(machine), Arc::new(Hubs::default()));
    for b in &world {
        let (machine, hubs) = (Arc::clone(&machine), Arc::clone(&hubs));
        let build_again = move |rank: usize, size: usize, prefix: &str| {
            let (t, ranks) = hubs.meet(prefix, size, rank, machine.cfg.timeout, || machine.hub(size))?;
            machine.rank(t, &ranks, rank)
        };
        b.set_lineage(Arc::new(Lineage::new(Arc::clone(&board), WORLD_PREFIX, Box::new(build_again), Vec::new())));
    }
    Ok((hub, world))
}

/// What every rank of a local world (and of the worlds grown from it) is made with.
struct Machine {
    cfg: ResolvedConfig,
    name: &'static str,
    /// One process: every rank reads the same profile.
    profile: Arc<Profile>,
    /// The CPUs this process may run on.
    cpus: usize,
}

impl Machine {
    /// A hub for a world of `n` threads, which share this process's CPUs: receivers look for
    /// their frames before they sleep, as over TCP.
    fn hub(&self, n: usize) -> Arc<MemoryHub> {
        let policy = wait::WaitPolicy::for_host(n, self.cpus, self.cfg.cpu.spin, self.cfg.cpu.yield_for);
        MemoryHub::polling(n, receive_poll(&policy), policy.yield_for)
    }

    /// Rank `rank` of the world of `ranks` over endpoint `t`.
    fn rank(&self, t: MemoryTransport, ranks: &Arc<[usize]>, rank: usize) -> Result<CpuBackend> {
        let crowd = wait::crowd(ranks.len(), self.cpus);
        CpuBackend::new(self.name, Arc::new(t), WORLD_COMM_ID, Arc::clone(ranks), rank, self.cfg.clone())?
            .with_machine(Arc::clone(&self.profile), crowd)
    }
}

/// The hubs of grown worlds being met at, by prefix: the first rank of a grown world to
/// come makes its hub, and every rank waits until all have come (as a world of processes
/// waits for its connections), so a newcomer that never comes fails the members' `grow`
/// instead of their first collective.
#[derive(Default)]
struct Hubs {
    meetings: Mutex<HashMap<String, Arc<Meeting>>>,
}

/// One grown world's hub, its ranks, and who has taken an endpoint of it.
struct Meeting {
    hub: Arc<MemoryHub>,
    ranks: Arc<[usize]>,
    came: Mutex<Vec<bool>>,
    all_came: Condvar,
}

impl Hubs {
    /// Rank `rank`'s endpoint of the world of `size` met at under `prefix`, and the world's
    /// ranks, once every rank has come (at most `timeout`); `make` makes the hub.
    fn meet(
        &self,
        prefix: &str,
        size: usize,
        rank: usize,
        timeout: Duration,
        make: impl FnOnce() -> Arc<MemoryHub>,
    ) -> Result<(MemoryTransport, Arc<[usize]>)> {
        let meeting = {
            let mut all = relock(&self.meetings);
            let m = all.entry(prefix.to_string()).or_insert_with(|| {
                Arc::new(Meeting {
                    hub: make(),
                    ranks: (0..size).collect(),
                    came: Mutex::new(vec![false; size]),
                    all_came: Condvar::new(),
                })
            });
            Arc::clone(m)
        };
        let t = meeting.hub.endpoint(rank)?;
        let deadline = Instant::now() + timeout;
        let mut came = relock(&meeting.came);
        if came.len() != size || std::mem::replace(&mut came[rank], true) {
            return Err(Error::Internal(format!(
                "grow: rank {rank} of {size} came twice, or to a world of {}, at {prefix}",
                came.len()
            )));
        }
        meeting.all_came.notify_all();
        loop {
            if came.iter().all(|&c| c) {
                drop(came);
                relock(&self.meetings).remove(prefix);
                return Ok((t, Arc::clone(&meeting.ranks)));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing: Vec<usize> = (0..size).filter(|&r| !came[r]).collect();
                drop(came);
                relock(&self.meetings).remove(prefix);
                return Err(Error::Store(format!(
                    "grow: rank(s) {missing:?} of the grown local world did not come within {timeout:?} (newcomers \
                     join through the world's entrance: oxccl::local::Entrance::join)"
                )));
            }
            came = meeting.all_came.wait_timeout(came, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
    }
}

/// The way into a local world for newcomer threads: [`Entrance::join`] waits until the
/// members admit it with `grow` (see `cpu/grow/`).
pub struct Entrance {
    lineage: Lineage<CpuBackend>,
    timeout: Duration,
}

impl std::fmt::Debug for Entrance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entrance").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl Entrance {
    /// This thread's rank of the grown world, once the members grow (at most the world's
    /// setup timeout).
    ///
    /// # Errors
    /// [`Error::Store`] when no grow admits it in time; the grown world's errors.
    pub fn join(&self) -> Result<CpuBackend> {
        let lineage = self.lineage.newcomer();
        let b = grow::join(&lineage, self.timeout)?;
        b.set_lineage(Arc::new(lineage));
        Ok(b)
    }
}

#[cfg(test)]
mod tests;
