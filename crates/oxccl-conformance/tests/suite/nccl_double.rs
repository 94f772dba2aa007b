//! The conformance suite through the whole `nccl` backend, on test doubles of the CUDA
//! driver and of the NCCL library (host memory posing as device memory; collectives computed
//! sequentially by the double), so CI without a GPU runs every op and dtype through the
//! engine: its streams and events, the non-blocking communicator, envelopes, fingerprints,
//! split and the failure paths.
//!
//! The suite holds its data in host vectors; `OXCCL_GPU_HOST_BUFFERS=stage` copies them to
//! device memory around each call, so NCCL sees device buffers (in-place forms included).
//! `OXCCL_GPU_FINGERPRINT=1` turns mismatched collectives into `Mismatch`, which the error
//! cases expect. Worlds of 1 to 4 ranks and an "old library" without the optional calls;
//! `rccl` (the same engine over a double posing as HIP) at 2 and 3 ranks.

use std::sync::Arc;

use oxccl::{Communicator, Config};
use oxccl_conformance::{run_suite, Report, SuiteOptions};

fn suite(n: usize, old_library: bool, opts: SuiteOptions) {
    suite_on("nccl", n, old_library, opts)
}

/// One world at a time: every rank of every world runs threads (streams, progress, the
/// host communicator's), and on a 2-core CI machine nine worlds at once only crowd each
/// other. (The "lost rank 1" this lock was first put here for was the engine's, fixed by
/// the grace of `xccl/engine/lost.rs`.)
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn suite_on(backend: &'static str, n: usize, old_library: bool, opts: SuiteOptions) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let cfg = Config::new()
        .set("OXCCL_GPU_HOST_BUFFERS", "stage")
        .and_then(|c| c.set("OXCCL_GPU_FINGERPRINT", "1"))
        .expect("settings");
    let backends = oxccl::testing::gpu_double_backends(&cfg, n, backend, old_library).expect("GPU double world");
    let reports: Vec<Report> = std::thread::scope(|s| {
        let hs: Vec<_> = backends
            .into_iter()
            .map(|b| {
                let opts = &opts;
                s.spawn(move || {
                    let comm = Communicator::from_backend(Arc::clone(&b));
                    assert_eq!(comm.backend(), backend);
                    run_suite(&comm, opts)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    Report::merge(reports).assert_passed();
}

/// The per-case deadline: long enough for a 2-core CI machine, short for the timeout cases.
fn options() -> SuiteOptions {
    SuiteOptions::from_env().quick(true)
}

#[test]
fn collectives_world_1() {
    suite(1, false, options().skipping(["errors/"]));
}

/// The full matrix (every dtype, every reduce op, the full list of counts) at 2 ranks.
#[test]
fn collectives_world_2_full_matrix() {
    suite(2, false, SuiteOptions::from_env().quick(false).skipping(["errors/"]));
}

#[test]
fn collectives_world_3_old_library() {
    suite(3, true, options().skipping(["errors/"]));
}

#[test]
fn collectives_world_4() {
    suite(4, false, options().skipping(["errors/"]));
}

#[test]
fn errors_world_2() {
    suite(2, false, options().only(["errors/"]));
}

#[test]
fn errors_world_3_old_library() {
    suite(3, true, options().only(["errors/"]));
}

/// `rccl` is the `nccl` code with the HIP runtime: the same suite, buffers on `rocm:N`.
#[test]
fn rccl_collectives_world_3() {
    suite_on("rccl", 3, false, options().skipping(["errors/"]));
}

#[test]
fn rccl_errors_world_2() {
    suite_on("rccl", 2, true, options().only(["errors/"]));
}

/// GPU communicators made through a caller's store (`Config::init_rendezvous` with
/// `nccl`, what the Python package's torch backend does for CUDA tensors): the host sides
/// meet through the store, rank `i` on fake device `i`, and the whole suite passes, errors
/// included.
#[test]
fn collectives_world_3_through_a_callers_store() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let n = 3;
    let cfg = Config::new()
        .set("OXCCL_GPU_HOST_BUFFERS", "stage")
        .and_then(|c| c.set("OXCCL_GPU_FINGERPRINT", "1"))
        .expect("settings");
    let rdv = oxccl::bootstrap::MemoryRendezvous::default();
    let opts = options();
    let reports: Vec<Report> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (cfg, rdv, opts) = (&cfg, &rdv, &opts);
                s.spawn(move || {
                    let b = oxccl::testing::gpu_double_rendezvous(cfg, (r, n), rdv, "secret", "nccl")
                        .expect("GPU double rank through the store");
                    let comm = Communicator::from_backend(b);
                    assert_eq!((comm.backend(), comm.rank(), comm.world_size()), ("nccl", r, n));
                    run_suite(&comm, opts)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    Report::merge(reports).assert_passed();
}
