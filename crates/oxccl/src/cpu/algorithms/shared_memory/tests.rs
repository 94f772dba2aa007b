//! The shared-memory collectives against sequential references, on worlds of threads over
//! shared-memory links.

use std::time::Duration;

use crate::cpu::transport::shm::links::tests::{world_with, world_with_settings};
use crate::{bf16, Algorithm, Error, ReduceOp};

const SLOT: usize = 16 * 1024;

#[test]
fn all_reduce_across_chunks_and_phases() {
    for n in [1, 2, 3, 4] {
        world_with(n, 1 << 16, Some(SLOT), |comm| {
            let r = comm.rank() as i64;
            // 0, direct (<= 16 KiB), and several chunks of the two-phase path.
            for count in [0usize, 1, 7, 2048, 2049, 10_000, 100_003] {
                let mut x: Vec<i64> = (0..count as i64).map(|i| i * (r + 1) - r).collect();
                comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                let k = (n * (n + 1) / 2) as i64;
                let sub = (n * (n - 1) / 2) as i64;
                assert!(x.iter().enumerate().all(|(i, v)| *v == i as i64 * k - sub), "n={n} count={count}");
                let input: Vec<f32> = (0..count).map(|i| ((i * 7 + comm.rank()) % 13) as f32).collect();
                let mut out = vec![0f32; count];
                comm.all_reduce_into(&input, &mut out, ReduceOp::Max).unwrap();
                for (i, v) in out.iter().enumerate() {
                    let want = (0..n).map(|q| ((i * 7 + q) % 13) as f32).fold(f32::MIN, f32::max);
                    assert_eq!(*v, want);
                }
            }
            // Half precision accumulates in f32 and rounds once; Avg divides before rounding.
            let mut h = vec![bf16::from_f32(1.0 + comm.rank() as f32); 5000];
            comm.all_reduce(&mut h, ReduceOp::Avg).unwrap();
            assert!(h.iter().all(|v| v.to_f32() == 1.0 + (n - 1) as f32 / 2.0));
        });
    }
}

#[test]
fn tiny_all_reduces_back_to_back_read_each_steps_own_box() {
    // Up to INLINE bytes travel in the box of the step's parity, beside the arrival; one
    // past it goes through the slot. Values change every call, so a box read at the wrong
    // parity (the previous step's, or one the peer already refilled) gives a wrong sum.
    use super::INLINE;
    for n in [2, 3, 5] {
        world_with(n, 1 << 16, Some(SLOT), |comm| {
            let r = comm.rank() as u64;
            for count in [1usize, 3, INLINE / 8 - 1, INLINE / 8, INLINE / 8 + 1] {
                for call in 0..200u64 {
                    let v = |q: u64, i: usize| (call * 1_000 + q * 31 + i as u64) ^ (call << 40);
                    let mut x: Vec<u64> = (0..count).map(|i| v(r, i)).collect();
                    comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                    let want: Vec<u64> = (0..count).map(|i| (0..n as u64).map(|q| v(q, i)).sum()).collect();
                    assert_eq!(x, want, "n={n} count={count} call={call}");
                }
            }
            // Bytes: every size up to one past the inline area.
            for bytes in 1..=INLINE + 1 {
                let mut x: Vec<u8> = (0..bytes).map(|i| (i + comm.rank()) as u8).collect();
                comm.all_reduce(&mut x, ReduceOp::Max).unwrap();
                assert!(x.iter().enumerate().all(|(i, v)| *v as usize == i + n - 1), "n={n} bytes={bytes}");
            }
        });
    }
}

