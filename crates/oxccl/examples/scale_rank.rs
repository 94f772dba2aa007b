//! One rank of a scale check (`scripts/bench/scale_check.sh` starts many): `oxccl::init()` from the
//! launcher's variables, then all_reduce, broadcast from the last rank, reduce_scatter and
//! barrier, each checked against the value every rank can compute. It prints one line:
//!
//! ```text
//! scale rank=R world=N init_start_ns=.. init_end_ns=.. ops_ms=.. threads=T fds=F ok=1
//! ```
//!
//! `threads` and `fds` are this process's, counted in /proc after the operations (the
//! progress threads and connections they needed are then all up). Exits non-zero (with
//! `ok=0` and the error) when a result is wrong or a call fails.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use oxccl::ReduceOp;

fn epoch_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// With `SCALE_PHASES` set, a line on stderr as each phase ends (where a stuck run stands).
fn phase(r: usize, what: &str, since: Instant) {
    if std::env::var_os("SCALE_PHASES").is_some() {
        eprintln!("rank {r}: {what} done at {:?}", since.elapsed());
    }
}

fn run() -> Result<(usize, usize, u128, u128, f64), String> {
    let start = epoch_ns();
    let t0 = Instant::now();
    let comm = oxccl::init().map_err(|e| format!("init: {e}"))?;
    let end = epoch_ns();
    let (r, n) = (comm.rank(), comm.world_size());
    phase(r, "init", t0);
    let ops = Instant::now();
    // all_reduce: element i of rank r is r + i.
    let len = 1000;
    let mut x: Vec<i64> = (0..len).map(|i| (r + i) as i64).collect();
    comm.all_reduce(&mut x, ReduceOp::Sum).map_err(|e| format!("all_reduce: {e}"))?;
    let t_ar = ops.elapsed();
    phase(r, "all_reduce", t0);
    let base = (n * (n - 1) / 2) as i64;
    if let Some(i) = (0..len).find(|&i| x[i] != base + (n * i) as i64) {
        return Err(format!("all_reduce: element {i} is {}, not {}", x[i], base + (n * i) as i64));
    }
    // broadcast from the last rank.
    let root = n - 1;
    let mut b: Vec<u32> = if r == root { (0..257).map(|i| i * 3 + 1).collect() } else { vec![0; 257] };
    comm.broadcast(&mut b, root).map_err(|e| format!("broadcast: {e}"))?;
    let t_bc = ops.elapsed();
    phase(r, "broadcast", t0);
    if b.iter().enumerate().any(|(i, &v)| v != i as u32 * 3 + 1) {
        return Err("broadcast: wrong values".into());
    }
    // reduce_scatter: 3 elements per rank; element j of rank r's input is r + j.
    let per = 3;
    let input: Vec<i64> = (0..per * n).map(|j| (r + j) as i64).collect();
    let mut out = vec![0i64; per];
    comm.reduce_scatter(&input, &mut out, ReduceOp::Sum).map_err(|e| format!("reduce_scatter: {e}"))?;
    for (k, &v) in out.iter().enumerate() {
        let j = r * per + k;
        if v != base + (n * j) as i64 {
            return Err(format!("reduce_scatter: element {k} is {v}, not {}", base + (n * j) as i64));
        }
    }
    let t_rs = ops.elapsed();
    phase(r, "reduce_scatter", t0);
    comm.barrier().map_err(|e| format!("barrier: {e}"))?;
    if std::env::var("SCALE_PHASES").is_ok() {
        eprintln!(
            "rank {r}: all_reduce {t_ar:?} broadcast {t_bc:?} reduce_scatter {t_rs:?} barrier {:?}",
            ops.elapsed()
        );
    }
    let ops_ms = ops.elapsed().as_secs_f64() * 1e3;
    let (threads, fds) = (count("/proc/self/task"), count("/proc/self/fd"));
    // A last barrier so that no rank leaves (closing its connections) while others count.
    comm.barrier().map_err(|e| format!("last barrier: {e}"))?;
    println!(
        "scale rank={r} world={n} init_start_ns={start} init_end_ns={end} ops_ms={ops_ms:.1} threads={threads} fds={fds} ok=1"
    );
    Ok((r, n, start, end, ops_ms))
}

fn main() {
    if let Err(e) = run() {
        let rank = std::env::var("RANK").unwrap_or_default();
        println!("scale rank={rank} ok=0 error={e}");
        eprintln!("rank {rank}: {e}");
        std::process::exit(1);
    }
}
