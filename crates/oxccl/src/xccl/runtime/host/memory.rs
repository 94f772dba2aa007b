//! Host memory posing as device memory: a registry of live allocations, by address range,
//! and the copies between them.
//!
//! Device allocations and pinned host allocations are both real heap blocks, aligned to
//! [`ALIGN`] bytes like `cudaMalloc`'s and filled with [`POISON`] (so code that reads memory
//! it never wrote sees garbage, as on a GPU, rather than zeros; the fill touches every page,
//! so a huge allocation costs what it says). The registry maps each
//! block's start to its length and owner; blocks never overlap, so the block containing an
//! address is the one with the greatest start at or below it. Everything still allocated is
//! freed when the registry drops (when the runtime and every worker holding it are gone).
//!
//! A copy is checked twice against the registry: when it is queued (a device range outside a
//! live allocation of the stream's device, or a host range overlapping device memory, fails
//! the call at once) and when the stream reaches it (memory freed in between breaks the
//! stream instead of being written). The second check and the copy itself run under the
//! registry's read lock, so no block can be freed in the middle of a copy.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::codes::{fail, ILLEGAL_ADDRESS, INVALID_VALUE, OUT_OF_MEMORY};
use crate::error::Result;
use crate::xccl::runtime::CopyKind;

/// The alignment of every allocation (`cudaMalloc` guarantees 256 bytes).
pub(super) const ALIGN: usize = 256;

/// The byte fresh allocations are filled with.
pub(super) const POISON: u8 = 0xA5;

/// Who an allocation belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// Device memory of this device.
    Device(u32),
    /// Pinned host memory.
    Pinned,
}

/// One live allocation.
#[derive(Debug)]
struct Block {
    /// The bytes asked for (at least 1): the range that counts as inside.
    len: usize,
    /// What it was allocated with (what it is freed with).
    layout: Layout,
    /// Whose it is.
    owner: Owner,
}

/// The live allocations by start address. Owns them: dropping it frees them all.
#[derive(Debug, Default)]
struct Blocks(BTreeMap<usize, Block>);

impl Drop for Blocks {
    fn drop(&mut self) {
        for (&start, block) in &self.0 {
            // SAFETY: every entry was made by `Memory::alloc` from `std::alloc::alloc` with
            // `block.layout`, at the address `start` whose provenance it exposed, and entries
            // are removed when freed, so each live block is deallocated exactly once, here.
            // The registry drops only when nothing can use it (its last holder is gone).
            unsafe { std::alloc::dealloc(std::ptr::with_exposed_provenance_mut(start), block.layout) };
        }
    }
}

/// A copy as queued: addresses, length, direction, and the device whose memory its device
/// side must be.
#[derive(Debug, Clone)]
pub(super) struct Transfer {
    /// Destination address.
    dst: usize,
    /// Source address.
    src: usize,
    /// Bytes to copy.
    bytes: usize,
    /// Which side is device memory.
    kind: CopyKind,
    /// The stream's device.
    device: u32,
}

impl Transfer {
    /// A copy of `bytes` from `src` to `dst`, for a stream on `device`.
    ///
    /// # Errors
    /// An address that does not fit this target's pointers, or a range that wraps around.
    pub(super) fn new(dst: u64, src: u64, bytes: usize, kind: CopyKind, device: u32) -> Result<Transfer> {
        let addr = |a: u64, what: &str| {
            usize::try_from(a)
                .ok()
                .filter(|a| a.checked_add(bytes).is_some())
                .ok_or_else(|| fail(INVALID_VALUE, "copy_async", format!("{what} {a:#x}..+{bytes} is not addressable")))
        };
        Ok(Transfer { dst: addr(dst, "destination")?, src: addr(src, "source")?, bytes, kind, device })
    }

    /// One line for messages.
    pub(super) fn describe(&self) -> String {
        format!("copy {:?} of {} bytes from {:#x} to {:#x}", self.kind, self.bytes, self.src, self.dst)
    }
}

impl Blocks {
    /// The block containing `addr`, with its start.
    fn containing(&self, addr: usize) -> Option<(usize, &Block)> {
        let (&start, block) = self.0.range(..=addr).next_back()?;
        (addr - start < block.len).then_some((start, block))
    }

