//! The double of the NCCL C API: `extern "C"` functions with `nccl.h`'s signatures (the
//! types of [`table`](crate::xccl::library::table)), implementing NCCL's semantics over
//! [`World`](super::world::World) and the host runtime, and [`table`] to build a
//! [`Table`] of them.
//!
//! - `comm.rs`: communicators: the live-handle registry (a bad or destroyed `ncclComm_t` is
//!   `ncclInvalidArgument`, never undefined behaviour), init by unique id, abort, async
//!   errors, and the fault injection tests use ([`hang_next`], [`kill`]).
//! - `child.rs`: split and shrink (a parent's ranks make a child; its handle comes late).
//! - `grow.rs`: `ncclCommGetUniqueId` and `ncclCommGrow` (existing and new ranks meet).
//! - `gathering.rs`: how ranks meet (by unique id, or as a parent's child).
//! - `calls.rs`: collectives, point-to-point, memory, registration, pre-mul-sum ops.
//! - `group.rs`: groups, the kernel of a group's sends and receives, `ncclInProgress` at
//!   first use.
//! - `status.rs`: the last error, `ncclGetLastError` and `ncclGetErrorString`, and the guard
//!   that keeps panics out of C; `ids.rs`: unique ids; `counts.rs`: [`Calls`]. Every other
//!   file stands on these three.
//!
//! Work is queued as closures on the host runtime's streams ([`enqueue_anywhere`]): a
//! stream handle names its runtime, so many runtimes can run in one process. The null
//! stream is the legacy default stream of the calling thread's current device, as on CUDA.
//! The device of a communicator, and of `ncclMemAlloc`, is the one current on the calling
//! thread ([`CurrentDevice`]).
//!
//! Every function catches panics (returning `ncclInternalError`) so none unwinds into C.
//! The functions that make communicators count their calls per thread ([`calls`]), so a
//! test can tell which way the engine made one.
//!
//! [`enqueue_anywhere`]: crate::xccl::runtime::host::enqueue_anywhere
//! [`CurrentDevice`]: crate::xccl::runtime::host::CurrentDevice

mod calls;
mod child;
mod comm;
mod counts;
mod gathering;
mod group;
mod grow;
mod ids;
mod status;
#[cfg(test)]
mod tests;

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicI32, Ordering};

use self::status::fail;
use crate::xccl::library::table::{GetVersionFn, Table};
use crate::xccl::library::types::NcclResult;

#[allow(unused_imports)] // Fault injection for the engine's tests (and ours).
pub(crate) use comm::{hang_next, hold_polls, kill, HangGuard};
#[cfg_attr(not(test), allow(unused_imports))] // the engine's tests count the calls
pub(crate) use counts::{calls, Calls};

/// What the double's library looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DoubleOptions {
    /// What `ncclGetVersion` reports (an `NCCL_VERSION` code; 22902 is 2.29.2). The
    /// optional functions are decided by the flags below, never by the version.
    pub(crate) version: i32,
    /// Whether `ncclCommSplit` is exported.
    pub(crate) split: bool,
    /// Whether `ncclCommShrink` is exported.
    pub(crate) shrink: bool,
    /// Whether `ncclCommGetUniqueId` and `ncclCommGrow` are exported.
    pub(crate) grow: bool,
    /// Whether `ncclAlltoAll` is exported.
    pub(crate) all_to_all: bool,
    /// Whether `ncclGather` and `ncclScatter` are exported.
    pub(crate) gather_scatter: bool,
    /// Whether `ncclMemAlloc`, `ncclMemFree`, `ncclCommRegister` and `ncclCommDeregister`
    /// are exported.
    pub(crate) mem_alloc_register: bool,
    /// Whether `ncclRedOpCreatePreMulSum` and `ncclRedOpDestroy` are exported.
    pub(crate) pre_mul_sum: bool,
}

impl Default for DoubleOptions {
    /// NCCL 2.29.2 (the first with `ncclCommGrow`) with every optional function.
    fn default() -> DoubleOptions {
        DoubleOptions {
            version: 22902,
            split: true,
            shrink: true,
            grow: true,
            all_to_all: true,
            gather_scatter: true,
            mem_alloc_register: true,
            pre_mul_sum: true,
        }
    }
}

