//! all_gather: every rank ends with every rank's block, in rank order.

pub mod bruck;
pub mod ring;

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::cpu::splitmix64;
    use crate::op_kind::OpKind;

    const COUNTS: [usize; 8] = [0, 1, 2, 3, 7, 13, 64, 1000];

    fn value(rank: usize, i: usize) -> u64 {
        splitmix64(((rank as u64) << 40) ^ i as u64)
    }

    type Case = (Algorithm, usize, Vec<i64>, Vec<i64>, Vec<u8>);

    #[test]
    fn every_algorithm_matches_the_sequential_reference() {
        for n in 1..=8 {
            let out = crate::local::run(n, |comm| -> crate::Result<Vec<Case>> {
                let r = comm.rank();
                let mut cases = Vec::new();
                for &algo in Algorithm::for_op(OpKind::AllGather) {
                    let c = comm.with_algorithm(algo);
                    for count in COUNTS {
                        let input: Vec<i64> = (0..count).map(|i| value(r, i) as i64).collect();
                        let mut out = vec![0i64; n * count];
                        c.all_gather(&input, &mut out)?;
                        let mut in_place = vec![-1i64; n * count];
                        in_place[r * count..(r + 1) * count].copy_from_slice(&input);
                        c.all_gather_in_place(&mut in_place)?;
                        // One-byte elements: blocks of odd byte sizes.
                        let bytes: Vec<u8> = (0..count).map(|i| value(r, i) as u8).collect();
                        let mut bout = vec![0u8; n * count];
                        c.all_gather(&bytes, &mut bout)?;
                        cases.push((algo, count, out, in_place, bout));
                    }
                }
                Ok(cases)
            })
            .unwrap();
            for (rank, res) in out.into_iter().enumerate() {
                for (algo, count, out, in_place, bout) in res.unwrap() {
                    let want: Vec<u64> = (0..n).flat_map(|q| (0..count).map(move |i| value(q, i))).collect();
                    let what = format!("{algo} n={n} count={count} rank={rank}");
                    assert_eq!(out, want.iter().map(|&x| x as i64).collect::<Vec<_>>(), "i64 {what}");
                    assert_eq!(in_place, out, "in place {what}");
                    assert_eq!(bout, want.iter().map(|&x| x as u8).collect::<Vec<_>>(), "u8 {what}");
                }
            }
        }
    }
}
