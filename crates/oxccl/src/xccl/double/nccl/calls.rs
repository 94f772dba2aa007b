//! The operations of the double: collectives, point-to-point, memory, registration
//! and pre-mul-sum operators. Each checks its arguments when called (as NCCL does, with the
//! last error saying what is wrong), takes its collective index in host call order, and
//! queues a closure on the given stream that meets the other ranks in the
//! [`World`](crate::xccl::double::world::World).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use super::comm::{lookup, Shared};
use super::gathering::Member;
use super::group::{finish, submit, Deferred, P2pOp, Work};
use super::status::{fail, guard};
use crate::dtype::DType;
use crate::reduce_op::ReduceOp;
use crate::sync::relock;
use crate::xccl::double::world::{Call, Coll};
use crate::xccl::library::types::{NcclComm, NcclDataType, NcclRedOp, NcclResult, NcclScalarResidence};
use crate::xccl::runtime::host::{stream_is_live, Closure, CurrentDevice};
use crate::xccl::runtime::RawStream;

/// oxccl's dtype for an NCCL data type.
///
/// # Errors
/// `ncclInvalidArgument` for a code NCCL does not define.
fn dtype_of(dt: NcclDataType, call: &str) -> Result<DType, NcclResult> {
    Ok(match dt {
        NcclDataType::INT8 => DType::I8,
        NcclDataType::UINT8 => DType::U8,
        NcclDataType::INT32 => DType::I32,
        NcclDataType::UINT32 => DType::U32,
        NcclDataType::INT64 => DType::I64,
        NcclDataType::UINT64 => DType::U64,
        NcclDataType::FLOAT16 => DType::F16,
        NcclDataType::FLOAT32 => DType::F32,
        NcclDataType::FLOAT64 => DType::F64,
        NcclDataType::BFLOAT16 => DType::BF16,
        _ => return Err(fail(NcclResult::INVALID_ARGUMENT, format!("{call}: unknown datatype {}", dt.0))),
    })
}

/// A reduction: a built-in operator, or a pre-mul-sum (the inputs scaled, then summed).
#[derive(Debug, Clone, Copy)]
enum Reduction {
    /// A built-in operator.
    Plain(ReduceOp),
    /// `ncclRedOpCreatePreMulSum`'s operator.
    PreMulSum(PreMul),
}

/// A pre-mul-sum operator's scalar.
#[derive(Debug, Clone, Copy)]
struct PreMul {
    /// Its data type (the collective's must be the same).
    dtype: DType,
    /// The scalar, read at creation (`ncclScalarHostImmediate`).
    value: Option<f64>,
    /// Where the scalar lives, read when the collective runs (`ncclScalarDevice`).
    at: usize,
}

/// The pre-mul-sum operators, by (communicator handle, operator).
static PRE_MUL: LazyLock<Mutex<HashMap<(usize, c_int), PreMul>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The reduction an NCCL operator stands for on `comm`, for data of `dtype`.
///
/// # Errors
/// `ncclInvalidArgument` for an unknown operator, or a pre-mul-sum of another data type.
fn reduction_of(op: NcclRedOp, dtype: DType, comm: NcclComm, call: &str) -> Result<Reduction, NcclResult> {
    Ok(Reduction::Plain(match op {
        NcclRedOp::SUM => ReduceOp::Sum,
        NcclRedOp::PROD => ReduceOp::Prod,
        NcclRedOp::MAX => ReduceOp::Max,
        NcclRedOp::MIN => ReduceOp::Min,
        NcclRedOp::AVG => ReduceOp::Avg,
        _ => {
            let custom = relock(&PRE_MUL).get(&(comm.addr(), op.0)).copied();
            return match custom {
                Some(p) if p.dtype == dtype => Ok(Reduction::PreMulSum(p)),
                Some(p) => Err(fail(
                    NcclResult::INVALID_ARGUMENT,
                    format!("{call}: operator {} is for {}, the data is {dtype}", op.0, p.dtype),
                )),
                None => Err(fail(NcclResult::INVALID_ARGUMENT, format!("{call}: unknown reduction operator {}", op.0))),
            };
        }
    }))
}

