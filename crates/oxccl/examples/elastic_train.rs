//! Elastic data-parallel training that survives a SIGKILL without a restart:
//!
//! ```text
//! oxccl run -n 4 --max-restarts 1 -- target/debug/examples/elastic_train
//! ```
//!
//! A linear model learns integer weights from integer samples, in fixed point (`i64`): the
//! gradient sums are exact, so the run is deterministic whatever the membership. Each step's
//! global batch is sharded by membership (sample `s` goes to the member `s % size`); the
//! members all_reduce their gradients and `agree` that every member's step succeeded before
//! they apply it. One rank kills itself (SIGKILL) at a step chosen at random
//! (`ELASTIC_KILL_RANK`, `ELASTIC_KILL_STEP` fix them; `ELASTIC_KILL_RANK=none` kills no
//! one): the survivors shrink and redo the step; `oxccl run` starts a replacement, which joins
//! (`OXCCL_JOIN=1`), `agree` tells the members, they grow, and rank 0 broadcasts the step and
//! the weights to it. At the end rank 0 replays the membership schedule sequentially, in one
//! process, and checks that the final weights are equal, bit for bit.
//!
//! Output (rank 0): `membership: step 0 size 4, step 7 size 3, step 9 size 4` and
//! `final weights match the sequential reference (STEPS steps, DIM weights)`.

use std::time::Duration;

use oxccl::{Communicator, ReduceOp};

/// Weights, samples per step, steps.
const DIM: usize = 8;
const BATCH: u64 = 64;
const STEPS: u64 = 40;
/// Fixed point: weights are integers scaled by this.
const SCALE: i64 = 1 << 20;

/// The weights to learn (unscaled).
fn truth(i: usize) -> i64 {
    (i as i64 * 7 % 11) - 5
}

/// A deterministic small integer from (step, sample, feature).
fn feature(step: u64, sample: u64, i: usize) -> i64 {
    let mut x = step.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ sample.wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ i as u64;
    x ^= x >> 31;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 29;
    (x % 7) as i64 - 3
}

/// The gradient (scaled) of the squared error of `w` over this member's shard of the step's
/// batch: samples `s` with `s % size == member`.
fn shard_gradient(w: &[i64], step: u64, member: usize, size: usize) -> Vec<i64> {
    let mut g = vec![0i64; DIM];
    for s in (0..BATCH).filter(|s| s % size as u64 == member as u64) {
        let x: Vec<i64> = (0..DIM).map(|i| feature(step, s, i)).collect();
        let predicted: i64 = x.iter().zip(w).map(|(a, b)| a * b).sum();
        let target: i64 = x.iter().enumerate().map(|(i, a)| a * truth(i) * SCALE).sum();
        let err = predicted - target;
        for (gi, xi) in g.iter_mut().zip(&x) {
            *gi += err * xi;
        }
    }
    g
}

/// One step's update from the summed gradient (integer division: exact and the same
/// everywhere).
fn apply(w: &mut [i64], g: &[i64]) {
    for (wi, gi) in w.iter_mut().zip(g) {
        *wi -= gi / (BATCH as i64 * 16);
    }
}

