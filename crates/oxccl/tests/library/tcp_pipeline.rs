//! Large messages over TCP travel as pipelines of 1 MiB pieces (`cpu/algorithms/pipeline.rs`),
//! exchanges of them driven by the caller (`cpu/transport/tcp/exchange.rs`): results against
//! a sequential reference at sizes that end mid-piece, on 2 to 4 ranks and with every
//! algorithm that exchanges (in place and out of place; over one and several connections
//! per peer), a count mismatch between the ranks found (not a hang, not
//! corruption) on a message long enough to be cut, and a rank that vanishes mid-exchange.

use std::time::{Duration, Instant};

use oxccl::{Algorithm, Communicator, Config, Error, ReduceOp};

fn tcp_world(n: usize) -> Vec<Communicator> {
    tcp_world_of(n, 1)
}

/// A TCP world with `lanes` connections between each pair of ranks (pieces striped across
/// them from 128 KiB on).
fn tcp_world_of(n: usize, lanes: usize) -> Vec<Communicator> {
    Config::new()
        .set("OXCCL_TRANSPORT", "tcp")
        .and_then(|c| c.set("OXCCL_SOCKETS_PER_PEER", &lanes.to_string()))
        .and_then(|c| c.init_world(n))
        .expect("a TCP world")
}

/// Rank `r`'s input: small integers, exact in f32 whatever the order of the sums.
fn input(r: usize, count: usize) -> Vec<f32> {
    (0..count).map(|i| ((i * 7 + r * 13) % 11) as f32).collect()
}

#[test]
fn pipelined_collectives_match_the_reference() {
    // 2.5 MiB + 3 elements: blocks and pieces end in odd places.
    let count = (5 << 18) + 3;
    for n in [2usize, 3] {
        let comms = tcp_world(n);
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, count)).collect();
        let want_sum: Vec<f32> = (0..count).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
        std::thread::scope(|s| {
            for c in &comms {
                let want_sum = &want_sum;
                s.spawn(move || {
                    let r = c.rank();
                    let mut x = input(r, count);
                    c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                    assert!(x == *want_sum, "all_reduce on rank {r} of {n}");
                    let mine = input(r, count);
                    let mut all = vec![0f32; count * n];
                    c.all_gather(&mine, &mut all).unwrap();
                    for q in 0..n {
                        assert!(all[q * count..(q + 1) * count] == input(q, count)[..], "all_gather block {q}");
                    }
                    let mut b = if r == n - 1 { input(7, count) } else { vec![0f32; count] };
                    c.broadcast(&mut b, n - 1).unwrap();
                    assert!(b == input(7, count), "broadcast on rank {r}");
                });
            }
        });
    }
}

#[test]
fn a_count_mismatch_on_a_pipelined_message_is_an_error() {
    let comms = tcp_world(2);
    let errs: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    // The same number of pieces; the counts differ in the last one.
                    let count = if c.rank() == 0 { (3 << 18) + 5 } else { (3 << 18) + 900 };
                    let mut x = vec![1f32; count];
                    c.with_timeout(std::time::Duration::from_secs(20)).all_reduce(&mut x, ReduceOp::Sum).unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(errs.iter().any(|e| matches!(e, Error::Mismatch { .. })), "{errs:?}");
    for e in &errs {
        assert!(matches!(e, Error::Mismatch { .. } | Error::Aborted { .. } | Error::PeerLost { .. }), "{e}");
    }
}

#[test]
fn exchanges_of_every_algorithm_match_the_reference() {
    // 7 MiB + 12 bytes: on 4 ranks the ring's blocks are still above a piece.
    let count = (7 << 18) + 3;
    for (n, lanes) in [(2usize, 1), (3, 1), (4, 1), (2, 3), (3, 2)] {
        let comms = tcp_world_of(n, lanes);
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, count)).collect();
        let want: Vec<f32> = (0..count).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
        for algo in [Algorithm::Ring, Algorithm::RecursiveDoubling, Algorithm::Rabenseifner] {
            std::thread::scope(|s| {
                for c in &comms {
                    let want = &want;
                    s.spawn(move || {
                        let r = c.rank();
                        let mut x = input(r, count);
                        c.with_algorithm(algo).all_reduce(&mut x, ReduceOp::Sum).unwrap();
                        assert!(x == *want, "{algo:?} all_reduce on rank {r} of {n}");
                        // Out of place (the ring reads its input without copying it first):
                        // the input stays as it was, every element of the output is written.
                        let mine = input(r, count);
                        let mut out = vec![f32::NAN; count];
                        c.with_algorithm(algo).all_reduce_into(&mine, &mut out, ReduceOp::Sum).unwrap();
                        assert!(out == *want, "{algo:?} all_reduce_into on rank {r} of {n}");
                        assert!(mine == input(r, count), "{algo:?} all_reduce_into changed rank {r}'s input");
                    });
                }
            });
        }
        // reduce_scatter: each rank's block of the sum.
        let per = count / n;
        std::thread::scope(|s| {
            for c in &comms {
                let want = &want;
                s.spawn(move || {
                    let r = c.rank();
                    let x = &input(r, count)[..per * n];
                    let mut out = vec![0f32; per];
                    c.with_algorithm(Algorithm::Ring).reduce_scatter(x, &mut out, ReduceOp::Sum).unwrap();
                    assert!(out[..] == want[r * per..(r + 1) * per], "reduce_scatter on rank {r} of {n}");
                });
            }
        });
    }
}

#[test]
fn a_rank_that_vanishes_mid_exchange_fails_the_others_in_bounded_time() {
    let mut comms = tcp_world(3);
    let gone = comms.remove(1);
    let count = 6 << 18;
    let started = Instant::now();
    let errs: Vec<Error> = std::thread::scope(|s| {
        s.spawn(move || {
            // Into its first exchange, then gone (its connections close with it).
            let mut x = vec![1f32; count];
            let _ = gone
                .with_timeout(Duration::from_millis(300))
                .with_algorithm(Algorithm::Ring)
                .all_reduce(&mut x, ReduceOp::Sum);
            drop(gone);
        });
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut x = vec![1f32; count];
                    let c = c.with_timeout(Duration::from_secs(30)).with_algorithm(Algorithm::Ring);
                    let mut r = Ok(());
                    for _ in 0..20 {
                        r = c.all_reduce(&mut x, ReduceOp::Sum);
                        if r.is_err() {
                            break;
                        }
                    }
                    r.unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errs {
        assert!(matches!(e, Error::PeerLost { .. } | Error::Aborted { .. } | Error::Timeout { .. }), "{e}");
    }
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
}
