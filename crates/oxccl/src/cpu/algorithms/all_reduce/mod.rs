//! all_reduce: every rank ends with the element-wise reduction of all inputs.

pub mod binomial_tree;
pub mod hierarchical;
pub mod rabenseifner;
pub mod recursive_doubling;
pub mod ring;

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::cpu::splitmix64;
    use crate::op_kind::OpKind;
    use crate::reduce_op::ReduceOp;

    const COUNTS: [usize; 8] = [0, 1, 2, 3, 7, 13, 64, 1000];

    /// A pseudo-random integer in -1000..=1000 for element `i` of rank `rank`'s input.
    fn value(rank: usize, i: usize, salt: u64) -> i64 {
        (splitmix64(((rank as u64) << 40) ^ ((i as u64) << 8) ^ salt) % 2001) as i64 - 1000
    }

    fn reference_i64(n: usize, count: usize, op: ReduceOp) -> Vec<i64> {
        (0..count)
            .map(|i| {
                let vals = (0..n).map(|r| value(r, i, 1));
                match op {
                    ReduceOp::Sum => vals.fold(0i64, i64::wrapping_add),
                    ReduceOp::Avg => vals.fold(0i64, i64::wrapping_add) / n as i64,
                    ReduceOp::Prod => vals.fold(1i64, i64::wrapping_mul),
                    ReduceOp::Min => vals.min().unwrap_or(0),
                    ReduceOp::Max => vals.max().unwrap_or(0),
                }
            })
            .collect()
    }

    fn reference_f64(n: usize, count: usize, op: ReduceOp) -> Vec<f64> {
        (0..count)
            .map(|i| {
                let vals = (0..n).map(|r| value(r, i, 2) as f64);
                match op {
                    ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                    _ => vals.sum(),
                }
            })
            .collect()
    }

    const FLOAT_OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg];

    type Case<T> = (Algorithm, ReduceOp, usize, Vec<T>);
    type Cases = (Vec<Case<i64>>, Vec<Case<f64>>);

    #[test]
    fn every_algorithm_matches_the_sequential_reference() {
        for n in 1..=8 {
            let out = crate::local::run(n, |comm| -> crate::Result<Cases> {
                let r = comm.rank();
                let (mut ints, mut floats) = (Vec::new(), Vec::new());
                for &algo in Algorithm::for_op(OpKind::AllReduce) {
                    let c = comm.with_algorithm(algo);
                    for count in COUNTS {
                        for op in ReduceOp::ALL {
                            let mut buf: Vec<i64> = (0..count).map(|i| value(r, i, 1)).collect();
                            c.all_reduce(&mut buf, op)?;
                            ints.push((algo, op, count, buf));
                        }
                        for op in [ReduceOp::Sum, ReduceOp::Max] {
                            let mut buf: Vec<f64> = (0..count).map(|i| value(r, i, 2) as f64).collect();
                            c.all_reduce(&mut buf, op)?;
                            floats.push((algo, op, count, buf));
                        }
                    }
                }
                Ok((ints, floats))
            })
            .unwrap();
            for (rank, res) in out.into_iter().enumerate() {
                let (ints, floats) = res.unwrap();
                for (algo, op, count, got) in ints {
                    assert_eq!(got, reference_i64(n, count, op), "i64 {algo} {op} n={n} count={count} rank={rank}");
                }
                for (algo, op, count, got) in floats {
                    assert_eq!(got, reference_f64(n, count, op), "f64 {algo} {op} n={n} count={count} rank={rank}");
                }
            }
        }
    }

    #[test]
    fn every_rank_gets_bitwise_identical_floats() {
        // Non-integer values whose sums round differently depending on the order of the
        // additions: every rank must still end with the same bits.
        let f = |rank: usize, i: usize| {
            let x = splitmix64(((rank as u64) << 40) ^ i as u64);
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 10f32.powi((x % 7) as i32 - 3)
        };
        for n in 1..=8 {
            let out = crate::local::run(n, |comm| -> crate::Result<Vec<Vec<u32>>> {
                let mut all = Vec::new();
                for &algo in Algorithm::for_op(OpKind::AllReduce) {
                    for count in COUNTS {
                        for op in FLOAT_OPS {
                            let mut buf: Vec<f32> = (0..count).map(|i| f(comm.rank(), i)).collect();
                            comm.with_algorithm(algo).all_reduce(&mut buf, op)?;
                            all.push(buf.iter().map(|x| x.to_bits()).collect());
                        }
                    }
                }
                Ok(all)
            })
            .unwrap();
            let out: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
            for (rank, res) in out.iter().enumerate() {
                assert_eq!(res, &out[0], "n={n}: rank {rank} differs from rank 0");
            }
            // And the sums are close to the exact ones.
            let mut cases = out[0].iter();
            for _ in Algorithm::for_op(OpKind::AllReduce) {
                for _count in COUNTS {
                    for op in FLOAT_OPS {
                        let got = cases.next().unwrap();
                        for (i, &bits) in got.iter().enumerate() {
                            let vals = (0..n).map(|r| f64::from(f(r, i)));
                            let want = match op {
                                ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                                ReduceOp::Avg => vals.sum::<f64>() / n as f64,
                                _ => vals.sum(),
                            };
                            let got = f64::from(f32::from_bits(bits));
                            assert!(
                                (got - want).abs() <= 1e-3 * want.abs().max(1.0),
                                "{op} n={n} [{i}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
