//! `oxccl bench`: the table, the correctness check, JSON, and the ways of starting ranks.

use std::time::Duration;

use crate::common::{oxccl, run};

const LIMIT: Duration = Duration::from_secs(60);

const OPS: [&str; 10] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "gather",
    "scatter",
    "send_recv",
    "barrier",
];

/// The data rows of a table (lines not starting with `#`), split into fields.
fn rows(table: &str) -> Vec<Vec<&str>> {
    table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect()
}

#[test]
fn all_operations_on_local_threads_check_clean() {
    let f = run(
        oxccl(["bench", "all", "--ranks", "3", "--backend", "local", "-b", "8", "-e", "4K", "-n", "2", "-w", "1"]),
        LIMIT,
    );
    assert_eq!(f.code(), Some(0), "{}", f.all());
    assert!(f.stdout.contains("#       size         count      type   redop    root     time   algbw   busbw  #wrong"));
    for op in OPS {
        assert!(f.stdout.contains(&format!("\n# {op}\n")), "no table for {op}\n{}", f.all());
    }
    assert_eq!(f.stdout.matches("# Out of bounds values : 0 OK").count(), OPS.len(), "{}", f.all());
    let rows = rows(&f.stdout);
    // 8, 32, 128, 512, 2048 bytes for the nine sized operations, one barrier row.
    assert_eq!(rows.len(), 9 * 5 + 1, "{}", f.all());
    for r in &rows {
        assert_eq!(r.len(), 13, "{r:?}");
        assert_eq!(r[8], "0", "out-of-place #wrong in {r:?}");
        assert!(r[12] == "0" || r[12] == "-", "in-place #wrong in {r:?}");
    }
    // Counts are rounded to a multiple of the 3 ranks where each owns a block.
    assert!(rows.iter().any(|r| r[..5] == ["24", "6", "float", "none", "-1"]), "{}", f.stdout);
}

