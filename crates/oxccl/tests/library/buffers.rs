//! The front door's buffer traits: host buffers of every kind, and memory a backend cannot
//! reach refused before anything is sent.

use oxccl::backend::{RawBuf, RawBufMut};
use oxccl::{local, Buffer, BufferMut, DType, Device, Error, ReduceOp};

/// Memory that claims to be on a GPU. It is never dereferenced: every call must be refused
/// before the backend sees it.
struct OnDevice {
    device: Device,
    count: usize,
}

// SAFETY: the description names device memory, which the host backends refuse before use;
// nothing ever reads or writes through the pointer.
unsafe impl Buffer for OnDevice {
    type Elem = f32;
    fn as_raw(&self) -> RawBuf {
        RawBuf {
            ptr: std::ptr::NonNull::<f32>::dangling().as_ptr().cast(),
            count: self.count,
            dtype: DType::F32,
            device: self.device,
        }
    }
}

// SAFETY: as above.
unsafe impl BufferMut for OnDevice {
    fn as_raw_mut(&mut self) -> RawBufMut {
        RawBufMut {
            ptr: std::ptr::NonNull::<f32>::dangling().as_ptr().cast(),
            count: self.count,
            dtype: DType::F32,
            device: self.device,
        }
    }
}

fn invalid(r: oxccl::Result<()>) -> String {
    match r {
        Err(Error::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn host_buffers_of_every_kind_reduce_alike() {
    let out = local::run(3, |c| -> oxccl::Result<Vec<f32>> {
        let r = c.rank() as f32;
        let mut v = vec![r, 1.0];
        c.all_reduce(&mut v, ReduceOp::Sum)?;
        let mut a = [r, 2.0];
        c.all_reduce(&mut a, ReduceOp::Sum)?;
        let mut s = vec![r, 3.0, 99.0];
        c.all_reduce(&mut s[..2], ReduceOp::Sum)?;
        let mut g = vec![0.0f32; 3];
        c.all_gather(&[r][..], &mut g)?;
        let mut root_out = vec![0.0f32; 3];
        c.gather(&[r + 10.0][..], (c.rank() == 1).then_some(&mut root_out[..]), 1)?;
        Ok([v, a.to_vec(), s, g, root_out].concat())
    })
    .unwrap();
    for (rank, o) in out.into_iter().enumerate() {
        let o = o.unwrap();
        let root = if rank == 1 { vec![10.0, 11.0, 12.0] } else { vec![0.0; 3] };
        let want = [vec![3.0, 3.0], vec![3.0, 6.0], vec![3.0, 9.0, 99.0], vec![0.0, 1.0, 2.0], root].concat();
        assert_eq!(o, want, "rank {rank}");
    }
}

#[test]
fn device_memory_is_refused_by_host_backends_naming_both() {
    let out = local::run(2, |c| -> oxccl::Result<()> {
        let mut d = OnDevice { device: Device::Cuda(0), count: 4 };
        let m = invalid(c.all_reduce(&mut d, ReduceOp::Sum));
        assert!(m.contains("all_reduce") && m.contains("local backend") && m.contains("cuda:0"), "{m}");
        let m = invalid(c.send(&OnDevice { device: Device::Rocm(1), count: 1 }, 1 - c.rank(), 0));
        assert!(m.contains("rocm:1"), "{m}");
        // The communicator stays usable: nothing was sent.
        let mut v = [1u8];
        c.all_reduce(&mut v, ReduceOp::Sum)?;
        assert_eq!(v, [2]);
        Ok(())
    })
    .unwrap();
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
}

#[test]
fn buffers_on_different_devices_are_refused() {
    let out = local::run(1, |c| -> oxccl::Result<()> {
        let host = [1.0f32; 4];
        let mut dev = OnDevice { device: Device::Cuda(0), count: 4 };
        let m = invalid(c.all_reduce_into(&host, &mut dev, ReduceOp::Sum));
        assert!(m.contains("different devices") && m.contains("cpu") && m.contains("cuda:0"), "{m}");
        let mut one = OnDevice { device: Device::Cuda(0), count: 1 };
        let m = invalid(c.scope(|s| s.all_gather(&host[..1], &mut one).map(drop)));
        assert!(m.contains("different devices"), "{m}");
        Ok(())
    })
    .unwrap();
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
}
