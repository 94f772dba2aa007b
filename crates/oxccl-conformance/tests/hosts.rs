//! The conformance suite on worlds that span hosts, in one process: ranks posing as being on
//! several hosts (shared memory inside a host, TCP on loopback between them), with the
//! hierarchical all_reduce forced and chosen automatically, at 2 hosts of 2 ranks and 3 hosts
//! of 2 (interleaved placement too: ranks of one host need not be neighbours).

use oxccl::{Communicator, Config};
use oxccl_conformance::{run_suite, Report, SuiteOptions};

fn suite_on_hosts(hosts: &[&str], cfg: Config, opts: SuiteOptions) {
    let backends = oxccl::testing::cpu_backends_on_hosts(&cfg, hosts).expect("a world spanning hosts");
    let reports: Vec<Report> = std::thread::scope(|s| {
        let hs: Vec<_> = backends
            .into_iter()
            .map(|b| {
                let opts = &opts;
                s.spawn(move || run_suite(&Communicator::from_backend(b), opts))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let report = Report::merge(reports);
    println!("{}", report.to_string().lines().next().unwrap_or_default());
    assert!(report.total() > 0, "no case ran");
    assert!(
        report.is_success(),
        "{} of {} cases failed on hosts {hosts:?}:\n{}",
        report.failed(),
        report.total(),
        report.failure_details(40, 3)
    );
}

fn hierarchical() -> Config {
    Config::new().set("OXCCL_ALGO", "all_reduce:hierarchical").expect("settings")
}

#[test]
fn two_hosts_of_two_hierarchical_forced() {
    suite_on_hosts(&["a", "a", "b", "b"], hierarchical(), SuiteOptions::from_env().quick(true).only(["all_reduce"]));
}

#[test]
fn three_hosts_of_two_interleaved_hierarchical_forced() {
    suite_on_hosts(
        &["a", "b", "c", "a", "b", "c"],
        hierarchical(),
        SuiteOptions::from_env().quick(true).only(["all_reduce"]),
    );
}

/// Every collective, the algorithms chosen automatically (hierarchical where the model
/// prefers it), errors included.
#[test]
fn two_hosts_of_two_automatic() {
    suite_on_hosts(&["a", "b", "a", "b"], Config::new(), SuiteOptions::from_env().quick(true));
}

/// A large all_reduce (pieces over both links, odd block ends) through the hierarchical
/// algorithm on 2 hosts of 3 ranks, against a sequential reference.
#[test]
fn large_hierarchical_all_reduce_matches_the_reference() {
    let hosts = ["a", "b", "a", "b", "a", "b"];
    let backends = oxccl::testing::cpu_backends_on_hosts(&hierarchical(), &hosts).expect("a world spanning hosts");
    let count = (3 << 18) + 7;
    let input = |r: usize| -> Vec<f32> { (0..count).map(|i| ((i * 5 + r * 11) % 13) as f32).collect() };
    let inputs: Vec<Vec<f32>> = (0..hosts.len()).map(input).collect();
    let want: Vec<f32> = (0..count).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
    std::thread::scope(|s| {
        for b in backends {
            let want = &want;
            s.spawn(move || {
                let c = Communicator::from_backend(b);
                let mut x = input(c.rank());
                c.all_reduce(&mut x, oxccl::ReduceOp::Sum).expect("all_reduce");
                assert!(x == *want, "rank {}", c.rank());
            });
        }
    });
}
