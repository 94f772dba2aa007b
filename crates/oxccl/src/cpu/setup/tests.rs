//! Process and world setup: worlds of threads over the real transports, the settings they
//! read, the host table, rank claims and launcher secrets.

use super::*;
use crate::bootstrap::env::job_id;
use crate::{Algorithm, Communicator, Config, ReduceOp};

fn run_world(transport: TransportChoice, n: usize) {
    let cfg = Config::new().timeout(Duration::from_secs(30)).resolve_with(|_| None).unwrap();
    let mut opts = CpuOptions::from_config(&cfg).unwrap();
    opts.transport = transport;
    let comms: Vec<Communicator> =
        init_world_with(&cfg, n, &opts).unwrap().into_iter().map(|b| Communicator::from_backend(Arc::new(b))).collect();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let r = comm.rank();
                for algo in [Algorithm::Auto, Algorithm::Ring, Algorithm::Rabenseifner] {
                    let mut x: Vec<f64> = (0..3001).map(|i| (i + r) as f64).collect();
                    comm.with_algorithm(algo).all_reduce(&mut x, ReduceOp::Sum).unwrap();
                    let sum_r = (n * (n - 1) / 2) as f64;
                    assert!(x.iter().enumerate().all(|(i, v)| *v == (i * n) as f64 + sum_r), "{algo}");
                }
                let mut y = vec![0u8; 4 * n];
                comm.all_to_all(&vec![r as u8; 4 * n], &mut y).unwrap();
                assert!(y.chunks(4).enumerate().all(|(p, c)| c.iter().all(|v| *v as usize == p)));
            });
        }
    });
    assert!(comms.iter().all(|c| c.backend() == NAME));
}

#[test]
fn a_world_of_threads_over_shared_memory() {
    run_world(TransportChoice::Auto, 3);
}

#[test]
fn a_world_of_threads_over_tcp() {
    run_world(TransportChoice::Tcp, 3);
}

