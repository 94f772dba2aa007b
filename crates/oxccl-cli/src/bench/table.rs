//! The results table, formatted like nccl-tests so existing habits and scripts carry over.
//!
//! ```text
//! #                                                        out-of-place                       in-place
//! #       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
//! #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
//!            8             2     float     sum      -1     4.12    0.00    0.00       0     3.90    0.00    0.00       0
//! ```

use oxccl::{Algorithm, DType, ReduceOp};
use serde::Serialize;

use super::ops::BenchOp;

/// The timing of one placement (out of place or in place) of one row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Measurement {
    /// Average time per iteration, the maximum over ranks, in microseconds.
    pub time_us: f64,
    /// Algorithm bandwidth: size / time, in GB/s (10⁹ bytes per second).
    pub algbw: f64,
    /// Bus bandwidth: algbw × the operation's bus factor, in GB/s.
    pub busbw: f64,
    /// Elements that differed from the expected result, summed over ranks (None: not checked).
    pub wrong: Option<u64>,
    /// Timed iterations behind `time_us`.
    pub iters: usize,
}

impl Measurement {
    /// The measurement of `op` moving `bytes` among `n` ranks in `time_us` microseconds.
    pub fn new(op: BenchOp, bytes: usize, n: usize, time_us: f64, wrong: Option<u64>) -> Measurement {
        let algbw = gbps(bytes, time_us);
        Measurement { time_us, algbw, busbw: algbw * op.bus_factor(n), wrong, iters: 0 }
    }

    /// The same measurement, `iters` iterations long.
    pub fn with_iters(mut self, iters: usize) -> Measurement {
        self.iters = iters;
        self
    }
}

/// `bytes` per `time_us` microseconds in GB/s (0 for a zero time).
pub fn gbps(bytes: usize, time_us: f64) -> f64 {
    if time_us > 0.0 {
        bytes as f64 / (time_us * 1e-6) / 1e9
    } else {
        0.0
    }
}

/// The memcpy references of one size (`--memcpy`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Memcpy {
    /// Average time of one single-threaded copy on rank 0 (the others idle), microseconds.
    pub time_us: f64,
    /// Bytes copied per second by that copy, in GB/s.
    pub gbps: f64,
    /// Bytes copied per second per rank when every rank copies at the same time (the
    /// slowest rank's rate), in GB/s: what the memory system gives each rank under load.
    pub all_ranks_gbps: f64,
}

/// One line of the table: one operation at one size.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The operation.
    pub op: BenchOp,
    /// Size in bytes (as nccl-tests defines it for the operation).
    pub bytes: usize,
    /// Element count.
    pub count: usize,
    /// Element type (None for barrier).
    pub dtype: Option<DType>,
    /// Reduce op (None when the operation does not reduce).
    pub redop: Option<ReduceOp>,
    /// Root (None when the operation has none).
    pub root: Option<usize>,
    /// Out-of-place timing.
    pub out_of_place: Measurement,
    /// In-place timing, when the operation has an in-place form.
    pub in_place: Option<Measurement>,
    /// The memcpy reference, with `--memcpy`.
    pub memcpy: Option<Memcpy>,
    /// The algorithm the backend ran (None where it does not say: mpi, nccl, send/recv).
    pub algorithm: Option<Algorithm>,
}

/// The type name nccl-tests uses for `d` (`float`, `half`, `bfloat16`, `int32`, ...).
pub fn type_name(d: DType) -> &'static str {
    match d {
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::I64 => "int64",
        DType::U64 => "uint64",
        DType::F16 => "half",
        DType::BF16 => "bfloat16",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

const LEAD: usize = 52; // size, count, type, redop and root columns, with the leading '#'
const BLOCK: usize = 33; // time, algbw, busbw and #wrong of one placement

fn center(s: &str, width: usize) -> String {
    let pad = width.saturating_sub(s.len());
    format!("{}{s}{}", " ".repeat(pad / 2), " ".repeat(pad - pad / 2))
}

/// The three header lines (with a trailing newline each).
pub fn header(memcpy: bool) -> String {
    let mut top = format!("#{}{}{}", " ".repeat(LEAD - 1), center("out-of-place", BLOCK), center("in-place", BLOCK));
    let mut names = String::from(
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
    );
    let units =
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)";
    if memcpy {
        top.push_str(&center("reference", 30));
        names.push_str("  memcpy(GB/s)  all-ranks(GB/s)");
    }
    format!("{}\n{names}\n{units}\n", top.trim_end())
}

/// nccl-tests' time format: fewer decimals for longer times, 7 characters.
fn format_time(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

fn format_measurement(m: Option<&Measurement>) -> String {
    match m {
        Some(m) => {
            let wrong = m.wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string());
            format!("  {}  {:6.2}  {:6.2}  {wrong:>6}", format_time(m.time_us), m.algbw, m.busbw)
        }
        None => format!("  {:>7}  {:>6}  {:>6}  {:>6}", "-", "-", "-", "-"),
    }
}

