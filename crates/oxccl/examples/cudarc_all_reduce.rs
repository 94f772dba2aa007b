// An all_reduce on cudarc's device memory (cargo feature `cudarc`), on the GPU the `nccl`
// backend picked for this rank. Build it with the feature (and a CUDA version for cudarc's
// bindings, e.g. CUDARC_CUDA_VERSION=12080), then run it under a launcher:
//   cargo build --features cudarc --example cudarc_all_reduce
//   OXCCL_BACKEND=nccl oxccl run -n 2 -- target/debug/examples/cudarc_all_reduce
// oxccl's documentation of its cudarc support shows this program; CI type-checks it.

use cudarc::driver::CudaContext;

fn main() -> oxccl::Result<()> {
    let comm = oxccl::init()?;
    let ordinal = comm.device().ordinal().expect("a GPU backend (OXCCL_BACKEND=nccl)");
    let ctx = CudaContext::new(ordinal as usize).expect("the rank's GPU");
    let stream = ctx.default_stream();
    let mut grads = stream.alloc_zeros::<f32>(1 << 20).expect("alloc");
    // Ordered after what `stream` already queued; the result is ready when this returns.
    // SAFETY: `stream` outlives the call.
    let comm = comm.with_stream(unsafe { oxccl::Stream::from_cudarc(&stream) });
    comm.all_reduce(&mut grads, oxccl::ReduceOp::Sum)?;
    Ok(())
}