#[test]
fn tiny_moves_and_reductions_back_to_back_read_each_steps_own_slot() {
    // One-step operations back to back, around the box's inline size (all_reduce's; the
    // movers use their slots at every size: carrying their bytes in the box too was tried
    // and measured no faster). Values and roots change with every call and the operations
    // alternate, so a slot read at the wrong parity, or one its owner already refilled,
    // gives a wrong result.
    use super::INLINE;
    let per_rank = INLINE / 8;
    for n in [2usize, 3, 5] {
        world_with(n, 1 << 16, Some(SLOT), |comm| {
            let sm = comm.with_algorithm(Algorithm::SharedMemory);
            let r = comm.rank();
            let v = |call: usize, q: usize, i: usize| (call * 1_000_003 + q * 7_919 + i * 31) as i64;
            for count in [1, per_rank - 1, per_rank, per_rank + 1] {
                for call in 0..60 {
                    let root = call % n;
                    let mine: Vec<i64> = (0..count).map(|i| v(call, r, i)).collect();
                    let mut b = if r == root { mine.clone() } else { vec![0; count] };
                    sm.broadcast(&mut b, root).unwrap();
                    assert!(
                        b.iter().enumerate().all(|(i, x)| *x == v(call, root, i)),
                        "broadcast n={n} {count} {call}"
                    );
                    let mut all = vec![0i64; n * count];
                    sm.gather(&mine, (r == root).then_some(&mut all), root).unwrap();
                    if r == root {
                        let want: Vec<i64> = (0..n * count).map(|j| v(call, j / count, j % count)).collect();
                        assert_eq!(all, want, "gather n={n} count={count} call={call}");
                    }
                    let mut g = vec![0i64; n * count];
                    sm.all_gather(&mine, &mut g).unwrap();
                    assert!(g.iter().enumerate().all(|(j, x)| *x == v(call, j / count, j % count)), "all_gather");
                    let mut out = vec![0i64; count];
                    sm.reduce_into(&mine, (r == root).then_some(&mut out), ReduceOp::Sum, root).unwrap();
                    if r == root {
                        let sum = |i: usize| (0..n).map(|q| v(call, q, i)).sum::<i64>();
                        assert!(out.iter().enumerate().all(|(i, x)| *x == sum(i)), "reduce n={n} {count} {call}");
                    }
                }
            }
            // Block operations: n blocks per rank, inline while n blocks fit.
            for count in [1, 2] {
                for call in 0..60 {
                    let root = (call + 1) % n;
                    let blocks: Vec<i64> = (0..n * count).map(|j| v(call, r, j)).collect();
                    let mut part = vec![0i64; count];
                    sm.scatter((r == root).then_some(&blocks), &mut part, root).unwrap();
                    assert!(part.iter().enumerate().all(|(i, x)| *x == v(call, root, r * count + i)), "scatter");
                    let mut a2a = vec![0i64; n * count];
                    sm.all_to_all(&blocks, &mut a2a).unwrap();
                    assert!(
                        a2a.iter().enumerate().all(|(j, x)| *x == v(call, j / count, r * count + j % count)),
                        "a2a"
                    );
                    let mut rs = vec![0i64; count];
                    sm.reduce_scatter(&blocks, &mut rs, ReduceOp::Sum).unwrap();
                    let sum = |j: usize| (0..n).map(|q| v(call, q, j)).sum::<i64>();
                    assert!(
                        rs.iter().enumerate().all(|(i, x)| *x == sum(r * count + i)),
                        "reduce_scatter n={n} {count}"
                    );
                }
            }
        });
    }
}

#[test]
fn large_operations_stream_their_results() {
    // Above `STREAM_FROM`, results are written with cache-bypassing stores.
    let count = crate::cpu::transport::shm::copy::STREAM_FROM / 4 + 1001;
    for n in [2, 3] {
        world_with(n, 1 << 16, Some(SLOT), |comm| {
            let r = comm.rank();
            let input: Vec<u32> = (0..count as u32).map(|i| i.wrapping_mul(2_654_435_761) ^ r as u32).collect();
            let want: Vec<u32> = (0..count as u32)
                .map(|i| (0..n as u32).fold(0u32, |a, q| a.wrapping_add(i.wrapping_mul(2_654_435_761) ^ q)))
                .collect();
            let mut out = vec![0u32; count];
            comm.all_reduce_into(&input, &mut out, ReduceOp::Sum).unwrap();
            assert!(out == want, "out of place, n={n}");
            let mut x = input.clone();
            comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            assert!(x == want, "in place, n={n}");
            let mut b = if r == 1 { input.clone() } else { vec![0; count] };
            comm.broadcast(&mut b, 1).unwrap();
            assert!(b.iter().enumerate().all(|(i, v)| *v == (i as u32).wrapping_mul(2_654_435_761) ^ 1));
            let mut g = vec![0u32; n * count];
            comm.all_gather(&input, &mut g).unwrap();
            for (q, c) in g.chunks(count).enumerate() {
                assert!(c.iter().enumerate().all(|(i, v)| *v == (i as u32).wrapping_mul(2_654_435_761) ^ q as u32));
            }
        });
    }
}

