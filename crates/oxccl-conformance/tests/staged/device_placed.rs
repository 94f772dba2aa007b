//! The conformance suite with device placement ([`SuiteOptions::on_gpu`]): every buffer a
//! case passes to a communicator call is copied to a GPU first, the call runs on the device
//! copy, and its outputs are copied back before they are compared with the sequential
//! references. The GPU is the host double (`oxccl::testing::host_gpu`: host memory posing as
//! `cuda:0`, with its copies registered as the host backends' staging copies), so the
//! `local` backend stages every device buffer through host temporaries. Worlds of 1, 2 and
//! 3 ranks; a device buffer read or written wrong (or never copied back) fails a case.
//!
//! The tests share the process-wide pinned pool, whose counters one of them reads: that one
//! runs alone ([`alone`]), the others beside each other and beside `staged`'s.

use oxccl_conformance::{run_local_with, SuiteOptions};

use crate::{alone, beside_others};

fn gpu() -> oxccl::Gpu {
    oxccl::testing::host_gpu(1, 0).unwrap()
}

fn device_placed(n: usize) {
    let _pool = beside_others();
    let opts = SuiteOptions::from_env().skipping(["errors/"]).on_gpu(gpu());
    let report = run_local_with(&oxccl::Config::new(), n, &opts).unwrap();
    report.assert_passed();
}

#[test]
fn device_placed_world_1() {
    device_placed(1);
}

#[test]
fn device_placed_world_2() {
    device_placed(2);
}

#[test]
fn device_placed_world_3() {
    device_placed(3);
}

/// Pinned-pool requests (each staged device buffer of a call leases one temporary).
fn pool_requests() -> u64 {
    let s = oxccl::pinned::global().unwrap().stats();
    s.hits + s.misses
}

/// The calls really get device buffers: with staging of host buffers switched off, a run
/// without placement leases no staging temporaries, and the same cases with placement do
/// (every device buffer is staged), and pass.
#[test]
fn placement_hands_the_calls_device_buffers() {
    let _pool = alone();
    let cfg = oxccl::Config::new().set("OXCCL_CPU_FORCE_STAGING", "0").unwrap();
    let host = SuiteOptions::new().only(["^all_reduce/i32/sum/", "^broadcast/u8/", "^p2p/ring/i64"]).quick(true);
    let placed = host.clone().on_gpu(gpu());
    assert_ne!(host, placed, "placement must be part of the options' equality");

    let before = pool_requests();
    let report = run_local_with(&cfg, 2, &host).unwrap();
    report.assert_passed();
    assert_eq!(pool_requests(), before, "host buffers were staged: the comparison below proves nothing");

    let report = run_local_with(&cfg, 2, &placed).unwrap();
    report.assert_passed();
    let staged = pool_requests() - before;
    assert!(staged > 0, "no device buffer was staged: the calls did not get device buffers");
    println!("{staged} staging temporaries leased for {} cases", report.total());
}