/// The checks every operation makes: a live, initialized, healthy communicator and a live
/// stream of the host runtime.
fn prepare(comm: NcclComm, stream: *mut c_void, call: &str) -> Result<(Arc<Shared>, Member), NcclResult> {
    let shared = lookup(comm, call)?;
    if let Some(e) = shared.sticky() {
        return Err(fail(e, format!("{call}: the communicator has failed ({e})")));
    }
    let member = shared.member().map_err(|code| {
        if code == NcclResult::IN_PROGRESS {
            fail(NcclResult::INVALID_USAGE, format!("{call}: the communicator is still initializing"))
        } else {
            code
        }
    })?;
    if let Some(code) = member.net.abort_code(member.rank) {
        return Err(fail(code, format!("{call}: the communicator was aborted")));
    }
    if shared.busy() {
        return Err(fail(
            NcclResult::INVALID_USAGE,
            format!(
                "{call}: the communicator is busy with a call that returned ncclInProgress; poll \
                 ncclCommGetAsyncError until it is ncclSuccess first"
            ),
        ));
    }
    // Stream 0, the legacy default stream (PyTorch's default), is the calling thread's
    // runtime's.
    let raw = RawStream(stream);
    if raw != RawStream::DEFAULT && !stream_is_live(raw) {
        return Err(fail(
            NcclResult::UNHANDLED_CUDA_ERROR,
            format!("{call}: {:#x} is not a live stream of a host runtime", stream.addr()),
        ));
    }
    Ok((shared, member))
}

/// Checks that a buffer this rank uses is not null.
fn need(ptr: usize, used: bool, what: &str, call: &str) -> Result<(), NcclResult> {
    if used && ptr == 0 {
        return Err(fail(NcclResult::INVALID_ARGUMENT, format!("{call}: {what} is null")));
    }
    Ok(())
}

/// Checks a root.
fn root_of(root: c_int, nranks: usize, call: &str) -> Result<usize, NcclResult> {
    usize::try_from(root)
        .ok()
        .filter(|&r| r < nranks)
        .ok_or_else(|| fail(NcclResult::INVALID_ARGUMENT, format!("{call}: root {root} of {nranks} ranks")))
}

/// What the reduction of a collective is, to scale the inputs of a pre-mul-sum.
struct Args {
    /// The collective (a pre-mul-sum runs as a sum of scaled inputs).
    coll: Coll,
    /// The pre-mul-sum's scalar, if it is one.
    pre_mul: Option<PreMul>,
    /// The data type.
    dtype: DType,
    /// The count, as the call counts it.
    count: usize,
    /// How many elements of the send buffer this rank sends.
    send_len: usize,
    /// The send buffer.
    send: usize,
    /// The receive buffer.
    recv: usize,
}

/// Queues a collective.
fn collective(name: &'static str, comm: NcclComm, stream: *mut c_void, args: Args) -> Result<NcclResult, NcclResult> {
    let (shared, member) = prepare(comm, stream, name)?;
    let index = shared.next_coll();
    let hang = shared.take_hang();
    let Args { coll, pre_mul, dtype, count, send_len, send, recv } = args;
    let owner = Arc::clone(&shared);
    let job: Closure = Box::new(move || {
        let failed = |why: String| {
            let code = member.net.abort_code(member.rank).unwrap_or(NcclResult::INTERNAL_ERROR);
            shared.failed(code, &format!("{name}: {why}"))
        };
        if let Some(h) = &hang {
            h.wait(&member.net).map_err(failed)?;
        }
        // The scaled inputs of a pre-mul-sum live here until the collective returns.
        let scaled = pre_mul.map(|p| {
            // SAFETY: `send` holds `send_len` elements until the stream passes this job
            // (the contract of the NCCL call that queued it); `at` is the scalar's address.
            unsafe { scaled_copy(p, dtype, send, send_len) }
        });
        let send = scaled.as_ref().map_or(send, |s| s.as_ptr().addr());
        let call = Call { coll, dtype, count, send, recv };
        // SAFETY: the buffers are what the NCCL call that queued this job described, valid
        // until the stream passes it (NCCL's contract); a scaled copy lives until the end of
        // this closure.
        unsafe { member.net.world.collective(member.rank, index, call) }.map_err(failed)
    });
    let d = Deferred { shared: owner, stream: RawStream(stream), work: Work::Coll(job), key: name.into() };
    submit(d, name)
}

