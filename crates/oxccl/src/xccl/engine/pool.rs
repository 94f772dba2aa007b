//! The engine's cache of device temporaries: blocks freed by finished operations are kept
//! for the next ones, so no driver call frees memory on the hot path. `cuMemFree` may
//! synchronize the whole device (stalling behind the application's kernels), and after an
//! abort it can block behind another communicator's stuck kernel; handing a block back here
//! never calls the driver.
//!
//! Blocks come in power-of-two size classes from [`MIN_BLOCK`] up, so a block serves any
//! later request of its class. At most [`CACHE_BYTES`] are kept; a block that would exceed
//! that (a temporary larger than the cache, or a burst of them) is freed at once, the only
//! case where a free happens while the engine runs. The cache is freed with the engine.

use std::collections::HashMap;

/// The smallest block.
pub(crate) const MIN_BLOCK: usize = 256;
/// The most bytes kept for reuse.
pub(crate) const CACHE_BYTES: usize = 256 << 20;

/// The size class of a request of `bytes`: the block size that serves it.
pub(crate) fn class_of(bytes: usize) -> usize {
    bytes.max(MIN_BLOCK).checked_next_power_of_two().unwrap_or(bytes)
}

/// Free blocks by size class (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Pool {
    free: HashMap<usize, Vec<u64>>,
    cached: usize,
}

impl Pool {
    /// A free block of `class`, if one is cached.
    pub(crate) fn take(&mut self, class: usize) -> Option<u64> {
        let ptr = self.free.get_mut(&class)?.pop()?;
        self.cached -= class;
        Some(ptr)
    }

    /// Keeps `ptr` (a block of `class`) for reuse; returns it when the cache is full, for the
    /// caller to free.
    pub(crate) fn give(&mut self, class: usize, ptr: u64) -> Option<u64> {
        if self.cached + class > CACHE_BYTES {
            return Some(ptr);
        }
        self.cached += class;
        self.free.entry(class).or_default().push(ptr);
        None
    }

    /// Every cached block, emptying the cache (to free them).
    pub(crate) fn drain(&mut self) -> Vec<u64> {
        self.cached = 0;
        self.free.drain().flat_map(|(_, v)| v).collect()
    }

    /// How many bytes are cached.
    #[cfg(test)]
    pub(crate) fn cached(&self) -> usize {
        self.cached
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_to_powers_of_two_from_the_minimum() {
        assert_eq!(class_of(0), MIN_BLOCK);
        assert_eq!(class_of(1), MIN_BLOCK);
        assert_eq!(class_of(MIN_BLOCK + 1), 2 * MIN_BLOCK);
        assert_eq!(class_of(1000), 1024);
        assert_eq!(class_of(1 << 20), 1 << 20);
    }

    #[test]
    fn blocks_are_reused_by_class_and_the_cache_is_bounded() {
        let mut p = Pool::default();
        assert_eq!(p.take(1024), None);
        assert_eq!(p.give(1024, 0x1000), None);
        assert_eq!(p.give(1024, 0x2000), None);
        assert_eq!(p.cached(), 2048);
        assert_eq!(p.take(512), None, "another class");
        assert_eq!(p.take(1024), Some(0x2000));
        assert_eq!(p.cached(), 1024);
        // Past the bound a block is handed back to be freed.
        assert_eq!(p.give(CACHE_BYTES, 0x9000), Some(0x9000));
        let mut all = p.drain();
        all.sort_unstable();
        assert_eq!(all, vec![0x1000]);
        assert_eq!(p.cached(), 0);
    }
}
