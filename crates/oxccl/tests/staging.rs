//! Device buffers on the host backends: staged through host memory. A "device" here is host
//! memory labelled `cuda:0`, and its copy functions are `memcpy` that count what they copy
//! (registered for CUDA memory in this test process only), so every operation's staging is
//! checked against a sequential reference without a GPU.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use oxccl::backend::{RawBuf, RawBufMut};
use oxccl::staging::{register_device_copy, DeviceCopy, DeviceKind};
use oxccl::{local, Buffer, BufferMut, Device, Element, Error, ReduceOp};

/// Host memory that says it is on `cuda:0`.
struct OnGpu<T>(Vec<T>);

// SAFETY: the vector's elements are valid and initialised; the label only routes the
// buffer through staging, whose copy functions (below) read and write host memory.
unsafe impl<T: Element> Buffer for OnGpu<T> {
    type Elem = T;
    fn as_raw(&self) -> RawBuf {
        RawBuf { ptr: self.0.as_ptr().cast(), count: self.0.len(), dtype: T::DTYPE, device: Device::Cuda(0) }
    }
}

// SAFETY: as above, exclusive through `&mut`.
unsafe impl<T: Element> BufferMut for OnGpu<T> {
    fn as_raw_mut(&mut self) -> RawBufMut {
        RawBufMut { ptr: self.0.as_mut_ptr().cast(), count: self.0.len(), dtype: T::DTYPE, device: Device::Cuda(0) }
    }
}

/// `memcpy` that counts, and fails for one rank's thread when asked.
#[derive(Default)]
struct Counting {
    to_host: AtomicUsize,
    to_device: AtomicUsize,
    /// Copies to the host of exactly one pipeline chunk (4 MiB; the other tests' buffers are
    /// far smaller, and a buffer staged whole is copied in one call of its full size).
    chunk_calls: AtomicUsize,
    /// Copies to the host of exactly one 1 MiB piece: a full block slice of an all_gather or
    /// reduce_scatter chunk on 3 ranks (4 MiB / (3 + 1)).
    piece_calls: AtomicUsize,
}

static COPIES: std::sync::OnceLock<Arc<Counting>> = std::sync::OnceLock::new();