#[test]
fn all_gather_in_place_keeps_its_own_block_and_fills_the_others() {
    // Several chunks per block (SLOT is 16 KiB), odd sizes, in place and out of place.
    for n in [1, 2, 3, 5] {
        world_with(n, 1 << 16, Some(SLOT), |comm| {
            let r = comm.rank();
            // 150_001 u32 per rank (600 KB): blocks of many chunks.
            for count in [0usize, 1, 999, 6001, 150_001] {
                let val = |q: usize, i: usize| (q * 1_000_003 + i * 7) as u32;
                let mut buf = vec![u32::MAX; n * count];
                buf[r * count..(r + 1) * count].iter_mut().enumerate().for_each(|(i, v)| *v = val(r, i));
                comm.with_algorithm(Algorithm::SharedMemory).all_gather_in_place(&mut buf).unwrap();
                for (q, c) in buf.chunks(count.max(1)).enumerate().take(if count == 0 { 0 } else { n }) {
                    assert!(
                        c.iter().enumerate().all(|(i, v)| *v == val(q, i)),
                        "in place n={n} count={count} block {q}"
                    );
                }
                let input: Vec<u32> = (0..count).map(|i| val(r, i)).collect();
                let mut out = vec![u32::MAX; n * count];
                comm.with_algorithm(Algorithm::SharedMemory).all_gather(&input, &mut out).unwrap();
                assert_eq!(out, buf, "out of place n={n} count={count}");
            }
        });
    }
}

#[test]
fn results_are_bitwise_identical_on_every_rank() {
    world_with(3, 1 << 16, Some(SLOT), |comm| {
        let mut x: Vec<f32> = (0..50_000).map(|i| ((i * 31 + comm.rank() * 17) % 1000) as f32 / 7.0).collect();
        comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        let mut all = vec![0f32; 3 * x.len()];
        comm.with_algorithm(Algorithm::Ring).all_gather(&x, &mut all).unwrap();
        let (a, rest) = all.split_at(x.len());
        assert!(rest.chunks(x.len()).all(|c| c.iter().zip(a).all(|(p, q)| p.to_bits() == q.to_bits())));
    });
}

#[test]
fn broadcast_all_gather_barrier_and_splits() {
    world_with(4, 1 << 16, Some(SLOT), |comm| {
        let r = comm.rank();
        for root in 0..4 {
            let mut b: Vec<i32> = (0..30_001).map(|i| (i * (r + 1)) as i32).collect();
            comm.broadcast(&mut b, root).unwrap();
            assert!(b.iter().enumerate().all(|(i, v)| *v == (i * (root + 1)) as i32));
        }
        let mut g = vec![0u32; 4 * 9000];
        comm.all_gather(&vec![r as u32; 9000], &mut g).unwrap();
        assert!(g.chunks(9000).enumerate().all(|(p, c)| c.iter().all(|v| *v == p as u32)));
        comm.barrier().unwrap();
        let sub = comm.split(Some((r % 2) as u32), r as i64).unwrap().unwrap();
        let mut s = [r as u8];
        sub.with_algorithm(Algorithm::SharedMemory).all_reduce(&mut s, ReduceOp::Sum).unwrap();
        assert_eq!(s[0] as usize, if r % 2 == 0 { 2 } else { 4 });
    });
}

#[test]
fn mismatch_and_timeout_are_errors_not_hangs() {
    world_with(2, 1 << 16, Some(SLOT), |comm| {
        let mut x = [1.0f32; 4];
        let r = if comm.rank() == 0 { comm.all_reduce(&mut x, ReduceOp::Sum) } else { comm.broadcast(&mut x, 0) };
        assert!(matches!(r, Err(Error::Mismatch { .. })), "rank {}: {r:?}", comm.rank());
    });
    world_with(2, 1 << 16, Some(SLOT), |comm| {
        let c = comm.with_timeout(Duration::from_millis(150));
        if comm.rank() == 0 {
            let r = c.barrier();
            assert!(matches!(r, Err(Error::Timeout { peer: Some(1), .. })), "{r:?}");
        } else {
            std::thread::sleep(Duration::from_millis(400));
        }
    });
}

