//! `--json FILE`: every measurement as one flat record (one per operation, size and
//! placement), easy to load into pandas or jq, plus the run's settings.

use std::path::Path;

use serde::Serialize;

use super::table::{type_name, Row};

/// The whole file.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Always `oxccl bench`.
    pub tool: &'static str,
    /// The version of oxccl that measured.
    pub version: &'static str,
    /// The backend measured.
    pub backend: String,
    /// Number of ranks.
    pub world_size: usize,
    /// Where the measured buffers lived: `cpu`, or the GPU (`cuda:0`, ...) of rank 0.
    pub device: String,
    /// Timed iterations per measurement: a number, or `auto` (each row's `iters` says how
    /// many it took).
    pub iters: String,
    /// Untimed iterations before them.
    pub warmup: usize,
    /// Whether results were checked.
    pub check: bool,
    /// The measurements.
    pub rows: Vec<Record>,
}

/// One measurement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// Operation name (`all_reduce`, ...).
    pub op: &'static str,
    /// Size in bytes.
    pub size: usize,
    /// Element count.
    pub count: usize,
    /// Element type, nccl-tests' name (`float`), or `none`.
    pub dtype: &'static str,
    /// Reduce op, or `none`.
    pub redop: &'static str,
    /// Root, or -1.
    pub root: i64,
    /// Whether this is the in-place measurement.
    pub in_place: bool,
    /// The algorithm the backend ran (`Communicator::algorithm_for`); null where the backend
    /// does not say (mpi, nccl) or for send/recv.
    pub algorithm: Option<&'static str>,
    /// Average time per iteration (maximum over ranks), microseconds.
    pub time_us: f64,
    /// Timed iterations behind it.
    pub iters: usize,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// Wrong elements summed over ranks; null when not checked.
    pub wrong: Option<u64>,
    /// Single-threaded memcpy of the same bytes on rank 0, microseconds (with `--memcpy`).
    pub memcpy_time_us: Option<f64>,
    /// Its bandwidth, GB/s.
    pub memcpy_gbps: Option<f64>,
    /// Per-rank memcpy bandwidth with every rank copying at once (the slowest), GB/s.
    pub memcpy_all_ranks_gbps: Option<f64>,
}

/// The records of `rows`: out of place, then in place where measured.
pub fn records(rows: &[Row]) -> Vec<Record> {
    let mut out = Vec::new();
    for r in rows {
        let placements = std::iter::once((false, &r.out_of_place)).chain(r.in_place.as_ref().map(|m| (true, m)));
        for (in_place, m) in placements {
            out.push(Record {
                op: r.op.name(),
                size: r.bytes,
                count: r.count,
                dtype: r.dtype.map_or("none", type_name),
                redop: r.redop.map_or("none", |o| o.name()),
                root: r.root.map_or(-1, |x| x as i64),
                in_place,
                algorithm: r.algorithm.map(|a| a.name()),
                time_us: m.time_us,
                iters: m.iters,
                algbw_gbps: m.algbw,
                busbw_gbps: m.busbw,
                wrong: m.wrong,
                memcpy_time_us: r.memcpy.map(|c| c.time_us),
                memcpy_gbps: r.memcpy.map(|c| c.gbps),
                memcpy_all_ranks_gbps: r.memcpy.map(|c| c.all_ranks_gbps),
            });
        }
    }
    out
}

/// Writes `report` to `path` as pretty-printed JSON.
///
/// # Errors
/// A message naming the file when it cannot be written.
pub fn write(path: &Path, report: &Report) -> Result<(), String> {
    let text =
        serde_json::to_string_pretty(report).map_err(|e| format!("could not encode the results as JSON: {e}"))?;
    std::fs::write(path, text + "\n").map_err(|e| {
        format!(
            "could not write the JSON results to {}: {e}; check that the directory exists and is writable",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::ops::BenchOp;
    use crate::bench::table::{Measurement, Memcpy};
    use oxccl::{DType, ReduceOp};

    #[test]
    fn one_record_per_placement() {
        let m = Measurement { time_us: 2.0, algbw: 1.0, busbw: 1.5, wrong: Some(0), iters: 7 };
        let row = Row {
            op: BenchOp::AllReduce,
            bytes: 64,
            count: 16,
            dtype: Some(DType::F32),
            redop: Some(ReduceOp::Sum),
            root: None,
            out_of_place: m,
            in_place: Some(m),
            memcpy: Some(Memcpy { time_us: 0.5, gbps: 0.128, all_ranks_gbps: 0.1 }),
            algorithm: Some(oxccl::Algorithm::Ring),
        };
        let gather =
            Row { op: BenchOp::Gather, redop: None, root: Some(0), in_place: None, memcpy: None, ..row.clone() };
        let recs = records(&[row, gather]);
        assert_eq!(recs.len(), 3);
        assert!(!recs[0].in_place && recs[1].in_place);
        assert_eq!((recs[0].iters, recs[0].algorithm), (7, Some("ring")));
        assert_eq!(recs[2].op, "gather");
        assert_eq!(recs[2].redop, "none");
        assert_eq!(recs[2].root, 0);
        let report = Report {
            tool: "oxccl bench",
            version: "0",
            backend: "local".into(),
            world_size: 2,
            device: "cpu".into(),
            iters: "1".into(),
            warmup: 0,
            check: true,
            rows: recs,
        };
        let v: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(v["rows"][0]["memcpy_gbps"], 0.128);
        assert_eq!(v["rows"][2]["memcpy_gbps"], serde_json::Value::Null);
        assert_eq!(v["rows"][1]["dtype"], "float");
    }

    #[test]
    fn unwritable_paths_are_explained() {
        let report = Report {
            tool: "oxccl bench",
            version: "0",
            backend: "local".into(),
            world_size: 1,
            device: "cpu".into(),
            iters: "1".into(),
            warmup: 0,
            check: true,
            rows: vec![],
        };
        let e = write(Path::new("/nonexistent-dir/x.json"), &report).unwrap_err();
        assert!(e.contains("/nonexistent-dir/x.json") && e.contains("writable"), "{e}");
    }
}
