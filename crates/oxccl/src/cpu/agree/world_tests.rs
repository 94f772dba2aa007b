//! `agree`, `shrink` and `shrink_excluding` on `local` worlds (ranks as threads), with
//! ranks killed as SIGKILL kills a process (`MemoryHub::kill`): before the call, in the
//! middle of a collective, in the middle of the agreement itself. Results are checked against
//! what the survivors' inputs say.

use std::sync::Arc;
use std::time::Duration;

use crate::communicator::Communicator;
use crate::config::Config;
use crate::cpu::transport::memory::MemoryHub;
use crate::error::Error;
use crate::reduce_op::ReduceOp;

/// A local world of `n` (no flight recorder: the failures would leave dumps) and its hub.
fn world(n: usize, timeout: Duration) -> (Arc<MemoryHub>, Vec<Communicator>) {
    let cfg = Config::new()
        .timeout(timeout)
        .set("OXCCL_FR_SIZE", "0")
        .and_then(|c| c.resolve_with(|_| None))
        .expect("config");
    let (hub, ranks) = crate::cpu::local::world_on_hub(&cfg, n, "local").expect("world");
    let perf = Arc::new(cfg.perf.clone());
    (hub, ranks.into_iter().map(|b| Communicator::observed(Arc::new(b), Arc::clone(&perf))).collect())
}

