//! The pool: size classes, the free list in least-recently-used order, the limit, eviction,
//! the statistics, and the leases ([`PinnedBuf`]) that go back to the free list when dropped.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::mapping::{page_size, Mapping};
use super::pinner::Pinner;
use crate::config::parse::format_size_exact;
use crate::error::{Error, Result};
use crate::sync::relock;

/// The smallest capacity of a pooled buffer (64 KiB): smaller requests get a buffer of this
/// size (see the module's rules on size classes).
pub const MIN_CAPACITY: usize = 64 << 10;

/// A pool of pinned host buffers with a byte limit (see the [module docs](super) for its
/// rules). Cheap to share: wrap it in an `Arc`, or use the process-wide [`global`](super::global)
/// pool. Thread-safe; its leases may outlive it.
pub struct PinnedPool {
    shared: Arc<Shared>,
}

/// What the pool and its leases share.
pub(super) struct Shared {
    limit: usize,
    page: usize,
    pinner: Arc<dyn Pinner>,
    state: Mutex<State>,
}

/// A pinned buffer (its mapping, pinned by the pool's pinner).
pub(super) struct Block {
    map: Mapping,
}

impl Block {
    /// The first byte.
    pub(super) fn ptr(&self) -> *mut u8 {
        self.map.ptr()
    }

    /// The capacity in bytes.
    pub(super) fn capacity(&self) -> usize {
        self.map.len()
    }
}

/// The books, behind the pool's lock.
#[derive(Default)]
struct State {
    /// Free buffers, least recently returned first.
    free: Vec<Block>,
    /// The capacities of `free`.
    free_bytes: usize,
    /// The capacities of every buffer, leased and free, including buffers being pinned.
    pinned_bytes: usize,
    /// The capacities of leased buffers (and of buffers being pinned for a lease).
    leased_bytes: usize,
    /// Buffers, leased and free (and being pinned).
    buffers: usize,
    /// Leased buffers (and buffers being pinned).
    leased_buffers: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
}

/// A snapshot of a pool's statistics ([`PinnedPool::stats`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PinnedStats {
    /// The most bytes the pool pins (`OXCCL_PINNED_LIMIT` for the process-wide pool).
    pub limit: usize,
    /// Bytes pinned: the capacities of every buffer, leased and free (and of buffers being
    /// pinned right now).
    pub pinned_bytes: usize,
    /// The capacities of the leased buffers.
    pub leased_bytes: usize,
    /// Buffers pinned, leased and free.
    pub buffers: usize,
    /// Requests met by a free buffer, without a system call.
    pub hits: u64,
    /// Requests that pinned a new buffer.
    pub misses: u64,
    /// Free buffers unpinned and unmapped to make room.
    pub evictions: u64,
    /// How the pool pins: `mlock`, or a device runtime's host registration.
    pub pinner: String,
}

impl PinnedPool {
    /// An empty pool that pins at most `limit` bytes with `pinner`. Nothing is pinned until
    /// the first [`acquire`](PinnedPool::acquire).
    pub fn new(limit: usize, pinner: Arc<dyn Pinner>) -> PinnedPool {
        let shared = Shared { limit, page: page_size(), pinner, state: Mutex::new(State::default()) };
        PinnedPool { shared: Arc::new(shared) }
    }

    /// The most bytes this pool pins.
    pub fn limit(&self) -> usize {
        self.shared.limit
    }

    /// The name of the pool's [`Pinner`].
    pub fn pinner_name(&self) -> &str {
        self.shared.pinner.name()
    }

    /// The capacity of the buffer a request of `bytes` gets: `bytes` rounded up to a power of
    /// two of at least [`MIN_CAPACITY`] and a page, or, when that exceeds the limit, `bytes`
    /// rounded up to a page.
    ///
    /// # Errors
    /// [`Error::Io`] (kind `OutOfMemory`) naming `OXCCL_PINNED_LIMIT` when `bytes` (rounded to
    /// a page) exceeds the limit.
    pub fn capacity_for(&self, bytes: usize) -> Result<usize> {
        self.shared.capacity_for(bytes)
    }