#[test]
fn a_frame_left_unread_by_a_point_to_point_collective_is_a_mismatch_at_the_next_step() {
    // Ranks that name different roots for a point-to-point broadcast: rank 0 thinks it is
    // the root and receives nothing, so the frame rank 3 sends it is never read. The
    // shared-memory barrier after it must not pass as if nothing happened.
    for n in [2, 4] {
        world_with(n, 1 << 16, Some(SLOT), |comm| {
            let c = comm.with_timeout(Duration::from_secs(10));
            let r = comm.rank();
            let root = if r == 0 { 0 } else { n - 1 };
            let b = c.with_algorithm(Algorithm::BinomialTree).broadcast(&mut [5u8; 8], root);
            let next = c.with_algorithm(Algorithm::SharedMemory).barrier();
            // Ranks that found nothing unread learn of the failure at the latest in the call
            // after (rank 0 poisons its communicator and tells everyone).
            let after = c.barrier();
            assert!(
                [&b, &next, &after].iter().any(|x| matches!(x, Err(Error::Mismatch { .. } | Error::Aborted { .. }))),
                "rank {r} of {n}: broadcast {b:?}, barrier {next:?}, then {after:?}"
            );
            assert!(after.is_err(), "rank {r} of {n}: the communicator goes on after a mismatch: {after:?}");
            if r == 0 {
                // Rank 0 is where the unread frame sits: it names the peer and its operation.
                match next {
                    Err(Error::Mismatch { peer, theirs, .. }) => {
                        assert_eq!((peer, theirs.root), (n - 1, Some((n - 1) as u32)), "{theirs:?}")
                    }
                    other => panic!("rank 0 of {n}: {other:?}"),
                }
            }
        });
    }
    // A correct mix of point-to-point and shared-memory collectives passes the tally.
    world_with(3, 1 << 16, Some(SLOT), |comm| {
        for root in 0..3 {
            let mut x = [comm.rank() as u32; 5];
            comm.with_algorithm(Algorithm::BinomialTree).broadcast(&mut x, root).unwrap();
            assert_eq!(x, [root as u32; 5]);
            comm.with_algorithm(Algorithm::SharedMemory).barrier().unwrap();
            let mut y = [1u32; 3];
            comm.with_algorithm(Algorithm::Ring).all_reduce(&mut y, ReduceOp::Sum).unwrap();
            comm.with_algorithm(Algorithm::SharedMemory).all_reduce(&mut y, ReduceOp::Sum).unwrap();
            assert_eq!(y, [9; 3]);
        }
    });
}

/// A value that depends on the rank and the index, different for every pair.
fn value(rank: usize, i: usize) -> i64 {
    ((i * 31 + rank * 1009) % 977) as i64 - 400
}

