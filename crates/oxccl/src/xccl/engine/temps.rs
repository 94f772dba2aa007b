//! Temporaries lent to operations: device blocks and pinned host blocks from the engine's
//! caches (`pool.rs`) until the operation completes, and issues kept until their event fires.

use std::sync::Arc;

use super::pool::class_of;
use super::state::{DeviceTemp, Inner, Issued, PinnedTemp};
use crate::error::Result;
use crate::sync::relock;

impl Inner {
    /// `bytes` of device memory until the operation completes.
    pub(super) fn temp(self: &Arc<Self>, bytes: usize) -> Result<DeviceTemp> {
        let (ptr, class) = self.block(bytes)?;
        Ok(DeviceTemp { inner: Arc::clone(self), ptr, class })
    }

    /// A block of at least `bytes` (and its size class): from the cache, else allocated.
    pub(super) fn block(&self, bytes: usize) -> Result<(u64, usize)> {
        self.reap();
        let class = class_of(bytes);
        if let Some(ptr) = relock(&self.pool).take(class) {
            return Ok((ptr, class));
        }
        Ok((self.rt.alloc(self.device, class)?, class))
    }

    /// Hands a block back to the cache (freed only when the cache is full).
    pub(super) fn give_back_block(&self, ptr: u64, class: usize) {
        let over = relock(&self.pool).give(class, ptr);
        if let Some(ptr) = over {
            // SAFETY: a block of `alloc` on the engine's device, no longer used (see
            // `DeviceTemp`), freed once.
            let _ = unsafe { self.rt.free(self.device, ptr) };
        }
    }

    /// `bytes` of pinned host memory until the operation completes.
    pub(super) fn pinned(self: &Arc<Self>, bytes: usize) -> Result<PinnedTemp> {
        let class = class_of(bytes);
        let cached = relock(&self.pinned_pool).take(class);
        let addr = match cached {
            Some(a) => a,
            None => self.rt.host_alloc(class)?.expose_provenance() as u64,
        };
        let ptr = std::ptr::with_exposed_provenance_mut::<u8>(addr as usize);
        Ok(PinnedTemp { inner: Arc::clone(self), ptr, class })
    }

    /// Hands a pinned block back to the cache (freed only when the cache is full).
    pub(super) fn give_back_pinned(&self, ptr: *mut u8, class: usize) {
        let over = relock(&self.pinned_pool).give(class, ptr.expose_provenance() as u64);
        if let Some(a) = over {
            // SAFETY: a block of `host_alloc`, no longer used, freed once.
            let _ = unsafe { self.rt.host_free(std::ptr::with_exposed_provenance_mut(a as usize)) };
        }
    }

    /// Keeps `issued` (and its temporaries) until its event fires.
    pub(super) fn retire(&self, issued: Arc<Issued>) {
        relock(&self.retiring).push(issued);
    }

    /// Lets go of retired issues whose event fired.
    pub(super) fn reap(&self) {
        let done: Vec<Arc<Issued>> = {
            let mut r = relock(&self.retiring);
            if r.is_empty() {
                return;
            }
            let (done, left): (Vec<_>, Vec<_>) = std::mem::take(&mut *r)
                .into_iter()
                .partition(|i| matches!(self.rt.event_query(i.event.event), Ok(true)));
            *r = left;
            done
        };
        drop(done);
    }
}