/// A copy of `len` elements at `send`, each multiplied by the pre-mul-sum's scalar.
///
/// # Safety
/// `send` holds `len` elements of `dtype`; a device scalar's address holds one.
unsafe fn scaled_copy(p: PreMul, dtype: DType, send: usize, len: usize) -> Vec<u64> {
    let bytes = len * dtype.size();
    let mut words = vec![0u64; bytes.div_ceil(8)];
    let buf = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes];
    if bytes > 0 {
        // SAFETY: `send` holds `bytes` bytes (our caller's contract).
        buf.copy_from_slice(unsafe { std::slice::from_raw_parts(send as *const u8, bytes) });
    }
    let scalar = p.value.unwrap_or_else(|| {
        let mut one = [0u8; 8];
        // SAFETY: the scalar's address holds one element (our caller's contract).
        one[..dtype.size()].copy_from_slice(unsafe { std::slice::from_raw_parts(p.at as *const u8, dtype.size()) });
        element(dtype, &one[..dtype.size()])
    });
    for e in buf.chunks_exact_mut(dtype.size()) {
        let v = element(dtype, e) * scalar;
        store(dtype, e, v);
    }
    words
}

/// One element as an `f64`.
fn element(dtype: DType, b: &[u8]) -> f64 {
    let arr = |n: usize| {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        a
    };
    let a = arr(dtype.size());
    match dtype {
        DType::I8 => f64::from(a[0] as i8),
        DType::U8 => f64::from(a[0]),
        DType::I32 => f64::from(i32::from_ne_bytes([a[0], a[1], a[2], a[3]])),
        DType::U32 => f64::from(u32::from_ne_bytes([a[0], a[1], a[2], a[3]])),
        DType::I64 => i64::from_ne_bytes(a) as f64,
        DType::U64 => u64::from_ne_bytes(a) as f64,
        DType::F16 => half::f16::from_ne_bytes([a[0], a[1]]).to_f64(),
        DType::BF16 => half::bf16::from_ne_bytes([a[0], a[1]]).to_f64(),
        DType::F32 => f64::from(f32::from_ne_bytes([a[0], a[1], a[2], a[3]])),
        DType::F64 => f64::from_ne_bytes(a),
    }
}

/// Stores `v` as one element (integers truncated, as a cast does).
fn store(dtype: DType, b: &mut [u8], v: f64) {
    match dtype {
        DType::I8 => b.copy_from_slice(&(v as i8).to_ne_bytes()),
        DType::U8 => b.copy_from_slice(&(v as u8).to_ne_bytes()),
        DType::I32 => b.copy_from_slice(&(v as i32).to_ne_bytes()),
        DType::U32 => b.copy_from_slice(&(v as u32).to_ne_bytes()),
        DType::I64 => b.copy_from_slice(&(v as i64).to_ne_bytes()),
        DType::U64 => b.copy_from_slice(&(v as u64).to_ne_bytes()),
        DType::F16 => b.copy_from_slice(&half::f16::from_f64(v).to_ne_bytes()),
        DType::BF16 => b.copy_from_slice(&half::bf16::from_f64(v).to_ne_bytes()),
        DType::F32 => b.copy_from_slice(&(v as f32).to_ne_bytes()),
        DType::F64 => b.copy_from_slice(&v.to_ne_bytes()),
    }
}

/// A reduction's collective and pre-mul-sum scalar.
fn split_reduction(r: Reduction, make: impl FnOnce(ReduceOp) -> Coll) -> (Coll, Option<PreMul>) {
    match r {
        Reduction::Plain(op) => (make(op), None),
        Reduction::PreMulSum(p) => (make(ReduceOp::Sum), Some(p)),
    }
}

/// `ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
///
/// # Safety
/// NCCL's: the buffers hold `count` elements until the stream has run the operation.
pub(super) unsafe extern "C" fn nccl_all_reduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    const CALL: &str = "ncclAllReduce";
    guard(CALL, || {
        finish((|| {
            let dtype = dtype_of(datatype, CALL)?;
            let (coll, pre_mul) = split_reduction(reduction_of(op, dtype, comm, CALL)?, Coll::AllReduce);
            need(sendbuff.addr(), count > 0, "sendbuff", CALL)?;
            need(recvbuff.addr(), count > 0, "recvbuff", CALL)?;
            let (send, recv) = (sendbuff.addr(), recvbuff.addr());
            collective(CALL, comm, stream, Args { coll, pre_mul, dtype, count, send_len: count, send, recv })
        })())
    })
}

