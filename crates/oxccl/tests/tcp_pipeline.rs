//! Large messages over TCP travel as pipelines of 1 MiB pieces (`cpu/algorithms/pipeline.rs`):
//! results against a sequential reference at sizes that end mid-piece, on 2 and 3 ranks,
//! and a count mismatch between the ranks found (not a hang, not corruption) on a message
//! long enough to be cut.

use oxccl::{Communicator, Config, Error, ReduceOp};

fn tcp_world(n: usize) -> Vec<Communicator> {
    Config::new().set("OXCCL_TRANSPORT", "tcp").and_then(|c| c.init_world(n)).expect("a TCP world")
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
