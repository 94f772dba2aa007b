//! One function per operation: each posts MPI's non-blocking call for an [`Op`] and returns
//! the [`Posted`] requests with what must happen once they complete.
//!
//! * In-place forms use `MPI_IN_PLACE` where MPI has the same in-place form (all_reduce,
//!   reduce at the root, all_gather(_v), gather at the root, scatter at the root) and the
//!   library's value of the macro is known; everything else that overlaps (NCCL-style
//!   in-place reduce_scatter, all_to_all(_v), unknown libraries) goes through a temporary.
//! * f16/bf16 sums and products are widened to f32 temporaries and narrowed once at the
//!   end (or use user operations, per [`HalfReduce`](crate::config::HalfReduce)); `Avg` is a
//!   sum followed by a division ([`Step::Divide`]).
//! * Counts and displacements are C `int`s: [`check_limits`] refuses larger ones before a
//!   sequence number is taken.

use std::ffi::{c_int, c_void};

use mpi::ffi;

use super::check::check;
use super::dtype::{mpi_type, reduction, Reduction};
use super::runtime::Runtime;
use crate::backend::reduce::{divide, narrow, widen};
use crate::backend::{BufferSlot, Op, RawBuf, RawBufMut};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op_kind::OpKind;

/// Work left for after the requests complete.
enum Step {
    /// Copies a temporary to the user's buffer.
    Copy { src: *const u8, dst: *mut u8, bytes: usize },
    /// Narrows an f32 temporary into the user's f16/bf16 buffer, dividing first for `Avg`.
    Narrow { src: *mut f32, count: usize, dst: *mut u8, dtype: DType, divide: Option<usize> },
    /// Divides the user's buffer (`Avg`).
    Divide { ptr: *mut u8, dtype: DType, count: usize, n: usize },
}

/// Posted MPI requests and the temporaries they use.
#[derive(Default)]
pub(crate) struct Posted {
    /// The requests (`MPI_REQUEST_NULL` once completed).
    pub reqs: Vec<ffi::MPI_Request>,
    /// For each request, the peer it waits on (point-to-point, rooted collectives).
    pub peers: Vec<Option<usize>>,
    temps: Vec<Vec<u64>>,
    ints: Vec<Vec<c_int>>,
    steps: Vec<Step>,
}

// SAFETY: the raw pointers refer to the temporaries owned here and to user buffers the
// submitter keeps valid until completion; MPI request handles may move between threads.
unsafe impl Send for Posted {}

/// The largest count MPI's `int` arguments carry.
const INT_MAX: usize = i32::MAX as usize;

fn int(x: usize) -> Result<c_int> {
    c_int::try_from(x).map_err(|_| Error::Internal(format!("count {x} exceeds MPI's int range")))
}

fn too_large(kind: OpKind, x: usize) -> Error {
    Error::invalid(format!(
        "the mpi backend passes counts as C ints: {kind} has a buffer of {x} elements, more than 2^31-1 (MPI-4 \
         large-count calls are not used); split the operation"
    ))
}

/// Refuses counts that MPI's `int` arguments cannot carry (checked before any communication).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the operation and its largest count.
pub(crate) fn check_limits(op: &Op) -> Result<()> {
    let mut largest = 0;
    op.for_each_buffer(|b| largest = largest.max(b.count));
    if largest > INT_MAX {
        Err(too_large(op.kind(), largest))
    } else {
        Ok(())
    }
}

/// The counts of the blocks of a `_v` operation as C ints, and their displacements (each
/// block starts where the previous one ends).
fn counts_and_displacements(counts: &[usize]) -> Result<(Vec<c_int>, Vec<c_int>)> {
    let mut at = 0usize;
    let mut displs = Vec::with_capacity(counts.len());
    for &c in counts {
        displs.push(int(at)?);
        at += c;
    }
    Ok((counts.iter().map(|&c| int(c)).collect::<Result<_>>()?, displs))
}

fn overlaps(a: *const u8, a_len: usize, b: *const u8, b_len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a_len > 0 && b_len > 0 && a < b + b_len && b < a + a_len
}

impl Posted {
    fn temp(&mut self, bytes: usize) -> *mut u8 {
        let mut v = vec![0u64; bytes.div_ceil(8).max(1)];
        let p = v.as_mut_ptr().cast::<u8>();
        self.temps.push(v);
        p
    }

    fn ints(&mut self, v: Vec<c_int>) -> *const c_int {
        let p = v.as_ptr();
        self.ints.push(v);
        p
    }