    /// Checks that `addr..+bytes` lies inside one live allocation of `device` (an empty range
    /// may also sit at the very end of one).
    fn device_range(&self, addr: usize, bytes: usize, device: u32, what: &str) -> Result<(), String> {
        let hit = self.containing(addr).or_else(|| {
            if bytes == 0 {
                addr.checked_sub(1).and_then(|a| self.containing(a))
            } else {
                None
            }
        });
        let Some((start, block)) = hit else {
            return Err(format!("{what} {addr:#x}..+{bytes} is not inside a live allocation of device {device}"));
        };
        match block.owner {
            Owner::Pinned => {
                return Err(format!("{what} {addr:#x} is pinned host memory, but the copy's kind says device memory"))
            }
            Owner::Device(d) if d != device => {
                return Err(format!("{what} {addr:#x} is memory of device {d}, but the stream is on device {device}"))
            }
            Owner::Device(_) => {}
        }
        let end = start + block.len;
        // `Transfer::new` made sure that `addr + bytes` does not overflow.
        if addr + bytes > end {
            return Err(format!(
                "{what} {addr:#x}..+{bytes} runs {} bytes past the end of its allocation at {start:#x} ({} bytes)",
                addr + bytes - end,
                block.len
            ));
        }
        Ok(())
    }

    /// Checks that `addr..+bytes` is host memory as far as the registry can tell: not null,
    /// overlapping no device allocation, and not running past the end of a pinned allocation
    /// it starts in.
    fn host_range(&self, addr: usize, bytes: usize, what: &str) -> Result<(), String> {
        if bytes == 0 {
            return Ok(());
        }
        if addr == 0 {
            return Err(format!("{what} is null"));
        }
        let end = addr + bytes;
        // Blocks are sorted and disjoint, so their ends are sorted too: walking down from the
        // last block starting before `end`, the first one ending at or before `addr` ends the
        // overlapping ones.
        for (&start, block) in self.0.range(..end).rev() {
            if start + block.len <= addr {
                break;
            }
            match block.owner {
                Owner::Device(d) => {
                    return Err(format!(
                        "{what} {addr:#x}..+{bytes} overlaps the allocation of device {d} at {start:#x}, but the \
                         copy's kind says host memory"
                    ))
                }
                Owner::Pinned if start <= addr && end > start + block.len => {
                    return Err(format!(
                        "{what} {addr:#x}..+{bytes} runs {} bytes past the end of its pinned allocation at {start:#x}",
                        end - (start + block.len)
                    ))
                }
                Owner::Pinned => {}
            }
        }
        Ok(())
    }

    /// Checks both ranges of `t` against its kind.
    fn check(&self, t: &Transfer) -> Result<(), String> {
        match t.kind {
            CopyKind::HostToDevice => {
                self.device_range(t.dst, t.bytes, t.device, "destination")?;
                self.host_range(t.src, t.bytes, "source")
            }
            CopyKind::DeviceToHost => {
                self.device_range(t.src, t.bytes, t.device, "source")?;
                self.host_range(t.dst, t.bytes, "destination")
            }
            CopyKind::DeviceToDevice => {
                self.device_range(t.dst, t.bytes, t.device, "destination")?;
                self.device_range(t.src, t.bytes, t.device, "source")
            }
        }
    }
}

/// The registry, shared by the runtime and its stream workers.
#[derive(Debug, Default)]
pub(super) struct Memory {
    /// The live allocations.
    blocks: RwLock<Blocks>,
}

