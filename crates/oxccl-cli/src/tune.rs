//! `oxccl tune`: measures the costs the `cpu` backend's algorithm choice reads and prints
//! (or writes) a profile for `OXCCL_TUNE_FILE` ([`oxccl::tuning`]).
//!
//! Every rank of the job joins two worlds over the same processes: one on the default
//! transports (shared memory on one host) and one on TCP only. Rank 0 and rank 1 then
//! measure, while the others wait at a barrier:
//! - per transport, α (an exchange of 8 bytes: both send and receive at once, as in the
//!   steps of a collective), the bandwidth (a 4 MiB exchange, α taken off), the cached
//!   bandwidth (an exchange of half the per-core L2 cache, read from sysfs), the one-way
//!   bandwidth (50 such messages streamed one way, as in a tree's rounds), the one-way
//!   latency (half an 8-byte ping-pong's round trip) and the
//!   overhead `o` (rank 0 streams 8-byte messages to rank 1, which answers once at the end:
//!   the sender's time per message);
//! - the step of the shared-memory collectives (a barrier in shared memory, every rank);
//! - crowded, in two more worlds whose waits yield (as on a host whose ranks outnumber its
//!   CPUs; one on TCP only), ranks 0 and 1 pinning every thread of theirs to one CPU: each
//!   link's wait (8-byte exchanges) and the step of the shared-memory collectives;
//! - on rank 0 alone: one core's copy and reduction speed (8 MiB buffers, past the caches,
//!   and buffers of a quarter of the per-core cache, within it), what a TCP message costs
//!   more when nothing comes back on its connection (8-byte messages over loopback, one way
//!   against a ping-pong: TCP's separate acknowledgement),
//!   the in-process transport of the `local` backend (two threads) and its crowded wait
//!   (8-byte exchanges between two threads of a `local` world on one CPU whose waits
//!   yield).
//!
//! Noise only adds time, so each is the best of several rounds, and a link's quantities
//! are measured in [`PASSES`] passes over all of them, each keeping its best pass: a slow
//! spell of the machine spoils one pass of each instead of every round of one.
//!
//! Run it across hosts (under `oxccl run --nnodes 2 ...`, with rank 1 on another host) to
//! price TCP over the real network; `--ranks N` measures this host.

use std::time::Instant;

use oxccl::backend::reduce::reduce_sources;
use oxccl::config::TransportChoice;
use oxccl::tuning::{LinkCost, Profile};
use oxccl::{Algorithm, Communicator, Config, DType, ReduceOp};

/// Bytes of the bandwidth messages (large enough to stream through the rings).
const BIG: usize = 4 << 20;
/// Bytes of the local copy and reduction buffers.
const LOCAL: usize = 8 << 20;

/// Seconds per exchange of `bytes` between ranks 0 and 1 of `comm` (each sends to the
/// other and receives from it at the same time, as the steps of a collective do), the
/// best round of `iters` calls ([`best_time`]); ranks other than 0 and 1 return 0 at once.
fn exchange(comm: &Communicator, bytes: usize, iters: usize) -> oxccl::Result<f64> {
    let r = comm.rank();
    if r > 1 {
        return Ok(0.0);
    }
    let peer = 1 - r;
    let out = vec![r as u8; bytes];
    let mut inc = vec![0u8; bytes];
    best_time(iters, || {
        let mut b = comm.batch();
        b.send(&out[..], peer, 7)?.recv(&mut inc[..], peer, 7)?;
        comm.run_batch(b).map(drop)
    })
}

/// Passes over a link's measurements ([`link`]).
const PASSES: usize = 4;

/// Rounds [`best_time`] splits its calls into.
const ROUNDS: usize = 5;

/// Seconds per call of `step`: after a tenth of `iters` (and three) untimed calls, the best
/// of [`ROUNDS`] rounds of `iters / ROUNDS` calls each. Noise (another process taking the
/// CPU a moment, a VM's vCPU descheduled) only adds time, and a mean over all calls took it
/// in (measurements: docs/selector.md).
fn best_time(iters: usize, mut step: impl FnMut() -> oxccl::Result<()>) -> oxccl::Result<f64> {
    for _ in 0..iters / 10 + 3 {
        step()?;
    }
    let per_round = iters.div_ceil(ROUNDS).max(1);
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..per_round {
            step()?;
        }
        best = best.min(t.elapsed().as_secs_f64() / per_round as f64);
    }
    Ok(best)
}

