//! Communicators made through a store the caller shares (`Config::init_rendezvous`), as the
//! Python package does with torch.distributed's store.

use oxccl::bootstrap::MemoryRendezvous;
use oxccl::{Config, Error, ReduceOp};

#[test]
fn ranks_meet_through_the_callers_store() {
    for n in [1usize, 3] {
        let rdv = MemoryRendezvous::default();
        let sums: Vec<oxccl::Result<Vec<f64>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let rdv = &rdv;
                    s.spawn(move || {
                        let comm = Config::new().init_rendezvous(r, n, rdv, "shared secret")?;
                        assert_eq!((comm.rank(), comm.world_size()), (r, n));
                        let mut x = vec![r as f64 + 1.0; 5];
                        comm.all_reduce(&mut x, ReduceOp::Sum)?;
                        Ok(x)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for x in sums {
            assert_eq!(x.unwrap(), vec![(n * (n + 1) / 2) as f64; 5]);
        }
    }
}

#[test]
fn bad_requests_are_refused_clearly() {
    let rdv = MemoryRendezvous::default();
    let e = Config::new().init_rendezvous(2, 2, &rdv, "s").unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("rank 2")), "{e}");
    // mpi and local bootstrap their own way (mpi, where this build lacks it, says that).
    let e = Config::new().backend("mpi").init_rendezvous(0, 2, &rdv, "s").unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("OXCCL_BACKEND=mpi"))
            || matches!(&e, Error::BackendUnavailable { backend, .. } if backend == "mpi"),
        "{e}"
    );
    let e = Config::new().backend("local").init_rendezvous(0, 2, &rdv, "s").unwrap_err();
    assert!(matches!(&e, Error::Config(m) if m.contains("OXCCL_BACKEND=local")), "{e}");
    // No GPU here: a named GPU backend says what it looked for.
    if !std::path::Path::new("/dev/nvidia0").exists() {
        let e = Config::new().backend("nccl").init_rendezvous(0, 2, &rdv, "s").unwrap_err().to_string();
        assert!(e.contains("nccl") && e.contains("libcuda"), "{e}");
    }
    let e = Config::new().init_rendezvous(0, 2, &rdv, "").unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
    // A peer that never shows up: the store's deadline, not a hang.
    let quick = Config::new().timeout(std::time::Duration::from_millis(300));
    let e = quick.init_rendezvous(0, 2, &rdv, "s").unwrap_err();
    assert!(matches!(e, Error::Store(_) | Error::Timeout { .. }), "{e}");
}

/// Host memory labelled `cuda:0`, to see what a device buffer meets.
struct LabelledCuda(Vec<f32>);

// SAFETY: the vector's elements are valid; the label only routes the buffer (the test
// expects it to be refused before any copy).
unsafe impl oxccl::Buffer for LabelledCuda {
    type Elem = f32;
    fn as_raw(&self) -> oxccl::backend::RawBuf {
        oxccl::backend::RawBuf {
            ptr: self.0.as_ptr().cast(),
            count: self.0.len(),
            dtype: oxccl::DType::F32,
            device: oxccl::Device::Cuda(0),
        }
    }
}

// SAFETY: as above, exclusive through `&mut`.
unsafe impl oxccl::BufferMut for LabelledCuda {
    fn as_raw_mut(&mut self) -> oxccl::backend::RawBufMut {
        oxccl::backend::RawBufMut {
            ptr: self.0.as_mut_ptr().cast(),
            count: self.0.len(),
            dtype: oxccl::DType::F32,
            device: oxccl::Device::Cuda(0),
        }
    }
}

/// A communicator made through a caller's store stages device buffers like any cpu
/// communicator: it asks for the GPU runtime (here, without a GPU, the error names the CUDA
/// driver it looked for) instead of finding no way to copy.
#[test]
fn device_buffers_are_staged_through_the_runtime() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        return; // a real driver would be asked to copy host memory
    }
    let rdv = MemoryRendezvous::default();
    let comm = Config::new().init_rendezvous(0, 1, &rdv, "s").unwrap();
    let e = comm.all_reduce(&mut LabelledCuda(vec![1.0; 4]), ReduceOp::Sum).unwrap_err().to_string();
    assert!(e.contains("libcuda") && !e.contains("no device copy function"), "{e}");
}
