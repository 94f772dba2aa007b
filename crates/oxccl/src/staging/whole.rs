//! Device buffers staged whole: every device input of an operation is copied into a host
//! temporary ([`Temp`]) before the operation runs, every device output is received into a
//! host temporary and copied back once it has completed (a receive copies back only what
//! arrived). The `cpu` backend stages this way what it does not pipeline
//! (`pipelined.rs`); the `mpi` backend the buffers a CUDA-aware MPI cannot take.

use std::sync::Arc;

use super::copy::{copier_for, Copier, DeviceCopy};
use super::temp::Temp;
use crate::backend::{BufferSlot, Op, RawBuf, RawBufMut};
use crate::device::Device;
use crate::error::Result;

/// A host temporary for one staged buffer, and where its content goes afterwards.
struct CopyBack {
    temp: *const u8,
    dst: *mut u8,
    elem: usize,
    count: usize,
    device: Device,
    copy: Arc<dyn DeviceCopy>,
    /// For a receive: its index among the batch's receives (only what arrived goes back).
    recv_index: Option<usize>,
}

/// The host temporaries of a staged operation; keep it alive until the operation has
/// completed, then call [`Staged::finish`].
#[derive(Default)]
pub struct Staged {
    temps: Vec<Temp>,
    back: Vec<CopyBack>,
}

// SAFETY: the pointers refer to the temporaries owned here and to user buffers that the
// submitter keeps valid until completion (the `Backend::submit` contract); the copy
// functions are `Send + Sync`.
unsafe impl Send for Staged {}

impl Staged {
    fn temp(&mut self, bytes: usize) -> *mut u8 {
        let mut t = Temp::new(bytes);
        let p = t.ptr();
        self.temps.push(t);
        p
    }

    fn input(&mut self, b: RawBuf, stage: &impl Fn(Device) -> bool, copier: Copier) -> Result<RawBuf> {
        if !stage(b.device) {
            return Ok(b);
        }
        let copy = copier(b.device)?;
        let t = self.temp(b.bytes());
        // SAFETY: `b` is valid for reads (submit contract), `t` is a fresh temporary of that size.
        unsafe { copy.to_host(b.device, b.ptr, t, b.bytes())? };
        Ok(RawBuf { ptr: t, device: Device::Cpu, ..b })
    }