thread_local! {
    static FAIL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl DeviceCopy for Counting {
    unsafe fn to_host(&self, device: Device, src: *const u8, dst: *mut u8, bytes: usize) -> oxccl::Result<()> {
        assert_eq!(device, Device::Cuda(0));
        if FAIL.with(|f| f.get()) {
            return Err(Error::Backend { code: 700, message: "an illegal address (injected)".into() });
        }
        self.to_host.fetch_add(bytes, Ordering::Relaxed);
        if bytes == 4 << 20 {
            self.chunk_calls.fetch_add(1, Ordering::Relaxed);
        }
        if bytes == 1 << 20 {
            self.piece_calls.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: staging passes a device (here host) source and a host temporary of `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
        Ok(())
    }
    unsafe fn to_device(&self, _: Device, src: *const u8, dst: *mut u8, bytes: usize) -> oxccl::Result<()> {
        if bytes == FAILING_TAIL * 4 {
            return Err(Error::Backend { code: 700, message: "an illegal address (injected)".into() });
        }
        self.to_device.fetch_add(bytes, Ordering::Relaxed);
        // SAFETY: as above, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
        Ok(())
    }
}

/// Held by the tests that copy whole chunks, so one's chunk count is not the other's.
static PIPELINES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The f32 length of the last chunk whose copy back fails (in the copy thread).
const FAILING_TAIL: usize = 777;

fn setup() -> Arc<Counting> {
    Arc::clone(COPIES.get_or_init(|| {
        let c = Arc::new(Counting::default());
        register_device_copy(DeviceKind::Cuda, c.clone());
        c
    }))
}

#[test]
fn every_collective_on_device_buffers_matches_the_reference() {
    let copies = setup();
    let before = (copies.to_host.load(Ordering::Relaxed), copies.to_device.load(Ordering::Relaxed));
    for n in [1usize, 2, 3, 5] {
        let out = local::run(n, |c| -> oxccl::Result<()> {
            let (r, n) = (c.rank(), c.world_size());
            let val = |i: usize, r: usize| (r * 1000 + i) as f32;
            // all_reduce, out of place and in place, an odd length.
            let input = OnGpu((0..37).map(|i| val(i, r)).collect::<Vec<f32>>());
            let mut output = OnGpu(vec![0.0f32; 37]);
            c.all_reduce_into(&input, &mut output, ReduceOp::Sum)?;
            let want: Vec<f32> = (0..37).map(|i| (0..n).map(|q| val(i, q)).sum()).collect();
            assert_eq!(output.0, want, "all_reduce_into on {n}");
            let mut inplace = OnGpu((0..37).map(|i| val(i, r)).collect::<Vec<f32>>());
            c.all_reduce(&mut inplace, ReduceOp::Max)?;
            assert_eq!(inplace.0, (0..37).map(|i| val(i, n - 1)).collect::<Vec<_>>(), "all_reduce max on {n}");
            // broadcast from the last rank, i64.
            let mut b = OnGpu(if r == n - 1 { vec![7i64, -8, 9] } else { vec![0i64; 3] });
            c.broadcast(&mut b, n - 1)?;
            assert_eq!(b.0, [7, -8, 9]);
            // all_gather and reduce_scatter, u8 and f64.
            let mut g = OnGpu(vec![0u8; 3 * n]);
            c.all_gather(&OnGpu(vec![r as u8; 3]), &mut g)?;
            assert_eq!(g.0, (0..n).flat_map(|q| [q as u8; 3]).collect::<Vec<_>>());
            let mut rs = OnGpu(vec![0.0f64; 2]);
            c.reduce_scatter(&OnGpu((0..2 * n).map(|i| i as f64).collect::<Vec<_>>()), &mut rs, ReduceOp::Sum)?;
            assert_eq!(rs.0, [(2 * r) as f64 * n as f64, (2 * r + 1) as f64 * n as f64]);
            // all_to_all: block q of rank r's input goes to rank q.
            let mut a2a = OnGpu(vec![0u32; n]);
            c.all_to_all(&OnGpu((0..n).map(|q| (r * 10 + q) as u32).collect::<Vec<_>>()), &mut a2a)?;
            assert_eq!(a2a.0, (0..n).map(|q| (q * 10 + r) as u32).collect::<Vec<_>>());
            // reduce to rank 0, and point-to-point around a ring.
            let mut red = OnGpu(vec![0i32; 4]);
            c.reduce_into(&OnGpu(vec![r as i32 + 1; 4]), (r == 0).then_some(&mut red), ReduceOp::Sum, 0)?;
            if r == 0 {
                assert_eq!(red.0, [(n * (n + 1) / 2) as i32; 4]);
            }
            if n > 1 {
                // Sends return before they are received: a ring of send-then-receive is safe.
                let mut got = OnGpu(vec![0.0f64; 5]);
                c.send(&OnGpu(vec![r as f64; 5]), (r + 1) % n, 4)?;
                c.recv(&mut got, (r + n - 1) % n, 4)?;
                assert_eq!(got.0, [((r + n - 1) % n) as f64; 5]);
            }
            c.barrier()?;
            Ok(())
        })
        .unwrap();
        assert!(out.iter().all(|r| r.is_ok()), "{n} ranks: {out:?}");
    }
    let after = (copies.to_host.load(Ordering::Relaxed), copies.to_device.load(Ordering::Relaxed));
    assert!(after.0 > before.0 && after.1 > before.1, "the device copies ran: {before:?} -> {after:?}");
    // The temporaries came from the pinned pool, and were reused.
    let pool = oxccl::pinned::global().unwrap().stats();
    assert!(pool.hits > 0 && pool.misses > 0, "{pool:?}");
}

#[test]
fn a_failed_device_copy_fails_its_rank_and_its_peers_promptly() {
    setup();
    let t = std::time::Instant::now();
    let out = local::run(3, |c| {
        FAIL.with(|f| f.set(c.rank() == 1));
        let mut v = OnGpu(vec![1.0f32; 8]);
        let r = c.all_reduce(&mut v, ReduceOp::Sum);
        FAIL.with(|f| f.set(false));
        r
    })
    .unwrap();
    match &out[1] {
        Err(Error::Backend { message, .. }) => assert!(message.contains("illegal address"), "{message}"),
        other => panic!("rank 1: {other:?}"),
    }
    for r in [0, 2] {
        assert!(matches!(out[r], Err(Error::Aborted { .. }) | Err(Error::PeerLost { .. })), "rank {r}: {:?}", out[r]);
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(10), "no wait for a timeout: {:?}", t.elapsed());
}

#[test]
fn large_all_reduce_and_broadcast_run_as_overlapped_chunks() {
    let _alone = PIPELINES.lock().unwrap_or_else(|p| p.into_inner());
    let copies = setup();
    // 2.5 chunks of 4 MiB, and an odd tail.
    let len = (10 << 20) / 4 + 3;
    let calls = copies.chunk_calls.load(Ordering::Relaxed);
    let out = local::run(3, |c| -> oxccl::Result<()> {
        let r = c.rank();
        let input = OnGpu((0..len).map(|i| ((i % 1000) + r) as f32).collect::<Vec<f32>>());
        let mut output = OnGpu(vec![0.0f32; len]);
        c.all_reduce_into(&input, &mut output, ReduceOp::Sum)?;
        assert!(output.0.iter().enumerate().all(|(i, &v)| v == (3 * (i % 1000) + 3) as f32), "all_reduce");
        let mut b = OnGpu(if r == 2 { (0..len).map(|i| i as i32).collect() } else { vec![-1i32; len] });
        c.broadcast(&mut b, 2)?;
        assert!(b.0.iter().enumerate().all(|(i, &v)| v == i as i32), "broadcast");
        Ok(())
    })
    .unwrap();
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    // Each rank copied the all_reduce's input in 2 full chunks and a tail, and the root the
    // broadcast's.
    let made = copies.chunk_calls.load(Ordering::Relaxed) - calls;
    assert_eq!(made, 3 * 2 + 2, "full chunks copied in");
}

#[test]
fn large_reduce_all_gather_and_reduce_scatter_run_as_overlapped_chunks() {
    let _alone = PIPELINES.lock().unwrap_or_else(|p| p.into_inner());
    let copies = setup();
    let (chunks, pieces) = (copies.chunk_calls.load(Ordering::Relaxed), copies.piece_calls.load(Ordering::Relaxed));
    // reduce: 2.5 chunks; all_gather and reduce_scatter: blocks of 4.96 slices of 1 MiB.
    let (len, k) = ((10 << 20) / 4 + 5, (5 << 20) / 4 - 13);
    let val = |i: usize, r: usize| ((i * 7 + r * 13) % 1009) as f32;
    let out = local::run(3, |c| -> oxccl::Result<()> {
        let (r, n) = (c.rank(), c.world_size());
        // reduce to rank 1, out of place (the others pass no output) and in place.
        let input = OnGpu((0..len).map(|i| val(i, r)).collect::<Vec<f32>>());
        let mut red = OnGpu(vec![-1.0f32; len]);
        c.reduce_into(&input, (r == 1).then_some(&mut red), ReduceOp::Sum, 1)?;
        let sum = |i: usize| (0..n).map(|q| val(i, q)).sum::<f32>();
        if r == 1 {
            assert!(red.0.iter().enumerate().all(|(i, &v)| v == sum(i)), "reduce_into at the root");
        }
        let mut inplace = OnGpu((0..len).map(|i| val(i, r)).collect::<Vec<f32>>());
        c.reduce(&mut inplace, ReduceOp::Max, 2)?;
        let want = |i: usize| if r == 2 { (0..n).map(|q| val(i, q)).fold(f32::MIN, f32::max) } else { val(i, r) };
        assert!(inplace.0.iter().enumerate().all(|(i, &v)| v == want(i)), "reduce in place, rank {r}");
        // all_gather: block q of the output is rank q's input.
        let mine = OnGpu((0..k).map(|i| val(i, r)).collect::<Vec<f32>>());
        let mut all = OnGpu(vec![0.0f32; n * k]);
        c.all_gather(&mine, &mut all)?;
        assert!(all.0.iter().enumerate().all(|(j, &v)| v == val(j % k, j / k)), "all_gather");
        // reduce_scatter: block r of the sum of every rank's n blocks.
        let blocks = OnGpu((0..n * k).map(|j| val(j, r)).collect::<Vec<f32>>());
        let mut mine = OnGpu(vec![0.0f32; k]);
        c.reduce_scatter(&blocks, &mut mine, ReduceOp::Sum)?;
        assert!(mine.0.iter().enumerate().all(|(i, &v)| v == sum(r * k + i)), "reduce_scatter");
        // In place: the input is (all_gather) or the output becomes (reduce_scatter) this
        // rank's block of the buffer, which later chunks must not read after it changed.
        let mut buf = OnGpu((0..n * k).map(|j| if j / k == r { val(j % k, r) } else { -1.0 }).collect::<Vec<f32>>());
        c.all_gather_in_place(&mut buf)?;
        assert!(buf.0.iter().enumerate().all(|(j, &v)| v == val(j % k, j / k)), "all_gather in place");
        let mut buf = OnGpu((0..n * k).map(|j| val(j, r)).collect::<Vec<f32>>());
        c.reduce_scatter_in_place(&mut buf, ReduceOp::Sum)?;
        assert!(buf.0[r * k..(r + 1) * k].iter().enumerate().all(|(i, &v)| v == sum(r * k + i)), "in place");
        Ok(())
    })
    .unwrap();
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    // reduce: each rank copies 2 full chunks in, twice. all_gather: 4 full slices per rank;
    // reduce_scatter: 4 full slices of each of 3 blocks per rank.
    assert_eq!(copies.chunk_calls.load(Ordering::Relaxed) - chunks, 2 * 3 * 2, "reduce chunks");
    assert_eq!(copies.piece_calls.load(Ordering::Relaxed) - pieces, 2 * (3 * 4 + 3 * 3 * 4), "block slices");
}

#[test]
fn a_failed_copy_in_the_pipeline_is_an_error_not_a_hang() {
    let _alone = PIPELINES.lock().unwrap_or_else(|p| p.into_inner());
    setup();
    let len = (8 << 20) / 4 + FAILING_TAIL;
    let out = local::run(2, |c| {
        let mut v = OnGpu(vec![1.0f32; len]);
        c.all_reduce(&mut v, ReduceOp::Sum)
    })
    .unwrap();
    for (r, o) in out.iter().enumerate() {
        match o {
            Err(Error::Backend { message, .. }) => assert!(message.contains("illegal address"), "{message}"),
            // The other rank may hear of the failure first.
            Err(Error::Aborted { .. }) => {}
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

/// The paths of before `oxccl::staging` (`oxccl::backend::staging`, `oxccl::mpi`'s copy
/// registry, `oxccl::pinned`) still name its items.
#[test]
fn the_former_public_paths_name_the_same_items() {
    let _: fn(DeviceKind, Arc<dyn oxccl::backend::staging::DeviceCopy>) = oxccl::backend::staging::register_device_copy;
    let _: fn(oxccl::mpi::DeviceKind, Arc<dyn oxccl::mpi::DeviceCopy>) = oxccl::mpi::register_device_copy;
    let _: fn(oxccl::backend::staging::Loader) = oxccl::staging::install_loader;
    let _: Option<oxccl::backend::staging::Staged> = None::<oxccl::staging::Staged>;
    let _: fn() -> oxccl::Result<Arc<oxccl::pinned::PinnedPool>> = oxccl::staging::pinned::global;
    let (old, new) = (oxccl::pinned::global().unwrap(), oxccl::staging::pinned::global().unwrap());
    assert!(Arc::ptr_eq(&old, &new), "one process-wide pool");
}