    /// A copy of `b` in a temporary.
    ///
    /// # Safety
    /// `b` must be readable (the submit contract).
    unsafe fn copy_of(&mut self, b: RawBuf) -> *const c_void {
        let t = self.temp(b.bytes());
        // SAFETY: `b` is readable, `t` a fresh temporary of the same size.
        unsafe { std::ptr::copy_nonoverlapping(b.ptr, t, b.bytes()) };
        t.cast_const().cast()
    }

    /// `b` widened to an f32 temporary.
    ///
    /// # Safety
    /// `b` must be readable (the submit contract).
    unsafe fn widened(&mut self, b: RawBuf) -> Result<*const c_void> {
        let t = self.temp(b.count * 4).cast::<f32>();
        // SAFETY: `b` is readable for its bytes; `t` holds `b.count` f32 values (8-aligned).
        unsafe {
            let src = if b.count == 0 { &[][..] } else { std::slice::from_raw_parts(b.ptr, b.bytes()) };
            widen(b.dtype, src, std::slice::from_raw_parts_mut(t, b.count))?;
        }
        Ok(t.cast_const().cast())
    }

    /// The send buffer for `input` given the output range: `input` itself, `MPI_IN_PLACE`
    /// when it sits exactly at `in_place_at` and the library's constant is known, else a copy.
    ///
    /// # Safety
    /// `input` must be readable (the submit contract).
    unsafe fn send_buf(
        &mut self,
        rt: &Runtime,
        input: RawBuf,
        out: *const u8,
        out_bytes: usize,
        in_place_at: Option<*const u8>,
    ) -> *const c_void {
        if !overlaps(input.ptr, input.bytes(), out, out_bytes) {
            return input.ptr.cast();
        }
        match (in_place_at, rt.in_place) {
            (Some(at), Some(v)) if at == input.ptr => v as *const c_void,
            // SAFETY: forwarded contract.
            _ => unsafe { self.copy_of(input) },
        }
    }

    /// The receive buffer of a reduction into `output` (`c` elements): a widened temporary
    /// narrowed afterwards, a temporary copied afterwards (when `alias` says the output
    /// overlaps the input in a way MPI cannot express), or the output itself; `Avg` divides.
    fn red_output(&mut self, red: &Reduction, output: RawBufMut, alias: bool, n: usize) -> *mut c_void {
        let (dtype, count) = (output.dtype, output.count);
        if red.widen {
            let t = self.temp(count * 4).cast::<f32>();
            self.steps.push(Step::Narrow { src: t, count, dst: output.ptr, dtype, divide: red.divide.then_some(n) });
            return t.cast();
        }
        let recv = if alias {
            let t = self.temp(output.bytes());
            self.steps.push(Step::Copy { src: t, dst: output.ptr, bytes: output.bytes() });
            t
        } else {
            output.ptr
        };
        if red.divide {
            self.steps.push(Step::Divide { ptr: output.ptr, dtype, count, n });
        }
        recv.cast()
    }

    /// `b`, or a small temporary when it is empty: an empty Rust slice's dangling pointer
    /// may equal `MPI_IN_PLACE` (Open MPI's is `(void*)1`, the dangling pointer of `[u8]`).
    fn nz(&mut self, b: RawBuf) -> RawBuf {
        if b.bytes() == 0 {
            RawBuf { ptr: self.temp(8), ..b }
        } else {
            b
        }
    }

    fn nz_mut(&mut self, b: RawBufMut) -> RawBufMut {
        if b.bytes() == 0 {
            RawBufMut { ptr: self.temp(8), ..b }
        } else {
            b
        }
    }

    /// `op` with every empty buffer replaced by a temporary ([`Posted::nz`]).
    fn sanitize(&mut self, op: &Op) -> Op {
        let mut op = op.clone();
        op.for_each_buffer_mut(|b| match b {
            BufferSlot::Input(i) => *i = self.nz(*i),
            BufferSlot::Output(o) => *o = self.nz_mut(*o),
        });
        op
    }

    fn push(&mut self, req: ffi::MPI_Request, peer: Option<usize>) {
        self.reqs.push(req);
        self.peers.push(peer);
    }

