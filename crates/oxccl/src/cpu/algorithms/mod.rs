//! Collective algorithms, written once over a [`Transport`] so that every CPU transport
//! (in-memory, shared memory, TCP) runs the same code. One folder per operation, one file
//! per algorithm; `shared_memory/` is the family that runs every collective but the `_v`
//! forms directly in a shared segment when every rank is on one host.
//!
//! Every algorithm works on byte buffers whose element boundaries it respects (block
//! boundaries come from [`block`](blocks::block), in elements). Reductions go through a [`Kernel`].
//! Algorithms address peers by their rank in the communicator; [`Ctx`] translates to
//! transport ranks, stamps every frame with the collective's fingerprint and checks every
//! frame it receives against it.

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod barrier;
mod blocks;
pub mod broadcast;
mod ctx;
pub mod gather;
pub mod halving_doubling;
pub mod hosts;
pub mod pipeline;
pub mod reduce;
pub mod reduce_scatter;
pub mod scatter;
pub mod shared_memory;

pub use blocks::{block_bytes, split_pair, Kernel, Scratch};
pub use ctx::Ctx;
pub(crate) use ctx::{map_transport_error, Clock, FrameTally, HostPhases};

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::blocks::block;
    use super::ctx::LOOK_ELSEWHERE;
    use crate::error::{Error, Result};
    use crate::reduce_op::ReduceOp;

    #[test]
    fn a_receiver_whose_peer_never_sends_finds_the_mismatch_from_another() {
        // Rank 0 runs a binomial-tree all_reduce and waits on rank 1; ranks 1 and 2 run a
        // ring all_gather, where rank 1 sends to rank 2 and only rank 2 sends to rank 0.
        let t0 = Instant::now();
        let out = crate::local::run(3, |comm| {
            let comm = comm.with_timeout(Duration::from_secs(20));
            if comm.rank() == 0 {
                let mut x = [1.0f32; 4];
                comm.with_algorithm(crate::Algorithm::BinomialTree).all_reduce(&mut x, ReduceOp::Sum)
            } else {
                let mut all = [0.0f32; 12];
                comm.with_algorithm(crate::Algorithm::Ring).all_gather(&[1.0f32; 4], &mut all)
            }
        })
        .unwrap();
        assert!(matches!(out[0], Err(Error::Mismatch { peer: 2, .. })), "rank 0: {:?}", out[0]);
        for (r, o) in out.iter().enumerate().skip(1) {
            assert!(matches!(o, Err(Error::Mismatch { .. } | Error::Aborted { .. })), "rank {r}: {o:?}");
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "waited {:?}: the deadline, not the mismatch", t0.elapsed());
    }

    #[test]
    fn a_peer_ahead_by_whole_operations_is_no_mismatch() {
        // A binomial-tree reduce to rank 0 on 3 ranks: rank 0 takes rank 1's buffer, then
        // waits on rank 2, which is slow, while rank 1 (which only sends) already sent its
        // buffers of the next reduces. Those frames are not this reduce's.
        let out = crate::local::run(3, |comm| -> Result<Vec<f32>> {
            let tree = comm.with_algorithm(crate::Algorithm::BinomialTree);
            let mut got = Vec::new();
            for i in 0..3 {
                if comm.rank() == 2 {
                    std::thread::sleep(LOOK_ELSEWHERE * 3);
                }
                let x = [(comm.rank() + 10 * i) as f32; 4];
                let mut y = [0.0f32; 4];
                tree.reduce_into(&x[..], (comm.rank() == 0).then_some(&mut y[..]), ReduceOp::Sum, 0)?;
                got.push(y[0]);
            }
            Ok(got)
        })
        .unwrap();
        assert_eq!(out[0].as_ref().unwrap(), &vec![3.0, 33.0, 63.0], "{out:?}");
        assert!(out.iter().all(|o| o.is_ok()), "{out:?}");
    }

    #[test]
    fn blocks_cover_exactly() {
        for count in [0usize, 1, 2, 7, 8, 13, 100] {
            for n in 1..=9 {
                let mut next = 0;
                for i in 0..n {
                    let b = block(count, n, i);
                    assert_eq!(b.start, next);
                    assert!(b.len() == count / n || b.len() == count / n + 1);
                    next = b.end;
                }
                assert_eq!(next, count);
            }
        }
    }
}
