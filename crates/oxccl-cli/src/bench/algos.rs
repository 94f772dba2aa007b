//! `oxccl bench --algo all`: every algorithm of each operation measured side by side, with
//! the one the backend's automatic choice runs marked, and how far that choice is from the
//! best: `pick/best`, the picked algorithm's time over the fastest one's, both measured
//! forced in the same rounds (the `auto` column runs the choice itself, as a check; on a
//! noisy machine it differs from its twin by the noise, which says how far to trust the
//! ratio).
//!
//! For each size, every candidate (auto, then each algorithm of the operation, then
//! `shared_memory` where the communicator has it) is measured out of place, in
//! [`ROUNDS`] interleaved rounds, each round starting at the next candidate; each keeps its
//! best round, so a noisy moment hurts one round of every candidate alike instead of one
//! candidate, and no candidate always runs right after a switch. A candidate the communicator
//! refuses (an algorithm it cannot run here) is left out of the row on every rank alike.

use oxccl::{Algorithm, Communicator, Error, ReduceOp};

use super::check;
use super::elem::BenchElem;
use super::ops::{self, BenchOp, OpArgs, Place};
use super::output::out;
use super::plan::Plan;
use super::timing::timed;

/// Interleaved rounds per size.
pub const ROUNDS: usize = 5;

/// One size's results: (candidate, best µs) with `None` for a refused candidate, and the
/// algorithm auto ran.
struct Line {
    size: usize,
    times: Vec<Option<f64>>,
    picked: Option<Algorithm>,
}

/// The candidates for `op`: auto first.
fn candidates(op: BenchOp) -> Vec<Algorithm> {
    let mut c = vec![Algorithm::Auto];
    if let Some(kind) = op.kind() {
        c.extend(Algorithm::for_op(kind));
        // Those that need a layout of hosts: refused (shown as such) where it does not fit.
        c.extend([Algorithm::SharedMemory, Algorithm::Hierarchical].into_iter().filter(|a| a.applies_to(kind)));
    }
    c
}

/// Runs the sweep of `plan` on `comm`; rank 0 prints a table per operation. Returns the
/// number of wrong values (this mode does not check: 0).
///
/// # Errors
/// An operation's error other than a refused algorithm, prefixed with the rank.
pub fn sweep<T: BenchElem>(comm: &Communicator, plan: &Plan) -> Result<u64, String> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let elem = T::DTYPE.size();
    let mut startup = true;
    for &op in plan.ops.iter().filter(|op| op.kind().is_some() && **op != BenchOp::Barrier) {
        let algos = candidates(op);
        let mut lines = Vec::new();
        for size in plan.sizes_of(op) {
            let count = op.count_for(size, elem, n);
            let a = OpArgs { place: Place::OutOfPlace, redop: plan.redop, root: plan.root };
            let mut b = check::prepare::<T>(comm, op, count, &a);
            let mut times: Vec<Option<f64>> = vec![None; algos.len()];
            let mut refused = vec![false; algos.len()];
            for round in 0..ROUNDS {
                // Each round starts at another candidate: whoever runs first after the
                // previous size (or after the last candidate of the round before, with
                // other partners and other connections awake) pays for the switch, and
                // with rotation every candidate takes its turn at that.
                for i in (0..algos.len()).map(|k| (k + round) % algos.len()) {
                    let algo = algos[i];
                    if refused[i] {
                        continue;
                    }
                    let c = comm.with_algorithm(algo);
                    match timed(&c, plan, std::mem::take(&mut startup), || ops::run(&c, op, &mut b, &a)) {
                        Ok((t, _)) => {
                            let mut t = [t];
                            comm.all_reduce(&mut t, ReduceOp::Max).map_err(|e| format!("rank {rank}: {e}"))?;
                            times[i] = Some(times[i].map_or(t[0], |b: f64| b.min(t[0])));
                        }
                        // Refused before anything was sent: the same on every rank.
                        Err(Error::InvalidArgument(_)) => refused[i] = true,
                        Err(e) => return Err(format!("rank {rank}: {op} of {size} bytes with {algo}: {e}")),
                    }
                }
            }
            let kind = op.kind().ok_or_else(|| format!("{op} has no algorithms"))?;
            let picked =
                comm.algorithm_for(kind, op.message_bytes(count, elem, n)).map_err(|e| format!("rank {rank}: {e}"))?;
            lines.push(Line { size: count * elem, times, picked });
        }
        if rank == 0 {
            out(&render(op, n, &algos, &lines));
        }
    }
    Ok(0)
}

/// The table of one operation.
fn render(op: BenchOp, n: usize, algos: &[Algorithm], lines: &[Line]) -> String {
    let shown: Vec<usize> = (0..algos.len()).filter(|&i| lines.iter().any(|l| l.times[i].is_some())).collect();
    let mut s = format!(
        "#\n# {op} on {n} ranks: µs per call (out of place, best of {ROUNDS} interleaved rounds); * = what auto runs\n#"
    );
    s.push_str(&format!("{:>12}", "size"));
    for &i in &shown {
        s.push_str(&format!(" {:>18}", algos[i].name()));
    }
    s.push_str(&format!(" {:>10}\n", "pick/best"));
    for l in lines {
        s.push_str(&format!(" {:>12}", l.size));
        let best = shown.iter().skip(1).filter_map(|&i| l.times[i]).fold(f64::INFINITY, f64::min);
        for &i in &shown {
            let mark = if Some(algos[i]) == l.picked && i > 0 { "*" } else { " " };
            match l.times[i] {
                Some(t) => s.push_str(&format!(" {:>17.2}{mark}", t)),
                None => s.push_str(&format!(" {:>18}", "-")),
            }
        }
        let picked = shown.iter().skip(1).find(|&&i| Some(algos[i]) == l.picked).and_then(|&i| l.times[i]);
        match picked {
            Some(t) if best.is_finite() => s.push_str(&format!(" {:>10.2}\n", t / best)),
            _ => s.push_str(&format!(" {:>10}\n", "-")),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_marks_autos_pick_and_its_ratio_to_the_best() {
        let algos = candidates(BenchOp::AllGather);
        assert_eq!(algos[0], Algorithm::Auto);
        assert!(algos.contains(&Algorithm::Bruck) && algos.contains(&Algorithm::SharedMemory));
        let lines = [
            Line { size: 1024, times: vec![Some(2.2), Some(3.0), Some(2.0), None], picked: Some(Algorithm::Bruck) },
            Line { size: 2048, times: vec![Some(4.4), Some(6.0), Some(4.0), None], picked: Some(Algorithm::Ring) },
        ];
        let t = render(BenchOp::AllGather, 4, &algos, &lines);
        assert!(t.contains("2.00*"), "{t}");
        assert!(t.lines().any(|l| l.contains("1024") && l.ends_with("1.00")), "the pick is the best: {t}");
        assert!(t.lines().any(|l| l.contains("6.00*") && l.ends_with("1.50")), "ring over bruck: {t}");
        assert!(!t.contains("shared_memory"), "a column nobody measured is left out: {t}");
    }
}
