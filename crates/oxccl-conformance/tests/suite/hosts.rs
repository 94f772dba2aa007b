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
    println!("hosts {hosts:?}");
    Report::merge(reports).assert_passed();
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

/// The hierarchical all_reduce with its host phases in each host's shared-memory
/// collectives (small slots: many chunks, blocks one element apart in length), at sizes
/// from nothing to fewer elements than a host has ranks, for sum, max and average over
/// f32, i64 and bf16, in place and out of place, against sequential references.
#[test]
fn hierarchical_host_phases_in_shared_memory_match_the_reference() {
    let hosts = ["a", "a", "a", "b", "b", "b"];
    let cfg = hierarchical().set("OXCCL_SHM_SLOT_BYTES", "8192").expect("settings");
    let backends = oxccl::testing::cpu_backends_on_hosts(&cfg, &hosts).expect("a world spanning hosts");
    let n = hosts.len();
    let f = |r: usize, i: usize| ((i * 7 + r * 5) % 11) as f32 - 3.0;
    std::thread::scope(|s| {
        for b in backends {
            s.spawn(move || {
                let c = Communicator::from_backend(b);
                let r = c.rank();
                for count in [0usize, 1, 2, 5, 1001, 10_007] {
                    let mut x: Vec<f32> = (0..count).map(|i| f(r, i)).collect();
                    c.all_reduce(&mut x, oxccl::ReduceOp::Sum).expect("sum");
                    let want: Vec<f32> = (0..count).map(|i| (0..n).map(|q| f(q, i)).sum()).collect();
                    assert!(x == want, "sum, rank {r}, count {count}");
                    // Out of place: the first phase reads the input itself, which stays as
                    // it was; every element of the output is written.
                    let mine: Vec<f32> = (0..count).map(|i| f(r, i)).collect();
                    let mut out = vec![f32::NAN; count];
                    c.all_reduce_into(&mine, &mut out, oxccl::ReduceOp::Sum).expect("sum into");
                    assert!(out == want, "sum into, rank {r}, count {count}");
                    assert!(mine.iter().enumerate().all(|(i, v)| *v == f(r, i)), "input changed, rank {r}");
                    let mut x: Vec<i64> = (0..count).map(|i| (i as i64 * 31 + r as i64 * 17) % 97).collect();
                    c.all_reduce(&mut x, oxccl::ReduceOp::Max).expect("max");
                    let want: Vec<i64> = (0..count)
                        .map(|i| (0..n).map(|q| (i as i64 * 31 + q as i64 * 17) % 97).max().unwrap_or(0))
                        .collect();
                    assert!(x == want, "max, rank {r}, count {count}");
                    let mut h: Vec<oxccl::bf16> = (0..count).map(|_| oxccl::bf16::from_f32(r as f32)).collect();
                    c.all_reduce(&mut h, oxccl::ReduceOp::Avg).expect("avg");
                    let mean = (n - 1) as f32 / 2.0;
                    assert!(h.iter().all(|v| v.to_f32() == mean), "avg, rank {r}, count {count}");
                }
            });
        }
    });
}

/// A world spanning hosts splits into communicators that get shared-memory collectives
/// where their ranks allow: one per host runs them whole; one spanning the hosts alike
/// runs its host phases in them. Both compute right.
#[test]
fn splits_of_a_world_spanning_hosts_share_memory_where_they_can() {
    let hosts = ["a", "b", "a", "b", "a", "b", "a", "b"];
    let backends = oxccl::testing::cpu_backends_on_hosts(&Config::new(), &hosts).expect("a world spanning hosts");
    std::thread::scope(|s| {
        for b in backends {
            s.spawn(move || {
                let c = Communicator::from_backend(b);
                let r = c.rank();
                let kind = oxccl::OpKind::AllReduce;
                // By host: ranks 0, 2, 4, 6 on a; 1, 3, 5, 7 on b.
                let host = c.split(Some((r % 2) as u32), r as i64).expect("split").expect("a member");
                assert_eq!(host.algorithm_for(kind, 1 << 20).expect("choice"), Some(oxccl::Algorithm::SharedMemory));
                let mut x = vec![r as f32; 1001];
                host.all_reduce(&mut x, oxccl::ReduceOp::Sum).expect("all_reduce on one host");
                let want: f32 = (0..8).filter(|q| q % 2 == r % 2).map(|q| q as f32).sum();
                assert!(x.iter().all(|v| *v == want), "rank {r} on its host");
                // Ranks 0-3: two hosts of two; hierarchical, with its host phases in shared memory.
                let half = c.split(Some((r / 4) as u32), r as i64).expect("split").expect("a member");
                let mut x: Vec<f32> = (0..70_001).map(|i| (i % 5 + r) as f32).collect();
                half.with_algorithm(oxccl::Algorithm::Hierarchical)
                    .all_reduce(&mut x, oxccl::ReduceOp::Sum)
                    .expect("hierarchical all_reduce on a split");
                let members: Vec<usize> = (0..8).filter(|q| q / 4 == r / 4).collect();
                assert!(
                    x.iter().enumerate().all(|(i, v)| *v == members.iter().map(|&q| (i % 5 + q) as f32).sum::<f32>()),
                    "rank {r} in its half"
                );
            });
        }
    });
}
