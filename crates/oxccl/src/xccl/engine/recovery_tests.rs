//! Shrink and grow on the engine against the doubles, with and without NCCL's own calls
//! (`ncclCommShrink`, `ncclCommGrow`): which way each rank took is read from the double's
//! per-thread call counts, and results are checked against sums computed here.

use std::sync::Arc;
use std::time::Duration;

use super::{Engine, Parts};
use crate::backend::Backend;
use crate::config::{Config, HostBuffers, ResolvedConfig};
use crate::xccl::double::nccl::{calls, kill, table, Calls, DoubleOptions};
use crate::xccl::library::{Flavor, Library};
use crate::xccl::memory::Gpu;
use crate::xccl::runtime::host::HostRuntime;
use crate::xccl::runtime::DeviceRuntime;
use crate::{Communicator, ReduceOp};

/// No fingerprints, device buffers only, no flight recorder (failures would leave dumps).
fn config() -> ResolvedConfig {
    let mut cfg = Config::new()
        .timeout(Duration::from_secs(20))
        .set("OXCCL_FR_SIZE", "0")
        .and_then(|c| c.resolve_with(|_| None))
        .expect("config");
    cfg.gpu.fingerprint = false;
    cfg.gpu.host_buffers = Some(HostBuffers::Refuse);
    cfg
}

/// The library double with `opts`.
fn library(opts: &DoubleOptions) -> Arc<Library> {
    Arc::new(Library::from_table(table(opts), Flavor::Nccl, "nccl-double").expect("double library"))
}

/// What a rank on device `device` over `host` is made of.
fn parts(
    lib: &Arc<Library>,
    rt: &Arc<HostRuntime>,
    host: Arc<dyn Backend>,
    cfg: &ResolvedConfig,
    device: u32,
) -> Parts {
    let rt: Arc<dyn DeviceRuntime> = rt.clone();
    Parts {
        name: "nccl",
        lib: Arc::clone(lib),
        rt,
        device,
        host,
        check: cfg.gpu.fingerprint,
        host_buffers: HostBuffers::Refuse,
        timeout: cfg.timeout,
        algorithms: cfg.algorithms.clone(),
    }
}

/// Engines over `hosts`, rank i on device i (made together, in threads).
fn engines(hosts: Vec<Arc<dyn Backend>>, lib: &Arc<Library>, rt: &Arc<HostRuntime>) -> Vec<Arc<Engine>> {
    let cfg = config();
    std::thread::scope(|s| {
        let hs: Vec<_> = hosts
            .into_iter()
            .enumerate()
            .map(|(i, host)| {
                let p = parts(lib, rt, host, &cfg, i as u32);
                s.spawn(move || Engine::create(p).expect("engine"))
            })
            .collect();
        hs.into_iter().map(|h| Arc::new(h.join().expect("rank thread"))).collect()
    })
}

/// The communicator of an engine.
fn communicator(e: &Arc<Engine>) -> Communicator {
    Communicator::observed(Arc::clone(e) as Arc<dyn Backend>, Arc::new(config().perf))
}

/// The GPU of rank `rank`.
fn gpu(rt: &Arc<HostRuntime>, rank: usize) -> Gpu {
    let rt: Arc<dyn DeviceRuntime> = rt.clone();
    Gpu::new(rt, rank as u32).expect("gpu")
}

/// What this thread called in the double since `before`.
fn since(before: Calls) -> Calls {
    let now = calls();
    Calls {
        init: now.init - before.init,
        split: now.split - before.split,
        shrink: now.shrink - before.shrink,
        get_unique_id: now.get_unique_id - before.get_unique_id,
        grow: now.grow - before.grow,
    }
}

/// One `ncclCommInitRankConfig`, nothing else: the fresh-id way.
const BY_ID: Calls = Calls { init: 1, split: 0, shrink: 0, get_unique_id: 0, grow: 0 };
/// One `ncclCommShrink`.
const BY_SHRINK: Calls = Calls { init: 0, split: 0, shrink: 1, get_unique_id: 0, grow: 0 };
/// One `ncclCommGrow`.
const BY_GROW: Calls = Calls { init: 0, split: 0, shrink: 0, get_unique_id: 0, grow: 1 };
/// The root's `ncclCommGetUniqueId` and `ncclCommGrow`.
const BY_GROW_ROOT: Calls = Calls { init: 0, split: 0, shrink: 0, get_unique_id: 1, grow: 1 };

/// Runs `f(rank, communicator, gpu)` on every rank, in threads; the results in rank order.
fn run<R: Send>(
    comms: &[Communicator],
    rt: &Arc<HostRuntime>,
    f: impl Fn(usize, &Communicator, Gpu) -> R + Sync,
) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let (f, g) = (&f, gpu(rt, r));
                s.spawn(move || f(r, c, g))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

/// Every rank's `[rank + 1, 10 (rank + 1)]`, summed over the new communicator `s`.
fn sums(s: &Communicator, g: &Gpu, rank: usize) -> Vec<i64> {
    let v = (rank + 1) as i64;
    let mut buf = g.copy_from_host(&[v, 10 * v]).expect("upload");
    s.all_reduce(&mut buf, ReduceOp::Sum).expect("all_reduce on the new communicator");
    buf.to_vec().expect("download")
}