#[test]
fn json_and_memcpy_reference() {
    let dir = std::env::temp_dir().join(format!("oxccl-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("out.json");
    let mut cmd =
        oxccl(["bench", "all_reduce", "gather", "--ranks", "2", "--backend", "local", "-b", "1K", "-e", "4K"]);
    cmd.args(["-f", "2", "-n", "2", "-w", "0", "-d", "bf16", "-o", "max", "--memcpy", "--json"]).arg(&path);
    let f = run(cmd, LIMIT);
    assert_eq!(f.code(), Some(0), "{}", f.all());
    assert!(f.stdout.contains("memcpy(GB/s)"), "{}", f.all());
    assert!(f.stdout.contains("bfloat16     max"), "{}", f.all());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("json written")).expect("valid json");
    let recs = v["rows"].as_array().expect("rows");
    // all_reduce: 3 sizes × 2 placements; gather: 3 sizes out of place only.
    assert_eq!(recs.len(), 9, "{v}");
    assert_eq!(v["world_size"], 2);
    for r in recs {
        assert_eq!(r["wrong"], 0, "{r}");
        assert_eq!(r["dtype"], "bfloat16");
        assert!(r["memcpy_gbps"].as_f64().is_some_and(|g| g > 0.0), "{r}");
        assert!(r["time_us"].as_f64().is_some_and(|t| t > 0.0), "{r}");
    }
    assert_eq!(recs[0]["redop"], "max");
    assert_eq!(recs[8]["op"], "gather");
    assert_eq!(recs[8]["redop"], "none");
    assert_eq!(recs[8]["in_place"], false);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn plots_of_a_run_and_of_two_runs() {
    let dir = std::env::temp_dir().join(format!("oxccl-plot-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (svg, json) = (dir.join("run.svg"), dir.join("cpu.json"));
    // Processes on the default backend: rank 0 draws.
    let mut cmd = oxccl(["bench", "all_reduce", "all_gather", "--ranks", "2", "-b", "8", "-e", "64K", "-f", "8"]);
    cmd.args(["-n", "3", "-w", "1", "--json"]).arg(&json).arg("--plot").arg(&svg);
    let f = run(cmd, LIMIT);
    assert_eq!(f.code(), Some(0), "{}", f.all());
    let text = std::fs::read_to_string(&svg).expect("svg written").replace('\n', "");
    for label in [">all_reduce<", ">all_gather<", ">memcpy<", ">8<", "cpu backend, 2 ranks"] {
        assert!(text.contains(label), "{label} not in the plot");
    }
    let local = dir.join("local.json");
    let mut cmd =
        oxccl(["bench", "all_reduce", "--ranks", "3", "--backend", "local", "-b", "8", "-e", "64K", "-f", "8"]);
    cmd.args(["-n", "3", "-w", "1", "--json"]).arg(&local);
    assert_eq!(run(cmd, LIMIT).code(), Some(0));
    let png = dir.join("cmp.png");
    let mut cmd = oxccl(["plot"]);
    cmd.arg(&json).arg(&local).arg("-o").arg(&png);
    let f = run(cmd, LIMIT);
    assert_eq!(f.code(), Some(0), "{}", f.all());
    let bytes = std::fs::read(&png).expect("png written");
    assert_eq!(&bytes[..4], b"\x89PNG");
    // Bad uses: an extension that is no image format, a file that is no bench output.
    let mut cmd = oxccl(["plot"]);
    cmd.arg(&json).arg("-o").arg(dir.join("x.pdf"));
    let f = run(cmd, LIMIT);
    assert_eq!(f.code(), Some(1), "{}", f.all());
    assert!(f.stderr.contains("x.pdf") && f.stderr.contains(".svg"), "{}", f.all());
    let mut cmd = oxccl(["plot"]);
    cmd.arg(&svg).arg("-o").arg(dir.join("y.svg"));
    let f = run(cmd, LIMIT);
    assert!(f.code() == Some(1) && f.stderr.contains("run.svg"), "{}", f.all());
    let mut cmd = oxccl(["bench", "--ranks", "2", "--backend", "local", "--plot"]);
    cmd.arg(dir.join("z.jpg"));
    let f = run(cmd, LIMIT);
    assert_ne!(f.code(), Some(0), "{}", f.all());
    assert!(f.stderr.contains("z.jpg"), "refused before measuring: {}", f.all());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ranks_as_processes_with_the_cpu_backend() {
    let f = run(
        oxccl([
            "bench",
            "all_reduce",
            "send_recv",
            "--ranks",
            "2",
            "--backend",
            "cpu",
            "-e",
            "1K",
            "-n",
            "2",
            "-w",
            "1",
        ]),
        LIMIT,
    );
    assert_eq!(f.code(), Some(0), "{}", f.all());
    assert!(f.stdout.contains("2 ranks on backend cpu"), "{}", f.all());
    assert_eq!(f.stdout.matches("# Out of bounds values : 0 OK").count(), 2, "{}", f.all());
    // Bound by default where the ranks fit: rank 0 on the first CPU alone.
    let cpus = oxccl::tuning::allowed_cpus();
    if cpus.len() >= 2 {
        assert!(f.stdout.contains(&format!("rank 0 on CPUs {}\n", cpus[0])), "{}", f.all());
    }
}

#[test]
fn under_oxccl_run_it_joins_the_launched_job() {
    let bin = env!("CARGO_BIN_EXE_oxccl");
    let f = run(
        oxccl(["run", "-n", "2", "--", bin, "bench", "broadcast", "-r", "1", "-e", "256", "-n", "1", "-w", "0"]),
        LIMIT,
    );
    assert_eq!(f.code(), Some(0), "{}", f.all());
    assert!(f.stdout.contains("[rank 0] # oxccl bench: 2 ranks"), "{}", f.all());
    assert!(f.stdout.contains("[rank 0] # Out of bounds values : 0 OK"), "{}", f.all());
}

#[test]
fn bad_arguments_explain_themselves() {
    let f = run(oxccl(["bench", "allreduse", "--ranks", "2", "--backend", "local"]), LIMIT);
    assert_eq!(f.code(), Some(1), "{}", f.all());
    assert!(f.stderr.contains("expected `all` or one of"), "{}", f.all());

    // The library's size grammar, its hint, and the option it was given to.
    let f = run(oxccl(["bench", "-e", "1Q"]), LIMIT);
    assert_eq!(f.code(), Some(2), "{}", f.all());
    assert!(f.stderr.contains("--maxbytes") && f.stderr.contains("is not a size; use e.g."), "{}", f.all());

    let f = run(oxccl(["bench", "broadcast", "--ranks", "2", "--backend", "local", "-r", "5"]), LIMIT);
    assert_eq!(f.code(), Some(1), "{}", f.all());
    assert!(f.stderr.contains("--root 5 is out of range for 2 ranks"), "{}", f.all());

    let f = run(oxccl(["bench", "--ranks", "2", "--backend", "warp"]), LIMIT);
    assert_eq!(f.code(), Some(1), "{}", f.all());
    assert!(f.stderr.contains("unknown backend `warp`"), "{}", f.all());

    let f = run(oxccl(["bench", "--device", "gpu0"]), LIMIT);
    assert_eq!(f.code(), Some(2), "{}", f.all());
    assert!(f.stderr.contains("expected cpu, cuda:N or rocm:N"), "{}", f.all());

    let f = run(oxccl(["bench", "--device", "cuda", "--algo", "all"]), LIMIT);
    assert_eq!(f.code(), Some(1), "{}", f.all());
    assert!(f.stderr.contains("--algo all compares the algorithms on host buffers"), "{}", f.all());
}

/// `--device cpu` is the host (as without it); a GPU that is not there is refused by every
/// rank with the runtime's reason, not a panic or a hang. (The GPU check measures real
/// device buffers: scripts/gpu/gpu_staged_check.sh.)
#[test]
fn device_buffers_need_the_device() {
    let f =
        run(oxccl(["bench", "--ranks", "2", "--backend", "local", "--device", "cpu", "-e", "64", "-n", "1"]), LIMIT);
    assert_eq!(f.code(), Some(0), "{}", f.all());
    assert!(f.stdout.contains("buffers on cpu"), "{}", f.all());
    if std::path::Path::new("/dev/nvidia0").exists() {
        return;
    }
    let f =
        run(oxccl(["bench", "--ranks", "2", "--backend", "local", "--device", "cuda:0", "-e", "64", "-n", "1"]), LIMIT);
    assert_eq!(f.code(), Some(1), "{}", f.all());
    assert!(f.stderr.contains("--device") && f.stderr.contains("nccl"), "{}", f.all());
}

#[test]
fn two_nodes_on_one_host_meet_at_node_0s_store() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let bin = env!("CARGO_BIN_EXE_oxccl");
    let node = |k: &str| {
        let mut c = oxccl(["run", "-n", "2", "--nnodes", "2", "--node-rank", k, "--master-addr", "127.0.0.1"]);
        c.args(["--master-port", &port.to_string(), "--timeout", "40", "--", bin, "bench", "all_gather"]);
        c.args(["--backend", "cpu", "-e", "1K", "-n", "2", "-w", "1"])
            .env("OXCCL_SECRET", "test-secret-shared-by-both-nodes");
        c
    };
    let node0 = node("0").spawn().expect("start node 0");
    let node1 = node("1").spawn().expect("start node 1");
    let f0 = crate::common::wait(node0, LIMIT);
    let f1 = crate::common::wait(node1, LIMIT);
    assert_eq!(f0.code(), Some(0), "node 0: {}", f0.all());
    assert_eq!(f1.code(), Some(0), "node 1: {}", f1.all());
    assert!(f0.stdout.contains("[rank 0] # oxccl bench: 4 ranks on backend cpu"), "{}", f0.all());
    assert!(f0.stdout.contains("# Out of bounds values : 0 OK"), "{}", f0.all());
}

/// The advice to start under a launcher, given only outside one.
const LAUNCH_ADVICE: &str = "start oxccl bench with `--ranks N`, or under a launcher";

#[test]
fn launcher_advice_only_when_the_launch_environment_is_missing_outside_a_launcher() {
    let bench = |env: &[(&str, &str)]| {
        let mut c = oxccl(["bench", "all_reduce", "--backend", "cpu", "-e", "64", "-n", "1", "-w", "0"]);
        // Were a case to wait for a store after all, it would fail fast.
        c.env("OXCCL_TIMEOUT", "2s").envs(env.iter().copied());
        run(c, LIMIT)
    };
    // By hand, half a launch environment (no secret, no store): start it properly.
    let f = bench(&[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert_eq!(f.code(), Some(1), "{}", f.all());
    assert!(f.stderr.contains("could not join the job") && f.stderr.contains(LAUNCH_ADVICE), "{}", f.all());

    let f = bench(&[("RANK", "1")]);
    assert!(f.stderr.contains("WORLD_SIZE is not") && f.stderr.contains(LAUNCH_ADVICE), "{}", f.all());

    // A launch environment missing WORLD_SIZE under a launcher: the launcher's setup to fix.
    for (var, val, name) in [
        ("OXCCL_LAUNCHER", "oxccl", "oxccl run"),
        ("TORCHELASTIC_RUN_ID", "x", "torchrun"),
        ("PMI_SIZE", "2", "mpirun"),
    ] {
        let f = bench(&[("RANK", "1"), (var, val)]);
        assert_eq!(f.code(), Some(1), "{}", f.all());
        assert!(f.stderr.contains("could not join the job"), "{}", f.all());
        assert!(!f.stderr.contains(LAUNCH_ADVICE), "{var}: {}", f.all());
        assert!(f.stderr.contains(&format!("runs under {name}")), "{var}: {}", f.all());
    }

    // A store that does not answer, under oxccl run: no launch advice, but where to look.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port");
    let store = closed.to_string();
    let f = bench(&[
        ("OXCCL_LAUNCHER", "oxccl"),
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("OXCCL_SECRET", "test-secret"),
        ("OXCCL_STORE_ADDR", &store),
        ("OXCCL_TIMEOUT", "1s"),
    ]);
    assert_eq!(f.code(), Some(1), "{}", f.all());
    assert!(f.stderr.contains("no store answered") && !f.stderr.contains(LAUNCH_ADVICE), "{}", f.all());
    assert!(f.stderr.contains("Another rank may have failed first"), "{}", f.all());
}

#[test]
fn a_rank_of_oxccl_run_that_cannot_join_is_not_told_to_use_oxccl_run() {
    // Rank 1 loses its RANK (WORLD_SIZE stays): a broken launch environment under oxccl run.
    let bin = env!("CARGO_BIN_EXE_oxccl");
    let script = format!(r#"[ "$RANK" = 1 ] && unset RANK; exec {bin} bench all_reduce --backend cpu -e 64 -n 1 -w 0"#);
    let f = run(oxccl(["run", "-n", "2", "--timeout", "30", "--", "sh", "-c", &script]), LIMIT);
    assert_ne!(f.code(), Some(0), "{}", f.all());
    assert!(f.stderr.contains("[rank 1] oxccl bench: error: could not join the job"), "{}", f.all());
    assert!(f.stderr.contains("runs under oxccl run"), "{}", f.all());
    assert!(!f.stderr.contains(LAUNCH_ADVICE), "{}", f.all());
}