/// Seconds of rank 0's time per message when it streams `msgs` messages of `bytes` to rank
/// 1, which sends nothing until it answers once after the last: the best of `rounds` such
/// rounds (noise, another process taking the CPU a moment, only adds, and one noisy round
/// can move the result by half). Ranks other than 0 and 1 return 0 at once.
fn stream(comm: &Communicator, bytes: usize, msgs: usize, rounds: usize) -> oxccl::Result<f64> {
    let r = comm.rank();
    if r > 1 {
        return Ok(0.0);
    }
    let mut buf = vec![r as u8; bytes];
    let mut ack = [0u8; 8];
    let mut round = || -> oxccl::Result<()> {
        if r == 0 {
            for _ in 0..msgs {
                comm.send(&buf[..], 1, 8)?;
            }
            comm.recv(&mut ack[..], 1, 9).map(drop)
        } else {
            for _ in 0..msgs {
                comm.recv(&mut buf[..], 0, 8)?;
            }
            comm.send(&ack[..], 0, 9)
        }
    };
    round()?;
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        round()?;
        best = best.min(t.elapsed().as_secs_f64() / msgs as f64);
    }
    Ok(best)
}

/// Seconds per round trip of an 8-byte message from rank 0 to rank 1 and back (each rank
/// sends only once it received), the best round of `iters` ([`best_time`]); ranks other than 0 and 1 return 0
/// at once.
fn ping_pong(comm: &Communicator, iters: usize) -> oxccl::Result<f64> {
    let r = comm.rank();
    if r > 1 {
        return Ok(0.0);
    }
    let mut buf = [r as u8; 8];
    best_time(iters, || {
        if r == 0 {
            comm.send(&buf[..], 1, 12)?;
            comm.recv(&mut buf[..], 1, 12).map(drop)
        } else {
            comm.recv(&mut buf[..], 0, 12)?;
            comm.send(&buf[..], 0, 12)
        }
    })
}

/// α, bandwidth and overhead of the links between ranks 0 and 1 of `comm` (meaningful on
/// rank 0): each the best of [`PASSES`] passes over all of them.
fn link(comm: &Communicator, cache: usize) -> oxccl::Result<LinkCost> {
    // Each quantity's best over passes spread across the whole measurement: a slow spell
    // of a few milliseconds spoils one pass of each, not every round of one.
    let mut best = [f64::MAX; 6];
    for _ in 0..PASSES {
        let now = [
            exchange(comm, 8, 2000)?,
            exchange(comm, BIG, 20)?,
            stream(comm, 8, 2000, 5)?,
            exchange(comm, cache / 2, 200)?,
            stream(comm, cache / 2, 50, 3)?,
            ping_pong(comm, 2000)?,
        ];
        for (b, t) in best.iter_mut().zip(now) {
            *b = b.min(t);
        }
    }
    let [alpha, big, overhead, cached, oneway, round_trip] = best;
    let bandwidth = BIG as f64 / (big - alpha).max(1e-9);
    let cached_bandwidth = (cache / 2) as f64 / (cached - alpha).max(1e-9);
    // Streamed: the messages' latency overlaps, and what is left is their bytes.
    let oneway_bandwidth = (cache / 2) as f64 / oneway.max(1e-12);
    // The crowded wait is measured where it applies (see `crowded_wait`).
    Ok(LinkCost {
        alpha: alpha.max(1e-9),
        oneway_alpha: (round_trip / 2.0).max(1e-9),
        bandwidth,
        cached_bandwidth,
        oneway_bandwidth,
        overhead: overhead.max(1e-9),
        ack: 0.0,
        wait: 0.0,
    })
}

/// The per-core (level 2) cache of the first CPU this process may run on, in bytes, from
/// sysfs; `None` where it cannot be read.
fn l2_cache() -> Option<usize> {
    let cpu = *oxccl::tuning::allowed_cpus().first()?;
    let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cache");
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |f: &str| std::fs::read_to_string(entry.path().join(f)).unwrap_or_default();
        if read("level").trim() == "2" && read("type").trim() != "Instruction" {
            // `2048K`, `1M`: the size grammar of oxccl's settings reads sysfs's too.
            return oxccl::config::parse::size(&read("size")).ok();
        }
    }
    None
}

/// Pins thread `tid` (0: the calling thread) to `cpu` and returns its previous CPU set;
/// `None` where the kernel refuses.
fn pin_thread(tid: libc::pid_t, cpu: usize) -> Option<libc::cpu_set_t> {
    set_thread_cpus(tid, &crate::run::bind::single_cpu_set(cpu)?)
}

