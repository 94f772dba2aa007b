//! The table of `nccl*` functions, resolved by name from a loaded library (or from any lookup,
//! which is how tests build one without a library).
//!
//! Every signature is `nccl.h`'s (NVIDIA/nccl `src/nccl.h.in`, tags `v2.14.3-1` for the
//! required functions and the first tag named in [`OPTIONAL_SINCE`] for the optional ones,
//! checked again against `v2.30.7-1` and the 2.32.3 wheel's `nccl.h`, except
//! `ncclCommGetUniqueId` and `ncclCommGrow`, checked against `v2.29.2-1`, `v2.30.7-1` and
//! master (2.30) only; RCCL declares the same with `hipStream_t`, ROCm/rccl
//! `src/nccl.h.in`). Streams are `*mut c_void`: a `cudaStream_t`/`hipStream_t`, which is a
//! pointer to an opaque struct in both runtimes.
//!
//! [`OPTIONAL_SINCE`]: super::version::OPTIONAL_SINCE

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::Arc;

use super::types::{NcclComm, NcclConfig, NcclDataType, NcclRedOp, NcclResult, NcclScalarResidence, NcclUniqueId};
use crate::xccl::dl::{resolve_fields, Opened, Resolver};

/// `cudaStream_t` / `hipStream_t`.
pub(crate) type Stream = *mut c_void;

