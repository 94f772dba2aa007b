//! `oxccl-failure-probe SCENARIO`: one rank of a failure test (`tests/suite/failures.rs`), started
//! like any rank of a `cpu` world (`oxccl run`, or the tests' own launcher).
//!
//! Scenarios:
//! - `loop`: all_reduce (max) of `PROBE_BYTES` bytes of f32 (default 2 MiB) over and over,
//!   for at most `PROBE_SECONDS` (default 90); prints `PROBE-READY iter=20` after 20
//!   iterations, so a test can kill a rank while the others are busy.
//! - `mismatch`: rank 0 calls all_reduce, the others all_gather (in place) of the same
//!   4096-element f32 buffer.
//! - `barrier`: a barrier and an all_reduce whose result is checked.
//! - `skip`: three all_reduces of 64 f32, then a barrier; rank 1 skips the third
//!   all_reduce (so it meets the others' all_reduce with its barrier).
//! - `hang`: three all_reduces of 64 f32; after the second, rank 1 "hangs in user code": it
//!   sends itself SIGUSR1 (as an operator would: its flight recorder dumps) and sleeps
//!   `PROBE_SECONDS` (default 90).
//! - `recv_any`: rank 0 receives from any source, over and over; rank 2 (and every rank
//!   above it) sends it one message and then waits in a barrier; rank 1 sends nothing and
//!   sleeps `PROBE_SECONDS` (a test kills it). Rank 0 prints `PROBE-READY` once it has a
//!   message, and its next receive must end when rank 1 dies.
//!
//! - `shrink`: as `loop` (sum instead of max, each rank contributing `rank + 1`); when a
//!   call fails, the rank shrinks the communicator, checks an all_reduce over the survivors
//!   against the sum of their old ranks + 1, and prints `PROBE-SHRUNK rank=R size=S
//!   new_rank=N sum=X recovery_ms=M done_unix_ms=T` (M: from the failed call's error to the
//!   working shrunk communicator; T: when it was working, in ms since the epoch) and exits 0; a rank whose shrink or check fails prints `PROBE-ERROR`.
//!
//! - `elastic`: a training loop of `PROBE_STEPS` steps (default 30, `PROBE_STEP_MS` apart,
//!   default 20): each step an all_reduce (sum) of 1 per rank, checked against the size,
//!   then `agree`. A failed call or a dead rank found by `agree`: the rank shrinks and
//!   redoes the step (`PROBE-SHRUNK ...`); `agree` saying newcomers wait: the members grow
//!   by that many and rank 0 broadcasts the step to the newcomers (`PROBE-GREW ...`). Rank
//!   `PROBE_VICTIM` (default 1) kills itself with SIGKILL at step `PROBE_DIE_AT` (default
//!   10), unless it is a newcomer (`OXCCL_JOIN=1`: it joins and learns the step). The loop
//!   ends after the last step once the communicator is back to its first size (or after
//!   `PROBE_SECONDS`); each rank prints `PROBE-ELASTIC rank=R size=S steps=N shrinks=A
//!   grows=B joined=0|1`; a newcomer first prints `PROBE-JOINED rank=R size=S step=N
//!   join_ms=M` (M: from the start of its `main` to the members' state in hand).
//!
//! - `drop`: rank 0 drops its communicator (as an exception unwinding through a training
//!   script does), waits `PROBE_SECONDS`×100 ms (default 3: 300 ms) and exits with code 1;
//!   the others' all_reduce loses it (`PROBE-ERROR ... kind=PeerLost peer=0`), so under a
//!   launcher they end first, and only what they report says that rank 0 was the cause.
//!
//! - `revoke`: every rank loops over all_reduces of `PROBE_BYTES` (default 64 MiB) of f32;
//!   after `PROBE_REVOKE_AFTER_MS` (default 300) rank `PROBE_VICTIM` (default 1) revokes the
//!   communicator from another thread while its own all_reduce runs, printing
//!   `PROBE-REVOKED-AT unix_us=T`; every rank prints `PROBE-REVOKE-SEEN rank=R unix_us=T
//!   iter=I` when its call returns `Revoked` (a script takes the last minus the revoke),
//!   then stays `PROBE_LINGER_MS` (default 1000) before it exits.
//!
//! - `chaos`: issue 39's randomized trials. A training loop of `PROBE_STEPS` steps (default
//!   10): each step gathers the members' first ranks (after a shrink) and all_reduces
//!   `PROBE_BYTES` (default 1 MiB) of u64 holding first rank + 1, checked against the sum over
//!   the members, then `agree`s; a failure (a call's error, `agree`'s flag 0 or dead ranks)
//!   shrinks and redoes the step. The ranks in `PROBE_VICTIMS` (comma-separated first ranks,
//!   default `1`) die by SIGKILL at step `PROBE_DIE_AT` (default 3), where `PROBE_KILL_WHERE`
//!   says: `between` (before the step's first call), `collective` (`PROBE_KILL_DELAY_US`
//!   after entering the step's all_reduce), `agree` (that long after entering its `agree`),
//!   or `shrink` (the first victim between calls, the others that long after entering the
//!   shrink that follows). A victim whose armed call returns before the kill waits for it.
//!   Each survivor prints `PROBE-CHAOS rank=R members=A,B,.. steps=N shrinks=S`; a wrong sum
//!   prints `PROBE-ERROR ... kind=Wrong`.
//!
//! - `agree`: a barrier, then rank `PROBE_VICTIM` (default 1) dies by SIGKILL; the others
//!   wait `PROBE_AGREE_DELAY_MS` (default 0) and `agree` on a flag with their own bit
//!   (rank mod 64) cleared, and print `PROBE-AGREED rank=R flag=0x.. failed=A,B` (the same on
//!   every survivor; every survivor's bit cleared).
//! - `exclude`: every rank calls `shrink_excluding(PROBE_VICTIM)` (default 1); that rank
//!   prints `PROBE-EXCLUDED rank=R`, the others check an all_reduce of old rank + 1 on the new
//!   communicator and print `PROBE-SHRUNK rank=R size=S new_rank=N sum=X`.
//!
//! `PROBE_LINGER_MS` (default 0): how long a rank whose call failed waits before it exits.
//! `PROBE_BACKEND` picks the backend (default `cpu`; `mpi` under mpirun, in a build with the
//! `mpi` feature).
//!
//! When `PROBE_GATE` names a store key, the process, once it joined the world, waits (up to
//! 60 s) until that key is set in the job's store (`OXCCL_STORE_ADDR`, `OXCCL_SECRET`) before
//! its calls.
//!
//! Output, one line each: `PROBE-OK ...` when every call succeeded; `PROBE-ERROR rank=R
//! kind=K peer=P iter=I elapsed_ms=E error=MESSAGE` for the first failed call, where `peer` is
//! the rank the error names (`-` when none) and `elapsed_ms` the time since the last call that
//! succeeded (or since the failed call began, when none had); `PROBE-INIT-ERROR: MESSAGE` when
//! the process could not join the world.
//!
//! Exit status: 0 all calls succeeded, 2 could not join the world, 3 a call failed, 64 usage.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use oxccl::bootstrap::auth::Secret;
use oxccl::bootstrap::store::StoreClient;
use oxccl::{Communicator, Config, Error, ReduceOp};