#[test]
fn shrink_excluding_takes_ncclcommshrink_when_the_library_has_it() {
    for (n, exclude) in [(3, vec![1]), (5, vec![3, 0])] {
        for shrink in [true, false] {
            let rt = Arc::new(HostRuntime::new(n as u32));
            let lib = library(&DoubleOptions { shrink, ..DoubleOptions::default() });
            let hosts = crate::cpu::local::world(&config(), n).expect("hosts");
            let es = engines(hosts.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect(), &lib, &rt);
            let comms: Vec<Communicator> = es.iter().map(communicator).collect();
            let out = run(&comms, &rt, |me, c, g| {
                let before = calls();
                let small = c.shrink_excluding(&exclude).expect("shrink_excluding");
                let made = since(before);
                let got = small.map(|s| (s.rank(), s.world_size(), sums(&s, &g, me)));
                // The old communicator stays usable: a planned removal fails nothing.
                let mut all = g.copy_from_host(&[1i64]).expect("upload");
                c.all_reduce(&mut all, ReduceOp::Sum).expect("all_reduce on the old communicator");
                (got, made, all.to_vec().expect("download")[0])
            });
            let kept: Vec<usize> = (0..n).filter(|r| !exclude.contains(r)).collect();
            let total: i64 = kept.iter().map(|&r| (r + 1) as i64).sum();
            for (me, (got, made, all)) in out.into_iter().enumerate() {
                let case = format!("n={n} exclude={exclude:?} ncclCommShrink={shrink} rank {me}");
                assert_eq!(all, n as i64, "{case}");
                match kept.iter().position(|&r| r == me) {
                    None => assert_eq!((got, made), (None, Calls::default()), "{case}: excluded, calls nothing"),
                    Some(rank) => {
                        assert_eq!(got, Some((rank, kept.len(), vec![total, 10 * total])), "{case}");
                        assert_eq!(made, if shrink { BY_SHRINK } else { BY_ID }, "{case}");
                    }
                }
            }
        }
    }
}

/// A rank dies (its host side and its NCCL communicator, as a killed process): the survivors
/// shrink through a fresh id, although the library has `ncclCommShrink`.
#[test]
fn survivors_of_a_death_shrink_through_a_fresh_id() {
    for (n, victim) in [(3, 0), (5, 2)] {
        let rt = Arc::new(HostRuntime::new(n as u32));
        let lib = library(&DoubleOptions::default());
        let (hub, hosts) = crate::cpu::local::world_on_hub(&config(), n, "local").expect("hosts");
        let es = engines(hosts.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect(), &lib, &rt);
        let comms: Vec<Communicator> = es.iter().map(communicator).collect();
        // Everyone has seen the first all_reduce complete before the victim dies (a rank
        // still waiting for it would see the death there).
        let first = std::sync::Barrier::new(n);
        let out = run(&comms, &rt, |me, c, g| {
            let mut x = g.copy_from_host(&[1.0f32; 16]).expect("upload");
            c.all_reduce(&mut x, ReduceOp::Sum).expect("a first all_reduce");
            first.wait();
            if me == victim {
                hub.kill(victim);
                assert!(kill(es[me].inner.comm.with(|h| h).expect("live handle")));
                return None;
            }
            assert!(c.all_reduce(&mut x, ReduceOp::Sum).is_err(), "n={n}: the victim is gone");
            let before = calls();
            let s = c.shrink().expect("shrink");
            let made = since(before);
            Some((s.rank(), s.world_size(), sums(&s, &g, me), made))
        });
        let kept: Vec<usize> = (0..n).filter(|&r| r != victim).collect();
        let total: i64 = kept.iter().map(|&r| (r + 1) as i64).sum();
        for (me, got) in out.into_iter().enumerate() {
            match kept.iter().position(|&r| r == me) {
                None => assert!(got.is_none()),
                Some(rank) => {
                    assert_eq!(got, Some((rank, n - 1, vec![total, 10 * total], BY_ID)), "n={n} rank {me}");
                }
            }
        }
    }
}

/// After a revoke nobody is dead, but the old NCCL communicators are aborted: the kept ranks
/// shrink through a fresh id.
#[test]
fn a_revoked_communicator_shrinks_through_a_fresh_id() {
    let n = 3;
    let rt = Arc::new(HostRuntime::new(n as u32));
    let lib = library(&DoubleOptions::default());
    let hosts = crate::cpu::local::world(&config(), n).expect("hosts");
    let es = engines(hosts.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect(), &lib, &rt);
    let comms: Vec<Communicator> = es.iter().map(communicator).collect();
    let out = run(&comms, &rt, |me, c, g| {
        if me == 2 {
            std::thread::sleep(Duration::from_millis(100));
            c.revoke("rank 2 stops the step").expect("revoke");
        } else {
            let mut x = g.copy_from_host(&[1.0f32; 8]).expect("upload");
            assert!(c.all_reduce(&mut x, ReduceOp::Sum).is_err(), "rank {me}: revoked");
        }
        let before = calls();
        let small = c.shrink_excluding(&[1]).expect("shrink_excluding");
        let made = since(before);
        small.map(|s| (s.rank(), s.world_size(), sums(&s, &g, me), made))
    });
    let total = 1 + 3;
    assert_eq!(out[0], Some((0, 2, vec![total, 10 * total], BY_ID)));
    assert_eq!(out[1], None);
    assert_eq!(out[2], Some((1, 2, vec![total, 10 * total], BY_ID)));
}