    /// A lease on a pinned buffer of `bytes` bytes (its capacity: [`capacity_for`]): a free
    /// buffer of that capacity when there is one (a hit, no system call), else a new one,
    /// evicting free buffers least recently used first to stay within the limit. Its
    /// contents are unspecified (zeros when new, what the last lease left when reused).
    ///
    /// [`capacity_for`]: PinnedPool::capacity_for
    ///
    /// # Errors
    /// - [`Error::Io`] (kind `OutOfMemory`) naming `OXCCL_PINNED_LIMIT`, the limit and the
    ///   bytes leased, when the request exceeds the limit or the leased buffers leave too
    ///   little of it;
    /// - the pinner's error when it cannot pin (after evicting every free buffer and trying
    ///   once more): for [`MlockPinner`](super::MlockPinner) an [`Error::Io`] naming
    ///   `RLIMIT_MEMLOCK`, its values and how to raise it;
    /// - [`Error::Io`] when `mmap` fails.
    ///
    /// A failed request pins nothing and leases nothing.
    pub fn acquire(&self, bytes: usize) -> Result<PinnedBuf> {
        let sh = &self.shared;
        let cap = sh.capacity_for(bytes)?;
        let victims = {
            let mut st = relock(&sh.state);
            // A hit: the most recently returned free buffer of this class.
            if let Some(i) = st.free.iter().rposition(|b| b.capacity() == cap) {
                let block = st.free.remove(i);
                st.free_bytes -= cap;
                st.leased_bytes += cap;
                st.leased_buffers += 1;
                st.hits += 1;
                drop(st);
                return Ok(PinnedBuf::new(Arc::clone(sh), block, bytes));
            }
            let held = st.pinned_bytes - st.free_bytes;
            if held.saturating_add(cap) > sh.limit {
                return Err(sh.full_error(bytes, cap, &st));
            }
            // A miss: evict the least recently used free buffers until the new one fits.
            let mut evict = 0;
            let mut evicted_bytes = 0;
            while (st.pinned_bytes - evicted_bytes).saturating_add(cap) > sh.limit {
                match st.free.get(evict) {
                    Some(b) => {
                        evicted_bytes += b.capacity();
                        evict += 1;
                    }
                    None => return Err(Error::Internal("the pinned pool's books do not add up".into())),
                }
            }
            let victims: Vec<Block> = st.free.drain(..evict).collect();
            st.free_bytes -= evicted_bytes;
            st.pinned_bytes -= evicted_bytes;
            st.buffers -= evict;
            st.evictions += evict as u64;
            // Reserve the new buffer, so concurrent requests see the limit it takes.
            st.misses += 1;
            st.pinned_bytes += cap;
            st.leased_bytes += cap;
            st.buffers += 1;
            st.leased_buffers += 1;
            victims
        };
        // Unpin the victims before pinning more (the kernel's limit counts both).
        for b in victims {
            sh.release(b);
        }
        match sh.pin_new(cap) {
            Ok(block) => Ok(PinnedBuf::new(Arc::clone(sh), block, bytes)),
            Err(e) => {
                let mut st = relock(&sh.state);
                st.pinned_bytes -= cap;
                st.leased_bytes -= cap;
                st.buffers -= 1;
                st.leased_buffers -= 1;
                Err(e)
            }
        }
    }

    /// Unpins and unmaps every free buffer (leased ones stay); returns the bytes released.
    /// Not counted as evictions.
    pub fn trim(&self) -> usize {
        let sh = &self.shared;
        let victims = {
            let mut st = relock(&sh.state);
            let bytes = st.free_bytes;
            st.pinned_bytes -= bytes;
            st.buffers -= st.free.len();
            st.free_bytes = 0;
            std::mem::take(&mut st.free)
        };
        let bytes = victims.iter().map(Block::capacity).sum();
        for b in victims {
            sh.release(b);
        }
        bytes
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> PinnedStats {
        self.shared.stats()
    }

    /// Checks the books (tests).
    #[cfg(test)]
    pub(super) fn check_books(&self) {
        let st = relock(&self.shared.state);
        assert_eq!(st.free_bytes, st.free.iter().map(Block::capacity).sum::<usize>());
        assert_eq!(st.pinned_bytes, st.free_bytes + st.leased_bytes);
        assert_eq!(st.buffers, st.free.len() + st.leased_buffers);
        assert!(st.pinned_bytes <= self.shared.limit);
    }
}

impl fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedPool").field("stats", &self.stats()).finish()
    }
}