const USAGE: &str =
    "usage: oxccl-failure-probe loop|mismatch|barrier|skip|hang|recv_any|shrink|elastic|drop|revoke|chaos|agree|exclude";

/// The variant's name and the rank it names, if any.
fn describe(e: &Error) -> (&'static str, Option<usize>) {
    match e {
        Error::InvalidArgument(_) => ("InvalidArgument", None),
        Error::Mismatch { peer, .. } => ("Mismatch", Some(*peer)),
        Error::Timeout { peer, .. } => ("Timeout", *peer),
        Error::PeerLost { rank, .. } => ("PeerLost", Some(*rank)),
        Error::Aborted { .. } => ("Aborted", None),
        Error::BackendUnavailable { .. } => ("BackendUnavailable", None),
        Error::Store(_) => ("Store", None),
        Error::Io { .. } => ("Io", None),
        Error::Backend { .. } => ("Backend", None),
        Error::Config(_) => ("Config", None),
        Error::Internal(_) => ("Internal", None),
        _ => ("Other", None),
    }
}

fn report_error(rank: usize, e: &Error, iter: u64, since: Instant) -> ExitCode {
    let (kind, peer) = describe(e);
    let peer = peer.map_or("-".to_string(), |p| p.to_string());
    let ms = since.elapsed().as_millis();
    // One line: the test parses it.
    let msg = e.to_string().replace('\n', " ");
    println!("PROBE-ERROR rank={rank} kind={kind} peer={peer} iter={iter} elapsed_ms={ms} error={msg}");
    ExitCode::from(3)
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// Waits until `key` is set in the job's store.
fn gate(key: &str) -> Result<(), String> {
    let addr = std::env::var("OXCCL_STORE_ADDR").map_err(|_| "PROBE_GATE needs OXCCL_STORE_ADDR".to_string())?;
    let secret =
        Secret::from_env().map_err(|e| e.to_string())?.ok_or_else(|| "PROBE_GATE needs OXCCL_SECRET".to_string())?;
    let store = StoreClient::connect(&addr, &secret, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    store.get_wait(key, Duration::from_secs(60)).map(drop).map_err(|e| e.to_string())
}

fn run_loop(comm: &Communicator) -> ExitCode {
    let rank = comm.rank();
    let bytes = env_number("PROBE_BYTES", 2 << 20) as usize;
    let limit = Duration::from_secs(env_number("PROBE_SECONDS", 90));
    let mut buf = vec![rank as f32; (bytes / 4).max(1)];
    let started = Instant::now();
    let mut last_ok = Instant::now();
    let mut iter = 0u64;
    while started.elapsed() < limit {
        if let Err(e) = comm.all_reduce(&mut buf, ReduceOp::Max) {
            return report_error(rank, &e, iter, last_ok);
        }
        last_ok = Instant::now();
        iter += 1;
        if iter == 20 {
            println!("PROBE-READY iter={iter}");
        }
    }
    println!("PROBE-OK rank={rank} iterations={iter}");
    ExitCode::SUCCESS
}

fn run_shrink(comm: &Communicator) -> ExitCode {
    let rank = comm.rank();
    let bytes = env_number("PROBE_BYTES", 2 << 20) as usize;
    let limit = Duration::from_secs(env_number("PROBE_SECONDS", 90));
    let mut buf = vec![(rank + 1) as f32; (bytes / 4).max(1)];
    let started = Instant::now();
    let mut last_ok = Instant::now();
    let mut iter = 0u64;
    while started.elapsed() < limit {
        buf.fill((rank + 1) as f32);
        if comm.all_reduce(&mut buf, ReduceOp::Sum).is_err() {
            let failed_at = Instant::now();
            let shrunk = match comm.shrink() {
                Ok(s) => s,
                Err(e) => return report_error(rank, &e, iter, last_ok),
            };
            // Every survivor contributes its old rank + 1: the sum says who is in.
            let mut mine = [(rank + 1) as u64];
            if let Err(e) = shrunk.all_reduce(&mut mine, ReduceOp::Sum) {
                return report_error(rank, &e, iter, last_ok);
            }
            let recovery = failed_at.elapsed().as_millis();
            // For scripts that time from the kill (scripts/bench/recovery_bench.sh).
            let done_unix_ms =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
            println!(
                "PROBE-SHRUNK rank={rank} size={} new_rank={} sum={} recovery_ms={recovery} done_unix_ms={done_unix_ms}",
                shrunk.world_size(),
                shrunk.rank(),
                mine[0]
            );
            return ExitCode::SUCCESS;
        }
        last_ok = Instant::now();
        iter += 1;
        if iter == 20 {
            println!("PROBE-READY iter={iter}");
        }
    }
    println!("PROBE-OK rank={rank} iterations={iter}");
    ExitCode::SUCCESS
}

/// When `main` began (a newcomer reports how long joining took from there).
static PROCESS_START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn run_elastic(first: Communicator) -> ExitCode {
    let joined = std::env::var("OXCCL_JOIN").is_ok_and(|v| v == "1");
    let steps = env_number("PROBE_STEPS", 30);
    let pause = Duration::from_millis(env_number("PROBE_STEP_MS", 20));
    let victim = env_number("PROBE_VICTIM", 1) as usize;
    let die_at = env_number("PROBE_DIE_AT", 10);
    let limit = Duration::from_secs(env_number("PROBE_SECONDS", 90));
    let started = Instant::now();
    let first_rank = first.rank();
    let mut comm = first;
    // [step, the size to get back to]: a newcomer learns them from rank 0.
    let mut state = [0u64, comm.world_size() as u64];
    if joined {
        if let Err(e) = comm.broadcast(&mut state, 0) {
            return report_error(comm.rank(), &e, 0, started);
        }
        // From the start of main to a working communicator (it has the members' state).
        let ms = PROCESS_START.get().map_or(0, |t| t.elapsed().as_millis());
        println!("PROBE-JOINED rank={} size={} step={} join_ms={ms}", comm.rank(), comm.world_size(), state[0]);
    }
    let (mut shrinks, mut grows) = (0, 0);
    while state[0] < steps || (comm.world_size() as u64) < state[1] {
        if started.elapsed() > limit {
            println!(
                "PROBE-ERROR rank={} kind=Timeout peer=- iter={} elapsed_ms=0 error=the loop ran past PROBE_SECONDS",
                comm.rank(),
                state[0]
            );
            return ExitCode::from(3);
        }
        if !joined && first_rank == victim && state[0] == die_at {
            // SAFETY: kill(2) on this process with SIGKILL: nothing runs after it.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let mut x = [1u64];
        let summed = comm.all_reduce(&mut x, ReduceOp::Sum);
        let agreed = comm.agree(u64::from(summed.is_ok()));
        let dead = match &agreed {
            Ok(a) => a.flag == 0 || !a.failed.is_empty(),
            Err(_) => true,
        };
        if dead {
            // Someone's step failed: shrink, and redo the step.
            let failed_at = Instant::now();
            comm = match comm.shrink() {
                Ok(c) => c,
                Err(e) => return report_error(first_rank, &e, state[0], failed_at),
            };
            shrinks += 1;
            println!(
                "PROBE-SHRUNK rank={first_rank} size={} new_rank={} step={} recovery_ms={}",
                comm.world_size(),
                comm.rank(),
                state[0],
                failed_at.elapsed().as_millis()
            );
            continue;
        }
        if x[0] != comm.world_size() as u64 {
            println!(
                "PROBE-ERROR rank={} kind=Wrong peer=- iter={} elapsed_ms=0 error=sum {} on {} ranks",
                comm.rank(),
                state[0],
                x[0],
                comm.world_size()
            );
            return ExitCode::from(3);
        }
        // Past the last step, the loop only waits for newcomers to bring the size back.
        state[0] = (state[0] + 1).min(steps);
        let joiners = agreed.map_or(0, |a| a.joiners);
        if joiners > 0 {
            let grew_at = Instant::now();
            comm = match comm.grow(joiners) {
                Ok(c) => c,
                Err(e) => return report_error(first_rank, &e, state[0], grew_at),
            };
            if let Err(e) = comm.broadcast(&mut state, 0) {
                return report_error(comm.rank(), &e, state[0], grew_at);
            }
            grows += 1;
            println!(
                "PROBE-GREW rank={} size={} step={} grow_ms={}",
                comm.rank(),
                comm.world_size(),
                state[0],
                grew_at.elapsed().as_millis()
            );
        }
        std::thread::sleep(pause);
    }
    println!(
        "PROBE-ELASTIC rank={} size={} steps={} shrinks={shrinks} grows={grows} joined={}",
        comm.rank(),
        comm.world_size(),
        state[0],
        u8::from(joined)
    );
    ExitCode::SUCCESS
}

/// Microseconds since the epoch (ranks on one host share the clock).
fn unix_us() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros())
}

fn run_revoke(comm: &Communicator) -> ExitCode {
    let rank = comm.rank();
    let bytes = env_number("PROBE_BYTES", 64 << 20) as usize;
    let after = Duration::from_millis(env_number("PROBE_REVOKE_AFTER_MS", 300));
    let limit = Duration::from_secs(env_number("PROBE_SECONDS", 60));
    if rank == env_number("PROBE_VICTIM", 1) as usize {
        let c = comm.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            println!("PROBE-REVOKED-AT unix_us={}", unix_us());
            let _ = c.revoke("the revoke probe");
        });
    }
    let mut buf = vec![1.0f32; (bytes / 4).max(1)];
    let started = Instant::now();
    let mut iter = 0u64;
    while started.elapsed() < limit {
        match comm.all_reduce(&mut buf, ReduceOp::Sum) {
            Ok(()) => iter += 1,
            Err(Error::Revoked { .. }) => {
                println!("PROBE-REVOKE-SEEN rank={rank} unix_us={} iter={iter}", unix_us());
                // Stay a while, as a rank that goes on to shrink would: one that exits at once
                // can end a peer's receive from it (PeerLost) before the revoke reaches it.
                std::thread::sleep(Duration::from_millis(env_number("PROBE_LINGER_MS", 1000)));
                return ExitCode::SUCCESS;
            }
            Err(e) => return report_error(rank, &e, iter, started),
        }
    }
    println!(
        "PROBE-ERROR rank={rank} kind=NoRevoke peer=- iter={iter} elapsed_ms=0 error=no Revoked before PROBE_SECONDS"
    );
    ExitCode::from(3)
}

