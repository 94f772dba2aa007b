//! Local worlds that grow: newcomer threads join through the entrance, after a planned grow,
//! after a rank died and the survivors shrank, and twice in a row. Sums are checked against
//! values computed here.

use std::sync::Arc;
use std::time::Duration;

use super::{growable_world, world_on_hub, Entrance};
use crate::communicator::Communicator;
use crate::config::{Config, ResolvedConfig};
use crate::cpu::engine::CpuBackend;
use crate::error::{Error, Result};
use crate::reduce_op::ReduceOp;

fn config(timeout: Duration) -> ResolvedConfig {
    Config::new().timeout(timeout).set("OXCCL_FR_SIZE", "0").and_then(|c| c.resolve_with(|_| None)).expect("config")
}

fn communicator(b: CpuBackend) -> Communicator {
    Communicator::observed(Arc::new(b), Arc::default())
}

/// (rank, size, sum over the communicator of rank + 1).
fn sum(c: &Communicator) -> Result<(usize, usize, u64)> {
    let mut x = [c.rank() as u64 + 1];
    c.all_reduce(&mut x, ReduceOp::Sum)?;
    Ok((c.rank(), c.world_size(), x[0]))
}

/// Waits until `agree` says `n` newcomers wait (members learn it only there).
fn await_joiners(c: &Communicator, n: usize) -> Result<()> {
    for _ in 0..2000 {
        if c.agree(1)?.joiners == n {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Err(Error::Internal(format!("agree never said {n} newcomers wait")))
}

/// What a thread of a grown world saw: (rank, size, sum, parameters broadcast to it).
type Seen = (usize, usize, u64, Vec<f32>);

fn triangle(size: usize) -> u64 {
    (size * (size + 1) / 2) as u64
}

#[test]
fn a_dead_rank_is_replaced_by_a_newcomer_that_gets_the_parameters() {
    let (hub, ranks) = world_on_hub(&config(Duration::from_secs(20)), 4, "local").expect("world");
    let lineage = ranks[0].lineage().expect("a local world has a lineage");
    let entrance = Entrance { lineage: lineage.newcomer(), timeout: Duration::from_secs(20) };
    let (hub, entrance) = (&hub, &entrance);
    let out: Vec<Result<Seen>> = std::thread::scope(|s| {
        let mut threads = Vec::new();
        for (r, b) in ranks.into_iter().enumerate() {
            threads.push(s.spawn(move || {
                let c = communicator(b);
                sum(&c)?;
                if r == 2 {
                    hub.kill(2);
                    return Ok((usize::MAX, 0, 0, Vec::new()));
                }
                // The step after the death fails on every survivor; they shrink and grow.
                let lost = loop {
                    if let Err(e) = sum(&c) {
                        break e;
                    }
                };
                assert!(matches!(lost, Error::PeerLost { rank: 2, .. } | Error::Aborted { .. }), "{lost}");
                let shrunk = c.shrink()?;
                assert_eq!((shrunk.world_size(), sum(&shrunk)?.2), (3, triangle(3)));
                await_joiners(&shrunk, 1)?;
                let grown = shrunk.grow(1)?;
                let mut params = if grown.rank() == 0 { vec![0.5f32, -1.25, 3.0] } else { vec![0.0; 3] };
                grown.broadcast(&mut params, 0)?;
                let (rank, size, total) = sum(&grown)?;
                Ok((rank, size, total, params))
            }));
        }
        threads.push(s.spawn(move || {
            let c = communicator(entrance.join()?);
            let mut params = vec![0.0f32; 3];
            c.broadcast(&mut params, 0)?;
            let (rank, size, total) = sum(&c)?;
            Ok((rank, size, total, params))
        }));
        threads.into_iter().map(|t| t.join().expect("thread")).collect()
    });
    let mut ranks = Vec::new();
    for (i, r) in out.into_iter().enumerate() {
        let (rank, size, total, params) = r.unwrap_or_else(|e| panic!("thread {i}: {e}"));
        if i == 2 {
            continue;
        }
        assert_eq!((size, total, params), (4, triangle(4), vec![0.5, -1.25, 3.0]), "thread {i}");
        ranks.push(rank);
    }
    // Survivors keep their order (0, 1, 3 become 0, 1, 2); the newcomer is last.
    assert_eq!(ranks, vec![0, 1, 2, 3]);
}

#[test]
fn a_newcomer_joins_twice_grown_worlds_and_counts_its_grows() {
    let (ranks, entrance) = growable_world(&config(Duration::from_secs(20)), 2).expect("world");
    let entrance = &entrance;
    let out: Vec<Result<Vec<(usize, usize, u64)>>> = std::thread::scope(|s| {
        let mut threads: Vec<_> = ranks
            .into_iter()
            .map(|b| {
                s.spawn(move || {
                    let c = communicator(b);
                    await_joiners(&c, 1)?;
                    let once = c.grow(1)?;
                    await_joiners(&once, 2)?;
                    let twice = once.grow(2)?;
                    Ok(vec![sum(&once)?, sum(&twice)?])
                })
            })
            .collect();
        // The first newcomer is a member at the second grow.
        threads.push(s.spawn(move || {
            let once = communicator(entrance.join()?);
            await_joiners(&once, 2)?;
            let twice = once.grow(2)?;
            Ok(vec![sum(&once)?, sum(&twice)?])
        }));
        // The second grow's newcomers come once the first grow is done.
        for _ in 0..2 {
            threads.push(s.spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let c = communicator(entrance.join()?);
                Ok(vec![sum(&c)?])
            }));
        }
        threads.into_iter().map(|t| t.join().expect("thread")).collect()
    });
    let out: Vec<Vec<(usize, usize, u64)>> =
        out.into_iter().enumerate().map(|(i, r)| r.unwrap_or_else(|e| panic!("thread {i}: {e}"))).collect();
    for (i, o) in out.iter().take(3).enumerate() {
        assert_eq!(o, &vec![(i, 3, triangle(3)), (i, 5, triangle(5))], "thread {i}");
    }
    let mut late: Vec<(usize, usize, u64)> = out[3..].iter().map(|o| o[0]).collect();
    late.sort_unstable();
    assert_eq!(late, vec![(3, 5, triangle(5)), (4, 5, triangle(5))]);
}

#[test]
fn a_newcomer_that_never_comes_fails_the_members_grow_naming_its_rank() {
    let (ranks, _entrance) = growable_world(&config(Duration::from_millis(300)), 2).expect("world");
    let out: Vec<Error> = std::thread::scope(|s| {
        let threads: Vec<_> =
            ranks.into_iter().map(|b| s.spawn(move || communicator(b).grow(1).map(drop).unwrap_err())).collect();
        threads.into_iter().map(|t| t.join().expect("thread")).collect()
    });
    for e in out {
        assert!(matches!(&e, Error::Store(m) if m.contains("[2]") && m.contains("did not come")), "{e}");
    }
}

#[test]
fn a_newcomer_nobody_admits_times_out_saying_what_to_do() {
    let (_ranks, entrance) = growable_world(&config(Duration::from_millis(100)), 2).expect("world");
    match entrance.join() {
        Err(Error::Store(m)) => assert!(m.contains("must call grow"), "{m}"),
        other => panic!("{:?}", other.map(drop)),
    }
}
