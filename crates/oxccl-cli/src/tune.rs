//! `oxccl tune`: measures the costs the `cpu` backend's algorithm choice reads and prints
//! (or writes) a profile for `OXCCL_TUNE_FILE` ([`oxccl::tuning`]).
//!
//! Every rank of the job joins two worlds over the same processes: one on the default
//! transports (shared memory on one host) and one on TCP only. Rank 0 and rank 1 then
//! measure, while the others wait at a barrier:
//! - per transport, α (an exchange of 8 bytes: both send and receive at once, as in the
//!   steps of a collective), the bandwidth (a 4 MiB exchange, α taken off) and the
//!   overhead `o` (rank 0 streams 8-byte messages to rank 1, which answers once at the end:
//!   the sender's time per message);
//! - the step of the shared-memory collectives (a barrier in shared memory, every rank);
//! - on rank 0 alone: one core's copy and reduction speed (8 MiB buffers, past the caches),
//!   the in-process transport of the `local` backend (two threads), and the switch cost
//!   (two threads on one CPU handing it to each other with `sched_yield`, as ranks that
//!   outnumber the CPUs do).
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
/// other and receives from it at the same time, as the steps of a collective do), averaged
/// over `iters`; ranks other than 0 and 1 return 0 at once.
fn exchange(comm: &Communicator, bytes: usize, iters: usize) -> oxccl::Result<f64> {
    let r = comm.rank();
    if r > 1 {
        return Ok(0.0);
    }
    let peer = 1 - r;
    let out = vec![r as u8; bytes];
    let mut inc = vec![0u8; bytes];
    let mut step = || -> oxccl::Result<()> {
        let mut b = comm.batch();
        b.send(&out[..], peer, 7)?.recv(&mut inc[..], peer, 7)?;
        comm.run_batch(b).map(drop)
    };
    for _ in 0..iters / 10 + 3 {
        step()?;
    }
    let t = Instant::now();
    for _ in 0..iters {
        step()?;
    }
    Ok(t.elapsed().as_secs_f64() / iters as f64)
}

/// Seconds of rank 0's time per message when it streams `msgs` 8-byte messages to rank 1,
/// which answers once after the last; ranks other than 0 and 1 return 0 at once.
fn stream(comm: &Communicator, msgs: usize) -> oxccl::Result<f64> {
    let r = comm.rank();
    if r > 1 {
        return Ok(0.0);
    }
    let out = [r as u8; 8];
    let mut inc = [0u8; 8];
    let mut round = || -> oxccl::Result<()> {
        if r == 0 {
            for _ in 0..msgs {
                comm.send(&out[..], 1, 8)?;
            }
            comm.recv(&mut inc[..], 1, 9).map(drop)
        } else {
            for _ in 0..msgs {
                comm.recv(&mut inc[..], 0, 8)?;
            }
            comm.send(&out[..], 0, 9)
        }
    };
    round()?;
    let t = Instant::now();
    round()?;
    Ok(t.elapsed().as_secs_f64() / msgs as f64)
}

/// α, bandwidth and overhead of the links between ranks 0 and 1 of `comm` (meaningful on
/// rank 0).
fn link(comm: &Communicator) -> oxccl::Result<LinkCost> {
    let alpha = exchange(comm, 8, 2000)?;
    let big = exchange(comm, BIG, 20)?;
    let overhead = stream(comm, 2000)?;
    let bandwidth = BIG as f64 / (big - alpha).max(1e-9);
    Ok(LinkCost { alpha: alpha.max(1e-9), bandwidth, overhead: overhead.max(1e-9) })
}