#[test]
fn reduce_and_reduce_scatter_match_a_sequential_reference() {
    for n in [1, 2, 3, 5] {
        world_with(n, 1 << 16, Some(SLOT), |comm| {
            let sm = comm.with_algorithm(Algorithm::SharedMemory);
            let r = comm.rank();
            // 0, one chunk, and several chunks of a slot split n ways; odd counts.
            for count in [0usize, 1, 13, 1000, 7001] {
                let input: Vec<i64> = (0..count).map(|i| value(r, i)).collect();
                let sum = |i: usize| (0..n).map(|q| value(q, i)).sum::<i64>();
                for root in [0, n - 1] {
                    let mut out = vec![i64::MIN; count];
                    sm.reduce_into(&input, (r == root).then_some(&mut out), ReduceOp::Sum, root).unwrap();
                    if r == root {
                        assert!(out.iter().enumerate().all(|(i, v)| *v == sum(i)), "reduce n={n} count={count}");
                    } else {
                        assert!(out.iter().all(|v| *v == i64::MIN), "a non-root output is untouched");
                    }
                    let mut x = input.clone();
                    sm.reduce(&mut x, ReduceOp::Max, root).unwrap();
                    let max = |i: usize| (0..n).map(|q| value(q, i)).max().unwrap_or_default();
                    if r == root {
                        assert!(x.iter().enumerate().all(|(i, v)| *v == max(i)), "in-place reduce n={n}");
                    } else {
                        assert_eq!(x, input, "a non-root buffer is unchanged");
                    }
                }
                let whole: Vec<i64> = (0..n * count).map(|i| value(r, i)).collect();
                let mut out = vec![0i64; count];
                sm.reduce_scatter(&whole, &mut out, ReduceOp::Sum).unwrap();
                assert!(out.iter().enumerate().all(|(i, v)| *v == sum(r * count + i)), "reduce_scatter n={n} {count}");
                let mut x = whole.clone();
                sm.reduce_scatter_in_place(&mut x, ReduceOp::Min).unwrap();
                let min = |i: usize| (0..n).map(|q| value(q, i)).min().unwrap_or_default();
                let mine = &x[r * count..(r + 1) * count];
                assert!(mine.iter().enumerate().all(|(i, v)| *v == min(r * count + i)), "in place n={n} {count}");
            }
            // Half precision: f32 accumulation rounded once, and Avg.
            let h: Vec<bf16> = (0..n * 3000).map(|i| bf16::from_f32((1 + r + i % 3) as f32)).collect();
            let mut out = vec![bf16::ZERO; 3000];
            sm.reduce_scatter(&h, &mut out, ReduceOp::Avg).unwrap();
            let want = |i: usize| (0..n).map(|q| (1 + q + i % 3) as f32).sum::<f32>() / n as f32;
            assert!(out.iter().enumerate().all(|(i, v)| *v == bf16::from_f32(want(r * 3000 + i))));
        });
    }
}

#[test]
fn all_to_all_gather_and_scatter_match_a_sequential_reference() {
    for n in [1, 2, 3, 4] {
        world_with(n, 1 << 16, Some(SLOT), |comm| {
            let sm = comm.with_algorithm(Algorithm::SharedMemory);
            let r = comm.rank();
            for count in [0usize, 1, 7, 1500, 9001] {
                // all_to_all: block q of rank p goes to block p of rank q.
                let input: Vec<i64> = (0..n * count).map(|i| value(r, i)).collect();
                let mut out = vec![0i64; n * count];
                sm.all_to_all(&input, &mut out).unwrap();
                for p in 0..n {
                    let got = &out[p * count..(p + 1) * count];
                    assert!(got.iter().enumerate().all(|(i, v)| *v == value(p, r * count + i)), "a2a n={n} {count}");
                }
                let mut x = input.clone();
                sm.all_to_all_in_place(&mut x).unwrap();
                assert_eq!(x, out, "in-place all_to_all n={n} count={count}");
                for root in [0, n / 2] {
                    let mine: Vec<i64> = (0..count).map(|i| value(r, i)).collect();
                    let mut all = vec![0i64; n * count];
                    sm.gather(&mine, (r == root).then_some(&mut all), root).unwrap();
                    if r == root {
                        for p in 0..n {
                            let got = &all[p * count..(p + 1) * count];
                            assert!(got.iter().enumerate().all(|(i, v)| *v == value(p, i)), "gather n={n}");
                        }
                    }
                    let src: Vec<i64> = (0..n * count).map(|i| value(root, i)).collect();
                    let mut part = vec![0i64; count];
                    sm.scatter((r == root).then_some(&src), &mut part, root).unwrap();
                    assert!(part.iter().enumerate().all(|(i, v)| *v == value(root, r * count + i)), "scatter n={n}");
                }
            }
        });
    }
}

#[test]
fn a_mismatch_between_new_operations_is_an_error() {
    world_with(3, 1 << 16, Some(SLOT), |comm| {
        let sm = comm.with_algorithm(Algorithm::SharedMemory);
        let mut x = [1i32; 6];
        let r = if comm.rank() == 1 {
            sm.all_to_all_in_place(&mut x)
        } else {
            sm.reduce_scatter_in_place(&mut x, ReduceOp::Sum)
        };
        assert!(matches!(r, Err(Error::Mismatch { .. })), "rank {}: {r:?}", comm.rank());
    });
}

