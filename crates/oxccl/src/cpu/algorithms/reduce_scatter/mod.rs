//! reduce_scatter: rank i ends with block i of the element-wise reduction of all inputs.

pub mod recursive_halving;
pub mod ring;

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::cpu::splitmix64;
    use crate::op_kind::OpKind;
    use crate::reduce_op::ReduceOp;

    const COUNTS: [usize; 8] = [0, 1, 2, 3, 7, 13, 64, 1000];

    /// A pseudo-random integer in -1000..=1000 for input element `i` of rank `rank`.
    fn value(rank: usize, i: usize) -> i64 {
        (splitmix64(((rank as u64) << 40) ^ i as u64) % 2001) as i64 - 1000
    }

    /// Block `rank` (of `count` elements) of the reduction of every rank's input.
    fn reference(n: usize, rank: usize, count: usize, op: ReduceOp) -> Vec<i64> {
        (rank * count..(rank + 1) * count)
            .map(|i| {
                let vals = (0..n).map(|r| value(r, i));
                match op {
                    ReduceOp::Sum => vals.sum(),
                    ReduceOp::Avg => vals.sum::<i64>() / n as i64,
                    ReduceOp::Min => vals.min().unwrap_or(0),
                    _ => vals.max().unwrap_or(0),
                }
            })
            .collect()
    }

    type Case = (Algorithm, ReduceOp, usize, Vec<i64>, Vec<f64>, Vec<i64>);

    #[test]
    fn every_algorithm_matches_the_sequential_reference() {
        let ops = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];
        for n in 1..=8 {
            let out = crate::local::run(n, |comm| -> crate::Result<Vec<Case>> {
                let r = comm.rank();
                let mut cases = Vec::new();
                for &algo in Algorithm::for_op(OpKind::ReduceScatter) {
                    let c = comm.with_algorithm(algo);
                    for count in COUNTS {
                        for op in ops {
                            let input: Vec<i64> = (0..n * count).map(|i| value(r, i)).collect();
                            let mut out = vec![0i64; count];
                            c.reduce_scatter(&input, &mut out, op)?;
                            let finput: Vec<f64> = input.iter().map(|&x| x as f64).collect();
                            let mut fout = vec![0f64; count];
                            c.reduce_scatter(&finput, &mut fout, op)?;
                            let mut whole = input;
                            c.reduce_scatter_in_place(&mut whole, op)?;
                            let in_place = whole[r * count..(r + 1) * count].to_vec();
                            cases.push((algo, op, count, out, fout, in_place));
                        }
                    }
                }
                Ok(cases)
            })
            .unwrap();
            for (rank, res) in out.into_iter().enumerate() {
                for (algo, op, count, out, fout, in_place) in res.unwrap() {
                    let want = reference(n, rank, count, op);
                    let what = format!("{algo} {op} n={n} count={count} rank={rank}");
                    assert_eq!(out, want, "i64 {what}");
                    assert_eq!(in_place, want, "in place {what}");
                    if op != ReduceOp::Avg {
                        let fwant: Vec<f64> = want.iter().map(|&x| x as f64).collect();
                        assert_eq!(fout, fwant, "f64 {what}");
                    }
                }
            }
        }
    }
}
