//! The tensor tests: host and device storage (device memory from the host double),
//! views, and the collectives on host tensors against sequential references.

use half::{bf16, f16};

use super::*;
use crate::local;
use crate::reduce_op::ReduceOp;

/// A deterministic value for rank `r` at 3-D index `(i, j, k)`, small enough to be exact
/// in every float type once summed over 5 ranks.
fn val(r: usize, i: usize, j: usize, k: usize) -> i64 {
    (r * 37 + i * 11 + j * 5 + k) as i64 % 50
}

fn make(r: usize, shape: [usize; 3]) -> Vec<i64> {
    let mut v = Vec::with_capacity(shape.iter().product());
    for i in 0..shape[0] {
        for j in 0..shape[1] {
            for k in 0..shape[2] {
                v.push(val(r, i, j, k));
            }
        }
    }
    v
}

/// Sequential reference for all_gather along `dim`: index loops over the output.
fn gather_ref(n: usize, shape: [usize; 3], dim: usize) -> (Vec<usize>, Vec<i64>) {
    let mut out_shape = shape;
    out_shape[dim] *= n;
    let mut out = Vec::new();
    for i in 0..out_shape[0] {
        for j in 0..out_shape[1] {
            for k in 0..out_shape[2] {
                let mut idx = [i, j, k];
                let r = idx[dim] / shape[dim];
                idx[dim] %= shape[dim];
                out.push(val(r, idx[0], idx[1], idx[2]));
            }
        }
    }
    (out_shape.to_vec(), out)
}

/// Sequential reference for a Sum reduce_scatter along `dim`, as seen by rank `me`.
fn scatter_ref(n: usize, me: usize, shape: [usize; 3], dim: usize) -> (Vec<usize>, Vec<i64>) {
    let mut out_shape = shape;
    out_shape[dim] /= n;
    let mut out = Vec::new();
    for i in 0..out_shape[0] {
        for j in 0..out_shape[1] {
            for k in 0..out_shape[2] {
                let mut idx = [i, j, k];
                idx[dim] += me * out_shape[dim];
                out.push((0..n).map(|r| val(r, idx[0], idx[1], idx[2])).sum());
            }
        }
    }
    (out_shape.to_vec(), out)
}

fn to_dtype(v: &[i64], dtype: DType) -> Tensor {
    with_dtype!(dtype, T => {
        let data: Vec<T> = v.iter().map(|&x| cast::<T>(x)).collect();
        Tensor::from_vec(data, &[v.len()]).unwrap()
    })
}

fn from_dtype(t: &Tensor) -> Vec<i64> {
    with_dtype!(t.dtype(), T => t.as_slice::<T>().unwrap().iter().map(|&x| uncast::<T>(x)).collect())
}