impl Shared {
    fn capacity_for(&self, bytes: usize) -> Result<usize> {
        let paged = bytes.max(1).checked_next_multiple_of(self.page);
        let class = bytes.max(MIN_CAPACITY).max(self.page).checked_next_power_of_two();
        match (class, paged) {
            (Some(c), _) if c <= self.limit => Ok(c),
            (_, Some(p)) if p <= self.limit => Ok(p),
            _ => Err(Error::Io {
                context: format!("leasing {} of pinned host memory", format_size_exact(bytes)),
                kind: std::io::ErrorKind::OutOfMemory,
                message: format!(
                    "the request alone exceeds the pool's limit, OXCCL_PINNED_LIMIT={}; raise \
                     OXCCL_PINNED_LIMIT, or stage in chunks of at most that size",
                    format_size_exact(self.limit)
                ),
            }),
        }
    }

    /// The error for a request that the leased buffers leave no room for.
    fn full_error(&self, bytes: usize, cap: usize, st: &State) -> Error {
        Error::Io {
            context: format!(
                "leasing {} of pinned host memory (a {} buffer)",
                format_size_exact(bytes),
                format_size_exact(cap)
            ),
            kind: std::io::ErrorKind::OutOfMemory,
            message: format!(
                "the pool's limit OXCCL_PINNED_LIMIT={} is held by leased buffers: {} leased in {} \
                 buffers, {} pinned in all, {} free to evict; raise OXCCL_PINNED_LIMIT, stage in \
                 smaller chunks, or return leases sooner",
                format_size_exact(self.limit),
                format_size_exact(st.leased_bytes),
                st.leased_buffers,
                format_size_exact(st.pinned_bytes),
                format_size_exact(st.free_bytes),
            ),
        }
    }

    /// Maps and pins a buffer of `cap` bytes (already reserved in the books). When the
    /// pinner refuses and free buffers exist, they are evicted and the pin tried once more.
    fn pin_new(&self, cap: usize) -> Result<Block> {
        let map = Mapping::new(cap)?;
        // SAFETY: `map` is a fresh mapping of `cap` bytes owned here, page aligned, pinned by
        // nobody; it stays mapped until it is unpinned (it is unpinned before it is dropped,
        // by `release`) or, if the pin fails, until this function drops it.
        let first = unsafe { self.pinner.pin(map.ptr(), map.len()) };
        let Err(refused) = first else {
            return Ok(Block { map });
        };
        let victims = {
            let mut st = relock(&self.state);
            let bytes = st.free_bytes;
            st.pinned_bytes -= bytes;
            st.buffers -= st.free.len();
            st.evictions += st.free.len() as u64;
            st.free_bytes = 0;
            std::mem::take(&mut st.free)
        };
        if victims.is_empty() {
            return Err(refused);
        }
        for b in victims {
            self.release(b);
        }
        // SAFETY: as above; the first pin failed, so the mapping is still pinned by nobody.
        unsafe { self.pinner.pin(map.ptr(), map.len()) }?;
        Ok(Block { map })
    }

    /// Unpins and unmaps a buffer that left the books. If the pinner cannot unpin it, its
    /// mapping is leaked: a device may still reach it, so the address must stay reserved.
    fn release(&self, b: Block) {
        // SAFETY: `b` was pinned by this pool's pinner with these arguments (`pin_new`), is
        // still mapped (it owns its mapping) and is unpinned once, here, as it leaves the pool;
        // no lease refers to it (it came off the free list, or from a lease being dropped).
        match unsafe { self.pinner.unpin(b.ptr(), b.capacity()) } {
            Ok(()) => drop(b),
            Err(e) => {
                tracing::warn!(
                    "pinned pool: leaking a buffer of {} that {} cannot unpin: {e}",
                    format_size_exact(b.capacity()),
                    self.pinner.name()
                );
                std::mem::forget(b);
            }
        }
    }