    /// Runs the steps left for after completion.
    ///
    /// # Errors
    /// A broken invariant of the kernels (misaligned buffers): [`Error::Internal`].
    pub(crate) fn finish(&mut self) -> Result<()> {
        for s in self.steps.drain(..) {
            // SAFETY: every pointer is a temporary owned by `self` or a user buffer valid until
            // completion (now); sizes were recorded from the same buffers.
            unsafe {
                match s {
                    Step::Copy { src, dst, bytes } => std::ptr::copy(src, dst, bytes),
                    Step::Narrow { src, count, dst, dtype, divide: d } => {
                        let f = std::slice::from_raw_parts_mut(src, count);
                        if let Some(n) = d {
                            f.iter_mut().for_each(|x| *x /= n as f32);
                        }
                        if count > 0 {
                            narrow(dtype, f, std::slice::from_raw_parts_mut(dst, count * dtype.size()))
                                .map_err(|e| Error::Internal(e.to_string()))?;
                        }
                    }
                    Step::Divide { ptr, dtype, count, n } => {
                        if count > 0 {
                            divide(dtype, std::slice::from_raw_parts_mut(ptr, count * dtype.size()), n)
                                .map_err(|e| Error::Internal(e.to_string()))?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn null_req() -> ffi::MPI_Request {
    // SAFETY: reading the rsmpi shim's constant.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

fn null() -> *mut c_void {
    std::ptr::null_mut()
}

fn missing(what: &str) -> Error {
    Error::Internal(format!("{what} is missing at the root (the front door checks it)"))
}

/// Posts the non-blocking MPI collective for `op` on `comm`.
///
/// # Safety
/// Every buffer of `op` must stay valid (and untouched by others) until the returned
/// requests complete, per `Backend::submit`'s contract.
pub(crate) unsafe fn post_collective(
    rt: &Runtime,
    comm: ffi::MPI_Comm,
    rank: usize,
    n: usize,
    op: &Op,
) -> Result<Posted> {
    let mut p = Posted::default();
    let op = &p.sanitize(op);
    let mut req = null_req();
    let half = rt.cfg.half_reduce;
    // SAFETY: for every MPI call below, buffers satisfy the caller's contract or are temporaries
    // owned by `p` (kept alive with the requests); counts fit C ints (check_limits).
    unsafe {
        let rc = match op {
            Op::AllReduce { input, output, op } => {
                let red = reduction(&rt.ops, half, output.dtype, *op)?;
                let send = if red.widen {
                    p.widened(*input)?
                } else {
                    p.send_buf(rt, *input, output.ptr, output.bytes(), Some(output.ptr))
                };
                let recv = p.red_output(&red, *output, false, n);
                ffi::MPI_Iallreduce(send, recv, int(output.count)?, red.ty, red.op, comm, &mut req)
            }
            Op::Reduce { input, output, op, root } => {
                let red = reduction(&rt.ops, half, input.dtype, *op)?;
                let (send, recv) = if rank == *root {
                    let o = output.ok_or_else(|| missing("reduce's output"))?;
                    let send = if red.widen {
                        p.widened(*input)?
                    } else {
                        p.send_buf(rt, *input, o.ptr, o.bytes(), Some(o.ptr))
                    };
                    (send, p.red_output(&red, o, false, n))
                } else {
                    (if red.widen { p.widened(*input)? } else { input.ptr.cast() }, null())
                };
                let r = int(*root)?;
                ffi::MPI_Ireduce(send, recv, int(input.count)?, red.ty, red.op, r, comm, &mut req)
            }
            Op::Broadcast { input, output, root } => {
                if rank == *root {
                    let i = input.ok_or_else(|| missing("broadcast's input"))?;
                    if i.ptr != output.ptr.cast_const() {
                        std::ptr::copy(i.ptr, output.ptr, output.bytes());
                    }
                }
                let ty = mpi_type(output.dtype);
                ffi::MPI_Ibcast(output.ptr.cast(), int(output.count)?, ty, int(*root)?, comm, &mut req)
            }
            Op::AllGather { input, output } => {
                let c = input.count;
                let at = output.ptr.cast_const().add(rank * c * input.dtype.size());
                let send = p.send_buf(rt, *input, output.ptr, output.bytes(), Some(at));
                let ty = mpi_type(input.dtype);
                ffi::MPI_Iallgather(send, int(c)?, ty, output.ptr.cast(), int(c)?, ty, comm, &mut req)
            }
            Op::AllGatherV { input, output, counts } => {
                let (rc, displs) = counts_and_displacements(counts)?;
                let at = output.ptr.cast_const().add(usize::try_from(displs[rank]).unwrap_or(0) * output.dtype.size());
                let send = p.send_buf(rt, *input, output.ptr, output.bytes(), Some(at));
                let ty = mpi_type(output.dtype);
                let (rcp, dp) = (p.ints(rc), p.ints(displs));
                ffi::MPI_Iallgatherv(send, int(input.count)?, ty, output.ptr.cast(), rcp, dp, ty, comm, &mut req)
            }
            Op::ReduceScatter { input, output, op } => {
                let red = reduction(&rt.ops, half, output.dtype, *op)?;
                let alias = overlaps(input.ptr, input.bytes(), output.ptr, output.bytes());
                let send = if red.widen { p.widened(*input)? } else { input.ptr.cast() };
                let recv = p.red_output(&red, *output, alias, n);
                ffi::MPI_Ireduce_scatter_block(send, recv, int(output.count)?, red.ty, red.op, comm, &mut req)
            }
            Op::AllToAll { input, output } => {
                let c = input.count / n.max(1);
                let send = p.send_buf(rt, *input, output.ptr, output.bytes(), None);
                let ty = mpi_type(input.dtype);
                ffi::MPI_Ialltoall(send, int(c)?, ty, output.ptr.cast(), int(c)?, ty, comm, &mut req)
            }
            Op::AllToAllV { input, send_counts, output, recv_counts } => {
                let (sc, sd) = counts_and_displacements(send_counts)?;
                let (rc, rd) = counts_and_displacements(recv_counts)?;
                let send = p.send_buf(rt, *input, output.ptr, output.bytes(), None);
                let ty = mpi_type(input.dtype);
                let (scp, sdp, rcp, rdp) = (p.ints(sc), p.ints(sd), p.ints(rc), p.ints(rd));
                ffi::MPI_Ialltoallv(send, scp, sdp, ty, output.ptr.cast(), rcp, rdp, ty, comm, &mut req)
            }
            Op::Gather { input, output, root } => {
                let c = input.count;
                let ty = mpi_type(input.dtype);
                let (send, recv) = if rank == *root {
                    let o = output.ok_or_else(|| missing("gather's output"))?;
                    let at = o.ptr.cast_const().add(rank * c * input.dtype.size());
                    (p.send_buf(rt, *input, o.ptr, o.bytes(), Some(at)), o.ptr.cast::<c_void>())
                } else {
                    (input.ptr.cast(), null())
                };
                ffi::MPI_Igather(send, int(c)?, ty, recv, int(c)?, ty, int(*root)?, comm, &mut req)
            }
            Op::Scatter { input, output, root } => {
                let c = output.count;
                let ty = mpi_type(output.dtype);
                let (send, recv): (*const c_void, *mut c_void) = if rank == *root {
                    let i = input.ok_or_else(|| missing("scatter's input"))?;
                    if overlaps(i.ptr, i.bytes(), output.ptr, output.bytes()) {
                        let at = i.ptr.add(rank * c * output.dtype.size());
                        match rt.in_place {
                            Some(v) if at == output.ptr.cast_const() => (i.ptr.cast(), v as *mut c_void),
                            _ => (p.copy_of(i), output.ptr.cast()),
                        }
                    } else {
                        (i.ptr.cast(), output.ptr.cast())
                    }
                } else {
                    (std::ptr::null(), output.ptr.cast())
                };
                ffi::MPI_Iscatter(send, int(c)?, ty, recv, int(c)?, ty, int(*root)?, comm, &mut req)
            }
            Op::Barrier => ffi::MPI_Ibarrier(comm, &mut req),
            Op::Batch(_) => return Err(Error::Internal("a batch is not a collective".into())),
        };
        check(rc, &format!("MPI non-blocking {}", op.kind()))?;
    }
    let root = match op {
        Op::Reduce { root, .. } | Op::Broadcast { root, .. } | Op::Gather { root, .. } | Op::Scatter { root, .. } => {
            Some(*root).filter(|&r| r != rank)
        }
        _ => None,
    };
    p.push(req, root);
    Ok(p)
}

/// Posts `MPI_Isend` of a copy of `buf` to `peer` with MPI tag `tag`: a send is complete
/// once its data is handed over (as on the other backends), so that ranks that all send
/// before they receive cannot deadlock on MPI's rendezvous protocol. The copy must live
/// until the returned request completes.
///
/// # Safety
/// `buf` must be readable now.
pub(crate) unsafe fn post_send_buffered(
    comm: ffi::MPI_Comm,
    buf: RawBuf,
    peer: usize,
    tag: c_int,
) -> Result<(Vec<u64>, ffi::MPI_Request)> {
    let mut copy = vec![0u64; buf.bytes().div_ceil(8).max(1)];
    // SAFETY: `buf` is readable for its bytes; `copy` is at least as large.
    unsafe { std::ptr::copy_nonoverlapping(buf.ptr, copy.as_mut_ptr().cast::<u8>(), buf.bytes()) };
    let mut req = null_req();
    // SAFETY: the copy stays alive (with the request) until the request completes.
    let rc = unsafe {
        ffi::MPI_Isend(copy.as_ptr().cast(), int(buf.count)?, mpi_type(buf.dtype), int(peer)?, tag, comm, &mut req)
    };
    check(rc, "MPI_Isend")?;
    Ok((copy, req))
}

/// Posts `MPI_Irecv` of `count` elements into `buf` from `peer` with MPI tag `tag` into `p`.
///
/// # Safety
/// `buf` must hold `count` elements and stay valid until the request completes.
pub(crate) unsafe fn post_recv(
    p: &mut Posted,
    comm: ffi::MPI_Comm,
    buf: RawBufMut,
    count: usize,
    peer: usize,
    tag: c_int,
) -> Result<()> {
    let mut req = null_req();
    let buf = if count == 0 { p.nz_mut(RawBufMut { count: 0, ..buf }) } else { buf };
    // SAFETY: the caller keeps `buf` valid for `count` elements until completion.
    let rc =
        unsafe { ffi::MPI_Irecv(buf.ptr.cast(), int(count)?, mpi_type(buf.dtype), int(peer)?, tag, comm, &mut req) };
    check(rc, "MPI_Irecv")?;
    p.push(req, Some(peer));
    Ok(())
}

/// Tests every request of `p`; `Ok(true)` once all have completed.
///
/// # Errors
/// MPI's error of a failed request.
pub(crate) fn test_all(p: &mut Posted) -> Result<bool> {
    let null = null_req();
    let mut all = true;
    for r in p.reqs.iter_mut() {
        if *r == null {
            continue;
        }
        let mut flag: c_int = 0;
        // SAFETY: MPI_Status is plain data that MPI fills in.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: `r` is an active request created by a non-blocking call on this process.
        check(unsafe { ffi::MPI_Test(r, &mut flag, &mut status) }, "MPI_Test")?;
        if flag == 0 {
            all = false;
        }
    }
    Ok(all)
}

/// The first peer an incomplete request of `p` waits on.
pub(crate) fn waiting_on(p: &Posted) -> Option<usize> {
    let null = null_req();
    p.reqs.iter().zip(&p.peers).find(|(r, _)| **r != null).and_then(|(_, peer)| *peer)
}

/// Cancels the incomplete receives of an abandoned operation (sends and collectives cannot
/// be cancelled: they stay with their temporaries, see `engine`).
pub(crate) fn cancel_receives(p: &mut Posted, recv_from: usize) {
    let null = null_req();
    for r in p.reqs.iter_mut().skip(recv_from) {
        if *r != null {
            // SAFETY: an active receive request of this process.
            unsafe { ffi::MPI_Cancel(r) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_rules() {
        let b = [0u8; 16];
        let p = b.as_ptr();
        assert!(overlaps(p, 8, p, 8));
        // SAFETY: offsets stay inside `b`.
        unsafe {
            assert!(overlaps(p, 8, p.add(4), 8));
            assert!(!overlaps(p, 8, p.add(8), 8));
        }
        assert!(!overlaps(p, 0, p, 8));
    }

    #[test]
    fn limits() {
        let big =
            RawBufMut { ptr: std::ptr::null_mut(), count: INT_MAX + 1, dtype: DType::U8, device: crate::Device::Cpu };
        let op = Op::AllReduce { input: big.as_const(), output: big, op: crate::ReduceOp::Sum };
        let e = check_limits(&op).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("all_reduce") && m.contains("2147483648")), "{e}");
        assert!(check_limits(&Op::Barrier).is_ok());
        // Every buffer counts: a receive of a batch, a root's output, not a non-root's.
        let fits = RawBufMut { count: INT_MAX, ..big };
        let recv = Op::Batch(vec![crate::backend::P2p::Recv { buf: big, peer: 0, tag: 0 }]);
        assert!(check_limits(&recv).unwrap_err().to_string().contains("recv has a buffer"));
        let gather = |output| Op::Gather { input: fits.as_const(), output, root: 0 };
        assert!(check_limits(&gather(Some(big))).is_err());
        assert!(check_limits(&gather(None)).is_ok());
    }
}