/// Where `chaos` kills its victims.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KillAt {
    Between,
    Collective,
    Agree,
    Shrink,
}

/// SIGKILLs this process `delay` from now (from another thread), so the kill lands inside
/// the call the caller makes next.
fn kill_after(delay: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        // SAFETY: kill(2) on this process with SIGKILL: nothing runs after it.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    });
}

/// A victim whose armed call came back before the kill: it waits for the kill.
fn await_kill() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// One step on `comm`: the members' first ranks (when `members` is stale), then the
/// all_reduce of first rank + 1, checked: whether the calls succeeded; `Err` says how a
/// result was wrong.
fn chaos_step(
    comm: &Communicator,
    first_rank: usize,
    members: &mut Option<Vec<usize>>,
    buf: &mut [u64],
) -> Result<bool, String> {
    if members.is_none() {
        let mut all = vec![0u64; comm.world_size()];
        if comm.all_gather(&[first_rank as u64], &mut all).is_err() {
            return Ok(false);
        }
        *members = Some(all.into_iter().map(|r| r as usize).collect());
    }
    buf.fill(first_rank as u64 + 1);
    if comm.all_reduce(buf, ReduceOp::Sum).is_err() {
        return Ok(false);
    }
    let want: u64 = members.as_ref().map_or(0, |m| m.iter().map(|&r| r as u64 + 1).sum());
    match buf.iter().position(|&x| x != want) {
        None => Ok(true),
        Some(at) => Err(format!("element {at} is {} where the members {members:?} sum to {want}", buf[at])),
    }
}

