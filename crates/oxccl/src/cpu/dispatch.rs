//! From a type-erased [`Op`] to algorithm calls: in-place and out-of-place copies, f16/bf16
//! widening to f32 working buffers, the division of `Avg`, and the choice of algorithm
//! function. Everything here runs on the thread that executes the operation.

use std::ops::Range;

use super::algorithms::{
    all_gather, all_reduce, all_to_all, barrier, broadcast, gather, reduce, reduce_scatter, scatter, Ctx, Kernel,
    Scratch,
};
use crate::algorithm::{not_applicable, Algorithm};
use crate::backend::reduce::{divide, narrow, widen};
use crate::backend::{Op, RawBuf, RawBufMut};
use crate::dtype::DType;
use crate::error::Result;
use crate::op_kind::OpKind;
use crate::reduce_op::ReduceOp;

/// Bytes of a read-only buffer.
///
/// # Safety
/// `b` must describe valid memory that nobody writes while the slice lives (the
/// `Backend::submit` contract).
unsafe fn bytes<'a>(b: &RawBuf) -> &'a [u8] {
    if b.count == 0 {
        return &[];
    }
    // SAFETY: guaranteed by this function's contract.
    unsafe { std::slice::from_raw_parts(b.ptr, b.bytes()) }
}

/// Bytes of a writable buffer.
///
/// # Safety
/// `b` must describe valid memory that nobody else reads or writes while the slice lives
/// (the `Backend::submit` contract), and no other slice of it may be alive.
unsafe fn bytes_mut<'a>(b: &RawBufMut) -> &'a mut [u8] {
    if b.count == 0 {
        return &mut [];
    }
    // SAFETY: guaranteed by this function's contract.
    unsafe { std::slice::from_raw_parts_mut(b.ptr, b.bytes()) }
}

fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// A working copy of `src` in the dtype reductions run in (f32 for half types) and the
/// kernel for it.
fn working_copy(dtype: DType, op: ReduceOp, src: &[u8]) -> Result<(Scratch, Kernel)> {
    if is_half(dtype) {
        let n = src.len() / 2;
        let mut w = Scratch::new(n * 4);
        widen(dtype, src, bytemuck::cast_slice_mut(w.bytes_mut()))?;
        Ok((w, Kernel { dtype: DType::F32, op }))
    } else {
        Ok((Scratch::copy_of(src), Kernel { dtype, op }))
    }
}

/// Writes a working buffer back to the user's dtype.
fn write_back(dtype: DType, work: &[u8], dst: &mut [u8]) -> Result<()> {
    if is_half(dtype) {
        narrow(dtype, bytemuck::cast_slice(work), dst)
    } else {
        dst.copy_from_slice(work);
        Ok(())
    }
}

fn finish_avg(k: &Kernel, buf: &mut [u8], n: usize) -> Result<()> {
    if k.op == ReduceOp::Avg {
        divide(k.dtype, buf, n)?;
    }
    Ok(())
}

fn prefix_blocks(counts: &[usize], elem: usize) -> Vec<Range<usize>> {
    let mut at = 0;
    counts
        .iter()
        .map(|&c| {
            let r = at..at + c * elem;
            at = r.end;
            r
        })
        .collect()
}

fn run_all_reduce(ctx: &Ctx, buf: &mut [u8], k: &Kernel, algo: Algorithm) -> Result<()> {
    match algo {
        Algorithm::Ring => all_reduce::ring::run(ctx, buf, k),
        Algorithm::RecursiveDoubling => all_reduce::recursive_doubling::run(ctx, buf, k),
        Algorithm::Rabenseifner => all_reduce::rabenseifner::run(ctx, buf, k),
        Algorithm::BinomialTree => all_reduce::binomial_tree::run(ctx, buf, k),
        Algorithm::Hierarchical => all_reduce::hierarchical::run(ctx, buf, k),
        other => Err(not_applicable(OpKind::AllReduce, other)),
    }
}

fn run_reduce_scatter(ctx: &Ctx, buf: &mut [u8], k: &Kernel, algo: Algorithm) -> Result<()> {
    match algo {
        Algorithm::Ring => reduce_scatter::ring::run(ctx, buf, k),
        Algorithm::RecursiveHalving => reduce_scatter::recursive_halving::run(ctx, buf, k),
        other => Err(not_applicable(OpKind::ReduceScatter, other)),
    }
}

fn run_all_gather(ctx: &Ctx, buf: &mut [u8], block: usize, algo: Algorithm) -> Result<()> {
    match algo {
        Algorithm::Ring => all_gather::ring::run(ctx, buf, block),
        Algorithm::Bruck => all_gather::bruck::run(ctx, buf, block),
        other => Err(not_applicable(OpKind::AllGather, other)),
    }
}

