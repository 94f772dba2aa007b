//! Device buffers on the `mpi` backend: detecting a CUDA-aware MPI, and staging through
//! host memory where MPI cannot take device pointers.
//!
//! * **Detection**: Open MPI exports `MPIX_Query_cuda_support()` (from `mpi-ext.h`) when it
//!   was built with CUDA; it returns 1 when the library can take device pointers *at run
//!   time*. oxccl looks the symbol up in the already loaded libraries (`dlsym(RTLD_DEFAULT)`),
//!   so the build never needs `mpi-ext.h`. [`MpiConfig::cuda_aware`](super::MpiConfig)
//!   overrides the answer (`yes`: trust the library, e.g. MVAPICH2-GDR or a Cray MPICH with
//!   `MPICH_GPU_SUPPORT_ENABLED=1`, which have no such query; `no`: always stage).
//! * **Staging**: every device input is copied into a host temporary before the operation
//!   is posted, every device output is received into a host temporary and copied back once
//!   the operation has completed (a receive copies back only what arrived). The copies use
//!   the [`DeviceCopy`] registered for device memory ([`register_device_copy`]; the GPU
//!   runtime layer registers one); host memory uses `memcpy`, which is how the staging path
//!   is tested without a GPU (`OXCCL_MPI_FORCE_STAGING=1` stages every buffer).
//! * A CUDA-aware MPI gets device pointers directly only for operations that need no work
//!   on the host (data movement, and integer/f32/f64 `Sum`/`Prod`/integer `Min`/`Max`
//!   reductions without `Avg`, without overlapping input and output); the others are staged.

use std::ffi::{c_int, CString};
use std::sync::{Arc, Mutex};

use crate::backend::{Op, P2p, RawBuf, RawBufMut};
use crate::device::Device;
use crate::error::{Error, Result};

/// What was found out about the MPI library's device-pointer support.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaSupport {
    /// Device pointers may be handed to MPI.
    Yes(String),
    /// They may not; device buffers are staged through host memory.
    No(String),
}

impl CudaSupport {
    /// Whether device pointers may go to MPI directly.
    pub fn is_aware(&self) -> bool {
        matches!(self, CudaSupport::Yes(_))
    }
}

/// The signature of `MPIX_Query_cuda_support`.
pub type QueryFn = unsafe extern "C" fn() -> c_int;

/// Decides the support from the configured mode and a symbol lookup.
pub fn detect(mode: crate::config::CudaAware, lookup: impl Fn(&str) -> Option<QueryFn>) -> CudaSupport {
    use crate::config::CudaAware;
    match mode {
        CudaAware::Yes => CudaSupport::Yes("OXCCL_MPI_CUDA_AWARE=yes (not checked with the library)".into()),
        CudaAware::No => CudaSupport::No("OXCCL_MPI_CUDA_AWARE=no".into()),
        CudaAware::Auto => match lookup("MPIX_Query_cuda_support") {
            None => CudaSupport::No(
                "the MPI library has no MPIX_Query_cuda_support (not an Open MPI built with CUDA); \
                 device buffers are staged through host memory"
                    .into(),
            ),
            // SAFETY: the symbol is Open MPI's `int MPIX_Query_cuda_support(void)`, which
            // takes nothing and only reads the library's state.
            Some(f) => match unsafe { f() } {
                1 => CudaSupport::Yes("MPIX_Query_cuda_support() = 1".into()),
                v => CudaSupport::No(format!(
                    "MPIX_Query_cuda_support() = {v}: this Open MPI was built with CUDA support but it is \
                     not enabled at run time; device buffers are staged through host memory"
                )),
            },
        },
    }
}

/// Looks `name` up in the libraries already loaded into the process.
pub fn lookup_loaded(name: &str) -> Option<QueryFn> {
    let c = CString::new(name).ok()?;
    // SAFETY: dlsym with RTLD_DEFAULT and a valid C string only searches the loaded objects.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // SAFETY: the only symbol looked up here is `int MPIX_Query_cuda_support(void)`.
        Some(unsafe { std::mem::transmute::<*mut libc::c_void, QueryFn>(p) })
    }
}