fn run_chaos(first: Communicator) -> ExitCode {
    let first_rank = first.rank();
    let steps = env_number("PROBE_STEPS", 10);
    let die_at = env_number("PROBE_DIE_AT", 3);
    let delay = Duration::from_micros(env_number("PROBE_KILL_DELAY_US", 0));
    let victims: Vec<usize> = std::env::var("PROBE_VICTIMS")
        .unwrap_or_else(|_| "1".into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let at = match std::env::var("PROBE_KILL_WHERE").as_deref() {
        Ok("collective") => KillAt::Collective,
        Ok("agree") => KillAt::Agree,
        Ok("shrink") => KillAt::Shrink,
        _ => KillAt::Between,
    };
    // Under `shrink` the first victim dies between calls and the others inside the shrink.
    let victim = victims.iter().position(|&v| v == first_rank);
    let lead = victim == Some(0) || at != KillAt::Shrink;
    let started = Instant::now();
    let mut buf = vec![0u64; (env_number("PROBE_BYTES", 1 << 20) as usize / 8).max(1)];
    let mut comm = first;
    let mut members: Option<Vec<usize>> = Some((0..comm.world_size()).collect());
    let (mut step, mut shrinks) = (0, 0);
    while step < steps {
        let mine = victim.is_some() && step == die_at;
        if mine && lead && (at == KillAt::Between || at == KillAt::Shrink) {
            // SAFETY: kill(2) on this process with SIGKILL: nothing runs after it.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        if mine && at == KillAt::Collective {
            kill_after(delay);
        }
        let ok = match chaos_step(&comm, first_rank, &mut members, &mut buf) {
            Ok(ok) => ok,
            Err(wrong) => {
                println!("PROBE-ERROR rank={first_rank} kind=Wrong peer=- iter={step} elapsed_ms=0 error={wrong}");
                return ExitCode::from(3);
            }
        };
        if mine && at == KillAt::Collective {
            await_kill();
        }
        if mine && at == KillAt::Agree {
            kill_after(delay);
        }
        let agreed = comm.agree(u64::from(ok));
        if mine && at == KillAt::Agree {
            await_kill();
        }
        let failed = match &agreed {
            Ok(a) => a.flag == 0 || !a.failed.is_empty(),
            Err(e) => {
                eprintln!("chaos: agree failed at step {step}");
                return report_error(first_rank, e, step, started);
            }
        };
        if !failed {
            step += 1;
            continue;
        }
        let arm = victim.is_some() && !lead && at == KillAt::Shrink && shrinks == 0;
        if arm {
            kill_after(delay);
        }
        comm = match comm.shrink() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("chaos: shrink failed at step {step}");
                return report_error(first_rank, &e, step, started);
            }
        };
        if arm {
            await_kill();
        }
        shrinks += 1;
        members = None;
    }
    let list = members.unwrap_or_default().iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    println!("PROBE-CHAOS rank={first_rank} members={list} steps={step} shrinks={shrinks}");
    ExitCode::SUCCESS
}