/// Large moves by single-copy reads (where this machine allows them) and through the slots
/// (`OXCCL_SHM_SINGLE_COPY=0`) give the same results, against a sequential reference, in
/// place and out of place, at odd sizes above and below the single-copy threshold.
#[test]
fn a_broadcasts_root_writes_its_part_into_every_peer() {
    // Between two ranks, in place from 64 KiB per rank up, the root writes the last half
    // into the peer (see `single_copy_moves`; from three ranks up a broadcast goes through
    // the slots, checked here too); sizes on both sides of that, odd ones, every root, and
    // three calls in a row (the words of both parities, and stale ones from two steps before).
    for n in [2, 3, 4] {
        world_with_settings(n, 1 << 16, Some(SLOT), &[("OXCCL_SHM_SINGLE_COPY", "1")], |comm| {
            let sm = comm.with_algorithm(Algorithm::SharedMemory);
            let r = comm.rank();
            for count in [8191usize, 16_384 * n + 1, 70_001] {
                for root in 0..n {
                    for call in 0..3 {
                        let want = |i: usize| value(root, i) + call as i64;
                        let mut b: Vec<i64> = (0..count).map(|i| if r == root { want(i) } else { -1 }).collect();
                        sm.broadcast(&mut b, root).unwrap();
                        let bad = b.iter().enumerate().find(|(i, v)| **v != want(*i));
                        assert!(bad.is_none(), "n={n} count={count} root={root} call={call}: first wrong {bad:?}");
                    }
                }
            }
        });
    }
}

#[test]
fn moves_agree_with_and_without_single_copy() {
    for single_copy in ["1", "0"] {
        for n in [2, 3] {
            world_with_settings(n, 1 << 16, Some(SLOT), &[("OXCCL_SHM_SINGLE_COPY", single_copy)], |comm| {
                let sm = comm.with_algorithm(Algorithm::SharedMemory);
                let r = comm.rank();
                let ctx = |what: &str, count: usize| format!("{what} n={n} count={count} single_copy={single_copy}");
                // i64 elements: 1000 is below 8 KiB per peer, 3001 and 40_009 above it.
                for count in [1000usize, 3001, 40_009] {
                    for root in [0, n - 1] {
                        let mut b: Vec<i64> = (0..count).map(|i| if r == root { value(root, i) } else { -1 }).collect();
                        sm.broadcast(&mut b, root).unwrap();
                        assert!(b.iter().enumerate().all(|(i, v)| *v == value(root, i)), "{}", ctx("broadcast", count));
                        let src: Vec<i64> = (0..count).map(|i| value(root, i)).collect();
                        let mut out = vec![-1i64; count];
                        sm.broadcast_into((r == root).then_some(&src[..]), &mut out, root).unwrap();
                        assert_eq!(out, src, "{}", ctx("broadcast out of place", count));
                        // scatter: each rank reads its own block of the root's input.
                        let all: Vec<i64> = (0..n * count).map(|i| value(root, i)).collect();
                        let mut part = vec![-1i64; count];
                        sm.scatter((r == root).then_some(&all[..]), &mut part, root).unwrap();
                        let bad = part.iter().enumerate().find(|(i, v)| **v != value(root, r * count + i));
                        assert!(bad.is_none(), "{}: first wrong {bad:?}", ctx("scatter", count));
                    }
                    let mine: Vec<i64> = (0..count).map(|i| value(r, i)).collect();
                    let want: Vec<i64> = (0..n).flat_map(|p| (0..count).map(move |i| value(p, i))).collect();
                    let mut all = vec![-1i64; n * count];
                    sm.all_gather(&mine, &mut all).unwrap();
                    assert_eq!(all, want, "{}", ctx("all_gather", count));
                    let mut buf = vec![-1i64; n * count];
                    buf[r * count..(r + 1) * count].copy_from_slice(&mine);
                    sm.all_gather_in_place(&mut buf).unwrap();
                    assert_eq!(buf, want, "{}", ctx("all_gather in place", count));
                    let input: Vec<i64> = (0..n * count).map(|i| value(r, i)).collect();
                    let mut out = vec![-1i64; n * count];
                    sm.all_to_all(&input, &mut out).unwrap();
                    for p in 0..n {
                        let got = &out[p * count..(p + 1) * count];
                        assert!(
                            got.iter().enumerate().all(|(i, v)| *v == value(p, r * count + i)),
                            "{}",
                            ctx("all_to_all", count)
                        );
                    }
                }
            });
        }
    }
}