/// Moves thread `tid` (0: the calling thread) to the CPUs of `set` and returns its previous
/// CPU set; `None` where the kernel refuses.
fn set_thread_cpus(tid: libc::pid_t, set: &libc::cpu_set_t) -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: the sizes and pointers describe `old` (written) and `set` (only read).
    let ok =
        unsafe { libc::sched_getaffinity(tid, size, &mut old) == 0 && libc::sched_setaffinity(tid, size, set) == 0 };
    ok.then_some(old)
}

/// The host's online CPUs (not this process's: a rank of `oxccl tune --ranks N` is bound
/// to one CPU).
fn online_cpus() -> usize {
    // SAFETY: sysconf reads a system value and touches no memory of ours.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(0) as usize
}

/// Pins every thread of this process to `cpu`; returns each thread with the CPU set to
/// give back to it ([`unpin`]). Threads the kernel refuses to move are left where they are.
fn pin_process(cpu: usize) -> Vec<(libc::pid_t, libc::cpu_set_t)> {
    let tids = std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten();
    tids.filter_map(|t| t.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter_map(|tid| pin_thread(tid, cpu).map(|old| (tid, old)))
        .collect()
}

/// Gives the threads [`pin_process`] moved their CPU sets back.
fn unpin(saved: &[(libc::pid_t, libc::cpu_set_t)]) {
    for (tid, set) in saved {
        // SAFETY: the size and pointer describe `set`, which the kernel only reads; a
        // thread that has exited makes the call fail, which changes nothing.
        unsafe { libc::sched_setaffinity(*tid, std::mem::size_of::<libc::cpu_set_t>(), set) };
    }
}

/// The `wait` of `comm`'s links: ranks 0 and 1 pin every thread of theirs to `cpu` (one
/// CPU for both, as on a host whose ranks outnumber its CPUs) and time 8-byte exchanges.
/// `comm` must wait as such a host's ranks do (no spin, polls between yields): a receiver
/// that spins holds the CPU its peer needs for the whole spin, which a crowded host's ranks
/// never do (measurements: docs/selector.md).
/// The cost model prices such an exchange at one exchanging round (two waits: each rank
/// runs once its partner has) plus both messages' work on one CPU, `t = 4w`. Meaningful on
/// rank 0. `threads`: each rank is a thread of this process (the `local` backend), which
/// pins only itself; else a rank pins every thread of its process (its links' threads too).
fn crowded_wait(comm: &Communicator, cpu: usize, threads: bool) -> oxccl::Result<f64> {
    if comm.rank() > 1 {
        return Ok(0.0);
    }
    let saved =
        if threads { pin_thread(0, cpu).map(|old| vec![(0, old)]).unwrap_or_default() } else { pin_process(cpu) };
    let t = exchange(comm, 8, 1000);
    unpin(&saved);
    Ok((t? / 4.0).max(1e-9))
}

/// Seconds per step of `native`'s shared-memory collectives (a barrier, every rank), the
/// best round of `iters` ([`best_time`]).
fn step_time(native: &Communicator, iters: usize) -> oxccl::Result<f64> {
    best_time(iters, || native.barrier())
}

/// The step of the shared-memory collectives with two ranks on one CPU: ranks 0 and 1 of
/// `crowded` (a world whose waits never spin: they yield, then sleep) pin every thread of
/// theirs to `cpu` while every rank times barriers. `None` without shared-memory
/// collectives (the same answer on every rank).
fn crowded_step(crowded: &Communicator, cpu: usize) -> oxccl::Result<Option<f64>> {
    let native = crowded.with_algorithm(Algorithm::SharedMemory);
    if native.barrier().is_err() {
        return Ok(None);
    }
    let saved = if crowded.rank() <= 1 { pin_process(cpu) } else { Vec::new() };
    // Both ranks are pinned before anyone times.
    let t = native.barrier().and_then(|()| step_time(&native, 2000));
    unpin(&saved);
    t.map(Some)
}

/// One core's copy and reduction speeds over buffers of `len` bytes, bytes per second.
fn local_speeds(len: usize) -> oxccl::Result<(f64, f64)> {
    let src = vec![1.0f32; len / 4];
    let other = vec![2.0f32; len / 4];
    let mut dst = vec![0.0f32; len / 4];
    let iters = (LOCAL / len).max(1) * 10;
    // Rounds of `iters` calls each (best_time adds untimed warm-up calls first).
    let calls = iters * ROUNDS;
    let copy = best_time(calls, || {
        dst.copy_from_slice(std::hint::black_box(&src));
        Ok(())
    })?;
    let (a, b): (&[u8], &[u8]) = (bytemuck::cast_slice(&src), bytemuck::cast_slice(&other));
    let reduce =
        best_time(calls, || reduce_sources(DType::F32, ReduceOp::Sum, &[a, b], bytemuck::cast_slice_mut(&mut dst)))?;
    Ok((len as f64 / copy, len as f64 / reduce))
}

/// Seconds a TCP message costs more when its connection carries nothing back ([`LinkCost::ack`]).
///
/// On one thread, over a loopback connection: 8-byte messages written at one end and read at
/// the other, one way, against the same written and read in turn in both directions (a
/// ping-pong, where each message carries the acknowledgement of the one before it): the
/// difference per message, each side the best of [`ROUNDS`] rounds. Read one way, the
/// kernel acknowledges what was read with a segment of its own (about every message or every
/// other one, against one segment per message in the ping-pong). Over loopback the reading
/// thread does both ends' work for that segment; between hosts it is split between them, so
/// this prices the network path at the host's cost.
///
/// # Errors
/// [`oxccl::Error::Io`] when the loopback connection cannot be set up or used.
fn tcp_ack() -> oxccl::Result<f64> {
    use std::io::{Read, Write};
    let io = |e: std::io::Error| oxccl::Error::io("a TCP connection over loopback", &e);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let mut a = std::net::TcpStream::connect(listener.local_addr().map_err(io)?).map_err(io)?;
    let (mut b, _) = listener.accept().map_err(io)?;
    a.set_nodelay(true).map_err(io)?;
    b.set_nodelay(true).map_err(io)?;
    const MSGS: usize = 2000;
    let (msg, mut got) = ([7u8; 8], [0u8; 8]);
    // Calls of MSGS messages each.
    let one_way = best_time(ROUNDS * 2, || {
        for _ in 0..MSGS {
            a.write_all(&msg).and_then(|()| b.read_exact(&mut got)).map_err(io)?;
        }
        Ok(())
    })?;
    let ping_pong = best_time(ROUNDS * 2, || {
        for _ in 0..MSGS / 2 {
            a.write_all(&msg).and_then(|()| b.read_exact(&mut got)).map_err(io)?;
            b.write_all(&msg).and_then(|()| a.read_exact(&mut got)).map_err(io)?;
        }
        Ok(())
    })?;
    Ok(((one_way - ping_pong) / MSGS as f64).max(1e-9))
}

/// The in-process transport's costs (two threads of the `local` backend), measured on the
/// host's CPUs: rank 0 is bound to one CPU (`--bind-to auto`), where the two threads would
/// take turns and measure a crowded world (measurements: docs/selector.md). The threads
/// inherit the calling thread's CPU set.
fn memory_link(cache: usize) -> oxccl::Result<LinkCost> {
    // The host's online CPUs (a container's cpuset narrows them when they are used).
    let host = crate::run::bind::cpu_set(0..online_cpus().clamp(1, libc::CPU_SETSIZE as usize));
    let saved = host.and_then(|set| set_thread_cpus(0, &set));
    let costs = oxccl::local::run(2, |comm| link(&comm, cache));
    if let Some(old) = saved {
        set_thread_cpus(0, &old);
    }
    costs?.into_iter().next().unwrap_or_else(|| Err(oxccl::Error::Internal("no rank 0".into())))
}

/// The in-process transport's crowded wait: [`crowded_wait`] between the two threads of a
/// `local` world whose waits are `crowded`'s (no spin, polls between yields).
fn memory_wait(crowded: &Config) -> oxccl::Result<f64> {
    let cpu = oxccl::tuning::allowed_cpus().first().copied().unwrap_or(0);
    let waits = oxccl::local::run_with(crowded, 2, |comm| crowded_wait(&comm, cpu, true))?;
    waits.into_iter().next().unwrap_or_else(|| Err(oxccl::Error::Internal("no rank 0".into())))
}

/// Measures this rank's part; rank 0 returns the profile.
///
/// # Errors
/// Joining either world, or a measurement's error.
pub fn run_rank(backend_cfg: Config) -> Result<Option<Profile>, String> {
    let shm = backend_cfg.clone().init().map_err(|e| format!("joining the job: {e}"))?;
    if shm.world_size() < 2 {
        return Err("oxccl tune needs at least 2 ranks: `oxccl tune --ranks 2`, or under `oxccl run -n 2`".into());
    }
    let tcp = backend_cfg
        .clone()
        .transport(TransportChoice::Tcp)
        .init()
        .map_err(|e| format!("joining the TCP world: {e}"))?;
    let rank = shm.rank();
    let e = |what: &'static str| move |err: oxccl::Error| format!("rank {rank}: {what}: {err}");
    // Rank 0's cache size, so that every pair exchanges the same messages.
    let mut cache = [l2_cache().unwrap_or(Profile::default().cache as usize).clamp(64 << 10, BIG) as u64];
    shm.broadcast(&mut cache[..], 0).map_err(e("broadcast"))?;
    let cache = cache[0] as usize;
    let mut ring = link(&shm, cache).map_err(e("shared-memory ping-pong"))?;
    shm.barrier().map_err(e("barrier"))?;
    let mut net = link(&tcp, cache).map_err(e("TCP ping-pong"))?;
    tcp.barrier().map_err(e("barrier"))?;
    let native = shm.with_algorithm(Algorithm::SharedMemory);
    // Every rank learns the same way whether the shared-memory collectives exist (an
    // error before anything is sent); without them (several hosts) the default step stays.
    let step = match native.barrier() {
        Ok(()) => step_time(&native, 2000).map_err(e("shared-memory barrier"))?,
        Err(_) => Profile::default().native_step,
    };
    // Last among the measurements between ranks: they move their threads.
    // Rank 0's first CPU, for the crowded TCP exchanges and steps.
    let mut cpu = [oxccl::tuning::allowed_cpus().first().copied().unwrap_or(0) as u64];
    shm.broadcast(&mut cpu[..], 0).map_err(e("broadcast"))?;
    // Waits as on an oversubscribed host: no spin, yields, then sleep.
    let yields = oxccl::tuning::YIELD_CROWDED.as_micros().to_string();
    let crowded_cfg = backend_cfg.clone().set("OXCCL_SPIN_US", "0").and_then(|c| c.set("OXCCL_YIELD_US", &yields));
    let crowded_cfg = crowded_cfg.map_err(|err| format!("the crowded world's settings: {err}"))?;
    let crowded_tcp = crowded_cfg
        .clone()
        .transport(TransportChoice::Tcp)
        .init()
        .map_err(|err| format!("joining the crowded TCP world: {err}"))?;
    net.wait = crowded_wait(&crowded_tcp, cpu[0] as usize, false).map_err(e("crowded TCP exchange"))?;
    drop(crowded_tcp);
    shm.barrier().map_err(e("barrier"))?;
    let crowded = crowded_cfg.init().map_err(|err| format!("joining the crowded world: {err}"))?;
    ring.wait = crowded_wait(&crowded, cpu[0] as usize, false).map_err(e("crowded shared-memory exchange"))?;
    crowded.barrier().map_err(e("barrier"))?;
    let crowded_step = crowded_step(&crowded, cpu[0] as usize)
        .map_err(e("crowded shared-memory barrier"))?
        // Without shared-memory collectives, what the reference machine adds to its step.
        .unwrap_or(step + Profile::default().crowded_step - Profile::default().native_step);
    drop(crowded);
    shm.barrier().map_err(e("barrier"))?;
    let mut profile = None;
    if shm.rank() == 0 {
        let (copy, reduce) = local_speeds(LOCAL).map_err(e("local speeds"))?;
        // Three buffers (two sources, a destination) that fit the cache together.
        let (cached_copy, cached_reduce) = local_speeds(cache / 4).map_err(e("local speeds"))?;
        net.ack = tcp_ack().map_err(e("TCP acknowledgements"))?;
        let mut memory = memory_link(cache).map_err(e("in-process ping-pong"))?;
        memory.wait = memory_wait(&crowded_cfg).map_err(e("crowded in-process exchange"))?;
        profile = Some(Profile {
            shm: ring,
            tcp: net,
            memory,
            native_step: step,
            crowded_step,
            cache: cache as f64,
            copy,
            cached_copy,
            reduce,
            cached_reduce,
            source: "oxccl tune".into(),
        });
    }
    shm.barrier().map_err(e("final barrier"))?;
    Ok(profile)
}

/// The header line of a profile written on this host now.
pub fn header(ranks: usize) -> String {
    let host = oxccl::topology::host::name().unwrap_or_default();
    let cpus = online_cpus();
    format!("written by `oxccl tune` on {host} ({cpus} CPUs, {ranks} ranks); load it with OXCCL_TUNE_FILE")
}
