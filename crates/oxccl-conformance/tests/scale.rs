//! The scale test of the `cpu` backend: 256 rank processes (`OXCCL_SCALE_RANKS` to change)
//! over TCP across 32 emulated hosts of 8 (`OXCCL_HOST_ID`: shared memory inside a host,
//! TCP between hosts), each under the default descriptor limit (`ulimit -Sn 1024`), running a
//! slice of the conformance suite's quick matrix: all_reduce (shared memory inside each host,
//! the host leaders over TCP), reduce_scatter (recursive halving: every rank talks to peers
//! on other hosts), broadcast (a tree across the hosts) and barrier (the dissemination, in
//! which every rank dials peers on other hosts); `OXCCL_SCALE_FILTER` to change. Every rank
//! must pass, and hold at most 8 threads and 64 descriptors once the suite ran; its sockets
//! (its TCP lanes, 2 per connected peer, its listener, the store's connections) must stay
//! far below one per rank: connections are made on demand, to the peers the algorithms name.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PER_HOST: usize = 8;
const MAX_THREADS: usize = 8;
const MAX_FDS: usize = 64;
const DEFAULT_FILTER: &str = "^all_reduce/i64/sum/auto/in_place,^reduce_scatter/f32/sum/auto/,\
     ^broadcast/i64/auto/in_place,^barrier/waits_for_the_last_rank";

fn spawn(bin: &str, dir: &Path, r: usize, n: usize, port: u16, secret: &str, filter: &str) -> Child {
    let out = File::create(dir.join(format!("{r}.out"))).expect("an output file");
    let err = File::create(dir.join(format!("{r}.err"))).expect("an error file");
    Command::new("sh")
        .args(["-c", "ulimit -S -n 1024 && exec \"$0\"", bin])
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("LOCAL_RANK", (r % PER_HOST).to_string())
        .env("LOCAL_WORLD_SIZE", PER_HOST.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("OXCCL_SECRET", secret)
        .env("OXCCL_HOST_ID", format!("scale-host-{}", r / PER_HOST))
        .env("OXCCL_TIMEOUT", "300s")
        .env("OXCCL_CONFORMANCE_QUICK", "1")
        .env("OXCCL_CONFORMANCE_FILTER", filter)
        .env_remove("OXCCL_TRANSPORT")
        .env_remove("OXCCL_STORE_ADDR")
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .expect("starting a rank")
}

/// `threads=`, `fds=` and `sockets=` of a rank's `resources:` line.
fn resources(out: &str) -> Option<(usize, usize, usize)> {
    let line = out.lines().find(|l| l.contains("] resources: "))?;
    let get = |k: &str| -> Option<usize> {
        line.split_whitespace().find_map(|w| w.strip_prefix(k)).and_then(|v| v.parse().ok())
    };
    Some((get("threads=")?, get("fds=")?, get("sockets=")?))
}

// The ranks are oversubscribed 128 to a CPU.
#[test]
fn quick_cases_on_256_ranks_across_32_emulated_hosts() {
    let n: usize = std::env::var("OXCCL_SCALE_RANKS").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    let filter = std::env::var("OXCCL_SCALE_FILTER").unwrap_or_else(|_| DEFAULT_FILTER.to_string());
    let opts = oxccl_conformance::SuiteOptions::new().quick(true).only(filter.split(','));
    let names = oxccl_conformance::case_names(n, &opts);
    println!("{} cases on {n} ranks: {names:?}", names.len());
    for family in ["all_reduce/", "reduce_scatter/", "broadcast/", "barrier/"] {
        assert!(names.iter().any(|c| c.starts_with(family)), "no {family} case selected by {filter}");
    }
    let bin = env!("CARGO_BIN_EXE_oxccl-conformance");
    let dir = std::env::temp_dir().join(format!("oxccl-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder for the ranks' output");
    // Rank 0 hosts the store on MASTER_PORT + 1 (torchrun's own store has MASTER_PORT):
    // that one must be free.
    let port = loop {
        let l = std::net::TcpListener::bind("0.0.0.0:0").expect("binding a free port");
        let p = l.local_addr().expect("the bound address").port();
        if p > 1025 {
            break p - 1;
        }
    };
    let secret = format!("scale-test-{}", std::process::id());
    let started = Instant::now();
    let mut children: Vec<Child> = (0..n).map(|r| spawn(bin, &dir, r, n, port, &secret, &filter)).collect();
    let deadline = started + Duration::from_secs(900);
    let mut status = vec![None; n];
    while status.iter().any(Option::is_none) {
        for (r, c) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = c.try_wait().expect("waiting for a rank");
            }
        }
        if Instant::now() > deadline {
            for c in &mut children {
                let _ = c.kill();
            }
            panic!("{n} ranks did not finish within 900 s (output in {})", dir.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = started.elapsed();
    let read = |r: usize, ext: &str| std::fs::read_to_string(dir.join(format!("{r}.{ext}"))).unwrap_or_default();
    let failed: Vec<usize> = (0..n).filter(|&r| !status[r].is_some_and(|s| s.success())).collect();
    assert!(
        failed.is_empty(),
        "ranks {failed:?} failed; rank {}:\n{}\n{}",
        failed[0],
        read(failed[0], "out"),
        read(failed[0], "err")
    );
    let summary = read(0, "out");
    let verdict = summary.lines().find(|l| l.starts_with("conformance: ")).unwrap_or_default().to_string();
    assert!(verdict.contains(" 0 failed") && !verdict.starts_with("conformance: 0 passed"), "{summary}");
    let (mut threads, mut fds, mut sockets) = (0, 0, 0);
    for r in 0..n {
        let (t, f, s) = resources(&read(r, "out")).unwrap_or_else(|| panic!("rank {r} printed no resources"));
        assert!(t <= MAX_THREADS, "rank {r} ran {t} threads (at most {MAX_THREADS})");
        assert!(f <= MAX_FDS, "rank {r} held {f} descriptors (at most {MAX_FDS})");
        // 2 lanes per peer: a rank of 256 connected to a few dozen peers at most.
        assert!(s <= 2 * 24 + 4, "rank {r} held {s} sockets");
        (threads, fds, sockets) = (threads.max(t), fds.max(f), sockets.max(s));
    }
    println!(
        "{verdict}; {n} ranks in {took:?}; per rank at most {threads} threads, {fds} descriptors, {sockets} sockets"
    );
    // Where rank 0's time went: its cases, the slowest of them, and its whole run.
    for line in
        summary.lines().filter(|l| l.contains(" cases: ") || l.contains("slowest: ") || l.contains("finished in"))
    {
        println!("{line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
