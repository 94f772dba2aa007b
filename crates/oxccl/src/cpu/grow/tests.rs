//! The grow protocol's records without I/O, and worlds of threads (shared memory) that grow:
//! newcomer threads join through the world's in-process board, as processes join through the
//! store. Results are checked against sums computed here.

use std::sync::Arc;
use std::time::Duration;

use super::protocol::{self, Admission};
use super::{join, Board, MemoryBoard};
use crate::communicator::Communicator;
use crate::config::Config;
use crate::cpu::engine::CpuBackend;
use crate::error::Error;
use crate::reduce_op::ReduceOp;

#[test]
fn an_admission_reads_back_as_written() {
    let a = Admission { grow: 3, rank: 5, size: 7, admitted: 9 };
    assert_eq!(Admission::decode(&a.encode()).expect("decode"), a);
}

#[test]
fn malformed_admissions_are_store_errors() {
    let good = Admission { grow: 1, rank: 2, size: 3, admitted: 1 }.encode();
    let mut bad_magic = good.clone();
    bad_magic[0] ^= 1;
    let mut rank_past_size = good.clone();
    rank_past_size[12..20].copy_from_slice(&3u64.to_le_bytes());
    let mut grow_zero = good.clone();
    grow_zero[4..12].copy_from_slice(&0u64.to_le_bytes());
    for (what, bytes) in [
        ("short", &good[..good.len() - 1]),
        ("magic", &bad_magic[..]),
        ("rank", &rank_past_size[..]),
        ("grow", &grow_zero[..]),
    ] {
        match Admission::decode(bytes) {
            Err(Error::Store(m)) => assert!(m.contains("malformed grow admission"), "{what}: {m}"),
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn a_plan_admits_the_next_tickets_after_the_members() {
    let plan = protocol::plan(3, 2, 1, 4).expect("plan");
    assert_eq!(
        plan,
        vec![
            (4, Admission { grow: 2, rank: 3, size: 5, admitted: 6 }),
            (5, Admission { grow: 2, rank: 4, size: 5, admitted: 6 }),
        ]
    );
    assert!(matches!(protocol::plan(3, 0, 0, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(protocol::plan(usize::MAX, 1, 0, 0), Err(Error::InvalidArgument(_))));
    assert_eq!((protocol::waiting(6, 4), protocol::waiting(4, 4), protocol::waiting(-1, 0)), (2, 0, 0));
}

#[test]
fn the_memory_board_counts_and_waits() {
    let b = MemoryBoard::default();
    assert_eq!((b.add("k", 1).unwrap(), b.add("k", 2).unwrap(), b.add("k", 0).unwrap()), (1, 3, 3));
    assert!(matches!(b.get_wait("absent", Duration::from_millis(20)), Err(Error::Store(_))));
    b.set("x", b"v").unwrap();
    assert_eq!(b.get_wait("x", Duration::from_millis(20)).unwrap(), b"v");
}

/// A world of `n` threads over shared memory (no flight recorder: failures leave dumps).
fn world(n: usize) -> Vec<CpuBackend> {
    let cfg = Config::new()
        .timeout(Duration::from_secs(20))
        .set("OXCCL_FR_SIZE", "0")
        .and_then(|c| c.resolve_with(|_| None))
        .expect("config");
    crate::cpu::setup::init_world(&cfg, n).expect("world")
}

fn communicator(b: CpuBackend) -> Communicator {
    Communicator::observed(Arc::new(b), Arc::default())
}

/// Members (`n` of them, each calling `grow(counts[r])` once `agree` says newcomers wait)
/// and `newcomers` threads that join; each thread's result: (rank, size, sum of the ranks
/// over the grown communicator, whether agree saw newcomers waiting), or its error.
#[allow(clippy::type_complexity)]
fn grow_world(n: usize, newcomers: usize, counts: &[usize]) -> Vec<Result<(usize, usize, u64, bool), Error>> {
    let members = world(n);
    let lineage = Arc::clone(members[0].lineage().expect("a world of threads has a lineage"));
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for (r, b) in members.into_iter().enumerate() {
            let count = counts[r];
            hs.push(s.spawn(move || {
                let c = communicator(b);
                // Members learn of newcomers only through agree (rank 0 reads the store).
                let mut seen = false;
                for _ in 0..2000 {
                    let a = c.agree(1)?;
                    if a.joiners == count {
                        seen = true;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                let g = c.grow(count)?;
                let mut x = [g.rank() as u64];
                g.all_reduce(&mut x, ReduceOp::Sum)?;
                // The old communicator stays usable.
                let mut y = [1u64];
                c.all_reduce(&mut y, ReduceOp::Sum)?;
                assert_eq!(y[0], n as u64);
                Ok((g.rank(), g.world_size(), x[0], seen))
            }));
        }
        for _ in 0..newcomers {
            let lineage = lineage.newcomer();
            hs.push(s.spawn(move || {
                let b = join(&lineage, Duration::from_secs(20))?;
                b.set_lineage(Arc::new(lineage));
                let g = communicator(b);
                let mut x = [g.rank() as u64];
                g.all_reduce(&mut x, ReduceOp::Sum)?;
                Ok((g.rank(), g.world_size(), x[0], true))
            }));
        }
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    })
}

#[test]
fn members_seen_newcomers_at_agree_and_grow_to_admit_them() {
    for (n, k) in [(2, 1), (3, 2)] {
        let size = n + k;
        let sum = (size * (size - 1) / 2) as u64;
        let out = grow_world(n, k, &vec![k; n]);
        let mut ranks: Vec<usize> = Vec::new();
        for (i, r) in out.into_iter().enumerate() {
            let (rank, got_size, got_sum, seen) = r.unwrap_or_else(|e| panic!("n={n} k={k} thread {i}: {e}"));
            assert_eq!((got_size, got_sum), (size, sum), "n={n} k={k} thread {i}");
            assert!(seen, "n={n} k={k}: member {i} grew without agree saying newcomers wait");
            if i < n {
                assert_eq!(rank, i, "members keep their ranks");
            }
            ranks.push(rank);
        }
        ranks.sort_unstable();
        assert_eq!(ranks, (0..size).collect::<Vec<_>>(), "n={n} k={k}");
    }
}

#[test]
fn members_that_pass_different_counts_all_fail_alike() {
    let members = world(3);
    let out: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = members
            .into_iter()
            .enumerate()
            .map(|(r, b)| s.spawn(move || communicator(b).grow(if r == 2 { 2 } else { 1 }).map(drop).unwrap_err()))
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for e in out {
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("different numbers")), "{e}");
    }
}

#[test]
fn a_split_communicator_cannot_grow_and_says_why() {
    let members = world(2);
    let out: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = members
            .into_iter()
            .map(|b| {
                s.spawn(move || {
                    let c = communicator(b);
                    let sub = c.split(Some(0), 0).expect("split").expect("member");
                    sub.grow(1).map(drop).unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for e in out {
        assert!(matches!(&e, Error::BackendUnavailable { why, .. } if why.contains("split off")), "{e}");
    }
}

#[test]
fn no_newcomers_is_an_invalid_argument() {
    let members = world(2);
    let out: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> =
            members.into_iter().map(|b| s.spawn(move || communicator(b).grow(0).map(drop).unwrap_err())).collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for e in out {
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("at least one newcomer")), "{e}");
    }
}

#[test]
fn a_newcomer_nobody_admits_times_out_saying_what_to_do() {
    let members = world(1);
    let lineage = members[0].lineage().expect("lineage").newcomer();
    match join(&lineage, Duration::from_millis(100)) {
        Err(Error::Store(m)) => assert!(m.contains("must call grow"), "{m}"),
        other => panic!("{:?}", other.map(drop)),
    }
}