/// What a rank of a grow got: (rank, size, the sum of every rank over the grown
/// communicator, the calls it made the communicator with).
type Grown = (usize, usize, i64, Calls);

/// `n` members grow by `k` newcomers; the members' library is `members`, the newcomers'
/// `newcomers`. Each member's result, then each newcomer's.
fn grow_world(n: usize, k: usize, members: &DoubleOptions, newcomers: &DoubleOptions) -> Vec<Grown> {
    let cfg = config();
    let rt = Arc::new(HostRuntime::new((n + k) as u32));
    let (lib, new_lib) = (library(members), library(newcomers));
    let hosts = crate::cpu::setup::init_world(&cfg, n).expect("hosts");
    let lineage = Arc::clone(hosts[0].lineage().expect("a world of threads has a lineage"));
    let es = engines(hosts.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect(), &lib, &rt);
    let comms: Vec<Communicator> = es.iter().map(communicator).collect();
    let sum_of_ranks = |c: &Communicator, g: &Gpu| {
        let mut x = g.copy_from_host(&[c.rank() as i64]).expect("upload");
        c.all_reduce(&mut x, ReduceOp::Sum).expect("all_reduce on the grown communicator");
        x.to_vec().expect("download")[0]
    };
    std::thread::scope(|s| {
        let joining: Vec<_> = (0..k)
            .map(|_| {
                let (lineage, rt, new_lib, cfg) = (lineage.newcomer(), &rt, &new_lib, &cfg);
                s.spawn(move || {
                    let b = crate::cpu::grow::join(&lineage, Duration::from_secs(20)).expect("join");
                    b.set_lineage(Arc::new(lineage));
                    let rank = b.rank();
                    let before = calls();
                    let e = Engine::join(parts(new_lib, rt, Arc::new(b), cfg, rank as u32)).expect("newcomer engine");
                    let made = since(before);
                    let c = communicator(&Arc::new(e));
                    (c.rank(), c.world_size(), sum_of_ranks(&c, &gpu(rt, rank)), made)
                })
            })
            .collect();
        let mut out = run(&comms, &rt, |me, c, g| {
            let before = calls();
            let grown = c.grow(k).expect("grow");
            let made = since(before);
            let sum = sum_of_ranks(&grown, &g);
            // The old communicator stays usable.
            let mut y = g.copy_from_host(&[1i64]).expect("upload");
            c.all_reduce(&mut y, ReduceOp::Sum).expect("all_reduce on the old communicator");
            assert_eq!(y.to_vec().expect("download"), [n as i64], "member {me}");
            (grown.rank(), grown.world_size(), sum, made)
        });
        out.extend(joining.into_iter().map(|h| h.join().expect("newcomer thread")));
        out
    })
}

#[test]
fn grow_takes_ncclcommgrow_when_every_rank_can() {
    let with = DoubleOptions::default();
    let without = DoubleOptions { grow: false, ..DoubleOptions::default() };
    // (members, newcomers, the members' library, the newcomers', whether ncclCommGrow is used)
    let cases = [
        (3, 1, &with, &with, true),
        (3, 2, &with, &with, true),
        (1, 2, &with, &with, true),
        (3, 1, &without, &without, false),
        (3, 2, &without, &without, false),
        (1, 2, &without, &without, false),
        // One side cannot: nobody does.
        (2, 1, &with, &without, false),
    ];
    for (n, k, members, newcomers, native) in cases {
        let size = n + k;
        let total = (size * (size - 1) / 2) as i64;
        let out = grow_world(n, k, members, newcomers);
        let case = format!("n={n} k={k} newcomers' ncclCommGrow={}", newcomers.grow);
        let mut newcomer_ranks = Vec::new();
        for (i, &(rank, got_size, sum, made)) in out.iter().enumerate() {
            assert_eq!((got_size, sum), (size, total), "{case}: thread {i}");
            let want = match (native, i) {
                (false, _) => BY_ID,
                (true, 0) => BY_GROW_ROOT,
                (true, _) => BY_GROW,
            };
            assert_eq!(made, want, "{case}: thread {i}");
            if i < n {
                assert_eq!(rank, i, "{case}: a member keeps its rank");
            } else {
                newcomer_ranks.push(rank);
            }
        }
        newcomer_ranks.sort_unstable();
        assert_eq!(newcomer_ranks, (n..size).collect::<Vec<_>>(), "{case}");
    }
}