/// Copies between device memory and host memory.
pub trait DeviceCopy: Send + Sync {
    /// Copies `bytes` bytes from `src` on `device` to host memory at `dst`.
    ///
    /// # Errors
    /// The device runtime's error.
    ///
    /// # Safety
    /// `src` must be `bytes` readable bytes on `device`, `dst` `bytes` writable host bytes.
    unsafe fn to_host(&self, device: Device, src: *const u8, dst: *mut u8, bytes: usize) -> Result<()>;
    /// Copies `bytes` bytes from host memory at `src` to `dst` on `device`.
    ///
    /// # Errors
    /// The device runtime's error.
    ///
    /// # Safety
    /// `src` must be `bytes` readable host bytes, `dst` `bytes` writable bytes on `device`.
    unsafe fn to_device(&self, device: Device, src: *const u8, dst: *mut u8, bytes: usize) -> Result<()>;
}

/// Host "device": `memcpy` (host buffers staged for testing).
struct HostCopy;

impl DeviceCopy for HostCopy {
    unsafe fn to_host(&self, _: Device, src: *const u8, dst: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: the caller promises both ranges; temporaries never overlap user buffers.
        unsafe { std::ptr::copy(src, dst, bytes) };
        Ok(())
    }
    unsafe fn to_device(&self, _: Device, src: *const u8, dst: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: as above.
        unsafe { std::ptr::copy(src, dst, bytes) };
        Ok(())
    }
}

static DEVICE_COPY: Mutex<Option<Arc<dyn DeviceCopy>>> = Mutex::new(None);

/// Registers the copy functions used to stage device buffers (CUDA and ROCm memory).
pub fn register_device_copy(copy: Arc<dyn DeviceCopy>) {
    *crate::sync::relock(&DEVICE_COPY) = Some(copy);
}

fn copier(device: Device) -> Result<Arc<dyn DeviceCopy>> {
    if device == Device::Cpu {
        return Ok(Arc::new(HostCopy));
    }
    crate::sync::relock(&DEVICE_COPY).clone().ok_or_else(|| Error::BackendUnavailable {
        backend: "mpi".into(),
        why: format!(
            "a {device} buffer must be staged through host memory (this MPI is not CUDA-aware, or the \
             operation needs host-side work), but no device copy function is registered \
             (oxccl::backend::mpi::register_device_copy)"
        ),
    })
}

/// A host temporary for one staged buffer, and where its content goes afterwards.
struct CopyBack {
    temp: *const u8,
    dst: *mut u8,
    elem: usize,
    count: usize,
    device: Device,
    /// For a receive: its index among the batch's receives (only what arrived goes back).
    recv_index: Option<usize>,
}

/// The host temporaries of a staged operation; keep it alive until the operation has
/// completed, then call [`Staged::finish`].
#[derive(Default)]
pub struct Staged {
    temps: Vec<Vec<u64>>,
    back: Vec<CopyBack>,
}

// SAFETY: the pointers refer to the temporaries owned here and to user buffers that the
// submitter keeps valid until completion (the `Backend::submit` contract).
unsafe impl Send for Staged {}

impl Staged {
    fn temp(&mut self, bytes: usize) -> *mut u8 {
        let mut v = vec![0u64; bytes.div_ceil(8).max(1)];
        let p = v.as_mut_ptr().cast::<u8>();
        self.temps.push(v);
        p
    }

    fn input(&mut self, b: RawBuf, stage: &impl Fn(Device) -> bool) -> Result<RawBuf> {
        if !stage(b.device) {
            return Ok(b);
        }
        let t = self.temp(b.bytes());
        // SAFETY: `b` is valid for reads (submit contract), `t` is a fresh temporary of that size.
        unsafe { copier(b.device)?.to_host(b.device, b.ptr, t, b.bytes())? };
        Ok(RawBuf { ptr: t, device: Device::Cpu, ..b })
    }

