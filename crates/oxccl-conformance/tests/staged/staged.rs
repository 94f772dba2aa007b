//! The conformance suite with every buffer staged through host temporaries, as device
//! buffers are on the host backends (`OXCCL_CPU_FORCE_STAGING=1`: the `cpu`/`local` engine
//! copies inputs into pinned temporaries, runs on them and copies outputs back, with
//! `memcpy` standing in for the device copies). Every op and dtype of the suite, worlds of 1,
//! 2, 3 and 5 ranks; a wrong copy-back (a receive's length, an in-place operation, a rooted
//! output) fails a case's comparison with its sequential reference.

use oxccl_conformance::{run_local_with, SuiteOptions};

use crate::beside_others;

fn staged(n: usize) {
    let _pool = beside_others();
    let cfg = oxccl::Config::new().set("OXCCL_CPU_FORCE_STAGING", "1").unwrap();
    let opts = SuiteOptions::from_env().skipping(["errors/"]);
    let report = run_local_with(&cfg, n, &opts).unwrap();
    report.assert_passed();
    // The temporaries came from the pinned pool and were reused.
    let pool = oxccl::pinned::global().unwrap().stats();
    assert!(pool.hits > 0, "{pool:?}");
}

#[test]
fn staged_world_1() {
    staged(1);
}

#[test]
fn staged_world_2() {
    staged(2);
}

#[test]
fn staged_world_3() {
    staged(3);
}

#[test]
fn staged_world_5() {
    staged(5);
}