/// `ncclResult_t ncclGetVersion(int *version);`
pub(crate) type GetVersionFn = unsafe extern "C" fn(version: *mut c_int) -> NcclResult;
/// `ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);`
pub(crate) type GetUniqueIdFn = unsafe extern "C" fn(unique_id: *mut NcclUniqueId) -> NcclResult;
/// `ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
/// int rank, ncclConfig_t* config);` (the id is passed by value).
pub(crate) type CommInitRankConfigFn = unsafe extern "C" fn(
    comm: *mut NcclComm,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
    config: *mut NcclConfig,
) -> NcclResult;
/// `ncclResult_t ncclCommDestroy(ncclComm_t comm);`, `ncclCommAbort` and `ncclCommFinalize`
/// (same shape).
pub(crate) type CommFn = unsafe extern "C" fn(comm: NcclComm) -> NcclResult;
/// `ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);`
pub(crate) type CommGetAsyncErrorFn = unsafe extern "C" fn(comm: NcclComm, async_error: *mut NcclResult) -> NcclResult;
/// `ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);`, `ncclCommCuDevice`
/// (`int* device`) and `ncclCommUserRank` (`int* rank`) (same shape).
pub(crate) type CommIntFn = unsafe extern "C" fn(comm: NcclComm, out: *mut c_int) -> NcclResult;
/// `const char* ncclGetErrorString(ncclResult_t result);`
pub(crate) type GetErrorStringFn = unsafe extern "C" fn(result: NcclResult) -> *const c_char;
/// `const char* ncclGetLastError(ncclComm_t comm);` (`comm` is unused and may be null).
pub(crate) type GetLastErrorFn = unsafe extern "C" fn(comm: NcclComm) -> *const c_char;
/// `ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);`
pub(crate) type AllReduceFn = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    comm: NcclComm,
    stream: Stream,
) -> NcclResult;
/// `ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);`, and
/// `ncclGather`/`ncclScatter` (same shape; `count` is per rank).
pub(crate) type RootedFn = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclComm,
    stream: Stream,
) -> NcclResult;
/// `ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);`
pub(crate) type ReduceFn = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    root: c_int,
    comm: NcclComm,
    stream: Stream,
) -> NcclResult;
/// `ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
/// ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);`, and `ncclAlltoAll`
/// (same shape; `count` per peer).
pub(crate) type GatherAllFn = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    comm: NcclComm,
    stream: Stream,
) -> NcclResult;
/// `ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
/// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);` (the same
/// shape as `ncclAllReduce`, with `recvcount`).
pub(crate) type ReduceScatterFn = AllReduceFn;
/// `ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
/// int peer, ncclComm_t comm, cudaStream_t stream);`
pub(crate) type SendFn = unsafe extern "C" fn(
    sendbuff: *const c_void,
    count: usize,
    datatype: NcclDataType,
    peer: c_int,
    comm: NcclComm,
    stream: Stream,
) -> NcclResult;
/// `ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
/// ncclComm_t comm, cudaStream_t stream);`
pub(crate) type RecvFn = unsafe extern "C" fn(
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    peer: c_int,
    comm: NcclComm,
    stream: Stream,
) -> NcclResult;
/// `ncclResult_t ncclGroupStart();` and `ncclGroupEnd()`.
pub(crate) type GroupFn = unsafe extern "C" fn() -> NcclResult;
/// `ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
/// ncclConfig_t* config);` (since 2.18.1)
pub(crate) type CommSplitFn = unsafe extern "C" fn(
    comm: NcclComm,
    color: c_int,
    key: c_int,
    newcomm: *mut NcclComm,
    config: *mut NcclConfig,
) -> NcclResult;
/// `ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int
/// excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);` (since
/// 2.27.3)
pub(crate) type CommShrinkFn = unsafe extern "C" fn(
    comm: NcclComm,
    exclude_ranks: *mut c_int,
    exclude_count: c_int,
    newcomm: *mut NcclComm,
    config: *mut NcclConfig,
    shrink_flags: c_int,
) -> NcclResult;
/// `ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);` (since
/// 2.29.2): the id of a grow of `comm`, made by one of its ranks (the root).
pub(crate) type CommGetUniqueIdFn = unsafe extern "C" fn(comm: NcclComm, unique_id: *mut NcclUniqueId) -> NcclResult;
/// `ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int
/// rank, ncclComm_t* newcomm, ncclConfig_t* config);` (since 2.29.2; `nRanks` is the new
/// total; existing ranks pass their communicator and rank -1, new ones a null communicator,
/// the id and their rank)
pub(crate) type CommGrowFn = unsafe extern "C" fn(
    comm: NcclComm,
    nranks: c_int,
    unique_id: *const NcclUniqueId,
    rank: c_int,
    newcomm: *mut NcclComm,
    config: *mut NcclConfig,
) -> NcclResult;
/// `ncclResult_t ncclMemAlloc(void** ptr, size_t size);` (since 2.19.1)
pub(crate) type MemAllocFn = unsafe extern "C" fn(ptr: *mut *mut c_void, size: usize) -> NcclResult;
/// `ncclResult_t ncclMemFree(void *ptr);` (since 2.19.1)
pub(crate) type MemFreeFn = unsafe extern "C" fn(ptr: *mut c_void) -> NcclResult;
/// `ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void**
/// handle);` (since 2.19.1)
pub(crate) type CommRegisterFn =
    unsafe extern "C" fn(comm: NcclComm, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> NcclResult;
/// `ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);` (since 2.19.1)
pub(crate) type CommDeregisterFn = unsafe extern "C" fn(comm: NcclComm, handle: *mut c_void) -> NcclResult;
/// `ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t
/// datatype, ncclScalarResidence_t residence, ncclComm_t comm);` (since 2.11.4)
pub(crate) type RedOpCreatePreMulSumFn = unsafe extern "C" fn(
    op: *mut NcclRedOp,
    scalar: *mut c_void,
    datatype: NcclDataType,
    residence: NcclScalarResidence,
    comm: NcclComm,
) -> NcclResult;
/// `ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);` (since 2.11.4)
pub(crate) type RedOpDestroyFn = unsafe extern "C" fn(op: NcclRedOp, comm: NcclComm) -> NcclResult;

/// The `nccl*` functions the GPU engine calls. Required ones are plain function pointers
/// (a library without any of them is not loaded); optional ones, which newer releases added,
/// are `None` where the library lacks them.
///
/// Calling any of them is `unsafe`: the caller keeps NCCL's rules (valid communicators,
/// device pointers of the right size, the current device set).
#[derive(Clone)]
pub(crate) struct Table {
    /// `ncclGetVersion`.
    pub(crate) get_version: GetVersionFn,
    /// `ncclGetUniqueId`.
    pub(crate) get_unique_id: GetUniqueIdFn,
    /// `ncclCommInitRankConfig`.
    pub(crate) comm_init_rank_config: CommInitRankConfigFn,
    /// `ncclCommDestroy`.
    pub(crate) comm_destroy: CommFn,
    /// `ncclCommAbort`.
    pub(crate) comm_abort: CommFn,
    /// `ncclCommFinalize`.
    pub(crate) comm_finalize: CommFn,
    /// `ncclCommGetAsyncError`.
    pub(crate) comm_get_async_error: CommGetAsyncErrorFn,
    /// `ncclCommCount`.
    pub(crate) comm_count: CommIntFn,
    /// `ncclCommCuDevice`.
    pub(crate) comm_cu_device: CommIntFn,
    /// `ncclCommUserRank`.
    pub(crate) comm_user_rank: CommIntFn,
    /// `ncclGetErrorString`.
    pub(crate) get_error_string: GetErrorStringFn,
    /// `ncclGetLastError`.
    pub(crate) get_last_error: GetLastErrorFn,
    /// `ncclAllReduce`.
    pub(crate) all_reduce: AllReduceFn,
    /// `ncclBroadcast`.
    pub(crate) broadcast: RootedFn,
    /// `ncclReduce`.
    pub(crate) reduce: ReduceFn,
    /// `ncclAllGather`.
    pub(crate) all_gather: GatherAllFn,
    /// `ncclReduceScatter`.
    pub(crate) reduce_scatter: ReduceScatterFn,
    /// `ncclSend`.
    pub(crate) send: SendFn,
    /// `ncclRecv`.
    pub(crate) recv: RecvFn,
    /// `ncclGroupStart`.
    pub(crate) group_start: GroupFn,
    /// `ncclGroupEnd`.
    pub(crate) group_end: GroupFn,
    /// `ncclCommSplit` (NCCL 2.18.1+).
    pub(crate) comm_split: Option<CommSplitFn>,
    /// `ncclCommShrink` (NCCL 2.27.3+).
    pub(crate) comm_shrink: Option<CommShrinkFn>,
    /// `ncclCommGetUniqueId` (NCCL 2.29.2+).
    pub(crate) comm_get_unique_id: Option<CommGetUniqueIdFn>,
    /// `ncclCommGrow` (NCCL 2.29.2+).
    pub(crate) comm_grow: Option<CommGrowFn>,
    /// `ncclAlltoAll` (NCCL 2.28.3+), or RCCL's older `ncclAllToAll` (same signature).
    pub(crate) all_to_all: Option<GatherAllFn>,
    /// `ncclGather` (NCCL 2.28.3+; RCCL earlier).
    pub(crate) gather: Option<RootedFn>,
    /// `ncclScatter` (NCCL 2.28.3+; RCCL earlier).
    pub(crate) scatter: Option<RootedFn>,
    /// `ncclMemAlloc` (NCCL 2.19.1+).
    pub(crate) mem_alloc: Option<MemAllocFn>,
    /// `ncclMemFree` (NCCL 2.19.1+).
    pub(crate) mem_free: Option<MemFreeFn>,
    /// `ncclCommRegister` (NCCL 2.19.1+).
    pub(crate) comm_register: Option<CommRegisterFn>,
    /// `ncclCommDeregister` (NCCL 2.19.1+).
    pub(crate) comm_deregister: Option<CommDeregisterFn>,
    /// `ncclRedOpCreatePreMulSum` (NCCL 2.11.4+).
    pub(crate) red_op_create_pre_mul_sum: Option<RedOpCreatePreMulSumFn>,
    /// `ncclRedOpDestroy` (NCCL 2.11.4+).
    pub(crate) red_op_destroy: Option<RedOpDestroyFn>,
    /// The library the pointers point into, kept loaded as long as any copy of the table
    /// lives. `None` for a table built from a lookup of functions that are always there
    /// (tests).
    library: Option<Arc<Opened>>,
}

/// The names of the required functions, in the table's order (a test checks that
/// [`Table::resolve`] asks for exactly these).
#[cfg(test)]
pub(crate) const REQUIRED: [&CStr; 21] = [
    c"ncclGetVersion",
    c"ncclGetUniqueId",
    c"ncclCommInitRankConfig",
    c"ncclCommDestroy",
    c"ncclCommAbort",
    c"ncclCommFinalize",
    c"ncclCommGetAsyncError",
    c"ncclCommCount",
    c"ncclCommCuDevice",
    c"ncclCommUserRank",
    c"ncclGetErrorString",
    c"ncclGetLastError",
    c"ncclAllReduce",
    c"ncclBroadcast",
    c"ncclReduce",
    c"ncclAllGather",
    c"ncclReduceScatter",
    c"ncclSend",
    c"ncclRecv",
    c"ncclGroupStart",
    c"ncclGroupEnd",
];

/// RCCL's name for all-to-all before it adopted NCCL 2.28's `ncclAlltoAll` (ROCm/rccl
/// `src/nccl.h.in`, `ncclAllToAll`, same signature).
pub(crate) const RCCL_ALL_TO_ALL: &CStr = c"ncclAllToAll";

impl Table {
    /// Resolves every function through `lookup` (a name to its address, `None` or null when
    /// absent).
    ///
    /// # Errors
    /// `lacks ncclCommInitRankConfig, ncclCommFinalize`: every required function that is
    /// missing, in the table's order.
    ///
    /// # Safety
    /// Every non-null address `lookup` returns for a name is that function with the
    /// signature `nccl.h` declares for it (the types above), callable as long as the table
    /// and its copies live. A test may give addresses of functions with other signatures
    /// for entries it never calls.
    pub(crate) unsafe fn resolve(lookup: &mut dyn FnMut(&CStr) -> Option<*mut c_void>) -> Result<Table, String> {
        let mut r = Resolver::new(lookup);
        // SAFETY: each name below is resolved into the field whose type is that name's
        // signature in nccl.h (see the type aliases); the addresses are our caller's promise.
        unsafe {
            resolve_fields!(r, Table;
                required {
                    get_version = c"ncclGetVersion",
                    get_unique_id = c"ncclGetUniqueId",
                    comm_init_rank_config = c"ncclCommInitRankConfig",
                    comm_destroy = c"ncclCommDestroy",
                    comm_abort = c"ncclCommAbort",
                    comm_finalize = c"ncclCommFinalize",
                    comm_get_async_error = c"ncclCommGetAsyncError",
                    comm_count = c"ncclCommCount",
                    comm_cu_device = c"ncclCommCuDevice",
                    comm_user_rank = c"ncclCommUserRank",
                    get_error_string = c"ncclGetErrorString",
                    get_last_error = c"ncclGetLastError",
                    all_reduce = c"ncclAllReduce",
                    broadcast = c"ncclBroadcast",
                    reduce = c"ncclReduce",
                    all_gather = c"ncclAllGather",
                    reduce_scatter = c"ncclReduceScatter",
                    send = c"ncclSend",
                    recv = c"ncclRecv",
                    group_start = c"ncclGroupStart",
                    group_end = c"ncclGroupEnd",
                }
                optional {
                    comm_split = r.optional(c"ncclCommSplit"),
                    comm_shrink = r.optional(c"ncclCommShrink"),
                    comm_get_unique_id = r.optional(c"ncclCommGetUniqueId"),
                    comm_grow = r.optional(c"ncclCommGrow"),
                    all_to_all = r.optional(c"ncclAlltoAll").or_else(|| r.optional(RCCL_ALL_TO_ALL)),
                    gather = r.optional(c"ncclGather"),
                    scatter = r.optional(c"ncclScatter"),
                    mem_alloc = r.optional(c"ncclMemAlloc"),
                    mem_free = r.optional(c"ncclMemFree"),
                    comm_register = r.optional(c"ncclCommRegister"),
                    comm_deregister = r.optional(c"ncclCommDeregister"),
                    red_op_create_pre_mul_sum = r.optional(c"ncclRedOpCreatePreMulSum"),
                    red_op_destroy = r.optional(c"ncclRedOpDestroy"),
                }
            )
        }
    }

    /// Resolves the table from an opened library, which the table then keeps loaded.
    ///
    /// # Errors
    /// As [`resolve`](Self::resolve): the required functions the library lacks.
    pub(crate) fn from_library(library: Arc<Opened>) -> Result<Table, String> {
        // SAFETY: the library exports the nccl* names (it was found as NCCL or RCCL, which
        // define them with the signatures of nccl.h); `Opened::symbol` gives the addresses,
        // which stay valid because the table holds the library.
        let mut table = unsafe { Table::resolve(&mut |name| library.symbol(name)) }?;
        table.library = Some(library);
        Ok(table)
    }

    /// The names of the optional functions this table has (for diagnostics).
    pub(crate) fn optional_present(&self) -> Vec<&'static str> {
        let present = [
            ("ncclCommSplit", self.comm_split.is_some()),
            ("ncclCommShrink", self.comm_shrink.is_some()),
            ("ncclCommGetUniqueId", self.comm_get_unique_id.is_some()),
            ("ncclCommGrow", self.comm_grow.is_some()),
            ("ncclAlltoAll", self.all_to_all.is_some()),
            ("ncclGather", self.gather.is_some()),
            ("ncclScatter", self.scatter.is_some()),
            ("ncclMemAlloc", self.mem_alloc.is_some()),
            ("ncclMemFree", self.mem_free.is_some()),
            ("ncclCommRegister", self.comm_register.is_some()),
            ("ncclCommDeregister", self.comm_deregister.is_some()),
            ("ncclRedOpCreatePreMulSum", self.red_op_create_pre_mul_sum.is_some()),
            ("ncclRedOpDestroy", self.red_op_destroy.is_some()),
        ];
        present.into_iter().filter(|&(_, p)| p).map(|(n, _)| n).collect()
    }
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("library", &self.library.as_ref().map(|l| &l.path))
            .field("optional", &self.optional_present())
            .finish_non_exhaustive()
    }
}