fn run_agree(comm: &Communicator) -> ExitCode {
    let rank = comm.rank();
    let t = Instant::now();
    if let Err(e) = comm.barrier() {
        return report_error(rank, &e, 0, t);
    }
    if rank == env_number("PROBE_VICTIM", 1) as usize {
        // SAFETY: kill(2) on this process with SIGKILL: nothing runs after it.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    std::thread::sleep(Duration::from_millis(env_number("PROBE_AGREE_DELAY_MS", 0)));
    match comm.agree(!(1u64 << (rank % 64))) {
        Ok(a) => {
            let failed = a.failed.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
            println!("PROBE-AGREED rank={rank} flag={:#x} failed={failed}", a.flag);
            ExitCode::SUCCESS
        }
        Err(e) => report_error(rank, &e, 1, t),
    }
}

fn run_exclude(comm: &Communicator) -> ExitCode {
    let rank = comm.rank();
    let t = Instant::now();
    let shrunk = match comm.shrink_excluding(&[env_number("PROBE_VICTIM", 1) as usize]) {
        Ok(Some(c)) => c,
        Ok(None) => {
            println!("PROBE-EXCLUDED rank={rank}");
            return ExitCode::SUCCESS;
        }
        Err(e) => return report_error(rank, &e, 0, t),
    };
    let mut mine = [(rank + 1) as u64];
    if let Err(e) = shrunk.all_reduce(&mut mine, ReduceOp::Sum) {
        return report_error(rank, &e, 1, t);
    }
    println!("PROBE-SHRUNK rank={rank} size={} new_rank={} sum={}", shrunk.world_size(), shrunk.rank(), mine[0]);
    ExitCode::SUCCESS
}

fn run_mismatch(comm: &Communicator) -> ExitCode {
    let rank = comm.rank();
    let mut buf = vec![1.0f32; 4096];
    let t = Instant::now();
    let r = if rank == 0 { comm.all_reduce(&mut buf, ReduceOp::Sum) } else { comm.all_gather_in_place(&mut buf) };
    match r {
        Ok(()) => {
            println!("PROBE-OK rank={rank} (the mismatched call succeeded)");
            ExitCode::SUCCESS
        }
        Err(e) => report_error(rank, &e, 0, t),
    }
}

fn run_barrier(comm: &Communicator) -> ExitCode {
    let (rank, n) = (comm.rank(), comm.world_size());
    let t = Instant::now();
    if let Err(e) = comm.barrier() {
        return report_error(rank, &e, 0, t);
    }
    let mut x = vec![rank as u64 + 1; 1000];
    if let Err(e) = comm.all_reduce(&mut x, ReduceOp::Sum) {
        return report_error(rank, &e, 1, t);
    }
    let want = (n * (n + 1) / 2) as u64;
    if x.iter().any(|&v| v != want) {
        println!("PROBE-ERROR rank={rank} kind=WrongResult peer=- iter=1 elapsed_ms=0 error=expected {want}");
        return ExitCode::from(3);
    }
    println!("PROBE-OK rank={rank}");
    ExitCode::SUCCESS
}

/// `skip` and `hang`: three all_reduces (then a barrier), rank 1 leaving the third out
/// (`skip`) or stopping before it (`hang`).
fn run_skip_or_hang(comm: &Communicator, hang: bool) -> ExitCode {
    let rank = comm.rank();
    let mut buf = vec![1.0f32; 64];
    let t = Instant::now();
    for iter in 0..3u64 {
        if rank == 1 && iter == 2 {
            if !hang {
                break;
            }
            // SAFETY: raise sends a signal to this process; the flight recorder's watcher
            // thread handles SIGUSR1 (the process left it at its default).
            unsafe { libc::raise(libc::SIGUSR1) };
            std::thread::sleep(Duration::from_secs(env_number("PROBE_SECONDS", 90)));
        }
        if let Err(e) = comm.all_reduce(&mut buf, ReduceOp::Sum) {
            return report_error(rank, &e, iter, t);
        }
    }
    if let Err(e) = comm.barrier() {
        return report_error(rank, &e, 3, t);
    }
    println!("PROBE-OK rank={rank}");
    ExitCode::SUCCESS
}

fn run_recv_any(comm: &Communicator) -> ExitCode {
    let rank = comm.rank();
    let t = Instant::now();
    let mut buf = [0u32; 4];
    match rank {
        0 => {
            for iter in 0.. {
                let since = Instant::now();
                match comm.recv_any(&mut buf, 1) {
                    Ok(info) => println!("PROBE-READY iter={iter} source={}", info.source),
                    Err(e) => return report_error(rank, &e, iter, since),
                }
            }
            ExitCode::SUCCESS
        }
        1 => {
            std::thread::sleep(Duration::from_secs(env_number("PROBE_SECONDS", 90)));
            ExitCode::SUCCESS
        }
        _ => {
            if let Err(e) = comm.send(&[rank as u32; 4], 0, 1) {
                return report_error(rank, &e, 0, t);
            }
            match comm.barrier() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => report_error(rank, &e, 1, t),
            }
        }
    }
}

