//! `oxccl::local`: run N ranks as threads of this process, each with its communicator of a
//! new `local` world (the CPU algorithms over the in-memory transport); or make a world whose
//! members can grow, with the entrance newcomer threads join it through.

use std::sync::Arc;

use crate::backend::Backend;
use crate::communicator::Communicator;
use crate::config::{Config, PerfSettings};
use crate::cpu::engine::CpuBackend;
use crate::cpu::local::{growable_world, world};
use crate::error::Result;

pub use crate::cpu::local::NAME;

/// Runs `f` on `n` threads, each with its rank's communicator of a new `local` world
/// (configured from the environment), and returns the results in rank order.
///
/// A rank that panics drops its communicator, so the others fail with
/// [`Error::PeerLost`](crate::Error::PeerLost) instead of hanging; the panic is then resumed
/// on the calling thread.
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `n` is 0;
/// [`Error::Config`](crate::Error::Config) for unusable `OXCCL_*` values.
///
/// ```
/// let sums = oxccl::local::run(3, |comm| {
///     let mut x = [comm.rank() as i32 + 1];
///     comm.all_reduce(&mut x, oxccl::ReduceOp::Sum).map(|()| x[0])
/// }).unwrap();
/// assert_eq!(sums, vec![Ok(6), Ok(6), Ok(6)]);
/// ```
pub fn run<R: Send>(n: usize, f: impl Fn(Communicator) -> R + Sync) -> Result<Vec<R>> {
    run_with(&Config::new(), n, f)
}

/// [`run`] with an explicit configuration (its backend setting is ignored: this is `local`).
///
/// # Errors
/// As [`run`].
pub fn run_with<R: Send>(cfg: &Config, n: usize, f: impl Fn(Communicator) -> R + Sync) -> Result<Vec<R>> {
    let cfg = cfg.resolve()?;
    crate::perf::log::install(&cfg.log);
    let comms = observed(world(&cfg, n)?, &Arc::new(cfg.perf.clone()));
    let f = &f;
    let results: Vec<std::thread::Result<R>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(r, c)| {
                std::thread::Builder::new().name(format!("oxccl-local-rank{r}")).spawn_scoped(s, move || f(c))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join(),
                Err(e) => Err(Box::new(format!("could not start a rank thread: {e}")) as Box<dyn std::any::Any + Send>),
            })
            .collect()
    });
    let mut out = Vec::with_capacity(n);
    for r in results {
        match r {
            Ok(v) => out.push(v),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
    Ok(out)
}

/// Makes a `local` world of `n` ranks that can grow, configured by `cfg`: its communicators
/// (rank order; hand each to a thread) and the [`Entrance`] through which newcomer threads
/// join it. A newcomer comes in when the members call [`Communicator::grow`] (every member,
/// the same count), as a process joins a job with [`oxccl::join`](crate::join); the members'
/// [`agree`](Communicator::agree) says how many newcomers wait. A world shrunk after a rank
/// died grows the same way.
///
/// # Errors
/// As [`run`].
///
/// ```
/// let (comms, entrance) = oxccl::local::growable(&oxccl::Config::new(), 2).unwrap();
/// let sum = |c: &oxccl::Communicator| {
///     let mut x = [c.rank() as u32 + 1];
///     c.all_reduce(&mut x, oxccl::ReduceOp::Sum).map(|()| (c.rank(), c.world_size(), x[0]))
/// };
/// let (entrance, sum) = (&entrance, &sum);
/// let out: Vec<oxccl::Result<_>> = std::thread::scope(|s| {
///     let mut threads: Vec<_> = comms.into_iter().map(|c| s.spawn(move || sum(&c.grow(1)?))).collect();
///     threads.push(s.spawn(move || sum(&entrance.join()?)));
///     threads.into_iter().map(|t| t.join().unwrap()).collect()
/// });
/// assert_eq!(out, vec![Ok((0, 3, 6)), Ok((1, 3, 6)), Ok((2, 3, 6))]);
/// ```
pub fn growable(cfg: &Config, n: usize) -> Result<(Vec<Communicator>, Entrance)> {
    let cfg = cfg.resolve()?;
    crate::perf::log::install(&cfg.log);
    let perf = Arc::new(cfg.perf.clone());
    let (ranks, inner) = growable_world(&cfg, n)?;
    Ok((observed(ranks, &perf), Entrance { inner, perf }))
}

/// The communicators of `ranks`, observed with `perf`.
fn observed(ranks: Vec<CpuBackend>, perf: &Arc<PerfSettings>) -> Vec<Communicator> {
    ranks.into_iter().map(|b| Communicator::observed(Arc::new(b) as Arc<dyn Backend>, Arc::clone(perf))).collect()
}

/// The way into a [`growable`] `local` world for newcomer threads (share it by reference).
#[derive(Debug)]
pub struct Entrance {
    inner: crate::cpu::local::Entrance,
    perf: Arc<PerfSettings>,
}

impl Entrance {
    /// Waits until the members admit this thread with [`Communicator::grow`] (at most the
    /// world's setup timeout, `OXCCL_TIMEOUT`), and returns its communicator of the grown
    /// world: its rank follows the members', in the order the newcomers came.
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store) when no grow admits it in time (the members
    /// must call `grow` with the number of newcomers).
    pub fn join(&self) -> Result<Communicator> {
        let b = self.inner.join()?;
        Ok(Communicator::observed(Arc::new(b) as Arc<dyn Backend>, Arc::clone(&self.perf)))
    }
}
