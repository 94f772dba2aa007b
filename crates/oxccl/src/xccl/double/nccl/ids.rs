//! The double's unique ids: `ncclGetUniqueId`'s and `ncclCommGetUniqueId`'s, made with a
//! magic, a process-wide counter, the process id and the kind of call that made them.

use std::sync::atomic::{AtomicU64, Ordering};

use super::status::{fail, guard};
use crate::xccl::library::types::{NcclResult, NcclUniqueId, NCCL_UNIQUE_ID_BYTES};

/// The magic at the start of every unique id the double makes.
pub(super) const ID_MAGIC: &[u8; 16] = b"oxccl-nccl-dbl\0\x01";

/// Numbers the unique ids of the process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Where an id says which call made it.
const ID_KIND: usize = 28;
/// The kind byte of `ncclCommGetUniqueId`'s ids (0 for `ncclGetUniqueId`'s).
const GROW_KIND: u8 = b'g';

/// A fresh id (the magic, a process-wide counter, the process id and its kind: `grow` for
/// `ncclCommGetUniqueId`'s).
pub(super) fn fresh_id(grow: bool) -> NcclUniqueId {
    let mut id = NcclUniqueId::zeroed();
    id.internal[..16].copy_from_slice(ID_MAGIC);
    id.internal[16..24].copy_from_slice(&NEXT_ID.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    id.internal[24..ID_KIND].copy_from_slice(&std::process::id().to_le_bytes());
    id.internal[ID_KIND] = if grow { GROW_KIND } else { 0 };
    id
}

/// `ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId)`: a fresh id per call.
///
/// # Safety
/// `unique_id` is null or valid for writing an id.
pub(super) unsafe extern "C" fn nccl_get_unique_id(unique_id: *mut NcclUniqueId) -> NcclResult {
    guard("ncclGetUniqueId", || {
        if unique_id.is_null() {
            return fail(NcclResult::INVALID_ARGUMENT, "ncclGetUniqueId: uniqueId is null");
        }
        // SAFETY: non-null and writable (the caller's contract).
        unsafe { unique_id.write(fresh_id(false)) };
        NcclResult::SUCCESS
    })
}

/// Whether `id` is one the double made.
pub(super) fn is_our_id(id: &NcclUniqueId) -> bool {
    id.internal.len() == NCCL_UNIQUE_ID_BYTES && &id.internal[..16] == ID_MAGIC
}

/// Whether `id` is one of the double's `ncclCommGetUniqueId`.
pub(super) fn is_grow_id(id: &NcclUniqueId) -> bool {
    is_our_id(id) && id.internal[ID_KIND] == GROW_KIND
}