    fn output(
        &mut self,
        b: RawBufMut,
        recv_index: Option<usize>,
        stage: &impl Fn(Device) -> bool,
    ) -> Result<RawBufMut> {
        if !stage(b.device) {
            return Ok(b);
        }
        copier(b.device)?;
        let t = self.temp(b.bytes());
        self.back.push(CopyBack {
            temp: t,
            dst: b.ptr,
            elem: b.dtype.size(),
            count: b.count,
            device: b.device,
            recv_index,
        });
        Ok(RawBufMut { ptr: t, device: Device::Cpu, ..b })
    }

    /// Copies the staged outputs back (receives: only the `received` elements).
    ///
    /// # Errors
    /// The device runtime's copy error.
    pub fn finish(&self, received: &[usize]) -> Result<()> {
        for b in &self.back {
            let count = b.recv_index.and_then(|i| received.get(i).copied()).unwrap_or(b.count).min(b.count);
            // SAFETY: `temp` is our temporary of `b.count` elements, `dst` the user's output
            // of the same size (valid until completion, which is now).
            unsafe { copier(b.device)?.to_device(b.device, b.temp, b.dst, count * b.elem)? };
        }
        Ok(())
    }

    /// Whether anything was staged.
    pub fn is_empty(&self) -> bool {
        self.temps.is_empty()
    }
}