/// A table of the double's functions, with the version and the optional functions `opts`
/// asks for (the others are absent, as in an older NCCL).
///
/// # Panics
/// When more than [`VERSION_SLOTS`] distinct versions were asked for in this process (the
/// version is read by one of a fixed set of functions, since C functions get no context).
pub(crate) fn table(opts: &DoubleOptions) -> Table {
    let get_version = version_fn(opts.version);
    let mut lookup = |name: &CStr| -> Option<*mut c_void> {
        use calls::*;
        use child::*;
        use comm::*;
        use group::*;
        use grow::*;
        use ids::*;
        use status::*;
        let on = |flag: bool, f: *mut c_void| flag.then_some(f);
        Some(match name.to_bytes() {
            b"ncclGetVersion" => get_version as *mut c_void,
            b"ncclGetUniqueId" => nccl_get_unique_id as *mut c_void,
            b"ncclCommInitRankConfig" => nccl_comm_init_rank_config as *mut c_void,
            b"ncclCommDestroy" => nccl_comm_destroy as *mut c_void,
            b"ncclCommAbort" => nccl_comm_abort as *mut c_void,
            b"ncclCommFinalize" => nccl_comm_finalize as *mut c_void,
            b"ncclCommGetAsyncError" => nccl_comm_get_async_error as *mut c_void,
            b"ncclCommCount" => nccl_comm_count as *mut c_void,
            b"ncclCommCuDevice" => nccl_comm_cu_device as *mut c_void,
            b"ncclCommUserRank" => nccl_comm_user_rank as *mut c_void,
            b"ncclGetErrorString" => nccl_get_error_string as *mut c_void,
            b"ncclGetLastError" => nccl_get_last_error as *mut c_void,
            b"ncclAllReduce" => nccl_all_reduce as *mut c_void,
            b"ncclBroadcast" => nccl_broadcast as *mut c_void,
            b"ncclReduce" => nccl_reduce as *mut c_void,
            b"ncclAllGather" => nccl_all_gather as *mut c_void,
            b"ncclReduceScatter" => nccl_reduce_scatter as *mut c_void,
            b"ncclSend" => nccl_send as *mut c_void,
            b"ncclRecv" => nccl_recv as *mut c_void,
            b"ncclGroupStart" => nccl_group_start as *mut c_void,
            b"ncclGroupEnd" => nccl_group_end as *mut c_void,
            b"ncclCommSplit" => on(opts.split, nccl_comm_split as *mut c_void)?,
            b"ncclCommShrink" => on(opts.shrink, nccl_comm_shrink as *mut c_void)?,
            b"ncclCommGetUniqueId" => on(opts.grow, nccl_comm_get_unique_id as *mut c_void)?,
            b"ncclCommGrow" => on(opts.grow, nccl_comm_grow as *mut c_void)?,
            b"ncclAlltoAll" => on(opts.all_to_all, nccl_all_to_all as *mut c_void)?,
            b"ncclGather" => on(opts.gather_scatter, nccl_gather as *mut c_void)?,
            b"ncclScatter" => on(opts.gather_scatter, nccl_scatter as *mut c_void)?,
            b"ncclMemAlloc" => on(opts.mem_alloc_register, nccl_mem_alloc as *mut c_void)?,
            b"ncclMemFree" => on(opts.mem_alloc_register, nccl_mem_free as *mut c_void)?,
            b"ncclCommRegister" => on(opts.mem_alloc_register, nccl_comm_register as *mut c_void)?,
            b"ncclCommDeregister" => on(opts.mem_alloc_register, nccl_comm_deregister as *mut c_void)?,
            b"ncclRedOpCreatePreMulSum" => on(opts.pre_mul_sum, nccl_red_op_create_pre_mul_sum as *mut c_void)?,
            b"ncclRedOpDestroy" => on(opts.pre_mul_sum, nccl_red_op_destroy as *mut c_void)?,
            _ => return None,
        })
    };
    // SAFETY: every address the lookup gives is the double's function of that name, declared
    // with the signature of the table's type for it (see `calls.rs`, `group.rs`, `comm.rs`,
    // `child.rs`, `grow.rs`, `ids.rs`, `status.rs` and `get_version`); they are plain
    // functions, valid for the life of the process.
    match unsafe { Table::resolve(&mut lookup) } {
        Ok(table) => table,
        // Unreachable: the lookup has every required name.
        Err(lacks) => panic!("the NCCL double {lacks}"),
    }
}

/// How many distinct versions [`table`] can simulate in one process.
pub(crate) const VERSION_SLOTS: usize = 8;

/// A slot not yet given a version.
const EMPTY_SLOT: i32 = i32::MIN;

/// The version each slot's `ncclGetVersion` reports.
static VERSIONS: [AtomicI32; VERSION_SLOTS] = [const { AtomicI32::new(EMPTY_SLOT) }; VERSION_SLOTS];

/// `ncclGetVersion` of slot `K`.
///
/// # Safety
/// `version` is null or valid for writing an int.
unsafe extern "C" fn get_version<const K: usize>(version: *mut c_int) -> NcclResult {
    if version.is_null() {
        return fail(NcclResult::INVALID_ARGUMENT, "ncclGetVersion: version is null");
    }
    // SAFETY: non-null and writable (the caller's contract).
    unsafe { *version = VERSIONS[K].load(Ordering::Relaxed) };
    NcclResult::SUCCESS
}

/// The `ncclGetVersion` of each slot.
const VERSION_FNS: [GetVersionFn; VERSION_SLOTS] = [
    get_version::<0>,
    get_version::<1>,
    get_version::<2>,
    get_version::<3>,
    get_version::<4>,
    get_version::<5>,
    get_version::<6>,
    get_version::<7>,
];

/// An `ncclGetVersion` reporting `code`: the slot that has it, or a fresh one.
///
/// # Panics
/// Every slot holds another version.
fn version_fn(code: i32) -> GetVersionFn {
    for (slot, f) in VERSIONS.iter().zip(VERSION_FNS) {
        match slot.compare_exchange(EMPTY_SLOT, code, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return f,
            Err(held) if held == code => return f,
            Err(_) => {}
        }
    }
    panic!("the NCCL double simulates at most {VERSION_SLOTS} distinct versions per process")
}