trait Small: Element {
    fn from_i64(x: i64) -> Self;
    fn to_i64(self) -> i64;
}
macro_rules! small_int {
    ($($t:ty),*) => {$(impl Small for $t {
        fn from_i64(x: i64) -> Self { x as $t }
        fn to_i64(self) -> i64 { self as i64 }
    })*};
}
small_int!(i8, u8, i32, u32, i64, u64);
impl Small for f32 {
    fn from_i64(x: i64) -> Self {
        x as f32
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
}
impl Small for f64 {
    fn from_i64(x: i64) -> Self {
        x as f64
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
}
impl Small for f16 {
    fn from_i64(x: i64) -> Self {
        f16::from_f64(x as f64)
    }
    fn to_i64(self) -> i64 {
        self.to_f64() as i64
    }
}
impl Small for bf16 {
    fn from_i64(x: i64) -> Self {
        bf16::from_f64(x as f64)
    }
    fn to_i64(self) -> i64 {
        self.to_f64() as i64
    }
}
fn cast<T: Small>(x: i64) -> T {
    T::from_i64(x)
}
fn uncast<T: Small>(x: T) -> i64 {
    x.to_i64()
}

#[test]
fn construction_and_views() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    assert_eq!((t.shape(), t.dtype(), t.device(), t.numel(), t.ndim()), (&[2, 3][..], DType::F32, Device::Cpu, 6, 2));
    assert_eq!(t.as_slice::<f32>().unwrap()[4], 5.0);
    assert!(matches!(t.as_slice::<i32>(), Err(Error::InvalidArgument(_))));
    assert!(matches!(t.to_vec::<f64>(), Err(Error::InvalidArgument(_))));
    let mut t = t.reshape(&[3, 2]).unwrap();
    t.as_mut_slice::<f32>().unwrap()[0] = 9.0;
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![9.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert!(matches!(t.clone().reshape(&[4, 2]), Err(Error::InvalidArgument(_))));
    assert!(matches!(Tensor::from_vec(vec![1u8; 5], &[2, 3]), Err(Error::InvalidArgument(_))));
    assert!(matches!(Tensor::from_vec(vec![1u8; 5], &[usize::MAX, 3]), Err(Error::InvalidArgument(_))));
    // A GPU named by its Device: made through the process's CUDA runtime, or
    // BackendUnavailable where there is none (CI).
    match Tensor::zeros_on(&[2], DType::F32, Device::Cuda(0)) {
        Ok(g) => assert_eq!(g.device(), Device::Cuda(0)),
        Err(e) => assert!(matches!(e, Error::BackendUnavailable { .. }), "{e}"),
    }
    assert!(matches!(Tensor::zeros(&[0, usize::MAX, 2], DType::U8), Err(Error::InvalidArgument(_))));
    assert!(matches!(Tensor::zeros(&[usize::MAX / 4, 0], DType::F64), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        t.clone().to_device(Device::Rocm(1)),
        Err(Error::InvalidArgument(_) | Error::BackendUnavailable { .. })
    ));
    assert_eq!(t.clone().to_device(Device::Cpu).unwrap().numel(), 6);
    // Scalars, empty tensors and odd byte counts.
    let s = Tensor::from_vec(vec![7i8], &[]).unwrap();
    assert_eq!((s.numel(), s.ndim(), s.as_bytes().unwrap().len()), (1, 0, 1));
    let e = Tensor::zeros(&[3, 0, 2], DType::F64).unwrap();
    assert_eq!((e.numel(), e.to_vec::<f64>().unwrap().len()), (0, 0));
    for d in DType::ALL {
        let z = Tensor::zeros(&[3, 1], d).unwrap();
        assert_eq!(z.as_bytes().unwrap(), vec![0u8; 3 * d.size()]);
        assert_eq!(from_dtype(&to_dtype(&[1, 2, 3], d)), vec![1, 2, 3]);
    }
    let dbg = format!("{:?}", Tensor::from_vec(vec![1u32, 2], &[2]).unwrap());
    assert!(dbg.contains("[1, 2]") && dbg.contains("U32"), "{dbg}");
}

#[test]
fn narrow_takes_shards() {
    let t = Tensor::from_vec((0..24i32).collect(), &[2, 3, 4]).unwrap();
    let n = t.narrow(1, 1, 2).unwrap();
    assert_eq!(n.shape(), &[2, 2, 4]);
    assert_eq!(n.to_vec::<i32>().unwrap(), vec![4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23]);
    assert_eq!(t.narrow(2, 3, 1).unwrap().to_vec::<i32>().unwrap(), vec![3, 7, 11, 15, 19, 23]);
    assert_eq!(t.narrow(0, 2, 0).unwrap().numel(), 0);
    assert!(matches!(t.narrow(1, 2, 2), Err(Error::InvalidArgument(_))));
    assert!(matches!(t.narrow(1, usize::MAX, 2), Err(Error::InvalidArgument(_))));
    assert!(matches!(t.narrow(3, 0, 1), Err(Error::InvalidArgument(_))));
}

#[test]
fn all_gather_along_every_dim() {
    let shape = [2, 3, 4];
    for n in 1..=5 {
        for dim in 0..3 {
            let dtype = [DType::I64, DType::F32, DType::BF16][dim];
            let res = local::run(n, |comm| -> Result<Tensor> {
                let t = to_dtype(&make(comm.rank(), shape), dtype).reshape(&shape)?;
                comm.all_gather_tensor(&t, dim)
            })
            .unwrap();
            let (want_shape, want) = gather_ref(n, shape, dim);
            for (r, got) in res.into_iter().enumerate() {
                let got = got.unwrap_or_else(|e| panic!("n={n} dim={dim} rank {r}: {e}"));
                assert_eq!(got.shape(), &want_shape[..], "n={n} dim={dim} rank {r}");
                assert_eq!(got.dtype(), dtype);
                assert_eq!(from_dtype(&got), want, "n={n} dim={dim} rank {r}");
            }
        }
    }
}

#[test]
fn reduce_scatter_along_every_dim() {
    for n in 1..=5 {
        for dim in 0..3 {
            let mut shape = [2, 3, 2];
            shape[dim] *= n;
            let dtype = [DType::F64, DType::I32, DType::F16][dim];
            let res = local::run(n, |comm| -> Result<Tensor> {
                let t = to_dtype(&make(comm.rank(), shape), dtype).reshape(&shape)?;
                comm.reduce_scatter_tensor(&t, dim, ReduceOp::Sum)
            })
            .unwrap();
            for (r, got) in res.into_iter().enumerate() {
                let (want_shape, want) = scatter_ref(n, r, shape, dim);
                let got = got.unwrap_or_else(|e| panic!("n={n} dim={dim} rank {r}: {e}"));
                assert_eq!(got.shape(), &want_shape[..], "n={n} dim={dim} rank {r}");
                assert_eq!(from_dtype(&got), want, "n={n} dim={dim} rank {r}");
            }
        }
    }
}

#[test]
fn gather_then_scatter_round_trips() {
    // reduce_scatter(all_gather(x)) with Sum is n * x, along every dim.
    for n in 1..=5 {
        let res = local::run(n, |comm| -> Result<()> {
            for dim in 0..3 {
                let x = to_dtype(&make(comm.rank(), [3, 2, 5]), DType::I64).reshape(&[3, 2, 5])?;
                let g = comm.all_gather_tensor(&x, dim)?;
                let back = comm.reduce_scatter_tensor(&g, dim, ReduceOp::Sum)?;
                let want: Vec<i64> = x.as_slice::<i64>()?.iter().map(|v| v * n as i64).collect();
                assert_eq!(back.shape(), x.shape());
                assert_eq!(back.to_vec::<i64>()?, want, "n={n} dim={dim}");
            }
            Ok(())
        })
        .unwrap();
        assert!(res.iter().all(Result::is_ok), "n={n}: {res:?}");
    }
}

#[test]
fn argument_errors_leave_the_communicator_usable() {
    for n in 1..=5 {
        let res = local::run(n, |comm| -> Result<()> {
            let t = Tensor::zeros(&[2, n + 1, 3], DType::F32)?;
            if n > 1 {
                let e = comm.reduce_scatter_tensor(&t, 1, ReduceOp::Sum).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("divide")), "{e}");
            }
            for dim in [3, 7] {
                let e = comm.all_gather_tensor(&t, dim).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("out of range")), "{e}");
                let e = comm.reduce_scatter_tensor(&t, dim, ReduceOp::Sum).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            }
            let scalar = Tensor::from_vec(vec![1.0f32], &[])?;
            assert!(matches!(comm.all_gather_tensor(&scalar, 0), Err(Error::InvalidArgument(_))));
            let mut bad = Tensor::zeros(&[1], DType::F32)?;
            assert!(matches!(comm.broadcast_tensor(&mut bad, n), Err(Error::InvalidArgument(_))));
            // Still usable.
            let mut x = Tensor::from_vec(vec![1i32, 2], &[2])?;
            comm.all_reduce_tensor(&mut x, ReduceOp::Sum)?;
            assert_eq!(x.to_vec::<i32>()?, vec![n as i32, 2 * n as i32]);
            Ok(())
        })
        .unwrap();
        assert!(res.iter().all(Result::is_ok), "n={n}: {res:?}");
    }
}