#[test]
fn rank_0s_profile_decides_every_ranks_algorithms() {
    use crate::op_kind::OpKind;
    let dir = std::env::temp_dir().join(format!("oxccl-tune-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // TCP whose messages cost a lot (latency, and CPU time where the 3 ranks share fewer
    // CPUs): all_reduce of 1 MiB on 3 ranks takes recursive doubling (3 rounds with the
    // fold, 4 messages) over the ring's 4 rounds and 12 messages; with near-free messages
    // and a slow link the ring's bandwidth wins the same call.
    let file = dir.join("slow.tune");
    std::fs::write(&file, "tcp.alpha_us = 100000\ntcp.wait_us = 100000\ntcp.gbps = 100\n").unwrap();
    let cheap = dir.join("cheap.tune");
    std::fs::write(&cheap, "tcp.alpha_us = 0.001\ntcp.wait_us = 0.001\ntcp.gbps = 0.5\n").unwrap();
    let bad = dir.join("bad.tune");
    std::fs::write(&bad, "tcp.gbps = lots\n").unwrap();
    let world = |path: &std::path::Path| {
        let cfg = Config::new()
            .set("OXCCL_TUNE_FILE", path.to_str().unwrap())
            .unwrap()
            .transport(TransportChoice::Tcp)
            .timeout(Duration::from_secs(30))
            .resolve_with(|_| None)
            .unwrap();
        let opts = CpuOptions::from_config(&cfg).unwrap();
        init_world_with(&cfg, 3, &opts)
    };
    let picks = |path: &std::path::Path| -> Vec<Option<Algorithm>> {
        world(path)
            .unwrap()
            .into_iter()
            .map(|b| Communicator::from_backend(Arc::new(b)).algorithm_for(OpKind::AllReduce, 1 << 20).unwrap())
            .collect()
    };
    // Uncrowded, recursive doubling's fewer rounds; crowded, it ties with the tree's (its
    // 4 one-way turns against 2 exchanging and 2 one-way ones, 4 messages each).
    let slow = picks(&file);
    assert!(slow.iter().all(|p| *p == slow[0]), "{slow:?}");
    assert!(matches!(slow[0], Some(Algorithm::RecursiveDoubling | Algorithm::BinomialTree)), "{slow:?}");
    assert_eq!(picks(&cheap), vec![Some(Algorithm::Ring); 3]);
    // A file rank 0 cannot use fails every rank, naming the variable and the line.
    match world(&bad) {
        Err(Error::Config(m)) => assert!(m.contains("OXCCL_TUNE_FILE") && m.contains("line 1"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a malformed tune file was accepted"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn launcher_job_ids_give_a_secret_and_a_port() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    };
    assert_eq!(job_id(env(&[("TORCHELASTIC_RUN_ID", "abc")])).as_deref(), Some("TORCHELASTIC_RUN_ID=abc"));
    assert_eq!(
        job_id(env(&[("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0")])).as_deref(),
        Some("SLURM_JOB_ID=7,SLURM_STEP_ID=0")
    );
    assert_eq!(job_id(env(&[("RANK", "0")])), None);
    let p = derived_port("OMPI_MCA_ess_base_jobid=123");
    assert!((20000..40000).contains(&p));
    assert_eq!(p, derived_port("OMPI_MCA_ess_base_jobid=123"));
}

#[test]
fn options_come_from_the_resolved_settings() {
    let cfg = Config::new()
        .set("OXCCL_SHM_RING_BYTES", "64K")
        .and_then(|c| c.set("OXCCL_SOCKET_IFNAME", "=lo"))
        .and_then(|c| c.set("OXCCL_SPIN_US", "0"))
        .unwrap()
        .transport(TransportChoice::Tcp)
        .resolve_with(|_| None)
        .unwrap();
    let o = CpuOptions::from_config(&cfg).unwrap();
    assert_eq!(o.transport, TransportChoice::Tcp);
    assert_eq!(o.shm.ring_bytes, 64 << 10);
    assert_eq!((o.spin, o.shm.wait.spin), (Some(Duration::ZERO), Duration::ZERO));
    assert_eq!(o.tcp.ifname.as_deref(), Some("=lo"));
    assert_eq!(o.slot_bytes, 256 << 10);
}

#[test]
fn the_ranks_of_a_host_wait_by_the_cpus_they_share() {
    let arrival = |host: &str, cpus: &[usize]| format!("{host}\nboot\n{}", wait::format_cpus(cpus)).into_bytes();
    let table = |arrivals: &[Vec<u8>]| {
        let (hosts, masks): (Vec<&[u8]>, Vec<Vec<usize>>) = arrivals.iter().map(|a| host_and_cpus(a)).unzip();
        let machines: Vec<&[u8]> = hosts.iter().map(|h| machine_of(h)).collect();
        HostTable::new(&hosts, &machines, &masks)
    };
    let policy = |t: &HostTable, r: usize, spin: Option<Duration>| {
        let (ranks, cpus) = t.machine(r);
        WaitPolicy::for_host(ranks, cpus, spin, None)
    };
    // Four ranks on two shared CPUs: oversubscribed, no spinning.
    let shared = table(&(0..4).map(|_| arrival("h", &[0, 1])).collect::<Vec<_>>());
    assert_eq!(policy(&shared, 0, None).spin, Duration::ZERO);
    assert_eq!(shared.crowd, 2.0);
    // Four ranks bound one per CPU: not oversubscribed, although each sees one CPU.
    let bound = table(&(0..4).map(|r| arrival("h", &[r])).collect::<Vec<_>>());
    assert_eq!(policy(&bound, 0, None), WaitPolicy::default());
    assert_eq!(bound.crowd, 1.0);
    // The user's spin wins; a host without a CPU line (older peers) parses as no CPUs.
    assert_eq!(policy(&shared, 0, Some(Duration::from_micros(9))).spin, Duration::from_micros(9));
    assert_eq!(host_and_cpus(b"plain-host"), (&b"plain-host"[..], vec![]));
    assert_eq!(host_and_cpus(b"a\nb\n0-2,5"), (&b"a\nb"[..], vec![0, 1, 2, 5]));
    // The machine is the host part's last line: two emulated hosts of one machine (two
    // network namespaces under one kernel) are two hosts and one machine, and its ranks
    // wait by the CPUs of the whole machine.
    let (h1, h2) = (host_and_cpus(b"n/ns1\nboot-7\n0-1").0, host_and_cpus(b"n/ns2\nboot-7\n0-1").0);
    assert!(h1 != h2 && machine_of(h1) == machine_of(h2) && machine_of(h1) == b"boot-7");
    assert_eq!(machine_of(b"plain-host"), b"plain-host");
    assert!(!machine_id().is_empty());
    let emulated = table(&[arrival("ns1", &[0, 1]), arrival("ns2", &[0, 1]), arrival("ns2", &[0, 1])]);
    assert_eq!(emulated.local(1), vec![1, 2]);
    assert_eq!(policy(&emulated, 0, None).spin, Duration::ZERO);
}

#[test]
fn rank_0_publishes_the_host_table_and_the_others_read_it() {
    let rdv = MemoryRendezvous::default();
    for (r, h) in ["x", "y", "x"].iter().enumerate() {
        rdv.publish(&format!("p/host/{r}"), format!("{h}\nboot\n0").as_bytes()).unwrap();
    }
    let t = Duration::from_secs(5);
    let t0 = host_table(0, 3, &rdv, "p", t).unwrap();
    assert_eq!(t0.host_of, vec![0, 1, 0]);
    assert_eq!(host_table(2, 3, &rdv, "p", t).unwrap(), t0);
    // A missing rank: rank 0 names it, and the others fail with rank 0's words.
    rdv.publish("q/host/0", b"x\nboot\n0").unwrap();
    let e0 = host_table(0, 2, &rdv, "q", Duration::from_millis(20)).unwrap_err().to_string();
    assert!(e0.contains("rank 1 never arrived"), "{e0}");
    let e1 = host_table(1, 2, &rdv, "q", t).unwrap_err().to_string();
    assert!(e1.contains("rank 1 never arrived") && e1.contains("rank 0 could not gather"), "{e1}");
    // Rank 0 missing: the others say so.
    let e = host_table(1, 2, &rdv, "r", Duration::from_millis(20)).unwrap_err().to_string();
    assert!(e.contains("rank 0 did not publish"), "{e}");
}

#[test]
fn missing_ranks_are_named_as_ranks() {
    let rdv = MemoryRendezvous::default();
    rdv.publish("p/host/0", b"a").unwrap();
    rdv.publish("p/host/2", b"a").unwrap();
    let e = arrivals(0, 4, &rdv, "p", Duration::from_millis(20)).unwrap_err().to_string();
    assert!(e.contains("ranks 1, 3 never arrived") && e.contains("world of 4"), "{e}");
    rdv.publish("p/host/1", b"b").unwrap();
    let e = arrivals(2, 4, &rdv, "p", Duration::from_millis(20)).unwrap_err().to_string();
    assert!(e.contains("rank 3 never arrived") && !e.contains("p/host"), "{e}");
    rdv.publish("p/host/3", b"b").unwrap();
    assert_eq!(arrivals(2, 4, &rdv, "p", Duration::from_millis(20)).unwrap().len(), 4);
}

#[test]
fn a_rank_claimed_twice_is_refused() {
    let secret = Secret::generate().unwrap();
    let server = StoreServer::bind("127.0.0.1:0", secret.clone()).unwrap();
    let client = StoreClient::connect(&server.local_addr().to_string(), &secret, Duration::from_secs(5)).unwrap();
    claim_rank(&client, "j", 1, 2, "torchrun").unwrap();
    claim_rank(&client, "j", 0, 2, "torchrun").unwrap();
    let e = claim_rank(&client, "j", 1, 2, "torchrun").unwrap_err().to_string();
    assert!(e.contains("two processes were started as rank 1") && e.contains("RANK"), "{e}");
}
