//! How each operation becomes NCCL calls on a stream.
//!
//! | operation | NCCL calls |
//! |---|---|
//! | all_reduce, reduce, broadcast, all_gather, reduce_scatter | the one call of that name |
//! | barrier | `ncclAllReduce` of one `int32` on the engine's scratch word |
//! | all_to_all | `ncclAlltoAll` where the library has it, else a group of `ncclSend`/`ncclRecv` per peer |
//! | gather, scatter | `ncclGather`/`ncclScatter` where present, else a group of sends and receives at the root |
//! | all_gather_v, all_to_all_v | a group of `ncclSend`/`ncclRecv` per peer (NCCL has no v-collectives) |
//! | send, recv, batches | a group of `ncclSend`/`ncclRecv` with the counts the envelopes announced |
//!
//! This rank's own block of the grouped forms is a device-to-device copy on the same stream.
//! In-place all_to_all and all_to_all_v (an input that overlaps the output) go through a
//! temporary device copy of the input: the sends and receives of a group run at once, so
//! receives would overwrite blocks before they are sent. Zero-length sends and
//! receives are left out on both sides (the envelopes say so), as NCCL releases before 2.19
//! did not all accept them.

use std::ffi::{c_int, c_void};

use crate::backend::{Op, RawBuf, RawBufMut};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::xccl::library::types::{NcclDataType, NcclRedOp};
use crate::xccl::library::{Library, NcclComm, NcclResult};
use crate::xccl::runtime::{CopyKind, DeviceRuntime, RawStream};

/// Where calls go: the library, a live communicator (its lock held by the caller), the stream
/// and this rank's place.
pub(crate) struct Target<'a> {
    /// The NCCL table.
    pub(crate) lib: &'a Library,
    /// The communicator (valid for the whole issue: the caller holds its lock).
    pub(crate) comm: NcclComm,
    /// The stream the calls are queued on.
    pub(crate) stream: RawStream,
    /// The device runtime (for this rank's own-block copies).
    pub(crate) rt: &'a dyn DeviceRuntime,
    /// This rank.
    pub(crate) rank: usize,
    /// The number of ranks.
    pub(crate) size: usize,
}

/// One point-to-point transfer of a group, with its count settled.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Transfer {
    /// `ncclSend` of `count` elements at `ptr` to `peer`.
    Send { ptr: *const u8, count: usize, dtype: DType, peer: usize },
    /// `ncclRecv` of `count` elements into `ptr` from `peer`.
    Recv { ptr: *mut u8, count: usize, dtype: DType, peer: usize },
}

/// The address `elems` elements of `dtype` after `ptr` (a device address: no Rust object
/// lives there, so only the number is computed).
fn offset(ptr: *const u8, elems: usize, dtype: DType) -> *const u8 {
    ptr.wrapping_add(elems * dtype.size())
}

/// As [`offset`], for a writable address.
fn offset_mut(ptr: *mut u8, elems: usize, dtype: DType) -> *mut u8 {
    ptr.wrapping_add(elems * dtype.size())
}

/// Whether two buffers share memory (empty ones share none).
fn overlaps(a: &RawBuf, b: &RawBuf) -> bool {
    let (a0, b0) = (a.ptr as usize, b.ptr as usize);
    a.bytes() > 0 && b.bytes() > 0 && a0 < b0 + b.bytes() && b0 < a0 + a.bytes()
}

/// A rank as NCCL's `int`.
fn peer_int(rank: usize) -> Result<c_int> {
    c_int::try_from(rank).map_err(|_| Error::invalid(format!("rank {rank} is out of NCCL's range")))
}