#[test]
fn all_reduce_and_broadcast_every_dtype() {
    let res = local::run(3, |comm| -> Result<()> {
        for d in DType::ALL {
            let r = comm.rank() as i64;
            let mut t = to_dtype(&[r, r + 1, 2 * r, 5, 0, 1], d).reshape(&[2, 3])?;
            comm.all_reduce_tensor(&mut t, ReduceOp::Sum)?;
            assert_eq!(t.shape(), &[2, 3]);
            assert_eq!(from_dtype(&t), vec![3, 6, 6, 15, 0, 3], "{d}");
            let mut b = to_dtype(&[r + 10; 4], d).reshape(&[2, 2])?;
            comm.broadcast_tensor(&mut b, 2)?;
            assert_eq!(from_dtype(&b), vec![12; 4], "{d}");
        }
        // Empty tensors with huge other dims: no overflow, and a result too large is refused.
        let huge = Tensor::zeros(&[0, usize::MAX / 16, 2], DType::F32)?;
        assert_eq!(comm.all_gather_tensor(&huge, 0)?.shape(), &[0, usize::MAX / 16, 2]);
        assert!(matches!(comm.all_gather_tensor(&huge, 1), Err(Error::InvalidArgument(_))));
        assert!(matches!(comm.reduce_scatter_tensor(&huge, 2, ReduceOp::Sum), Err(Error::InvalidArgument(_))));
        // Empty tensors go through too.
        let e = Tensor::zeros(&[0, 6], DType::F32)?;
        assert_eq!(comm.all_gather_tensor(&e, 1)?.shape(), &[0, 18]);
        assert_eq!(comm.reduce_scatter_tensor(&e, 1, ReduceOp::Sum)?.shape(), &[0, 2]);
        Ok(())
    })
    .unwrap();
    assert!(res.iter().all(Result::is_ok), "{res:?}");
}

