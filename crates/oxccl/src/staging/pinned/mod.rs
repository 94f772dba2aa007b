//! Pinned (page-locked) host memory: a pool of buffers the kernel keeps resident, so a
//! device's DMA engine (or an RDMA NIC) can read and write them directly.
//!
//! Copies between a GPU and *pageable* host memory go through a hidden staging buffer of the
//! driver and run at a fraction of the bus's speed; copies from pinned memory run at full
//! speed and can be asynchronous. Pinning is slow (every page is faulted in and locked, and a
//! device runtime also maps it for its DMA engines), so NCCL and every fast staging path keep
//! pinned buffers and reuse them. This pool does that for oxccl: collectives on GPU buffers
//! over host algorithms (the `cpu` and `mpi` backends) stage device data through buffers
//! leased from it, chunk by chunk.
//!
//! # Rules
//!
//! - **Leases.** [`PinnedPool::acquire`] hands out a [`PinnedBuf`] of at least the bytes
//!   asked for; dropping it returns the buffer to the pool's free list (it stays pinned).
//! - **Size classes.** A buffer's capacity is the request rounded up to a power of two, at
//!   least [`MIN_CAPACITY`] (64 KiB) and at least a page ([`PinnedPool::capacity_for`]).
//!   Powers of two keep the number of distinct classes small (one per doubling), so the
//!   requests of a staging loop (a chunk size, and the smaller sizes of short messages) land
//!   on a few classes whose buffers are reused instead of pinning one buffer per exact size;
//!   the waste is below half of a buffer and counts against the limit like everything else.
//!   64 KiB is the smallest class because pinning (a system call, a device registration) and
//!   a device copy both cost more than copying 64 KiB, so smaller buffers are not worth it.
//!   When the power of two would exceed the limit but the request does not, the capacity is
//!   the request rounded up to a page: a request within the limit is never refused for
//!   rounding.
//! - **Reuse.** A free buffer of the request's class is handed out again without a system
//!   call (a *hit*); of several, the most recently returned (its pages are the warmest).
//!   Otherwise a new buffer is mapped (`mmap`, page aligned) and pinned (a *miss*).
//! - **Limit.** The capacities of all buffers, leased and free, stay within the pool's limit
//!   (`OXCCL_PINNED_LIMIT` for the process-wide pool, default 1 GiB).
//! - **Eviction.** When a new buffer would exceed the limit, free buffers are evicted (unpinned
//!   and unmapped) least recently used first, until it fits. Leased buffers are never evicted.
//! - **Errors.** When the limit cannot be met (the leases hold it, or the request alone exceeds
//!   it) the error names `OXCCL_PINNED_LIMIT`, the limit, the bytes leased and what to do. When
//!   the kernel refuses to lock memory (`RLIMIT_MEMLOCK`), the pool first evicts its free
//!   buffers and tries once more; if that fails too, the error names `RLIMIT_MEMLOCK`, its soft
//!   and hard values and how to raise them. Both are [`Error::Io`] whose kind is
//!   `OutOfMemory` (or `PermissionDenied` for `EPERM`), so a caller may fall back to pageable
//!   memory. A failed request leaves the pool as it was, less any evicted free buffers.
//! - **Statistics.** [`PinnedPool::stats`]: bytes pinned and leased, buffers, hits, misses,
//!   evictions, the pinner's name.
//!
//! How memory is pinned is a [`Pinner`]: [`MlockPinner`] (`mlock`) when no device runtime is
//! loaded; a device runtime installs its own ([`install_pinner`]) before the process-wide pool
//! ([`global`]) is first used.
//!
//! ```
//! use std::sync::Arc;
//! use oxccl::pinned::{MlockPinner, PinnedPool};
//! let pool = PinnedPool::new(4 << 20, Arc::new(MlockPinner));
//! let mut buf = pool.acquire(100_000)?; // a 128 KiB buffer, 100 000 bytes long
//! buf.as_mut_slice().fill(7);
//! assert_eq!((buf.len(), buf.capacity()), (100_000, 128 << 10));
//! drop(buf); // back to the free list, still pinned
//! let again = pool.acquire(80_000)?; // the same buffer: a hit
//! assert_eq!((pool.stats().hits, pool.stats().misses), (1, 1));
//! # drop(again);
//! # Ok::<(), oxccl::Error>(())
//! ```