impl Target<'_> {
    fn check(&self, call: &str, r: NcclResult) -> Result<NcclResult> {
        match r {
            NcclResult::SUCCESS | NcclResult::IN_PROGRESS => Ok(r),
            bad => Err(self.lib.error(call, bad, self.comm)),
        }
    }

    /// Queues a device-to-device copy of `count` elements (nothing for zero).
    ///
    /// # Safety
    /// Both ranges are device memory of the communicator's device, valid until the stream
    /// has run the copy.
    unsafe fn copy(&self, dst: *mut u8, src: *const u8, count: usize, dtype: DType) -> Result<()> {
        if count == 0 || std::ptr::eq(dst.cast_const(), src) {
            return Ok(());
        }
        // SAFETY: forwarded from this function's contract.
        unsafe {
            self.rt.copy_async(dst as u64, src as u64, count * dtype.size(), CopyKind::DeviceToDevice, self.stream)
        }
    }

    /// Issues `transfers` as one NCCL group (zero-length ones left out) and returns the
    /// group end's result (`ncclInProgress` on a non-blocking communicator that is still
    /// queuing).
    ///
    /// # Safety
    /// Every pointer is device memory of the right size, valid until the stream has run the
    /// group.
    pub(crate) unsafe fn group(&self, transfers: &[Transfer]) -> Result<NcclResult> {
        let table = &self.lib.table;
        // SAFETY: ncclGroupStart takes no arguments; every start below is matched by the
        // end that follows, whatever happens in between.
        self.check("ncclGroupStart", unsafe { (table.group_start)() })?;
        let mut first_error = None;
        for t in transfers {
            let r = match *t {
                Transfer::Send { count: 0, .. } | Transfer::Recv { count: 0, .. } => continue,
                Transfer::Send { ptr, count, dtype, peer } => peer_int(peer).map(|p| {
                    // SAFETY: a live communicator (caller's lock), a device range of
                    // `count` elements valid until the stream runs it (our contract).
                    unsafe {
                        (table.send)(ptr.cast(), count, NcclDataType::from_dtype(dtype), p, self.comm, self.stream.0)
                    }
                }),
                Transfer::Recv { ptr, count, dtype, peer } => peer_int(peer).map(|p| {
                    // SAFETY: as for the send.
                    unsafe {
                        (table.recv)(ptr.cast(), count, NcclDataType::from_dtype(dtype), p, self.comm, self.stream.0)
                    }
                }),
            };
            let r =
                r.and_then(|r| self.check(if matches!(t, Transfer::Send { .. }) { "ncclSend" } else { "ncclRecv" }, r));
            if let Err(e) = r {
                first_error = Some(e);
                break;
            }
        }
        // SAFETY: closes the group opened above.
        let end = unsafe { (table.group_end)() };
        if let Some(e) = first_error {
            return Err(e);
        }
        self.check("ncclGroupEnd", end)
    }

    /// Issues a collective `op` (not a batch). `scratch` is a device word for the barrier;
    /// `temp` allocates device memory that lives until the operation completes.
    ///
    /// # Safety
    /// Every buffer of `op` is device memory of the communicator's device, of the sizes its
    /// counts say, valid until the stream has run the calls; `scratch` is 4 bytes of it.
    pub(crate) unsafe fn collective(
        &self,
        op: &Op,
        scratch: u64,
        temp: &mut dyn FnMut(usize) -> Result<u64>,
    ) -> Result<NcclResult> {
        let t = &self.lib.table;
        let (s, comm, n, me) = (self.stream.0, self.comm, self.size, self.rank);
        let dt = |b: &RawBuf| NcclDataType::from_dtype(b.dtype);
        let dtm = |b: &RawBufMut| NcclDataType::from_dtype(b.dtype);
        let null = std::ptr::null_mut::<c_void>();
        // SAFETY (for every NCCL call below): a live communicator (caller's lock); the
        // buffers are device memory of the sizes NCCL derives from the counts passed, which
        // are the front door's checked counts (this function's contract); the stream is the
        // engine's or the caller's.
        match op {
            Op::AllReduce { input, output, op } => {
                // SAFETY: the contract stated at the top of this match.
                let r = unsafe {
                    (t.all_reduce)(
                        input.ptr.cast(),
                        output.ptr.cast(),
                        output.count,
                        dtm(output),
                        NcclRedOp::from_reduce_op(*op),
                        comm,
                        s,
                    )
                };
                self.check("ncclAllReduce", r)
            }
            Op::Reduce { input, output, op, root } => {
                let out = output.map_or(null, |o| o.ptr.cast());
                // SAFETY: the contract stated at the top of this match.
                let r = unsafe {
                    (t.reduce)(
                        input.ptr.cast(),
                        out,
                        input.count,
                        dt(input),
                        NcclRedOp::from_reduce_op(*op),
                        peer_int(*root)?,
                        comm,
                        s,
                    )
                };
                self.check("ncclReduce", r)
            }
            Op::Broadcast { input, output, root } => {
                let src = input.map_or(output.ptr.cast_const(), |i| i.ptr);
                // SAFETY: the contract stated at the top of this match.
                let r = unsafe {
                    (t.broadcast)(src.cast(), output.ptr.cast(), output.count, dtm(output), peer_int(*root)?, comm, s)
                };
                self.check("ncclBroadcast", r)
            }
            Op::AllGather { input, output } => {
                // SAFETY: the contract stated at the top of this match.
                let r = unsafe { (t.all_gather)(input.ptr.cast(), output.ptr.cast(), input.count, dt(input), comm, s) };
                self.check("ncclAllGather", r)
            }
            Op::ReduceScatter { input, output, op } => {
                // SAFETY: the contract stated at the top of this match.
                let r = unsafe {
                    (t.reduce_scatter)(
                        input.ptr.cast(),
                        output.ptr.cast(),
                        output.count,
                        dtm(output),
                        NcclRedOp::from_reduce_op(*op),
                        comm,
                        s,
                    )
                };
                self.check("ncclReduceScatter", r)
            }
            Op::Barrier => {
                let word = scratch as *mut c_void;
                // SAFETY: the contract stated at the top of this match.
                let r = unsafe { (t.all_reduce)(word, word, 1, NcclDataType::INT32, NcclRedOp::SUM, comm, s) };
                self.check("ncclAllReduce (barrier)", r)
            }
            Op::AllToAll { input, output } => {
                let c = input.count / n.max(1);
                let mut src = input.ptr;
                if overlaps(input, &output.as_const()) {
                    let copy = temp(input.bytes())? as *mut u8;
                    // SAFETY: `copy` is a fresh device allocation of the input's size.
                    unsafe { self.copy(copy, src, input.count, input.dtype)? };
                    src = copy;
                }
                match t.all_to_all {
                    Some(a2a) => {
                        // SAFETY: the contract stated at the top of this match.
                        let r = unsafe { a2a(src.cast(), output.ptr.cast(), c, dt(input), comm, s) };
                        self.check("ncclAlltoAll", r)
                    }
                    None => {
                        let counts = vec![c; n];
                        // SAFETY: forwarded; `src` is the input or its copy.
                        unsafe { self.all_to_all_v(src, &counts, output.ptr, &counts, input.dtype) }
                    }
                }
            }
            Op::AllToAllV { input, send_counts, output, recv_counts } => {
                let mut src = input.ptr;
                if overlaps(input, &output.as_const()) {
                    let copy = temp(input.bytes())? as *mut u8;
                    // SAFETY: `copy` is a fresh device allocation of the input's size.
                    unsafe { self.copy(copy, src, input.count, input.dtype)? };
                    src = copy;
                }
                // SAFETY: forwarded; `src` is the input or its copy.
                unsafe { self.all_to_all_v(src, send_counts, output.ptr, recv_counts, input.dtype) }
            }
            Op::AllGatherV { input, output, counts } => {
                let d = input.dtype;
                let mut xs = Vec::with_capacity(2 * n);
                let mine = counts[..me].iter().sum::<usize>();
                // SAFETY: this rank's block of the output, of its count.
                unsafe { self.copy(offset_mut(output.ptr, mine, d), input.ptr, input.count, d)? };
                let mut at = 0;
                for (p, &c) in counts.iter().enumerate() {
                    if p != me {
                        xs.push(Transfer::Send { ptr: input.ptr, count: input.count, dtype: d, peer: p });
                        xs.push(Transfer::Recv { ptr: offset_mut(output.ptr, at, d), count: c, dtype: d, peer: p });
                    }
                    at += c;
                }
                // SAFETY: forwarded.
                unsafe { self.group(&xs) }
            }
            Op::Gather { input, output, root } => {
                let c = input.count;
                if let Some(g) = t.gather {
                    let out = output.map_or(null, |o| o.ptr.cast());
                    // SAFETY: the contract stated at the top of this match.
                    let r = unsafe { g(input.ptr.cast(), out, c, dt(input), peer_int(*root)?, comm, s) };
                    return self.check("ncclGather", r);
                }
                let d = input.dtype;
                let xs: Vec<Transfer> = match output {
                    Some(out) => {
                        // SAFETY: the root's own block of the output.
                        unsafe { self.copy(offset_mut(out.ptr, me * c, d), input.ptr, c, d)? };
                        (0..n)
                            .filter(|&p| p != me)
                            .map(|p| Transfer::Recv { ptr: offset_mut(out.ptr, p * c, d), count: c, dtype: d, peer: p })
                            .collect()
                    }
                    None => vec![Transfer::Send { ptr: input.ptr, count: c, dtype: d, peer: *root }],
                };
                // SAFETY: forwarded.
                unsafe { self.group(&xs) }
            }
            Op::Scatter { input, output, root } => {
                let c = output.count;
                if let Some(sc) = t.scatter {
                    let src = input.map_or(null.cast_const(), |i| i.ptr.cast());
                    // SAFETY: the contract stated at the top of this match.
                    let r = unsafe { sc(src, output.ptr.cast(), c, dtm(output), peer_int(*root)?, comm, s) };
                    return self.check("ncclScatter", r);
                }
                let d = output.dtype;
                let xs: Vec<Transfer> = match input {
                    Some(inp) => {
                        // SAFETY: the root's own block of the input into its output.
                        unsafe { self.copy(output.ptr, offset(inp.ptr, me * c, d), c, d)? };
                        (0..n)
                            .filter(|&p| p != me)
                            .map(|p| Transfer::Send { ptr: offset(inp.ptr, p * c, d), count: c, dtype: d, peer: p })
                            .collect()
                    }
                    None => vec![Transfer::Recv { ptr: output.ptr, count: c, dtype: d, peer: *root }],
                };
                // SAFETY: forwarded.
                unsafe { self.group(&xs) }
            }
            Op::Batch(_) => Err(Error::Internal("a point-to-point batch reached the collective path".into())),
        }
    }

    /// all_to_all_v as a group of sends and receives (own block copied).
    ///
    /// # Safety
    /// As for [`collective`](Self::collective).
    unsafe fn all_to_all_v(
        &self,
        input: *const u8,
        send_counts: &[usize],
        output: *mut u8,
        recv_counts: &[usize],
        d: DType,
    ) -> Result<NcclResult> {
        let me = self.rank;
        let (mut so, mut ro) = (0, 0);
        let mut xs = Vec::with_capacity(2 * self.size);
        for (p, (&sc, &rc)) in send_counts.iter().zip(recv_counts).enumerate() {
            if p == me {
                // SAFETY: this rank's block to itself, of the counts the front door checked
                // equal.
                unsafe { self.copy(offset_mut(output, ro, d), offset(input, so, d), sc, d)? };
            } else {
                xs.push(Transfer::Send { ptr: offset(input, so, d), count: sc, dtype: d, peer: p });
                xs.push(Transfer::Recv { ptr: offset_mut(output, ro, d), count: rc, dtype: d, peer: p });
            }
            so += sc;
            ro += rc;
        }
        // SAFETY: forwarded.
        unsafe { self.group(&xs) }
    }
}