fn main() -> ExitCode {
    let _ = PROCESS_START.set(Instant::now());
    let scenario = std::env::args().nth(1).unwrap_or_default();
    if !matches!(
        scenario.as_str(),
        "loop"
            | "mismatch"
            | "barrier"
            | "skip"
            | "hang"
            | "recv_any"
            | "shrink"
            | "elastic"
            | "drop"
            | "revoke"
            | "chaos"
            | "agree"
            | "exclude"
    ) {
        eprintln!("{USAGE}");
        return ExitCode::from(64);
    }
    let backend = std::env::var("PROBE_BACKEND").unwrap_or_else(|_| "cpu".to_string());
    let comm = match Config::new().backend(&backend).init() {
        Ok(c) => c,
        Err(e) => {
            println!("PROBE-INIT-ERROR: {}", e.to_string().replace('\n', " "));
            return ExitCode::from(2);
        }
    };
    if let Ok(key) = std::env::var("PROBE_GATE") {
        if let Err(e) = gate(&key) {
            println!("PROBE-INIT-ERROR: waiting for the gate {key:?}: {e}");
            return ExitCode::from(2);
        }
    }
    if scenario == "elastic" {
        return run_elastic(comm);
    }
    if scenario == "revoke" {
        return run_revoke(&comm);
    }
    if scenario == "chaos" {
        return run_chaos(comm);
    }
    if scenario == "drop" {
        let rank = comm.rank();
        if rank == 0 {
            drop(comm);
            std::thread::sleep(Duration::from_millis(100 * env_number("PROBE_SECONDS", 3)));
            println!("PROBE-DROPPED rank=0");
            return ExitCode::from(1);
        }
        let mut x = [1.0f32; 16];
        let started = Instant::now();
        return match comm.all_reduce(&mut x, ReduceOp::Sum) {
            Ok(()) => {
                println!("PROBE-OK rank={rank} iterations=1");
                ExitCode::SUCCESS
            }
            Err(e) => report_error(rank, &e, 0, started),
        };
    }
    let code = match scenario.as_str() {
        "loop" => run_loop(&comm),
        "mismatch" => run_mismatch(&comm),
        "skip" => run_skip_or_hang(&comm, false),
        "hang" => run_skip_or_hang(&comm, true),
        "recv_any" => run_recv_any(&comm),
        "shrink" => run_shrink(&comm),
        "agree" => run_agree(&comm),
        "exclude" => run_exclude(&comm),
        _ => run_barrier(&comm),
    };
    if code != ExitCode::SUCCESS {
        // Under launchers that stop a job at its first failed rank (mpirun), give the others
        // the time to find the failure themselves (and write their dumps).
        std::thread::sleep(Duration::from_millis(env_number("PROBE_LINGER_MS", 0)));
    }
    code
}