/// Runs `f(rank, comm)` on every rank in threads; the results in rank order.
fn run<R: Send>(comms: Vec<Communicator>, f: impl Fn(usize, Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(r, c)| {
                s.spawn({
                    let f = &f;
                    move || f(r, c)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

#[test]
fn agree_without_failures_is_the_and_of_every_flag() {
    for n in 1..=5 {
        let (_hub, comms) = world(n, Duration::from_secs(10));
        let out = run(comms, |r, c| {
            let a = c.agree(!(1u64 << r)).expect("agree");
            let b = c.agree(u64::MAX).expect("agree again");
            (a, b)
        });
        let want = (0..n).fold(u64::MAX, |a, r| a & !(1u64 << r));
        for (a, b) in out {
            assert_eq!((a.flag, a.failed.as_slice()), (want, &[][..]), "n={n}");
            assert_eq!((b.flag, b.failed.as_slice()), (u64::MAX, &[][..]), "n={n}");
        }
    }
}

#[test]
fn ranks_killed_before_agree_are_agreed_failed_rank_0_included() {
    for (n, victims) in [(2, vec![0]), (3, vec![0]), (4, vec![1, 3]), (5, vec![0, 1, 2])] {
        let (hub, comms) = world(n, Duration::from_secs(10));
        for &v in &victims {
            hub.kill(v);
        }
        let out = run(comms, |r, c| (!victims.contains(&r)).then(|| c.agree(1 << r | 1).expect("agree")));
        let want = (0..n).filter(|r| !victims.contains(r)).fold(u64::MAX, |a, r| a & (1 << r | 1));
        for a in out.into_iter().flatten() {
            assert_eq!(a.flag, want, "n={n}");
            assert_eq!(a.failed, victims, "n={n}");
        }
    }
}

#[test]
fn a_rank_killed_during_agreements_leaves_the_survivors_agreeing() {
    // The victim agrees in a loop and is killed after a random delay: in some agreement,
    // anywhere in it. Every survivor's sequence of decisions is the same.
    for seed in 0..12u64 {
        let n = 3 + (seed % 3) as usize;
        let victim = (seed as usize * 7) % n;
        let (hub, comms) = world(n, Duration::from_secs(20));
        let delay = Duration::from_micros(crate::cpu::splitmix64(seed) % 3000);
        let out = run(comms, |r, c| {
            if r == victim {
                let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let killer = std::thread::spawn({
                    let (hub, killed) = (Arc::clone(&hub), Arc::clone(&killed));
                    move || {
                        std::thread::sleep(delay);
                        hub.kill(victim);
                        killed.store(true, std::sync::atomic::Ordering::Release);
                    }
                });
                // A dead process calls nothing more.
                while !killed.load(std::sync::atomic::Ordering::Acquire) && c.agree(1).is_ok() {}
                killer.join().expect("killer");
                return None;
            }
            let mut seen = Vec::new();
            loop {
                let a = c.agree(1).unwrap_or_else(|e| panic!("seed {seed}: rank {r}: {e}"));
                let done = a.failed.contains(&victim);
                seen.push(a);
                if done {
                    return Some(seen);
                }
            }
        });
        let survivors: Vec<&Vec<crate::backend::Agreement>> = out.iter().flatten().collect();
        assert_eq!(survivors.len(), n - 1);
        for s in &survivors {
            assert_eq!(*s, survivors[0], "seed {seed}: survivors decided differently");
        }
    }
}

#[test]
fn survivors_shrink_after_a_rank_dies_in_a_collective_and_compute_on() {
    for (n, victim) in [(2, 0), (3, 0), (4, 2), (5, 4), (6, 3)] {
        let (hub, comms) = world(n, Duration::from_secs(20));
        let out = run(comms, |r, c| {
            let mut x = vec![1.0f32; 4096];
            c.all_reduce(&mut x, ReduceOp::Sum).expect("a first all_reduce");
            if r == victim {
                hub.kill(victim);
                return None;
            }
            // The next one loses the victim: on every survivor, an error, not a hang.
            let mut y = vec![r as f32; 1 << 16];
            let lost = c.all_reduce(&mut y, ReduceOp::Sum).expect_err("the victim is gone");
            assert!(matches!(lost, Error::PeerLost { .. } | Error::Aborted { .. }), "{lost}");
            let s = c.shrink().expect("shrink");
            assert_eq!(s.world_size(), n - 1);
            assert_eq!(s.rank(), if r < victim { r } else { r - 1 }, "old rank order");
            let mut z = vec![r as f32; 1001];
            s.all_reduce(&mut z, ReduceOp::Sum).expect("all_reduce on the shrunk communicator");
            Some(z)
        });
        let want: f32 = (0..n).filter(|&r| r != victim).map(|r| r as f32).sum();
        for z in out.into_iter().flatten() {
            assert!(z.iter().all(|&v| v == want), "n={n} victim={victim}");
        }
    }
}

#[test]
fn shrink_excluding_removes_the_listed_ranks_who_get_none() {
    let n = 5;
    let (_hub, comms) = world(n, Duration::from_secs(10));
    let out = run(comms, |r, c| {
        let s = c.shrink_excluding(&[3, 1]).expect("shrink_excluding");
        s.map(|s| {
            let mut v = vec![r as i64];
            s.all_reduce(&mut v, ReduceOp::Sum).expect("all_reduce");
            (s.rank(), s.world_size(), v[0])
        })
    });
    assert_eq!(out, vec![Some((0, 3, 6)), None, Some((1, 3, 6)), None, Some((2, 3, 6))]);
}

#[test]
fn shrink_excluding_with_a_bad_or_differing_list_is_an_error_on_every_rank() {
    let (_hub, comms) = world(3, Duration::from_secs(10));
    let c = &comms[0];
    for (bad, says) in [(&[3][..], "not in this communicator"), (&[1, 1], "listed twice"), (&[0, 1, 2], "every rank")] {
        match c.shrink_excluding(bad) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("{bad:?}: {:?}", other.map(|o| o.map(|c| c.world_size()))),
        }
    }
    let out = run(comms, |r, c| c.shrink_excluding(if r == 2 { &[1] } else { &[2] }).map(|o| o.is_some()));
    for o in out {
        match o {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("different lists"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn revoke_ends_waits_on_every_rank_and_the_revoked_communicator_shrinks() {
    // Ranks 0, 2 and 3 enter a large all_reduce; rank 1 does not, and revokes instead: every
    // wait ends with `Revoked` naming rank 1 (not a timeout), later calls too, and the four
    // shrink the revoked communicator into one that works.
    let n = 4;
    let (_hub, comms) = world(n, Duration::from_secs(30));
    let out = run(comms, |r, c| {
        let started = std::time::Instant::now();
        let first = if r == 1 {
            std::thread::sleep(Duration::from_millis(50));
            c.revoke("rank 1 stops the step").expect("revoke");
            None
        } else {
            let mut big = vec![1.0f32; 4 << 20];
            Some(c.all_reduce(&mut big, ReduceOp::Sum).expect_err("revoked"))
        };
        let waited = started.elapsed();
        let later = c.barrier().expect_err("a call after the revoke");
        let s = c.shrink().expect("the revoked communicator shrinks");
        let mut v = vec![r as u32 + 1];
        s.all_reduce(&mut v, ReduceOp::Sum).expect("all_reduce after the shrink");
        (first, waited, later, s.world_size(), v[0])
    });
    for (r, (first, waited, later, size, sum)) in out.into_iter().enumerate() {
        if let Some(e) = first {
            assert!(
                matches!(&e, Error::Revoked { rank: 1, reason } if reason.contains("stops the step")),
                "rank {r}: {e}"
            );
            assert!(waited < Duration::from_secs(10), "rank {r} waited {waited:?} for the revoke");
        }
        assert!(matches!(later, Error::Revoked { rank: 1, .. }), "rank {r}: {later}");
        assert_eq!((size, sum), (4, 10), "rank {r}");
    }
}

#[test]
fn revoke_from_another_thread_ends_this_ranks_own_wait() {
    let (_hub, comms) = world(2, Duration::from_secs(30));
    let out = run(comms, |r, c| {
        if r == 1 {
            // Never joins the broadcast; waits for rank 0's revoke to reach it.
            let mut x = [0u8; 1];
            return c.recv(&mut x, 0, 9).map(drop);
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                c.revoke("from a watchdog thread").expect("revoke");
            });
            let mut x = vec![0u8; 1 << 20];
            c.broadcast(&mut x, 1).map(drop)
        })
    });
    for (r, o) in out.into_iter().enumerate() {
        assert!(matches!(&o, Err(Error::Revoked { rank: 0, .. })), "rank {r}: {o:?}");
    }
}

/// A coordinator killed halfway through its commits: rank 1 takes the shrink's decision and
/// drops the old communicator at once, as a training loop does (`comm = comm.shrink()?`);
/// only then does rank 0 die, and ranks 2 and 3, who never got the commit, ask rank 1, their
/// new coordinator, for it. The shrunk communicator keeps the old one's agreements answering
/// until its own first decision, so they get it: without that they waited until their
/// deadline.
#[test]
fn a_member_that_took_the_decision_and_dropped_the_old_communicator_still_answers() {
    let n = 4;
    let (hub, comms) = world(n, Duration::from_secs(5));
    // Rank 0 coordinates: its 3 proposals and its commit to rank 1 go out, no other.
    hub.mute_after_agreement_sends(0, n);
    let dropped = std::sync::Barrier::new(2);
    let out = run(comms, |r, c| {
        let shrunk = c.shrink();
        drop(c);
        match r {
            0 => {
                dropped.wait();
                hub.kill(0);
                return None;
            }
            1 => {
                dropped.wait();
            }
            _ => {}
        }
        let mut comm = shrunk.unwrap_or_else(|e| panic!("rank {r}: shrink: {e}"));
        // Rank 0 died after the decision: the next agreement finds it, the next shrink drops it.
        let a = comm.agree(1).unwrap_or_else(|e| panic!("rank {r}: agree: {e}"));
        if !a.failed.is_empty() {
            comm = comm.shrink().unwrap_or_else(|e| panic!("rank {r}: second shrink: {e}"));
        }
        let mut x = [r as u64 + 1];
        comm.all_reduce(&mut x, ReduceOp::Sum).unwrap_or_else(|e| panic!("rank {r}: all_reduce: {e}"));
        Some((comm.world_size(), comm.rank(), x[0]))
    });
    for (r, got) in out.iter().enumerate().skip(1) {
        assert_eq!(*got, Some((3, r - 1, 2 + 3 + 4)), "rank {r}");
    }
}
