//! `oxccl::local`: run N ranks as threads of this process, each with its communicator of a
//! new `local` world (the CPU algorithms over the in-memory transport).

use std::sync::Arc;

use crate::backend::Backend;
use crate::communicator::Communicator;
use crate::config::Config;
use crate::cpu::local::world;
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
    let perf = Arc::new(cfg.perf.clone());
    let comms: Vec<Communicator> = world(&cfg, n)?
        .into_iter()
        .map(|b| Communicator::observed(Arc::new(b) as Arc<dyn Backend>, Arc::clone(&perf)))
        .collect();
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
