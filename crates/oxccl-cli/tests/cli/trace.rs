//! `oxccl trace analyze DIR`: its words and exit codes (0 no problem, 1 a problem, 2 no
//! dumps), on dumps written the way flight recorders write them.

use std::process::Command;

use oxccl::perf::{Dump, OpRecord, OpState};

const OXCCL: &str = env!("CARGO_BIN_EXE_oxccl");

fn dir(name: &str) -> std::path::PathBuf {
    // In the build's scratch directory: emptied and reused by every run.
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("trace-cli-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn dump(rank: usize, ops: &[(&str, OpState)]) -> Dump {
    let ops = ops
        .iter()
        .enumerate()
        .map(|(i, (op, state))| OpRecord {
            seq: i as u64,
            op: op.to_string(),
            dtype: "f32".into(),
            count: 16,
            bytes: 64,
            root: None,
            reduce: None,
            state: *state,
            enqueued_us: 10.0 * i as f64,
            started_us: Some(10.0 * i as f64),
            ended_us: Some(10.0 * i as f64 + 2.0),
            waiting_on: None,
            error: None,
        })
        .collect();
    Dump {
        version: 1,
        job: Some("t".into()),
        rank,
        world_size: 2,
        comm: 0,
        backend: "cpu".into(),
        pid: 1,
        created_unix_us: 5,
        dumped_us: 100.0,
        reason: "SIGUSR1".into(),
        dropped: 0,
        ops,
    }
}

fn analyze(d: &std::path::Path) -> (i32, String) {
    let out = Command::new(OXCCL).args(["trace", "analyze"]).arg(d).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn exit_codes_say_whether_the_dumps_show_a_problem() {
    use OpState::*;
    let healthy = dir("healthy");
    for r in 0..2 {
        dump(r, &[("all_reduce", Completed), ("broadcast", Completed)]).write(&healthy).unwrap();
    }
    let (code, text) = analyze(&healthy);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2 dump(s)") && text.contains("no problem found"), "{text}");

    let diverged = dir("diverged");
    dump(0, &[("all_reduce", Completed), ("broadcast", Failed)]).write(&diverged).unwrap();
    dump(1, &[("all_reduce", Completed), ("barrier", Failed)]).write(&diverged).unwrap();
    let (code, text) = analyze(&diverged);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("PROBLEM communicator 0: the ranks diverged at collective #1"), "{text}");

    let empty = dir("empty");
    let (code, text) = analyze(&empty);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("holds no flight-recorder dump") && text.contains("OXCCL_FR_DIR"), "{text}");
    for d in [healthy, diverged, empty] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn merge_joins_the_ranks_traces_on_one_clock() {
    let d = dir("merge");
    // Two ranks whose communicators were created 1000 us apart.
    for (rank, created) in [(0u64, 5_000u64), (1, 6_000)] {
        let trace = serde_json::json!({
            "traceEvents": [
                { "name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": { "name": format!("rank {rank}") } },
                { "name": "all_reduce", "ph": "X", "ts": 10.0, "dur": 5.0, "pid": rank, "tid": 0 },
                { "name": "barrier", "ph": "X", "ts": 500.0, "dur": 5.0, "pid": rank, "tid": 0 },
            ],
            "otherData": { "created_unix_us": created }
        });
        std::fs::write(d.join(format!("oxccl-trace-t-comm0-rank{rank}.json")), trace.to_string()).unwrap();
    }
    let out = Command::new(OXCCL).args(["trace", "merge"]).arg(&d).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let merged: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("merged.json")).unwrap()).unwrap();
    let timed: Vec<(u64, f64)> = merged["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| (e["pid"].as_u64().unwrap(), e["ts"].as_f64().unwrap()))
        .collect();
    assert_eq!(timed, [(0, 10.0), (0, 500.0), (1, 1010.0), (1, 1500.0)]);
    let (code, text) = {
        let out = Command::new(OXCCL).args(["trace", "merge"]).arg(dir("nomerge")).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("OXCCL_PROFILE=trace:DIR"), "{text}");
    std::fs::remove_dir_all(d).unwrap();
}
