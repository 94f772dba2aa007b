//! A first look: the main collectives, a split and a scope on local worlds of 1 to 5 ranks.

use oxccl::{local, Algorithm, ReduceOp};

#[test]
fn smoke() {
    for n in 1..=5 {
        let out = local::run(n, |comm| -> oxccl::Result<()> {
            let r = comm.rank();
            let mut x = vec![r as f32 + 1.0; 7];
            comm.with_algorithm(Algorithm::Ring).all_reduce(&mut x, ReduceOp::Sum)?;
            assert_eq!(x, vec![(n * (n + 1) / 2) as f32; 7]);
            let mut g = vec![0i32; 3 * n];
            comm.all_gather(&[r as i32; 3], &mut g)?;
            assert_eq!(g, (0..n).flat_map(|i| [i as i32; 3]).collect::<Vec<_>>());
            let mut b = vec![r as u8; 5];
            comm.broadcast(&mut b, n - 1)?;
            assert_eq!(b, vec![(n - 1) as u8; 5]);
            let mut red = vec![1i64; 4];
            comm.reduce(&mut red, ReduceOp::Sum, 0)?;
            assert_eq!(red[0], if r == 0 { n as i64 } else { 1 });
            comm.barrier()?;
            let sub = comm.split(Some((r % 2) as u32), -(r as i64))?.unwrap();
            let mut y = [r as u64];
            sub.all_reduce(&mut y, ReduceOp::Max)?;
            assert_eq!(y[0] as usize % 2, r % 2);
            let mut a = vec![r as f64; 2];
            comm.scope(|s| {
                let w = s.all_reduce(&mut a, ReduceOp::Avg)?;
                let v = w.wait()?;
                assert_eq!(v[0], (n - 1) as f64 / 2.0);
                Ok(())
            })?;
            Ok(())
        })
        .unwrap();
        for o in out {
            o.unwrap();
        }
    }
}