// ---- Device tensors, over the host double posing as a two-GPU CUDA runtime. ----

use crate::xccl::runtime::host::HostRuntime;

fn gpu() -> Gpu {
    Gpu::new(Arc::new(HostRuntime::new(2)), 1).unwrap()
}

const SHAPES: &[&[usize]] = &[&[], &[0], &[3, 0, 2], &[1], &[7], &[3, 5], &[2, 3, 5], &[3, 1, 5, 3]];

fn host_tensor(shape: &[usize], dtype: DType, seed: usize) -> Tensor {
    let numel: usize = shape.iter().product();
    let v: Vec<i64> = (0..numel).map(|i| ((i * 7 + seed * 13) % 60) as i64).collect();
    to_dtype(&v, dtype).reshape(shape).unwrap()
}

/// The bytes of any tensor, copied back to the host.
fn host_bytes(t: &Tensor) -> Vec<u8> {
    t.clone().to_device(Device::Cpu).unwrap().as_bytes().unwrap().to_vec()
}

#[test]
fn device_round_trips_every_dtype_and_shape() {
    let g = gpu();
    for d in DType::ALL {
        for (i, &shape) in SHAPES.iter().enumerate() {
            let h = host_tensor(shape, d, i);
            let dev = h.clone().to_gpu(&g).unwrap();
            assert_eq!((dev.shape(), dev.dtype(), dev.device(), dev.numel()), (shape, d, Device::Cuda(1), h.numel()));
            let back = dev.clone().to_device(Device::Cpu).unwrap();
            assert_eq!(back.device(), Device::Cpu);
            assert_eq!(back.shape(), shape);
            assert_eq!(back.as_bytes().unwrap(), h.as_bytes().unwrap(), "{d} {shape:?}");
            with_dtype!(d, T => assert_eq!(dev.to_vec::<T>().unwrap(), h.to_vec::<T>().unwrap()));
            // Already there: the same tensor; to another GPU of the runtime: through the host.
            let same = dev.clone().to_gpu(&g).unwrap();
            assert_eq!(host_bytes(&same), h.as_bytes().unwrap());
            let other = Gpu::new(Arc::clone(g.runtime()), 0).unwrap();
            let moved = dev.clone().to_gpu(&other).unwrap();
            assert_eq!(moved.device(), Device::Cuda(0));
            assert_eq!(host_bytes(&moved), h.as_bytes().unwrap(), "{d} {shape:?}");
            assert_eq!(dev.clone().to_device(Device::Cuda(1)).unwrap().device(), Device::Cuda(1));
            let z = Tensor::zeros_on_gpu(shape, d, &g).unwrap();
            assert_eq!(host_bytes(&z), Tensor::zeros(shape, d).unwrap().as_bytes().unwrap());
        }
    }
    assert!(matches!(Tensor::zeros_on_gpu(&[usize::MAX, 2], DType::U8, &g), Err(Error::InvalidArgument(_))));
}

