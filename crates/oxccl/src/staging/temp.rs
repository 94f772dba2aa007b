//! [`Temp`]: one host temporary of the staging paths, leased from the process's pinned pool
//! ([`crate::staging::pinned::global`]) so the device copies run at the bus's full speed and
//! the steady state allocates nothing; where the pool cannot serve (its limit, the memlock
//! limit), a pageable temporary is used instead and the first such fallback is logged.

use std::sync::Once;

use super::pinned::PinnedBuf;

/// A host temporary: pinned where the pool serves, pageable otherwise.
pub(crate) enum Temp {
    Pinned(PinnedBuf),
    Pageable(Vec<u64>),
}

impl Temp {
    /// A temporary of at least `bytes` bytes.
    pub(crate) fn new(bytes: usize) -> Temp {
        match super::pinned::global().and_then(|pool| pool.acquire(bytes.max(1))) {
            Ok(b) => Temp::Pinned(b),
            Err(e) => {
                static SAID: Once = Once::new();
                SAID.call_once(|| {
                    tracing::warn!("staging device buffers through pageable host memory (slower): {e}");
                });
                Temp::Pageable(vec![0u64; bytes.div_ceil(8).max(1)])
            }
        }
    }

    /// Its first byte.
    pub(crate) fn ptr(&mut self) -> *mut u8 {
        match self {
            Temp::Pinned(b) => b.as_mut_ptr(),
            Temp::Pageable(v) => v.as_mut_ptr().cast(),
        }
    }
}
