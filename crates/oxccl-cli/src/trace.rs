//! `oxccl trace`: offline reading of what a job left behind.
//!
//! - `oxccl trace analyze DIR`: the flight recorders' dumps, through
//!   `oxccl::perf::analyze` (a public API the conformance tests use too);
//! - `oxccl trace merge DIR`: the profiler's Chrome traces (`OXCCL_PROFILE=trace:DIR`, one
//!   per rank and communicator) joined into one timeline ([`merge_traces`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use oxccl::{Error, Result};

/// `oxccl trace analyze DIR`: 0 when the dumps show no problem, 1 when they do, 2 when they
/// cannot be read.
pub(crate) fn analyze_command(dir: &Path) -> ExitCode {
    match oxccl::perf::analyze::analyze(dir) {
        Ok(a) => {
            println!("{} dump(s) in {}", a.dumps, dir.display());
            for f in &a.findings {
                println!("{} {f}", if f.is_problem() { "PROBLEM" } else { "note   " });
            }
            if a.has_problems() {
                ExitCode::from(1)
            } else {
                println!("no problem found");
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("oxccl trace analyze: {e}");
            ExitCode::from(2)
        }
    }
}

/// `oxccl trace merge DIR [-o FILE]`.
pub(crate) fn merge_command(dir: &Path, output: Option<PathBuf>) -> ExitCode {
    let out = output.unwrap_or_else(|| dir.join("merged.json"));
    let merged = match merge_traces(dir) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("oxccl trace merge: {e}");
            return ExitCode::from(2);
        }
    };
    let events = merged["traceEvents"].as_array().map_or(0, Vec::len);
    match std::fs::write(&out, merged.to_string()) {
        Ok(()) => {
            println!("{events} events written to {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("oxccl trace merge: writing {}: {e}", out.display());
            ExitCode::from(2)
        }
    }
}

/// Joins the Chrome traces in `dir` (`oxccl-trace-*.json`, one per rank and communicator,
/// as `oxccl::perf::Profiler::chrome_trace` writes them) into one timeline: each file's
/// timestamps move by its communicator's creation time (wall clock) minus the earliest one,
/// and the events are ordered by time.
///
/// # Errors
/// [`Error::Io`] when `dir` or a file cannot be read; [`Error::InvalidArgument`] when `dir`
/// holds no trace or a file is not one.
pub(crate) fn merge_traces(dir: &Path) -> Result<serde_json::Value> {
    let mut traces = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), &e))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("oxccl-trace-") && name.ends_with(".json")) {
            continue;
        }
        let path = e.path();
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::invalid(format!("{} is not a trace: {e}", path.display())))?;
        let created = v["otherData"]["created_unix_us"].as_u64().ok_or_else(|| {
            Error::invalid(format!("{} is not an oxccl trace (no otherData.created_unix_us)", path.display()))
        })?;
        traces.push((created, v));
    }
    let Some(first) = traces.iter().map(|t| t.0).min() else {
        return Err(Error::invalid(format!(
            "{} holds no trace (oxccl-trace-*.json); OXCCL_PROFILE=trace:DIR writes them",
            dir.display()
        )));
    };
    let mut meta = Vec::new();
    let mut events = Vec::new();
    for (created, v) in traces {
        let shift = (created - first) as f64;
        if let Some(list) = v["traceEvents"].as_array() {
            for e in list {
                let mut e = e.clone();
                if let Some(ts) = e["ts"].as_f64() {
                    e["ts"] = (ts + shift).into();
                    events.push(e);
                } else {
                    meta.push(e);
                }
            }
        }
    }
    events.sort_by(|a, b| a["ts"].as_f64().unwrap_or(0.0).total_cmp(&b["ts"].as_f64().unwrap_or(0.0)));
    meta.extend(events);
    Ok(serde_json::json!({ "traceEvents": meta, "displayTimeUnit": "ns", "otherData": { "created_unix_us": first } }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl::{Config, ReduceOp};

    #[test]
    fn the_traces_of_a_profiled_local_world_merge_into_one_ordered_timeline() {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("oxccl-cli-trace-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = Config::new().set("OXCCL_PROFILE", &format!("trace:{}", dir.display())).unwrap();
        oxccl::local::run_with(&cfg, 3, |c| {
            let mut v = [1.0f32; 2];
            for _ in 0..5 {
                c.all_reduce(&mut v[..], ReduceOp::Sum).unwrap();
            }
            let mut b = [0u8; 40];
            c.broadcast(&mut b[..], 0).unwrap();
        })
        .unwrap();
        // The communicators are gone: each rank wrote its trace, one event per operation.
        let merged = merge_traces(&dir).unwrap();
        let ts: Vec<f64> = merged["traceEvents"].as_array().unwrap().iter().filter_map(|e| e["ts"].as_f64()).collect();
        assert_eq!(ts.len(), 3 * 6);
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "the merged timeline is ordered");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