impl Memory {
    /// Reads the registry (poisoning ignored: every update is one map insert or remove).
    fn read(&self) -> RwLockReadGuard<'_, Blocks> {
        self.blocks.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the registry (poisoning ignored, as for reads).
    fn write(&self) -> RwLockWriteGuard<'_, Blocks> {
        self.blocks.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Allocates `bytes` (at least 1) for `owner`, filled with [`POISON`]; returns the address,
    /// its provenance exposed.
    ///
    /// # Errors
    /// A size too large for a layout, or the allocator's failure.
    pub(super) fn alloc(&self, owner: Owner, bytes: usize, call: &str) -> Result<usize> {
        let len = bytes.max(1);
        let layout = Layout::from_size_align(len, ALIGN)
            .map_err(|_| fail(OUT_OF_MEMORY, call, format!("{bytes} bytes is more than can be allocated")))?;
        // SAFETY: `layout` has a nonzero size (`len >= 1`).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(fail(OUT_OF_MEMORY, call, format!("the allocator refused {bytes} bytes")));
        }
        // SAFETY: `ptr` is a fresh allocation of `len` bytes, valid for writes.
        unsafe { std::ptr::write_bytes(ptr, POISON, len) };
        let start = ptr.expose_provenance();
        self.write().0.insert(start, Block { len, layout, owner });
        Ok(start)
    }

    /// Frees the allocation starting at `addr`, which must belong to `owner`.
    ///
    /// # Errors
    /// `addr` is not the start of a live allocation (never allocated, already freed, inside
    /// one), or the allocation is someone else's (another device's, pinned rather than device).
    pub(super) fn free(&self, owner: Owner, addr: usize, call: &str) -> Result<()> {
        let mut blocks = self.write();
        let Some(block) = blocks.0.get(&addr) else {
            let why = match blocks.containing(addr) {
                Some((start, _)) => format!("{addr:#x} is inside the allocation at {start:#x}, not its start"),
                None => format!("{addr:#x} is not a live allocation (never allocated, or already freed)"),
            };
            return Err(fail(INVALID_VALUE, call, why));
        };
        if block.owner != owner {
            let whose = |o: Owner| match o {
                Owner::Device(d) => format!("device {d}'s memory"),
                Owner::Pinned => "pinned host memory".to_string(),
            };
            return Err(fail(
                INVALID_VALUE,
                call,
                format!("{addr:#x} is {}, not {}", whose(block.owner), whose(owner)),
            ));
        }
        let layout = block.layout;
        blocks.0.remove(&addr);
        // SAFETY: the block at `addr` was allocated by `alloc` with `layout` at this address
        // (provenance exposed there) and was live until the line above removed it, so it is
        // freed once. The write lock waits out copies in progress; work still queued that
        // uses it finds it gone when it runs.
        unsafe { std::alloc::dealloc(std::ptr::with_exposed_provenance_mut(addr), layout) };
        Ok(())
    }

    /// Who owns the allocation containing `addr`, if any.
    pub(super) fn owner_of(&self, addr: usize) -> Option<Owner> {
        self.read().containing(addr).map(|(_, b)| b.owner)
    }

    /// Checks a copy when it is queued.
    ///
    /// # Errors
    /// A range that is not what the copy's kind says.
    pub(super) fn check(&self, t: &Transfer) -> Result<()> {
        self.read().check(t).map_err(|why| fail(INVALID_VALUE, "copy_async", why))
    }

    /// Runs a copy when its stream reaches it: checks it again, then copies, with the
    /// registry read-locked throughout.
    ///
    /// # Errors
    /// A device range no longer inside a live allocation (freed after the copy was queued).
    pub(super) fn run(&self, t: &Transfer) -> Result<()> {
        let blocks = self.read();
        blocks.check(t).map_err(|why| {
            fail(ILLEGAL_ADDRESS, "copy", format!("{why} (was memory freed before the stream reached the copy?)"))
        })?;
        if t.bytes == 0 {
            return Ok(());
        }
        let src: *const u8 = std::ptr::with_exposed_provenance(t.src);
        let dst: *mut u8 = std::ptr::with_exposed_provenance_mut(t.dst);
        // SAFETY: every device range was just checked to lie inside a live allocation of ours
        // (valid for reads and writes of `bytes` from its address), and none can be freed
        // while `blocks` holds the read lock. Every host range is valid for `bytes` bytes by
        // the contract of `copy_async`, which queued this copy: it stays valid until the
        // stream reaches it, which is now. `ptr::copy` allows overlap; bytes need no alignment.
        unsafe { std::ptr::copy(src, dst, t.bytes) };
        drop(blocks);
        Ok(())
    }

    /// How many device and pinned host allocations are live.
    pub(super) fn census(&self) -> (usize, usize) {
        let blocks = self.read();
        let device = blocks.0.values().filter(|b| matches!(b.owner, Owner::Device(_))).count();
        (device, blocks.0.len() - device)
    }
}