/// The sequential reference: every step's batch, summed shard by shard as `schedule` says
/// the members were at that step.
fn reference(schedule: &[(u64, usize)]) -> Vec<i64> {
    let mut w = vec![0i64; DIM];
    for step in 0..STEPS {
        let size = schedule.iter().rev().find(|(s, _)| *s <= step).map_or(1, |&(_, n)| n);
        let mut g = vec![0i64; DIM];
        for member in 0..size {
            for (a, b) in g.iter_mut().zip(shard_gradient(&w, step, member, size)) {
                *a += b;
            }
        }
        apply(&mut w, &g);
    }
    w
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> oxccl::Result<()> {
    // A replacement started by `oxccl run --max-restarts` has OXCCL_JOIN=1: `init` joins.
    let joined = std::env::var("OXCCL_JOIN").is_ok_and(|v| v == "1");
    let mut comm: Communicator = oxccl::init()?;
    let first_size = comm.world_size();
    let first_rank = comm.rank();
    // The victim and its step: from the environment, else "random" from the job's start.
    let seed =
        std::env::var("OXCCL_SECRET").map_or(1, |s| s.bytes().fold(7u64, |h, b| h.wrapping_mul(31) ^ u64::from(b)));
    let victim: Option<usize> = match std::env::var("ELASTIC_KILL_RANK").as_deref() {
        Ok("none") => None,
        Ok(v) => v.parse().ok(),
        Err(_) => Some((seed % first_size.max(2) as u64) as usize),
    };
    let kill_step: u64 = env_or("ELASTIC_KILL_STEP", 5 + (seed >> 8) % (STEPS - 15));

    // [step, size to return to, weights...]: what a newcomer learns from rank 0.
    let mut state = vec![0i64; 2 + DIM];
    state[1] = first_size as i64;
    if joined {
        comm.broadcast(&mut state, 0)?;
    }
    let mut schedule: Vec<(u64, usize)> = vec![(state[0] as u64, comm.world_size())];
    let mut short_since: Option<std::time::Instant> = None;
    while (state[0] as u64) < STEPS || comm.world_size() < state[1] as usize {
        let step = state[0] as u64;
        if !joined && Some(first_rank) == victim && step == kill_step && first_size > 1 {
            println!("rank {first_rank}: killing myself (SIGKILL) at step {step}");
            // SAFETY: kill(2) on this process; nothing runs after it.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let mut g = shard_gradient(&state[2..], step, comm.rank(), comm.world_size());
        let ok = comm.all_reduce(&mut g, ReduceOp::Sum).is_ok();
        // Did every member finish the step? The same answer on every survivor.
        let agreed = comm.agree(u64::from(ok));
        let failed = agreed.as_ref().map_or(true, |a| a.flag == 0 || !a.failed.is_empty());
        if failed {
            comm = comm.shrink()?;
            schedule.push((step, comm.world_size()));
            if comm.rank() == 0 {
                println!("step {step}: a member failed; {} survivors redo the step", comm.world_size());
            }
            continue;
        }
        if step < STEPS {
            apply(&mut state[2..], &g);
            state[0] += 1;
        }
        let joiners = agreed.map_or(0, |a| a.joiners);
        if joiners > 0 {
            comm = comm.grow(joiners)?;
            comm.broadcast(&mut state, 0)?;
            schedule.push((state[0] as u64, comm.world_size()));
            if comm.rank() == 0 {
                println!("step {}: {joiners} newcomer(s) joined; {} members", state[0], comm.world_size());
            }
        }
        if (state[0] as u64) >= STEPS && comm.world_size() < state[1] as usize {
            // Done, but short of the first size: give the replacement time to arrive.
            let waited = *short_since.get_or_insert_with(std::time::Instant::now);
            if waited.elapsed() > Duration::from_secs(60) {
                eprintln!("no replacement joined within 60 s (run under `oxccl run --max-restarts 1`)");
                std::process::exit(2);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    if comm.rank() == 0 {
        let trail: Vec<String> = schedule.iter().map(|(s, n)| format!("step {s} size {n}")).collect();
        println!("membership: {}", trail.join(", "));
        let want = reference(&schedule);
        if want != state[2..] {
            eprintln!("final weights {:?} differ from the sequential reference {want:?}", &state[2..]);
            std::process::exit(1);
        }
        let learned: Vec<f64> = state[2..].iter().map(|w| *w as f64 / SCALE as f64).collect();
        println!("learned {learned:.2?}");
        println!("final weights match the sequential reference ({STEPS} steps, {DIM} weights)");
    }
    // Every rank holds the same weights: compare with rank 0's.
    let mut check = state[2..].to_vec();
    comm.broadcast(&mut check, 0)?;
    assert_eq!(check, state[2..], "rank {} holds other weights than rank 0", comm.rank());
    Ok(())
}
