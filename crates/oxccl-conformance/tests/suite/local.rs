//! The conformance suite on the `local` backend, worlds of 1 to 8 ranks.
//!
//! One test per world size for the collective cases and one per world size for the error
//! cases, so they run in parallel and a failure names its world. Set
//! `OXCCL_CONFORMANCE_FILTER` / `OXCCL_CONFORMANCE_SKIP` (comma-separated name patterns),
//! `OXCCL_CONFORMANCE_QUICK=1` or `OXCCL_CONFORMANCE_SEED` to narrow or vary a run.

use oxccl_conformance::{run_local_in, Report, SuiteOptions};

/// The error cases fail operations on purpose, and the flight recorder dumps every failure:
/// into the build's scratch directory, not the system's temporary one.
fn config() -> oxccl::Config {
    oxccl::Config::new()
        .set("OXCCL_FR_DIR", concat!(env!("CARGO_TARGET_TMPDIR"), "/flight-records"))
        .expect("OXCCL_FR_DIR is a valid setting")
}

fn check(report: &Report) {
    for (name, t) in report.slowest(3) {
        println!("    slowest: {name} {:.3}s", t.as_secs_f64());
    }
    report.assert_passed();
}

fn collectives(n: usize) {
    let opts = SuiteOptions::from_env().skipping(["errors/"]);
    check(&run_local_in(&config(), n, &opts).unwrap());
}

fn errors(n: usize) {
    let opts = SuiteOptions::from_env().only(["errors/"]);
    check(&run_local_in(&config(), n, &opts).unwrap());
}

macro_rules! worlds {
    ($($c:ident, $e:ident = $n:expr;)*) => {$(
        #[test]
        fn $c() {
            collectives($n);
        }

        #[test]
        fn $e() {
            errors($n);
        }
    )*};
}

worlds! {
    collectives_world_1, errors_world_1 = 1;
    collectives_world_2, errors_world_2 = 2;
    collectives_world_3, errors_world_3 = 3;
    collectives_world_4, errors_world_4 = 4;
    collectives_world_5, errors_world_5 = 5;
    collectives_world_6, errors_world_6 = 6;
    collectives_world_7, errors_world_7 = 7;
    collectives_world_8, errors_world_8 = 8;
}

#[test]
fn case_list_is_the_same_for_equal_options_and_covers_the_matrix() {
    let opts = SuiteOptions::new();
    let names = oxccl_conformance::case_names(4, &opts);
    assert_eq!(names, oxccl_conformance::case_names(4, &opts));
    for family in ["all_reduce/", "reduce/", "reduce_scatter/", "broadcast/", "all_gather/", "all_gather_v/"] {
        assert!(names.iter().any(|n| n.starts_with(family)), "{family}");
    }
    for dtype in oxccl::DType::ALL {
        for op in oxccl::ReduceOp::ALL {
            for algo in oxccl::Algorithm::for_op(oxccl::OpKind::AllReduce) {
                let name = format!("all_reduce/{dtype}/{op}/{algo}/in_place");
                assert!(names.contains(&name), "{name}");
            }
        }
    }
    assert!(names.iter().any(|n| n.starts_with("errors/mismatch/")));
}

#[test]
fn a_broken_suite_communicator_fails_instead_of_hanging() {
    // The suite's own communicator is aborted before it starts: the first case fails, the
    // others are reported as not run (tests/suite/mutants.rs checks that broken backends fail).
    let opts = SuiteOptions::new().only(["broadcast/i32/auto/in_place"]);
    let reports = oxccl::local::run(2, |comm| {
        comm.abort("test: poison the suite's communicator");
        oxccl_conformance::run_suite(&comm, &opts)
    })
    .unwrap();
    let report = Report::merge(reports);
    assert!(!report.is_success(), "{report}");
    assert_eq!(report.failed(), 1, "{report}");
}