/// One table line (no newline).
pub fn format_row(row: &Row, memcpy: bool) -> String {
    let dtype = row.dtype.map_or("none", type_name);
    let redop = row.redop.map_or("none", |r| r.name());
    let root = row.root.map_or(-1, |r| r as i64);
    let mut s = format!("{:12}  {:12}  {dtype:>8}  {redop:>6}  {root:6}", row.bytes, row.count);
    s.push_str(&format_measurement(Some(&row.out_of_place)));
    s.push_str(&format_measurement(row.in_place.as_ref()));
    if memcpy {
        match row.memcpy {
            Some(m) => s.push_str(&format!("  {:12.2}  {:15.2}", m.gbps, m.all_ranks_gbps)),
            None => s.push_str(&format!("  {:>12}  {:>15}", "-", "-")),
        }
    }
    s
}

/// The wrong elements of `rows`, or None when nothing was checked.
pub fn total_wrong(rows: &[Row]) -> Option<u64> {
    let all = rows.iter().flat_map(|r| std::iter::once(&r.out_of_place).chain(r.in_place.as_ref()));
    all.map(|m| m.wrong).sum()
}

/// The two closing lines of one operation's table (with newlines).
pub fn footer(rows: &[Row]) -> String {
    let bounds = match total_wrong(rows) {
        Some(0) => "0 OK".to_string(),
        Some(w) => format!("{w} FAILED"),
        None => "not checked (-c 0)".to_string(),
    };
    let bws: Vec<f64> = rows
        .iter()
        .filter(|r| r.op != BenchOp::Barrier)
        .flat_map(|r| std::iter::once(&r.out_of_place).chain(r.in_place.as_ref()))
        .map(|m| m.busbw)
        .collect();
    let avg = if bws.is_empty() { 0.0 } else { bws.iter().sum::<f64>() / bws.len() as f64 };
    format!("# Out of bounds values : {bounds}\n# Avg bus bandwidth    : {avg:.4}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Row {
        Row {
            op: BenchOp::AllReduce,
            bytes: 8,
            count: 2,
            dtype: Some(DType::F32),
            redop: Some(ReduceOp::Sum),
            root: None,
            out_of_place: Measurement { time_us: 4.12, algbw: 0.0, busbw: 0.0, wrong: Some(0), iters: 10 },
            in_place: Some(Measurement { time_us: 3.9, algbw: 0.0, busbw: 0.0, wrong: Some(0), iters: 10 }),
            memcpy: None,
            algorithm: None,
        }
    }

    #[test]
    fn rows_line_up_with_nccl_tests() {
        let want = "           8             2     float     sum      -1     4.12    0.00    0.00       0     3.90    0.00    0.00       0";
        assert_eq!(format_row(&row(), false), want);
        let h = header(false);
        let lines: Vec<&str> = h.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1].len(), want.len());
        // Every column name ends where its values end (right-aligned columns).
        let ends = |s: &str| -> Vec<usize> {
            let b = s.as_bytes();
            (1..=b.len()).filter(|&i| b[i - 1] != b' ' && (i == b.len() || b[i] == b' ')).collect()
        };
        assert_eq!(ends(&lines[1].replacen('#', " ", 1)), ends(want));
        assert!(lines[0].contains("out-of-place") && lines[0].contains("in-place"));
    }

    #[test]
    fn missing_in_place_and_unchecked_values() {
        let mut r = row();
        r.op = BenchOp::Gather;
        r.redop = None;
        r.root = Some(0);
        r.in_place = None;
        r.out_of_place.wrong = None;
        let s = format_row(&r, true);
        assert!(s.contains("  none       0"), "{s}");
        assert!(s.contains("N/A"), "{s}");
        assert!(s.trim_end().ends_with('-'), "{s}");
        assert_eq!(s.len(), format_row(&row(), true).len());
        assert!(header(true).contains("memcpy(GB/s)  all-ranks(GB/s)"));
        let mut m = row();
        m.memcpy = Some(Memcpy { time_us: 1.0, gbps: 7.5, all_ranks_gbps: 5.25 });
        assert!(format_row(&m, true).ends_with("          7.50             5.25"), "{}", format_row(&m, true));
        assert_eq!(format_row(&m, true).len(), s.len());
    }

    #[test]
    fn times_and_bandwidths() {
        assert_eq!(format_time(4.123), "   4.12");
        assert_eq!(format_time(123.45), "  123.5");
        assert_eq!(format_time(12345.6), "  12346");
        let m = Measurement::new(BenchOp::AllReduce, 1_000_000, 4, 100.0, Some(0));
        assert!((m.algbw - 10.0).abs() < 1e-9);
        assert!((m.busbw - 15.0).abs() < 1e-9);
        assert_eq!(gbps(8, 0.0), 0.0);
        assert_eq!(type_name(DType::BF16), "bfloat16");
        assert_eq!(type_name(DType::F16), "half");
    }

    #[test]
    fn footers_sum_wrong_values_and_average_busbw() {
        let mut a = row();
        a.out_of_place.busbw = 2.0;
        a.in_place.as_mut().unwrap().busbw = 4.0;
        assert_eq!(footer(&[a.clone()]), "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 3.0000\n");
        a.in_place.as_mut().unwrap().wrong = Some(5);
        assert!(footer(&[a.clone()]).contains("5 FAILED"));
        a.out_of_place.wrong = None;
        a.in_place.as_mut().unwrap().wrong = None;
        assert!(footer(&[a]).contains("not checked"));
    }
}