mod mapping;
mod mlock;
mod pinner;
mod pool;

use std::sync::{Arc, Mutex, OnceLock};

pub use mlock::MlockPinner;
pub use pinner::Pinner;
pub use pool::{PinnedBuf, PinnedPool, PinnedStats, MIN_CAPACITY};

use crate::config::{parse, registry};
use crate::error::{Error, Result};
use crate::sync::relock;

/// The process-wide pool's limit: `OXCCL_PINNED_LIMIT` from the process environment, else
/// its default (1 GiB).
///
/// # Errors
/// [`Error::Config`] naming `OXCCL_PINNED_LIMIT` and its value when the value is not a size
/// in 1M..=1T.
pub fn limit_from_env() -> Result<usize> {
    limit_with(|name| std::env::var(name).ok())
}

/// Like [`limit_from_env`], reading variables through `env` (for tests and embedding). An
/// empty variable counts as unset.
///
/// # Errors
/// [`Error::Config`] naming `OXCCL_PINNED_LIMIT` and its value when the value is not a size
/// in 1M..=1T.
pub fn limit_with(env: impl Fn(&str) -> Option<String>) -> Result<usize> {
    let s = &registry::PINNED_LIMIT;
    match env(s.name).filter(|v| !v.trim().is_empty()) {
        Some(v) => {
            s.check(&v).and_then(|()| parse::size(&v)).map_err(|why| Error::Config(format!("{}={v:?}: {why}", s.name)))
        }
        None => parse::size(s.default)
            .map_err(|why| Error::Internal(format!("the default of {} is unusable: {why}", s.name))),
    }
}

/// The process-wide pool, made on first use.
static GLOBAL: OnceLock<Arc<PinnedPool>> = OnceLock::new();
/// The pinner [`install_pinner`] chose for the process-wide pool; its lock also serializes
/// the pool's creation.
static INSTALLED: Mutex<Option<Arc<dyn Pinner>>> = Mutex::new(None);

/// The process-wide pool, made on first use with the limit `OXCCL_PINNED_LIMIT` (read then,
/// once) and the pinner [`install_pinner`] chose, else [`MlockPinner`]. Later calls return
/// the same pool (cheaply: no lock once it exists).
///
/// # Errors
/// [`Error::Config`] naming `OXCCL_PINNED_LIMIT` when its value is not a size in 1M..=1T (no
/// pool is made; a later call reads the variable again).
pub fn global() -> Result<Arc<PinnedPool>> {
    if let Some(pool) = GLOBAL.get() {
        return Ok(Arc::clone(pool));
    }
    let installed = relock(&INSTALLED);
    if let Some(pool) = GLOBAL.get() {
        return Ok(Arc::clone(pool));
    }
    let limit = limit_from_env()?;
    let pinner: Arc<dyn Pinner> = match &*installed {
        Some(p) => Arc::clone(p),
        None => Arc::new(MlockPinner),
    };
    let pool = Arc::new(PinnedPool::new(limit, pinner));
    Ok(Arc::clone(GLOBAL.get_or_init(|| pool)))
}

/// Chooses how the process-wide pool ([`global`]) pins memory: a device runtime calls it
/// when it loads, so that staging buffers are registered with the device (faster copies)
/// rather than only `mlock`ed. It must come before the pool's first use; the last call before
/// then wins.
///
/// # Errors
/// [`Error::InvalidArgument`] when the pool already exists with a pinner of another name (it
/// keeps that pinner; its buffers still work as pinned host memory). Installing a pinner of
/// the same name again is a no-op.
pub fn install_pinner(pinner: Arc<dyn Pinner>) -> Result<()> {
    let mut installed = relock(&INSTALLED);
    if let Some(pool) = GLOBAL.get() {
        if pool.pinner_name() == pinner.name() {
            return Ok(());
        }
        return Err(Error::invalid(format!(
            "the process-wide pinned host memory pool is already in use and pins with {}; \
             install_pinner({}) must be called before its first use",
            pool.pinner_name(),
            pinner.name()
        )));
    }
    *installed = Some(pinner);
    Ok(())
}

#[cfg(test)]
mod tests;