#[test]
fn device_tensors_refuse_host_views() {
    let g = gpu();
    let mut dev = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap().to_gpu(&g).unwrap();
    let hint = |e: Error| matches!(e, Error::InvalidArgument(ref m) if m.contains("cuda:1") && m.contains("to_device(Device::Cpu)"));
    assert!(hint(dev.as_slice::<f32>().unwrap_err()));
    assert!(hint(dev.as_mut_slice::<f32>().unwrap_err()));
    assert!(hint(dev.as_bytes().unwrap_err()));
    assert!(matches!(dev.to_vec::<i32>(), Err(Error::InvalidArgument(_))));
    assert_eq!(dev.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    let dbg = format!("{dev:?}");
    assert!(dbg.contains("Cuda(1)") && dbg.contains("device memory"), "{dbg}");
    // A device named by its Device goes through the process's runtime of that vendor:
    // where there is none, that is BackendUnavailable, not a panic.
    let absent = |r: Result<Tensor>| match r {
        Ok(t) => t.device() == Device::Cuda(0),
        Err(e) => matches!(e, Error::BackendUnavailable { ref backend, .. } if backend == "nccl"),
    };
    assert!(absent(Tensor::zeros_on(&[2], DType::F32, Device::Cuda(0))));
    assert!(absent(Tensor::zeros(&[2], DType::F32).unwrap().to_device(Device::Cuda(0))));
    assert_eq!(Tensor::zeros_on(&[2], DType::F32, Device::Cpu).unwrap().device(), Device::Cpu);
}

#[test]
fn device_narrow_and_reshape_match_the_host() {
    let g = gpu();
    for (k, d) in DType::ALL.into_iter().enumerate() {
        for &shape in &SHAPES[4..] {
            let h = host_tensor(shape, d, k);
            let dev = h.clone().to_gpu(&g).unwrap();
            for dim in 0..shape.len() {
                for start in 0..=shape[dim] {
                    for len in 0..=shape[dim] - start {
                        let want = h.narrow(dim, start, len).unwrap();
                        let got = dev.narrow(dim, start, len).unwrap();
                        assert_eq!(got.device(), Device::Cuda(1));
                        assert_eq!(got.shape(), want.shape());
                        assert_eq!(host_bytes(&got), want.as_bytes().unwrap(), "{d} {shape:?} {dim} {start} {len}");
                    }
                }
                assert!(matches!(dev.narrow(dim, 1, shape[dim]), Err(Error::InvalidArgument(_))));
            }
            assert!(matches!(dev.narrow(shape.len(), 0, 0), Err(Error::InvalidArgument(_))));
            let flat = dev.clone().reshape(&[h.numel()]).unwrap();
            assert_eq!((flat.shape(), flat.device()), (&[h.numel()][..], Device::Cuda(1)));
            assert_eq!(host_bytes(&flat), h.as_bytes().unwrap());
            assert!(matches!(dev.clone().reshape(&[h.numel() + 1]), Err(Error::InvalidArgument(_))));
        }
    }
    // An empty result with a huge leading extent copies nothing (and finishes).
    let e = Tensor::zeros_on_gpu(&[usize::MAX / 16, 0, 2], DType::U8, &g).unwrap();
    assert_eq!(e.narrow(2, 1, 1).unwrap().shape(), &[usize::MAX / 16, 0, 1]);
}

#[test]
fn device_block_permutation_matches_the_host() {
    let g = gpu();
    for (a, b, block) in [(1, 1, 4), (2, 3, 4), (3, 2, 1), (5, 4, 6), (4, 5, 0), (0, 3, 2)] {
        let src = Tensor::from_vec((0..(a * b * block) as u32).map(|x| x as u8).collect::<Vec<u8>>(), &[a * b * block])
            .unwrap();
        let mut want = Tensor::zeros(src.shape(), DType::U8).unwrap();
        copy_blocks(&src, &mut want, swap_leading(a, b, block)).unwrap();
        let dsrc = src.clone().to_gpu(&g).unwrap();
        let mut got = Tensor::zeros_on_gpu(src.shape(), DType::U8, &g).unwrap();
        copy_blocks(&dsrc, &mut got, swap_leading(a, b, block)).unwrap();
        assert_eq!(host_bytes(&got), want.as_bytes().unwrap(), "{a} {b} {block}");
        // The independent reference: [a, b, block] -> [b, a, block] by index.
        let s = src.as_bytes().unwrap();
        let reference: Vec<u8> = (0..b)
            .flat_map(|j| (0..a).flat_map(move |i| (0..block).map(move |k| s[(i * b + j) * block + k])))
            .collect();
        assert_eq!(want.as_bytes().unwrap(), reference);
        // Host to device blocks are refused, not attempted.
        assert!(matches!(copy_blocks(&src, &mut got, swap_leading(a, b, block)), Err(Error::InvalidArgument(_))));
    }
}

#[test]
fn device_clones_share_until_written() {
    let g = gpu();
    let a = Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap().to_gpu(&g).unwrap();
    let mut b = a.clone();
    let new = Tensor::from_vec(vec![7i64, 8, 9], &[3]).unwrap().to_gpu(&g).unwrap();
    // A write (as a collective's output makes it) unshares b first.
    copy_blocks(&new, &mut b, [Block { src: 0, dst: 0, len: 24 }].into_iter()).unwrap();
    assert_eq!(b.to_vec::<i64>().unwrap(), vec![7, 8, 9]);
    assert_eq!(a.to_vec::<i64>().unwrap(), vec![1, 2, 3]);
    let c = a.try_clone().unwrap();
    assert_eq!(c.to_vec::<i64>().unwrap(), vec![1, 2, 3]);
    let ptr = |t: &Tensor| t.buf::<i64>("test").unwrap().as_raw().ptr;
    assert_ne!(ptr(&c), ptr(&a));
    assert_eq!(ptr(&a.clone()), ptr(&a));
    // A unique tensor is written in place.
    let mut c = c;
    let before = ptr(&c);
    assert_eq!(c.buf_mut::<i64>("test").unwrap().as_raw_mut().ptr.cast_const(), before);
    let h = Tensor::from_vec(vec![5u8], &[]).unwrap();
    assert_eq!(h.try_clone().unwrap().to_vec::<u8>().unwrap(), vec![5]);
}

#[test]
fn device_tensors_reach_the_backends_device_check() {
    let res = local::run(2, |comm| -> Result<()> {
        let g = gpu();
        let refused = |e: Error, what: &str| {
            assert!(
                matches!(e, Error::InvalidArgument(ref m) if m.contains("cuda:1") && m.contains("cannot copy them here")),
                "{what}: {e}"
            );
        };
        let h = host_tensor(&[4, 6], DType::F32, comm.rank());
        let mut dev = h.clone().to_gpu(&g)?;
        refused(comm.all_reduce_tensor(&mut dev, ReduceOp::Sum).unwrap_err(), "all_reduce");
        refused(comm.broadcast_tensor(&mut dev, 0).unwrap_err(), "broadcast");
        for dim in 0..2 {
            refused(comm.all_gather_tensor(&dev, dim).unwrap_err(), "all_gather");
            refused(comm.reduce_scatter_tensor(&dev, dim, ReduceOp::Sum).unwrap_err(), "reduce_scatter");
        }
        // The tensor is untouched and the communicator still usable.
        assert_eq!(host_bytes(&dev), h.as_bytes()?);
        let mut x = dev.to_device(Device::Cpu)?;
        comm.all_reduce_tensor(&mut x, ReduceOp::Sum)?;
        let want: Vec<i64> = (0..24).map(|i| ((i * 7) % 60 + (i * 7 + 13) % 60) as i64).collect();
        assert_eq!(from_dtype(&x), want);
        Ok(())
    })
    .unwrap();
    assert!(res.iter().all(Result::is_ok), "{res:?}");
}