/// Runs collective `op` in a world of one rank (the engine's, whichever algorithm was
/// chosen, shared memory included), where every collective's result is its input: a copy where input and output are two buffers, nothing where they are one (the
/// reduction of one value is that value, for every reduce op: `Avg` divides by 1). No
/// algorithm runs and nothing is allocated: a group of one (tensor parallelism of 1, a
/// `split` that leaves a rank alone) costs a call and a copy, as in NCCL.
///
/// # Safety
/// Every buffer in `op` must satisfy the `Backend::submit` contract.
///
/// # Errors
/// None for a collective; a point-to-point batch is refused as in [`run`].
pub unsafe fn run_alone(op: &Op) -> Result<()> {
    // Copies `from` into `to` unless they are the same memory. The front door checked that
    // a world of one's output has the input's length for every collective.
    let copy = |from: &RawBuf, to: &RawBufMut| {
        if !std::ptr::eq(from.ptr, to.ptr) {
            // SAFETY: both satisfy the submit contract (this function's own), and they do not
            // overlap: an in-place call passes the same pointer, checked above.
            unsafe { bytes_mut(to).copy_from_slice(bytes(from)) }
        }
    };
    match op {
        Op::AllReduce { input, output, .. }
        | Op::AllGather { input, output }
        | Op::AllGatherV { input, output, .. }
        | Op::ReduceScatter { input, output, .. }
        | Op::AllToAll { input, output }
        | Op::AllToAllV { input, output, .. } => copy(input, output),
        // The only rank is the root: the front door requires its output (its input).
        Op::Reduce { input, output, .. } | Op::Gather { input, output, .. } => {
            if let Some(o) = output {
                copy(input, o);
            }
        }
        Op::Broadcast { input, output, .. } | Op::Scatter { input, output, .. } => {
            if let Some(i) = input {
                copy(i, output);
            }
        }
        Op::Barrier => {}
        Op::Batch(_) => return Err(crate::error::Error::invalid("point-to-point batches are not collectives")),
    }
    Ok(())
}