    /// Takes back a lease's buffer: it joins the free list as the most recently used.
    pub(super) fn give_back(&self, block: Block) {
        let mut st = relock(&self.state);
        let cap = block.capacity();
        st.leased_bytes -= cap;
        st.leased_buffers -= 1;
        st.free_bytes += cap;
        st.free.push(block);
    }

    fn stats(&self) -> PinnedStats {
        let st = relock(&self.state);
        PinnedStats {
            limit: self.limit,
            pinned_bytes: st.pinned_bytes,
            leased_bytes: st.leased_bytes,
            buffers: st.buffers,
            hits: st.hits,
            misses: st.misses,
            evictions: st.evictions,
            pinner: self.pinner.name().to_string(),
        }
    }
}

impl Drop for Shared {
    /// The pool and every lease are gone: every buffer is free; unpin and unmap them.
    fn drop(&mut self) {
        let free = std::mem::take(&mut relock(&self.state).free);
        for b in free {
            self.release(b);
        }
    }
}

/// A pinned host buffer leased from a [`PinnedPool`](super::PinnedPool): `len` bytes
/// (what was asked for) of a page-aligned buffer of `capacity` bytes, all pinned. It
/// dereferences to `[u8]`. Dropping it returns the buffer to the pool (it stays pinned, for
/// the next request of its size class). It may be sent to another thread and may outlive the
/// pool's handle.
///
/// A device copy that reads or writes it asynchronously (through [`as_ptr`](PinnedBuf::as_ptr)
/// or [`as_mut_ptr`](PinnedBuf::as_mut_ptr)) must complete before the lease is dropped.
pub struct PinnedBuf {
    shared: Arc<Shared>,
    /// Taken out only by `drop`.
    block: ManuallyDrop<Block>,
    len: usize,
}

impl PinnedBuf {
    pub(super) fn new(shared: Arc<Shared>, block: Block, len: usize) -> PinnedBuf {
        PinnedBuf { shared, block: ManuallyDrop::new(block), len }
    }

    /// The bytes asked for (at most the capacity).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether [`len`](PinnedBuf::len) is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's size (its size class): all of it is pinned and usable through
    /// [`resize`](PinnedBuf::resize).
    pub fn capacity(&self) -> usize {
        self.block.capacity()
    }

    /// Changes [`len`](PinnedBuf::len), within the capacity (e.g. for the last, shorter chunk
    /// of a staging loop). Bytes it exposes hold whatever the buffer held.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `len` exceeds the capacity.
    pub fn resize(&mut self, len: usize) -> Result<()> {
        if len > self.capacity() {
            return Err(Error::invalid(format!(
                "a pinned buffer of capacity {} cannot be {len} bytes long",
                self.capacity()
            )));
        }
        self.len = len;
        Ok(())
    }

    /// The first byte (page aligned), for device copies.
    pub fn as_ptr(&self) -> *const u8 {
        self.block.ptr()
    }

    /// The first byte (page aligned), for device copies into the buffer.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.block.ptr()
    }

    /// The `len` bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the block's mapping is `capacity >= len` readable bytes, initialized (zeroed
        // by mmap, then written only through slices of leases), page aligned and so non-null;
        // this lease owns it alone until it is dropped, and the `&self` borrow excludes the
        // `&mut` slices of `as_mut_slice` for the returned slice's lifetime.
        unsafe { std::slice::from_raw_parts(self.block.ptr(), self.len) }
    }

    /// The `len` bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the `&mut self` borrow makes this the only slice of
        // the buffer for its lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.block.ptr(), self.len) }
    }
}

impl Deref for PinnedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for PinnedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl fmt::Debug for PinnedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuf")
            .field("ptr", &self.block.ptr())
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and `block` is not used after it is taken here.
        let block = unsafe { ManuallyDrop::take(&mut self.block) };
        self.shared.give_back(block);
    }
}