/// Rewrites `op` so that every buffer for which `stage(device)` holds lives in a host
/// temporary; device inputs are copied now.
///
/// # Errors
/// No copy function for a device; the device runtime's copy error.
pub fn stage(op: Op, stage: impl Fn(Device) -> bool) -> Result<(Op, Staged)> {
    let mut s = Staged::default();
    let st = &stage;
    let op = match op {
        Op::AllReduce { input, output, op } => {
            Op::AllReduce { input: s.input(input, st)?, output: s.output(output, None, st)?, op }
        }
        Op::Reduce { input, output, op, root } => Op::Reduce {
            input: s.input(input, st)?,
            output: output.map(|o| s.output(o, None, st)).transpose()?,
            op,
            root,
        },
        Op::Broadcast { input, output, root } => Op::Broadcast {
            input: input.map(|i| s.input(i, st)).transpose()?,
            output: s.output(output, None, st)?,
            root,
        },
        Op::AllGather { input, output } => {
            Op::AllGather { input: s.input(input, st)?, output: s.output(output, None, st)? }
        }
        Op::AllGatherV { input, output, counts } => {
            Op::AllGatherV { input: s.input(input, st)?, output: s.output(output, None, st)?, counts }
        }
        Op::ReduceScatter { input, output, op } => {
            Op::ReduceScatter { input: s.input(input, st)?, output: s.output(output, None, st)?, op }
        }
        Op::AllToAll { input, output } => {
            Op::AllToAll { input: s.input(input, st)?, output: s.output(output, None, st)? }
        }
        Op::AllToAllV { input, send_counts, output, recv_counts } => {
            Op::AllToAllV { input: s.input(input, st)?, send_counts, output: s.output(output, None, st)?, recv_counts }
        }
        Op::Gather { input, output, root } => {
            Op::Gather { input: s.input(input, st)?, output: output.map(|o| s.output(o, None, st)).transpose()?, root }
        }
        Op::Scatter { input, output, root } => {
            Op::Scatter { input: input.map(|i| s.input(i, st)).transpose()?, output: s.output(output, None, st)?, root }
        }
        Op::Barrier => Op::Barrier,
        Op::Batch(ops) => {
            let mut recv = 0;
            let mut out = Vec::with_capacity(ops.len());
            for p in ops {
                out.push(match p {
                    P2p::Send { buf, peer, tag } => P2p::Send { buf: s.input(buf, st)?, peer, tag },
                    P2p::Recv { buf, peer, tag } => {
                        recv += 1;
                        P2p::Recv { buf: s.output(buf, Some(recv - 1), st)?, peer, tag }
                    }
                });
            }
            Op::Batch(out)
        }
    };
    Ok((op, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CudaAware;
    use crate::dtype::DType;

    unsafe extern "C" fn yes() -> c_int {
        1
    }
    unsafe extern "C" fn no() -> c_int {
        0
    }

    #[test]
    fn detection() {
        assert!(detect(CudaAware::Auto, |_| Some(yes as QueryFn)).is_aware());
        let d = detect(CudaAware::Auto, |_| Some(no as QueryFn));
        assert!(matches!(&d, CudaSupport::No(w) if w.contains("= 0")), "{d:?}");
        let d = detect(CudaAware::Auto, |_| None);
        assert!(matches!(&d, CudaSupport::No(w) if w.contains("MPIX_Query_cuda_support")), "{d:?}");
        assert!(detect(CudaAware::Yes, |_| None).is_aware());
        assert!(!detect(CudaAware::No, |_| Some(yes as QueryFn)).is_aware());
        // The real lookup: this test binary has no MPI extension symbol.
        assert!(lookup_loaded("MPIX_Query_cuda_support_surely_absent").is_none());
    }

    #[test]
    fn staging_round_trip_with_host_buffers() {
        let input = [1.0f32, 2.0, 3.0];
        let mut output = [0.0f32; 3];
        let op = Op::AllReduce {
            input: RawBuf { ptr: input.as_ptr().cast(), count: 3, dtype: DType::F32, device: Device::Cpu },
            output: RawBufMut { ptr: output.as_mut_ptr().cast(), count: 3, dtype: DType::F32, device: Device::Cpu },
            op: crate::ReduceOp::Sum,
        };
        let (staged_op, staged) = stage(op, |_| true).unwrap();
        let Op::AllReduce { input: i, output: o, .. } = staged_op else { panic!("op changed kind") };
        assert_ne!(i.ptr, input.as_ptr().cast());
        assert_ne!(o.ptr.cast_const(), output.as_ptr().cast());
        // "MPI" runs on the temporaries: doubles the staged input into the staged output.
        for k in 0..3 {
            // SAFETY: both temporaries hold 3 f32 values.
            unsafe { *o.ptr.cast::<f32>().add(k) = *i.ptr.cast::<f32>().add(k) * 2.0 };
        }
        assert_eq!(output, [0.0; 3], "nothing is copied back before completion");
        staged.finish(&[]).unwrap();
        assert_eq!(output, [2.0, 4.0, 6.0]);
    }

    #[test]
    fn staged_receives_copy_back_only_what_arrived() {
        let mut buf = [7u32; 4];
        let op = Op::Batch(vec![P2p::Recv {
            buf: RawBufMut { ptr: buf.as_mut_ptr().cast(), count: 4, dtype: DType::U32, device: Device::Cpu },
            peer: 0,
            tag: 1,
        }]);
        let (op, staged) = stage(op, |_| true).unwrap();
        let Op::Batch(v) = op else { panic!() };
        let P2p::Recv { buf: t, .. } = v[0] else { panic!() };
        // SAFETY: the temporary holds 4 u32 values.
        unsafe { *t.ptr.cast::<u32>() = 42 };
        staged.finish(&[1]).unwrap();
        assert_eq!(buf, [42, 7, 7, 7]);
    }

    #[test]
    fn device_buffers_without_a_copier_are_refused_clearly() {
        let x = [0u8; 4];
        let op = Op::Broadcast {
            input: Some(RawBuf { ptr: x.as_ptr(), count: 4, dtype: DType::U8, device: Device::Cuda(0) }),
            output: RawBufMut { ptr: x.as_ptr().cast_mut(), count: 4, dtype: DType::U8, device: Device::Cuda(0) },
            root: 0,
        };
        let e = stage(op, |d| d != Device::Cpu).err().expect("no copier registered in tests").to_string();
        assert!(e.contains("cuda:0") && e.contains("register_device_copy"), "{e}");
        // Host buffers are left alone when only device buffers are staged.
        let y = [1u8; 2];
        let op = Op::AllGather {
            input: RawBuf { ptr: y.as_ptr(), count: 2, dtype: DType::U8, device: Device::Cpu },
            output: RawBufMut { ptr: y.as_ptr().cast_mut(), count: 2, dtype: DType::U8, device: Device::Cpu },
        };
        let (_, s) = stage(op, |d| d != Device::Cpu).unwrap();
        assert!(s.is_empty());
    }
}