    fn output(
        &mut self,
        b: RawBufMut,
        recv_index: Option<usize>,
        stage: &impl Fn(Device) -> bool,
        copier: Copier,
    ) -> Result<RawBufMut> {
        if !stage(b.device) {
            return Ok(b);
        }
        let copy = copier(b.device)?;
        let t = self.temp(b.bytes());
        self.back.push(CopyBack {
            temp: t,
            dst: b.ptr,
            elem: b.dtype.size(),
            count: b.count,
            device: b.device,
            copy,
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
            unsafe { b.copy.to_device(b.device, b.temp, b.dst, count * b.elem)? };
        }
        Ok(())
    }

    /// Whether anything was staged.
    pub fn is_empty(&self) -> bool {
        self.temps.is_empty()
    }
}

/// Rewrites `op` so that every buffer for which `stage(device)` holds lives in a host
/// temporary; device inputs are copied now. The copy functions come from the registry
/// ([`copier_for`]); `backend` names the backend in errors.
///
/// # Errors
/// No copy function for a device; the device runtime's copy error.
pub fn stage(op: Op, stage: impl Fn(Device) -> bool, backend: &str) -> Result<(Op, Staged)> {
    stage_with(op, stage, &|d| copier_for(d, backend))
}

/// [`stage`] with the copy functions `copier` gives per device (tests pass their own).
///
/// # Errors
/// As [`stage`].
pub fn stage_with(mut op: Op, stage: impl Fn(Device) -> bool, copier: Copier) -> Result<(Op, Staged)> {
    let mut s = Staged::default();
    // A batch's outputs are its receives, numbered as `finish`'s `received` counts them.
    let batch = matches!(op, Op::Batch(_));
    let (mut receives, mut failed) = (0, None);
    op.for_each_buffer_mut(|slot| {
        if failed.is_some() {
            return;
        }
        let staged = match slot {
            BufferSlot::Input(i) => s.input(*i, &stage, copier).map(|b| *i = b),
            BufferSlot::Output(o) => {
                let index = batch.then(|| {
                    receives += 1;
                    receives - 1
                });
                s.output(*o, index, &stage, copier).map(|b| *o = b)
            }
        };
        failed = staged.err();
    });
    match failed {
        Some(e) => Err(e),
        None => Ok((op, s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::P2p;
    use crate::dtype::DType;
    use crate::error::Error;

    #[test]
    fn staging_round_trip_with_host_buffers() {
        let input = [1.0f32, 2.0, 3.0];
        let mut output = [0.0f32; 3];
        let op = Op::AllReduce {
            input: RawBuf { ptr: input.as_ptr().cast(), count: 3, dtype: DType::F32, device: Device::Cpu },
            output: RawBufMut { ptr: output.as_mut_ptr().cast(), count: 3, dtype: DType::F32, device: Device::Cpu },
            op: crate::reduce_op::ReduceOp::Sum,
        };
        let (staged_op, staged) = stage(op, |_| true, "test").unwrap();
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
        let (op, staged) = stage(op, |_| true, "test").unwrap();
        let Op::Batch(v) = op else { panic!() };
        let P2p::Recv { buf: t, .. } = v[0] else { panic!() };
        // SAFETY: the temporary holds 4 u32 values.
        unsafe { *t.ptr.cast::<u32>() = 42 };
        staged.finish(&[1]).unwrap();
        assert_eq!(buf, [42, 7, 7, 7]);
    }

    /// Receives are numbered among receives only: a send between two receives does not
    /// shift which count of `received` each copies back.
    #[test]
    fn each_staged_receive_copies_back_its_own_count() {
        let (mut a, data, mut b) = ([7u32; 3], [5u32; 2], [8u32; 3]);
        let recv = |buf: &mut [u32; 3]| RawBufMut {
            ptr: buf.as_mut_ptr().cast(),
            count: 3,
            dtype: DType::U32,
            device: Device::Cpu,
        };
        let op = Op::Batch(vec![
            P2p::Recv { buf: recv(&mut a), peer: 0, tag: 1 },
            P2p::Send {
                buf: RawBuf { ptr: data.as_ptr().cast(), count: 2, dtype: DType::U32, device: Device::Cpu },
                peer: 1,
                tag: 1,
            },
            P2p::RecvAny { buf: recv(&mut b), tag: 2 },
        ]);
        let (op, staged) = stage(op, |_| true, "test").unwrap();
        let Op::Batch(v) = op else { panic!() };
        let (P2p::Recv { buf: ta, .. }, P2p::Send { buf: ts, .. }, P2p::RecvAny { buf: tb, .. }) = (v[0], v[1], v[2])
        else {
            panic!("the batch changed shape: {v:?}")
        };
        // SAFETY: the send's temporary holds the 2 values copied in; the receives' hold 3.
        unsafe {
            assert_eq!(std::slice::from_raw_parts(ts.ptr.cast::<u32>(), 2), [5, 5]);
            for k in 0..3 {
                *ta.ptr.cast::<u32>().add(k) = 1;
                *tb.ptr.cast::<u32>().add(k) = 2;
            }
        }
        staged.finish(&[1, 2]).unwrap();
        assert_eq!((a, b), ([1, 7, 7], [2, 2, 8]));
    }

    #[test]
    fn device_buffers_without_a_copier_are_refused_clearly() {
        let x = [0u8; 4];
        let op = Op::Broadcast {
            input: Some(RawBuf { ptr: x.as_ptr(), count: 4, dtype: DType::U8, device: Device::Cuda(0) }),
            output: RawBufMut { ptr: x.as_ptr().cast_mut(), count: 4, dtype: DType::U8, device: Device::Cuda(0) },
            root: 0,
        };
        let none = |d: Device| -> Result<Arc<dyn DeviceCopy>> {
            Err(Error::BackendUnavailable { backend: "test".into(), why: format!("no copy for {d}") })
        };
        let e = stage_with(op, |d| d != Device::Cpu, &none).err().expect("no copier").to_string();
        assert!(e.contains("cuda:0"), "{e}");
        // Host buffers are left alone when only device buffers are staged.
        let y = [1u8; 2];
        let op = Op::AllGather {
            input: RawBuf { ptr: y.as_ptr(), count: 2, dtype: DType::U8, device: Device::Cpu },
            output: RawBufMut { ptr: y.as_ptr().cast_mut(), count: 2, dtype: DType::U8, device: Device::Cpu },
        };
        let (_, s) = stage(op, |d| d != Device::Cpu, "test").unwrap();
        assert!(s.is_empty());
    }
}