/// `ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)`.
///
/// # Safety
/// NCCL's: the buffers hold `count` elements (the receive buffer on the root only) until
/// the stream has run the operation.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn nccl_reduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    const CALL: &str = "ncclReduce";
    guard(CALL, || {
        finish((|| {
            let dtype = dtype_of(datatype, CALL)?;
            let r = reduction_of(op, dtype, comm, CALL)?;
            let n = lookup(comm, CALL)?.member().map_or(usize::MAX, |m| m.nranks);
            let me = lookup(comm, CALL)?.member().map_or(usize::MAX, |m| m.rank);
            let root = root_of(root, n, CALL)?;
            let (coll, pre_mul) = split_reduction(r, |op| Coll::Reduce(op, root));
            need(sendbuff.addr(), count > 0, "sendbuff", CALL)?;
            need(recvbuff.addr(), count > 0 && me == root, "recvbuff", CALL)?;
            let (send, recv) = (sendbuff.addr(), recvbuff.addr());
            collective(CALL, comm, stream, Args { coll, pre_mul, dtype, count, send_len: count, send, recv })
        })())
    })
}

/// `ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
/// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
///
/// # Safety
/// NCCL's: the send buffer holds `nranks * recvcount` elements, the receive buffer
/// `recvcount`, until the stream has run the operation.
pub(super) unsafe extern "C" fn nccl_reduce_scatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    const CALL: &str = "ncclReduceScatter";
    guard(CALL, || {
        finish((|| {
            let dtype = dtype_of(datatype, CALL)?;
            let (coll, pre_mul) = split_reduction(reduction_of(op, dtype, comm, CALL)?, Coll::ReduceScatter);
            let n = lookup(comm, CALL)?.member().map_or(0, |m| m.nranks);
            need(sendbuff.addr(), recvcount > 0, "sendbuff", CALL)?;
            need(recvbuff.addr(), recvcount > 0, "recvbuff", CALL)?;
            let (send, recv) = (sendbuff.addr(), recvbuff.addr());
            let send_len = n * recvcount;
            collective(CALL, comm, stream, Args { coll, pre_mul, dtype, count: recvcount, send_len, send, recv })
        })())
    })
}

/// The body of the collectives without a reduction.
#[allow(clippy::too_many_arguments)]
fn plain(
    call: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: Option<c_int>,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    guard(call, || {
        finish((|| {
            let dtype = dtype_of(datatype, call)?;
            let (n, me) = lookup(comm, call)?.member().map_or((0, 0), |m| (m.nranks, m.rank));
            let root = root.map(|r| root_of(r, n.max(1), call)).transpose()?.unwrap_or(0);
            let is_root = me == root;
            // (coll, whether this rank reads its send buffer, whether it writes its receive
            // buffer).
            let (coll, sends, recvs) = match call {
                "ncclBroadcast" => (Coll::Broadcast(root), is_root, true),
                "ncclAllGather" => (Coll::AllGather, true, true),
                "ncclAlltoAll" => (Coll::AllToAll, true, true),
                "ncclGather" => (Coll::Gather(root), true, is_root),
                "ncclScatter" => (Coll::Scatter(root), is_root, true),
                _ => return Err(fail(NcclResult::INTERNAL_ERROR, format!("{call}: not a collective of the double"))),
            };
            need(sendbuff.addr(), count > 0 && sends, "sendbuff", call)?;
            need(recvbuff.addr(), count > 0 && recvs, "recvbuff", call)?;
            let (send, recv) = (sendbuff.addr(), recvbuff.addr());
            collective(call, comm, stream, Args { coll, pre_mul: None, dtype, count, send_len: 0, send, recv })
        })())
    })
}

/// `ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)`.
///
/// # Safety
/// NCCL's: the buffers hold `count` elements (the send buffer on the root only) until the
/// stream has run the operation.
pub(super) unsafe extern "C" fn nccl_broadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    plain("ncclBroadcast", sendbuff, recvbuff, count, datatype, Some(root), comm, stream)
}

/// `ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)` (`count` per
/// rank).
///
/// # Safety
/// NCCL's: the send buffer holds `count` elements, the root's receive buffer
/// `nranks * count`, until the stream has run the operation.
pub(super) unsafe extern "C" fn nccl_gather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    plain("ncclGather", sendbuff, recvbuff, count, datatype, Some(root), comm, stream)
}

/// `ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)` (`count` per
/// rank).
///
/// # Safety
/// NCCL's: the root's send buffer holds `nranks * count` elements, the receive buffer
/// `count`, until the stream has run the operation.
pub(super) unsafe extern "C" fn nccl_scatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    plain("ncclScatter", sendbuff, recvbuff, count, datatype, Some(root), comm, stream)
}