/// Runs collective `op` with `algo` (chosen by the caller and recorded in `ctx`'s fingerprint).
///
/// # Safety
/// Every buffer in `op` must satisfy the `Backend::submit` contract.
///
/// # Errors
/// The algorithm's errors.
pub unsafe fn run(ctx: &Ctx, op: &Op, algo: Algorithm) -> Result<()> {
    let n = ctx.size();
    let rank = ctx.rank();
    // SAFETY: for every `bytes`/`bytes_mut` below, the buffers satisfy the submit contract
    // (this function's own contract), and where input and output alias (in-place forms,
    // recognised by pointer equality) only the output slice is created.
    unsafe {
        match op {
            Op::AllReduce { input, output, op } => {
                let dtype = output.dtype;
                let out = bytes_mut(output);
                let same = std::ptr::eq(input.ptr, output.ptr);
                if is_half(dtype) {
                    let src: &[u8] = if same { out } else { bytes(input) };
                    let (mut w, k) = working_copy(dtype, *op, src)?;
                    run_all_reduce(ctx, w.bytes_mut(), &k, algo)?;
                    finish_avg(&k, w.bytes_mut(), n)?;
                    write_back(dtype, w.bytes(), out)
                } else {
                    let k = Kernel { dtype, op: *op };
                    if same {
                        run_all_reduce(ctx, out, &k, algo)?;
                    } else if algo == Algorithm::Ring {
                        // The ring reads the input where it would read a copy of it.
                        all_reduce::ring::run_from(ctx, bytes(input), out, &k)?;
                    } else if algo == Algorithm::Hierarchical {
                        // So do the host's shared-memory collectives.
                        all_reduce::hierarchical::run_from(ctx, Some(bytes(input)), out, &k)?;
                    } else {
                        out.copy_from_slice(bytes(input));
                        run_all_reduce(ctx, out, &k, algo)?;
                    }
                    finish_avg(&k, out, n)
                }
            }
            Op::Reduce { input, output, op, root } => {
                let dtype = input.dtype;
                let in_place = output.is_some_and(|o| std::ptr::eq(o.ptr, input.ptr));
                let out = output.filter(|_| rank == *root).map(|o| bytes_mut(&o));
                match out {
                    Some(out) if !is_half(dtype) => {
                        if !in_place {
                            out.copy_from_slice(bytes(input));
                        }
                        let k = Kernel { dtype, op: *op };
                        reduce::binomial_tree::run(ctx, out, &k, *root)?;
                        finish_avg(&k, out, n)
                    }
                    out => {
                        // Half types, and non-root ranks (whose buffer stays untouched),
                        // reduce in a working copy.
                        let src: &[u8] = match &out {
                            Some(o) if in_place => o,
                            _ => bytes(input),
                        };
                        let (mut w, k) = working_copy(dtype, *op, src)?;
                        reduce::binomial_tree::run(ctx, w.bytes_mut(), &k, *root)?;
                        if let Some(out) = out {
                            finish_avg(&k, w.bytes_mut(), n)?;
                            write_back(dtype, w.bytes(), out)?;
                        }
                        Ok(())
                    }
                }
            }
            Op::Broadcast { input, output, root } => {
                let out = bytes_mut(output);
                if rank == *root {
                    if let Some(input) = input.filter(|i| !std::ptr::eq(i.ptr, output.ptr)) {
                        out.copy_from_slice(bytes(&input));
                    }
                }
                broadcast::binomial_tree::run(ctx, out, *root)
            }
            Op::AllGather { input, output } => {
                let out = bytes_mut(output);
                let block = input.bytes();
                let mine = rank * block..(rank + 1) * block;
                if !std::ptr::eq(input.ptr, output.ptr.wrapping_add(mine.start)) {
                    out[mine].copy_from_slice(bytes(input));
                }
                run_all_gather(ctx, out, block, algo)
            }
            Op::AllGatherV { input, output, counts } => {
                let out = bytes_mut(output);
                let blocks = prefix_blocks(counts, output.dtype.size());
                let mine = blocks[rank].clone();
                if !std::ptr::eq(input.ptr, output.ptr.wrapping_add(mine.start)) {
                    out[mine].copy_from_slice(bytes(input));
                }
                all_gather::ring::run_blocks(ctx, out, &blocks)
            }
            Op::ReduceScatter { input, output, op } => {
                let dtype = output.dtype;
                let in_place = std::ptr::eq(output.ptr, input.ptr.wrapping_add(rank * output.bytes()));
                if in_place && !is_half(dtype) {
                    // The whole input is the user's (mutable) buffer; its other blocks end
                    // with partial results, as documented on the in-place form.
                    // The in-place form submits the user's whole mutable buffer as `input`.
                    let whole = bytes_mut(&RawBufMut { ptr: input.ptr as *mut u8, count: input.count, ..*output });
                    let k = Kernel { dtype, op: *op };
                    run_reduce_scatter(ctx, whole, &k, algo)?;
                    let mine = rank * output.bytes()..(rank + 1) * output.bytes();
                    finish_avg(&k, &mut whole[mine], n)
                } else {
                    let (mut w, k) = working_copy(dtype, *op, bytes(input))?;
                    run_reduce_scatter(ctx, w.bytes_mut(), &k, algo)?;
                    let wb = w.bytes().len() / n;
                    let mine = rank * wb..(rank + 1) * wb;
                    finish_avg(&k, &mut w.bytes_mut()[mine.clone()], n)?;
                    write_back(dtype, &w.bytes()[mine], bytes_mut(output))
                }
            }
            Op::AllToAll { input, output } => {
                let out = bytes_mut(output);
                let block = output.bytes() / n;
                let blocks: Vec<_> = (0..n).map(|i| i * block..(i + 1) * block).collect();
                if std::ptr::eq(input.ptr, output.ptr) {
                    let copy = Scratch::copy_of(out);
                    all_to_all::pairwise::run(ctx, copy.bytes(), &blocks, out, &blocks)
                } else {
                    all_to_all::pairwise::run(ctx, bytes(input), &blocks, out, &blocks)
                }
            }
            Op::AllToAllV { input, send_counts, output, recv_counts } => {
                let es = output.dtype.size();
                let sb = prefix_blocks(send_counts, es);
                let rb = prefix_blocks(recv_counts, es);
                all_to_all::pairwise::run(ctx, bytes(input), &sb, bytes_mut(output), &rb)
            }
            Op::Gather { input, output, root } => {
                let out = output.filter(|_| rank == *root).map(|o| bytes_mut(&o));
                gather::linear::run(ctx, bytes(input), out, *root)
            }
            Op::Scatter { input, output, root } => {
                let inp = input.filter(|_| rank == *root).map(|i| bytes(&i));
                scatter::linear::run(ctx, inp, bytes_mut(output), *root)
            }
            Op::Barrier => barrier::dissemination::run(ctx),
            Op::Batch(_) => Err(crate::error::Error::invalid("point-to-point batches are not collectives")),
        }
    }
}