/// Pins the calling thread to `cpu`; false where the kernel refuses.
fn pin_to(cpu: usize) -> bool {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: `cpu` is below CPU_SETSIZE, so CPU_SET writes within `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is this thread; the size and pointer describe `set`, which the kernel
    // only reads.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// Seconds to hand a CPU from one waiting thread to another: two threads pinned to one
/// CPU pass a turn back and forth, each polling with `sched_yield` until it is theirs.
/// `None` where the threads cannot be pinned.
fn switch_cost() -> Option<f64> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const ROUNDS: usize = 20_000;
    let cpu = *oxccl::tuning::allowed_cpus().first()?;
    let turn = AtomicUsize::new(0);
    const GONE: usize = usize::MAX;
    // Both sides run on threads of their own, so the caller's affinity is left alone.
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            if !pin_to(cpu) {
                turn.store(GONE, Ordering::Release);
                return;
            }
            for i in 0..ROUNDS {
                loop {
                    match turn.load(Ordering::Acquire) {
                        GONE => return,
                        now if now == 2 * i + 1 => break,
                        _ => std::thread::yield_now(),
                    }
                }
                turn.store(2 * i + 2, Ordering::Release);
            }
        });
        let timer = s.spawn(|| {
            if !pin_to(cpu) {
                turn.store(GONE, Ordering::Release);
                return None;
            }
            let t = Instant::now();
            for i in 0..ROUNDS {
                if turn.compare_exchange(2 * i, 2 * i + 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    return None;
                }
                loop {
                    match turn.load(Ordering::Acquire) {
                        GONE => return None,
                        now if now == 2 * i + 2 => break,
                        _ => std::thread::yield_now(),
                    }
                }
            }
            Some(t.elapsed().as_secs_f64() / (2 * ROUNDS) as f64)
        });
        let took = timer.join().ok().flatten();
        if took.is_none() {
            turn.store(GONE, Ordering::Release);
        }
        let _ = other.join();
        took
    })
}

/// Seconds per call of `f`, the best of five rounds of `iters` calls.
fn best_of(iters: usize, mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .fold(f64::MAX, f64::min)
}

/// One core's copy and reduction speeds, bytes per second.
fn local_speeds() -> oxccl::Result<(f64, f64)> {
    let src = vec![1.0f32; LOCAL / 4];
    let other = vec![2.0f32; LOCAL / 4];
    let mut dst = vec![0.0f32; LOCAL / 4];
    let copy = best_of(10, || dst.copy_from_slice(std::hint::black_box(&src)));
    let (a, b): (&[u8], &[u8]) = (bytemuck::cast_slice(&src), bytemuck::cast_slice(&other));
    let mut err = None;
    let reduce = best_of(10, || {
        if let Err(e) = reduce_sources(DType::F32, ReduceOp::Sum, &[a, b], bytemuck::cast_slice_mut(&mut dst)) {
            err = Some(e);
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    Ok((LOCAL as f64 / copy, LOCAL as f64 / reduce))
}

/// The in-process transport's costs (two threads of the `local` backend).
fn memory_link() -> oxccl::Result<LinkCost> {
    let costs = oxccl::local::run(2, |comm| link(&comm))?;
    costs.into_iter().next().unwrap_or_else(|| Err(oxccl::Error::Internal("no rank 0".into())))
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
    let tcp = backend_cfg.transport(TransportChoice::Tcp).init().map_err(|e| format!("joining the TCP world: {e}"))?;
    let rank = shm.rank();
    let e = |what: &'static str| move |err: oxccl::Error| format!("rank {rank}: {what}: {err}");
    let ring = link(&shm).map_err(e("shared-memory ping-pong"))?;
    shm.barrier().map_err(e("barrier"))?;
    let net = link(&tcp).map_err(e("TCP ping-pong"))?;
    tcp.barrier().map_err(e("barrier"))?;
    let native = shm.with_algorithm(Algorithm::SharedMemory);
    // Every rank learns the same way whether the shared-memory collectives exist (an
    // error before anything is sent); without them (several hosts) the default step stays.
    let step = match native.barrier() {
        Ok(()) => {
            let iters = 2000;
            let t = Instant::now();
            for _ in 0..iters {
                native.barrier().map_err(e("shared-memory barrier"))?;
            }
            t.elapsed().as_secs_f64() / iters as f64
        }
        Err(_) => Profile::default().native_step,
    };
    let mut profile = None;
    if shm.rank() == 0 {
        let (copy, reduce) = local_speeds().map_err(e("local speeds"))?;
        let memory = memory_link().map_err(e("in-process ping-pong"))?;
        let switch = switch_cost().unwrap_or(Profile::default().switch);
        profile = Some(Profile {
            shm: ring,
            tcp: net,
            memory,
            native_step: step,
            switch,
            copy,
            reduce,
            source: "oxccl tune".into(),
        });
    }
    shm.barrier().map_err(e("final barrier"))?;
    Ok(profile)
}

/// The header line of a profile written on this host now.
pub fn header(ranks: usize) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("written by `oxccl tune` on {} ({cpus} CPUs, {ranks} ranks); load it with OXCCL_TUNE_FILE", host.trim())
}