/// `ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
/// ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)`.
///
/// # Safety
/// NCCL's: the send buffer holds `sendcount` elements, the receive buffer
/// `nranks * sendcount`, until the stream has run the operation.
pub(super) unsafe extern "C" fn nccl_all_gather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: NcclDataType,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    plain("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, None, comm, stream)
}

/// `ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
/// ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)` (`count` per peer).
///
/// # Safety
/// NCCL's: both buffers hold `nranks * count` elements until the stream has run the
/// operation.
pub(super) unsafe extern "C" fn nccl_all_to_all(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    plain("ncclAlltoAll", sendbuff, recvbuff, count, datatype, None, comm, stream)
}

/// The body of `ncclSend` and `ncclRecv`.
#[allow(clippy::too_many_arguments)]
fn p2p(
    call: &'static str,
    buff: usize,
    count: usize,
    datatype: NcclDataType,
    peer: c_int,
    comm: NcclComm,
    stream: *mut c_void,
    sending: bool,
) -> NcclResult {
    guard(call, || {
        finish((|| {
            let dtype = dtype_of(datatype, call)?;
            let (shared, member) = prepare(comm, stream, call)?;
            let peer = usize::try_from(peer).ok().filter(|&p| p < member.nranks).ok_or_else(|| {
                fail(NcclResult::INVALID_ARGUMENT, format!("{call}: peer {peer} of {} ranks", member.nranks))
            })?;
            need(buff, count > 0, "buffer", call)?;
            let len = count * dtype.size();
            let hang = shared.take_hang();
            let op = P2pOp { send: sending, peer, ptr: buff, len };
            let work = Work::P2p(op, hang, member);
            let key = format!("p2p:{peer}");
            submit(Deferred { shared, stream: RawStream(stream), work, key }, call)
        })())
    })
}

/// `ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int
/// peer, ncclComm_t comm, cudaStream_t stream)`: completes only once the peer's matching
/// receive runs (NCCL: "blocking for the GPU"); group it with the receives it depends on.
///
/// # Safety
/// NCCL's: the buffer holds `count` elements until the stream has run the operation.
pub(super) unsafe extern "C" fn nccl_send(
    sendbuff: *const c_void,
    count: usize,
    datatype: NcclDataType,
    peer: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    p2p("ncclSend", sendbuff.addr(), count, datatype, peer, comm, stream, true)
}

/// `ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
/// ncclComm_t comm, cudaStream_t stream)`: the next message from `peer`, which must have the
/// same size (a mismatch is `ncclInvalidUsage` and breaks both streams).
///
/// # Safety
/// NCCL's: the buffer holds `count` elements until the stream has run the operation.
pub(super) unsafe extern "C" fn nccl_recv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    peer: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    p2p("ncclRecv", recvbuff.addr(), count, datatype, peer, comm, stream, false)
}

/// The allocations of `ncclMemAlloc`, by address, with the device they are on.
static ALLOCATIONS: LazyLock<Mutex<HashMap<usize, CurrentDevice>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// `ncclResult_t ncclMemAlloc(void** ptr, size_t size)`: device memory of the calling
/// thread's current device.
///
/// # Safety
/// `ptr` is null or writable.
pub(super) unsafe extern "C" fn nccl_mem_alloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    const CALL: &str = "ncclMemAlloc";
    guard(CALL, || {
        if ptr.is_null() {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: ptr is null"));
        }
        let Some(device) = CurrentDevice::get() else {
            return fail(
                NcclResult::UNHANDLED_CUDA_ERROR,
                format!("{CALL}: no host runtime made a device current on this thread"),
            );
        };
        match device.alloc(size) {
            Ok(addr) => {
                let addr = addr as usize;
                relock(&ALLOCATIONS).insert(addr, device);
                // SAFETY: non-null and writable (our caller's contract).
                unsafe { ptr.write(std::ptr::with_exposed_provenance_mut(addr)) };
                NcclResult::SUCCESS
            }
            Err(e) => fail(NcclResult::UNHANDLED_CUDA_ERROR, format!("{CALL}: {e}")),
        }
    })
}

/// `ncclResult_t ncclMemFree(void *ptr)`: frees memory of `ncclMemAlloc` (null is fine).
///
/// # Safety
/// NCCL's: no queued work uses the memory.
pub(super) unsafe extern "C" fn nccl_mem_free(ptr: *mut c_void) -> NcclResult {
    const CALL: &str = "ncclMemFree";
    guard(CALL, || {
        if ptr.is_null() {
            return NcclResult::SUCCESS;
        }
        let Some(device) = relock(&ALLOCATIONS).remove(&ptr.addr()) else {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: {:#x} is not from ncclMemAlloc", ptr.addr()));
        };
        // SAFETY: allocated by `ncclMemAlloc` on this device, removed from the map above so
        // freed once; no queued work uses it (our caller's contract).
        match unsafe { device.free(ptr.addr() as u64) } {
            Ok(()) => NcclResult::SUCCESS,
            Err(e) => fail(NcclResult::UNHANDLED_CUDA_ERROR, format!("{CALL}: {e}")),
        }
    })
}

/// Numbers registration handles (never dereferenced).
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

/// `ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void**
/// handle)`: bookkeeping only.
///
/// # Safety
/// `handle` is null or writable.
pub(super) unsafe extern "C" fn nccl_comm_register(
    comm: NcclComm,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> NcclResult {
    const CALL: &str = "ncclCommRegister";
    guard(CALL, || {
        if handle.is_null() || buff.is_null() || size == 0 {
            return fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: null handle or buffer, or size 0"));
        }
        let shared = match lookup(comm, CALL) {
            Ok(s) => s,
            Err(code) => return code,
        };
        let h = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        shared.register(h);
        // SAFETY: non-null and writable (our caller's contract).
        unsafe { handle.write(std::ptr::without_provenance_mut(h)) };
        NcclResult::SUCCESS
    })
}

/// `ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle)`.
///
/// # Safety
/// None needed.
pub(super) unsafe extern "C" fn nccl_comm_deregister(comm: NcclComm, handle: *mut c_void) -> NcclResult {
    const CALL: &str = "ncclCommDeregister";
    guard(CALL, || match lookup(comm, CALL) {
        Ok(shared) if shared.deregister(handle.addr()) => NcclResult::SUCCESS,
        Ok(_) => fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: not a registration of this communicator")),
        Err(code) => code,
    })
}

/// Numbers pre-mul-sum operators (from `ncclNumOps` up, process-wide).
static NEXT_OP: AtomicUsize = AtomicUsize::new(NcclRedOp::NUM_OPS as usize);

/// `ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t
/// datatype, ncclScalarResidence_t residence, ncclComm_t comm)`: an operator that sums the
/// inputs, each multiplied by the scalar first.
///
/// # Safety
/// `op` is null or writable; `scalar` holds one element (read now for host-immediate, when
/// each collective runs for device residence).
pub(super) unsafe extern "C" fn nccl_red_op_create_pre_mul_sum(
    op: *mut NcclRedOp,
    scalar: *mut c_void,
    datatype: NcclDataType,
    residence: NcclScalarResidence,
    comm: NcclComm,
) -> NcclResult {
    const CALL: &str = "ncclRedOpCreatePreMulSum";
    guard(CALL, || {
        finish((|| {
            if op.is_null() || scalar.is_null() {
                return Err(fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: op or scalar is null")));
            }
            let dtype = dtype_of(datatype, CALL)?;
            lookup(comm, CALL)?;
            let value = match residence {
                NcclScalarResidence::HOST_IMMEDIATE => {
                    // SAFETY: `scalar` holds one element (our caller's contract).
                    let b = unsafe { std::slice::from_raw_parts(scalar as *const u8, dtype.size()) };
                    Some(element(dtype, b))
                }
                NcclScalarResidence::DEVICE => None,
                r => return Err(fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: residence {}", r.0))),
            };
            let id = c_int::try_from(NEXT_OP.fetch_add(1, Ordering::Relaxed))
                .map_err(|_| fail(NcclResult::INTERNAL_ERROR, format!("{CALL}: out of operator numbers")))?;
            relock(&PRE_MUL).insert((comm.addr(), id), PreMul { dtype, value, at: scalar.addr() });
            // SAFETY: non-null and writable (our caller's contract).
            unsafe { op.write(NcclRedOp(id)) };
            Ok(NcclResult::SUCCESS)
        })())
    })
}

/// `ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)`.
///
/// # Safety
/// None needed.
pub(super) unsafe extern "C" fn nccl_red_op_destroy(op: NcclRedOp, comm: NcclComm) -> NcclResult {
    const CALL: &str = "ncclRedOpDestroy";
    guard(CALL, || match relock(&PRE_MUL).remove(&(comm.addr(), op.0)) {
        Some(_) => NcclResult::SUCCESS,
        None => fail(NcclResult::INVALID_ARGUMENT, format!("{CALL}: {} is not an operator of this communicator", op.0)),
    })
}
