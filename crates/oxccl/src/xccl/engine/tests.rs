//! The engine against the doubles: host memory posing as device memory
//! (`runtime/host/`) and the NCCL double (`double/nccl/`), with `local` host sides. Results
//! are checked against sequential computations on the same inputs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::config::{Config, HostBuffers, ResolvedConfig};
use crate::error::Error;
use crate::fingerprint::OpKind;
use crate::xccl::double::nccl::{table, DoubleOptions};
use crate::xccl::factory::world_over;
use crate::xccl::library::{Flavor, Library};
use crate::xccl::memory::Gpu;
use crate::xccl::runtime::host::HostRuntime;
use crate::xccl::runtime::DeviceRuntime;
use crate::{Communicator, ReduceOp};

/// A world of `n` ranks on the doubles, rank i on device i.
struct World {
    rt: Arc<HostRuntime>,
    comms: Vec<Communicator>,
}

fn config(fingerprint: bool, host: HostBuffers, timeout: Duration) -> ResolvedConfig {
    // No flight recorder: the failure cases would leave their dumps in the temporary directory.
    let mut cfg = Config::new()
        .timeout(timeout)
        .set("OXCCL_FR_SIZE", "0")
        .and_then(|c| c.resolve_with(|_| None))
        .expect("config");
    cfg.gpu.fingerprint = fingerprint;
    cfg.gpu.host_buffers = Some(host);
    cfg
}

fn world_with(n: usize, opts: &DoubleOptions, cfg: &ResolvedConfig) -> World {
    let rt = Arc::new(HostRuntime::new(n as u32));
    let dyn_rt: Arc<dyn DeviceRuntime> = rt.clone();
    let lib = Arc::new(Library::from_table(table(opts), Flavor::Nccl, "nccl-double").expect("double library"));
    let hosts: Vec<Arc<dyn Backend>> =
        crate::cpu::local::world(cfg, n).expect("hosts").into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect();
    let backends = world_over("nccl", &lib, &dyn_rt, hosts, cfg, &|i| i as u32).expect("world");
    // Recorded with `cfg`'s settings: no flight recorder (see `config`).
    let perf = Arc::new(cfg.perf.clone());
    World { rt, comms: backends.into_iter().map(|b| Communicator::observed(b, Arc::clone(&perf))).collect() }
}

fn world(n: usize) -> World {
    world_with(n, &DoubleOptions::default(), &config(false, HostBuffers::Refuse, Duration::from_secs(20)))
}

impl World {
    fn gpu(&self, rank: usize) -> Gpu {
        let rt: Arc<dyn DeviceRuntime> = self.rt.clone();
        Gpu::new(rt, rank as u32).expect("gpu")
    }

    /// Runs `f` on every rank, in threads.
    fn run<R: Send>(&self, f: impl Fn(&Communicator, Gpu) -> R + Sync) -> Vec<R> {
        std::thread::scope(|s| {
            let hs: Vec<_> = self
                .comms
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let g = self.gpu(i);
                    let f = &f;
                    s.spawn(move || f(c, g))
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
        })
    }
}

fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (rank * 1000 + i) as f32 * 0.5).collect()
}

#[test]
fn all_reduce_on_device_buffers_matches_a_sequential_sum() {
    for n in [1, 2, 3] {
        let w = world(n);
        let len = 37;
        let out = w.run(|c, g| {
            let mut buf = g.copy_from_host(&input(c.rank(), len)).expect("upload");
            c.all_reduce(&mut buf, ReduceOp::Sum).expect("all_reduce");
            buf.to_vec().expect("download")
        });
        let want: Vec<f32> = (0..len).map(|i| (0..n).map(|r| input(r, len)[i]).sum()).collect();
        assert!(out.iter().all(|o| *o == want), "n={n}");
    }
}

#[test]
fn every_collective_shape_on_device_memory() {
    // all_gather, reduce_scatter, broadcast, reduce, all_to_all (native and grouped),
    // gather/scatter (native and grouped) and barrier, with an old-library double too.
    for opts in [
        DoubleOptions::default(),
        DoubleOptions { all_to_all: false, gather_scatter: false, split: false, ..DoubleOptions::default() },
    ] {
        let n = 3;
        let w = world_with(n, &opts, &config(false, HostBuffers::Refuse, Duration::from_secs(20)));
        let c = 5;
        let results = w.run(|comm, g| {
            let me = comm.rank();
            let mine: Vec<i32> = (0..c).map(|i| (me * 100 + i) as i32).collect();
            let blocks: Vec<i32> = (0..n * c).map(|i| (me * 1000 + i) as i32).collect();
            // all_gather
            let inp = g.copy_from_host(&mine).unwrap();
            let mut ag = g.zeros::<i32>(n * c).unwrap();
            comm.all_gather(&inp, &mut ag).unwrap();
            // reduce_scatter (max)
            let rs_in = g.copy_from_host(&blocks).unwrap();
            let mut rs = g.zeros::<i32>(c).unwrap();
            comm.reduce_scatter(&rs_in, &mut rs, ReduceOp::Max).unwrap();
            // broadcast from 2
            let mut bc = g.copy_from_host(&mine).unwrap();
            comm.broadcast(&mut bc, 2).unwrap();
            // reduce to 1 (sum)
            let mut red = g.copy_from_host(&mine).unwrap();
            comm.reduce(&mut red, ReduceOp::Sum, 1).unwrap();
            // all_to_all, out of place and in place
            let mut a2a = g.zeros::<i32>(n * c).unwrap();
            comm.all_to_all(&rs_in, &mut a2a).unwrap();
            let mut a2a_ip = g.copy_from_host(&blocks).unwrap();
            comm.all_to_all_in_place(&mut a2a_ip).unwrap();
            // gather to 0, scatter from 1
            let mut gat = g.zeros::<i32>(n * c).unwrap();
            comm.gather(&inp, (me == 0).then_some(&mut gat), 0).unwrap();
            let mut sc = g.zeros::<i32>(c).unwrap();
            let sc_src = g.copy_from_host(&blocks).unwrap();
            comm.scatter((me == 1).then_some(&sc_src), &mut sc, 1).unwrap();
            comm.barrier().unwrap();
            [ag, rs, bc, red, a2a, a2a_ip, gat, sc].map(|b| b.to_vec().unwrap())
        });
        let mine = |r: usize| (0..c).map(move |i| (r * 100 + i) as i32);
        let blocks = |r: usize| -> Vec<i32> { (0..n * c).map(|i| (r * 1000 + i) as i32).collect() };
        for (me, r) in results.iter().enumerate() {
            let ag: Vec<i32> = (0..n).flat_map(mine).collect();
            assert_eq!(r[0], ag, "all_gather rank {me} ({opts:?})");
            let rs: Vec<i32> = (0..c).map(|i| (0..n).map(|p| blocks(p)[me * c + i]).max().unwrap()).collect();
            assert_eq!(r[1], rs, "reduce_scatter rank {me}");
            assert_eq!(r[2], mine(2).collect::<Vec<_>>(), "broadcast rank {me}");
            let red: Vec<i32> = if me == 1 {
                (0..c).map(|i| (0..n).map(|p| (p * 100 + i) as i32).sum()).collect()
            } else {
                mine(me).collect()
            };
            assert_eq!(r[3], red, "reduce rank {me}");
            let a2a: Vec<i32> = (0..n).flat_map(|p| blocks(p)[me * c..(me + 1) * c].to_vec()).collect();
            assert_eq!(r[4], a2a, "all_to_all rank {me}");
            assert_eq!(r[5], a2a, "all_to_all in place rank {me}");
            if me == 0 {
                assert_eq!(r[6], ag, "gather");
            }
            assert_eq!(r[7], blocks(1)[me * c..(me + 1) * c].to_vec(), "scatter rank {me}");
        }
    }
}

#[test]
fn host_memory_and_other_devices_are_invalid_arguments_that_say_what_is_expected() {
    let w = world(2);
    let errs = w.run(|c, g| {
        let mut host = [1.0f32; 4];
        let e1 = c.all_reduce(&mut host[..], ReduceOp::Sum).unwrap_err();
        let other = Gpu::new(g.runtime().clone(), 1 - c.rank() as u32).unwrap();
        let mut wrong = other.zeros::<f32>(4).unwrap();
        let e2 = c.all_reduce(&mut wrong, ReduceOp::Sum).unwrap_err();
        // The communicator is still usable.
        let mut ok = g.zeros::<f32>(4).unwrap();
        c.all_reduce(&mut ok, ReduceOp::Sum).unwrap();
        (e1, e2)
    });
    for (e1, e2) in errs {
        assert!(matches!(&e1, Error::InvalidArgument(m) if m.contains("host memory") && m.contains("cuda:")), "{e1}");
        assert!(matches!(&e2, Error::InvalidArgument(m) if m.contains("uses cuda:")), "{e2}");
    }
}

#[test]
fn a_collective_a_peer_never_joins_times_out_naming_op_and_sequence_then_the_communicator_is_aborted() {
    let w = world_with(2, &DoubleOptions::default(), &config(false, HostBuffers::Refuse, Duration::from_millis(600)));
    let rank0 = &w.comms[0];
    let g = w.gpu(0);
    let mut buf = g.zeros::<f32>(8).unwrap();
    let t = Instant::now();
    let e = rank0.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert!(matches!(e, Error::Timeout { op: OpKind::AllReduce, seq: 0, .. }), "{e}");
    let again = rank0.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
    assert!(matches!(again, Error::Aborted { .. }), "{again}");
}

#[test]
fn mismatched_collectives_are_a_mismatch_with_the_fingerprint_check() {
    let w = world_with(2, &DoubleOptions::default(), &config(true, HostBuffers::Refuse, Duration::from_secs(10)));
    let out = w.run(|c, g| {
        let mut buf = g.zeros::<f32>(4 + c.rank()).unwrap();
        c.all_reduce(&mut buf, ReduceOp::Sum)
    });
    for (me, r) in out.iter().enumerate() {
        match r {
            Err(Error::Mismatch { peer, ours, theirs }) => {
                assert_eq!(*peer, 1 - me);
                assert_eq!((ours.count, theirs.count), ((4 + me) as u64, (5 - me) as u64));
            }
            other => panic!("rank {me}: {other:?}"),
        }
    }
}

#[test]
fn abort_from_another_thread_ends_a_blocked_wait() {
    let w = world_with(2, &DoubleOptions::default(), &config(false, HostBuffers::Refuse, Duration::from_secs(30)));
    let rank0 = &w.comms[0];
    let g = w.gpu(0);
    let t = Instant::now();
    let e = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            rank0.abort("test says stop");
        });
        let mut buf = g.zeros::<f32>(8).unwrap();
        rank0.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err()
    });
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(matches!(&e, Error::Aborted { reason } if reason.contains("test says stop")), "{e}");
}

#[test]
fn every_rank_aborting_at_once_is_aborted_everywhere_not_a_remote_error() {
    // Each rank's abort reaches its peers' NCCL as ncclRemoteError, sometimes before a
    // peer's own abort (a moment later on its other thread) poisons the peer: the wait must
    // still end with Error::Aborted, the cause, not NCCL's "remote process exited" (it
    // once did in CI, in the conformance suite's errors/abort/from_another_thread).
    for round in 0..3 {
        let w = world_with(3, &DoubleOptions::default(), &config(false, HostBuffers::Refuse, Duration::from_secs(30)));
        let out = w.run(|c, g| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    // Staggered by a millisecond a rank: the earliest abort lands first.
                    std::thread::sleep(Duration::from_millis(100 + c.rank() as u64));
                    c.abort("every rank stops");
                });
                let mut buf = g.zeros::<f32>(8).unwrap();
                // Rank 0 never joins: the others wait until the aborts.
                if c.rank() == 0 {
                    c.recv(&mut buf, 1, 7).map(drop)
                } else {
                    c.all_reduce(&mut buf, ReduceOp::Sum)
                }
            })
        });
        for (me, r) in out.iter().enumerate() {
            assert!(matches!(r, Err(Error::Aborted { .. })), "round {round}, rank {me}: {r:?}");
        }
    }
}

#[test]
fn a_peer_that_goes_away_is_peer_lost_not_a_hang() {
    let mut w = world_with(2, &DoubleOptions::default(), &config(false, HostBuffers::Refuse, Duration::from_secs(30)));
    let gone = w.comms.pop().expect("rank 1");
    let g = w.gpu(0);
    let t = Instant::now();
    let e = std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(gone);
        });
        let mut buf = g.zeros::<f32>(8).unwrap();
        w.comms[0].all_reduce(&mut buf, ReduceOp::Sum).unwrap_err()
    });
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(matches!(e, Error::PeerLost { rank: 1, .. } | Error::Aborted { .. } | Error::Backend { .. }), "{e}");
}

#[test]
fn point_to_point_in_any_order_with_short_messages_and_probe() {
    let w = world(2);
    let out = w.run(|c, g| {
        let me = c.rank();
        let peer = 1 - me;
        let data = g.copy_from_host(&input(me, 6)).unwrap();
        let mut got = g.zeros::<f32>(10).unwrap();
        // Both ranks post the receive first and then send: must not deadlock.
        let n = c
            .scope(|s| {
                let r = s.recv(&mut got, peer, 7)?;
                let sent = s.send(&data, peer, 7)?;
                let n = r.wait().map(|(_, n)| n)?;
                sent.wait()?;
                Ok(n)
            })
            .expect("exchange");
        // Tags are matched: a receive for the second message's tag gets it first, and the
        // first waits in the stash for its own receive (which probe sees).
        let first = g.copy_from_host(&[42.0f32]).unwrap();
        let second = g.copy_from_host(&[1.0f32, 2.0]).unwrap();
        c.send(&first, peer, 9).unwrap();
        c.send(&second, peer, 8).unwrap();
        let mut two = g.zeros::<f32>(2).unwrap();
        let wrong = c.recv(&mut two, peer, 8).map(|k| (k, two.to_vec().unwrap()));
        let info = c.probe(peer, 9).unwrap();
        let mut one = g.zeros::<f32>(1).unwrap();
        let k = c.recv(&mut one, peer, 9).unwrap();
        // A message longer than the buffer is a Mismatch (and still received). Rank 0 sends;
        // the receiver's failure then aborts the world, which rank 0 may or may not see.
        let too_long = if me == 0 {
            let _ = c.send(&second, peer, 3);
            None
        } else {
            Some(c.recv(&mut one, peer, 3).unwrap_err())
        };
        (n, got.to_vec().unwrap(), wrong, info, k, one.to_vec().unwrap(), too_long)
    });
    for (me, (n, got, wrong, info, k, one, too_long)) in out.into_iter().enumerate() {
        assert_eq!(n, 6);
        assert_eq!(&got[..6], &input(1 - me, 6)[..]);
        assert!(got[6..].iter().all(|&x| x == 0.0), "the rest of the buffer is untouched");
        assert_eq!(wrong.expect("tag 8 first"), (2, vec![1.0, 2.0]));
        if let Some(e) = too_long {
            assert!(matches!(&e, Error::Mismatch { ours, theirs, .. } if ours.count == 1 && theirs.count == 2), "{e}");
        }
        let info = info.expect("probe sees the message");
        assert_eq!((info.source, info.tag, info.count), (1 - me, 9, 1));
        assert_eq!((k, one), (1, vec![42.0]));
    }
}

#[test]
fn split_with_and_without_ncclcommsplit() {
    for split in [true, false] {
        let opts = DoubleOptions { split, ..DoubleOptions::default() };
        let w = world_with(4, &opts, &config(false, HostBuffers::Refuse, Duration::from_secs(20)));
        let out = w.run(|c, g| {
            let me = c.rank();
            let color = (me != 3).then_some((me % 2) as u32);
            let sub = c.split(color, -(me as i64)).unwrap();
            sub.map(|s| {
                let mut buf = g.copy_from_host(&[me as i64]).unwrap();
                s.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                (s.rank(), s.world_size(), buf.to_vec().unwrap()[0])
            })
        });
        // Colors: {0, 2} and {1}; rank 3 takes no part. Keys reverse the order.
        assert_eq!(out[0], Some((1, 2, 2)), "split={split}");
        assert_eq!(out[2], Some((0, 2, 2)));
        assert_eq!(out[1], Some((0, 1, 1)));
        assert_eq!(out[3], None);
    }
}

/// A rank still waiting for its new communicator when a peer aborts it gets an error from
/// its split, and the parent stays usable on every rank: the failure is the child's.
#[test]
fn a_child_aborted_while_a_rank_creates_it_leaves_the_parent_usable() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let release = Arc::new(AtomicBool::new(false));
    // Ranks 0 and 1 both hold the new communicator before rank 1 aborts it.
    let both = std::sync::Barrier::new(2);
    let w = world(3);
    let out = w.run(|c, g| {
        let me = c.rank();
        if me == 2 {
            crate::xccl::double::nccl::hold_polls(Arc::clone(&release));
        }
        let made = c.split(Some(0), me as i64);
        match (me, &made) {
            (2, Err(_)) => {}
            (2, Ok(_)) => panic!("rank 2's split succeeded although rank 1 aborted the new communicator"),
            (_, Ok(Some(child))) => {
                both.wait();
                if me == 1 {
                    child.abort("rank 1 gives up on the new communicator");
                    release.store(true, Ordering::SeqCst);
                }
            }
            (_, other) => panic!("rank {me}'s split: {other:?}"),
        }
        let mut buf = g.copy_from_host(&[me as i64 + 1]).unwrap();
        c.all_reduce(&mut buf, ReduceOp::Sum).map(|()| buf.to_vec().unwrap()[0])
    });
    for (rank, r) in out.iter().enumerate() {
        assert_eq!(r.as_ref().ok(), Some(&6), "rank {rank}: the parent's all_reduce gave {r:?}");
    }
}

#[test]
fn async_work_and_the_caller_stream() {
    let w = world(3);
    let out = w.run(|c, g| {
        let mut a = g.copy_from_host(&input(c.rank(), 9)).unwrap();
        let mut b = g.copy_from_host(&input(c.rank() + 1, 9)).unwrap();
        c.scope(|s| {
            let wa = s.all_reduce(&mut a, ReduceOp::Sum)?;
            let wb = s.all_reduce(&mut b, ReduceOp::Max)?;
            wa.wait()?;
            wb.wait().map(drop)
        })
        .unwrap();
        (a.to_vec().unwrap(), b.to_vec().unwrap())
    });
    let sum: Vec<f32> = (0..9).map(|i| (0..3).map(|r| input(r, 9)[i]).sum()).collect();
    let max: Vec<f32> = input(3, 9);
    assert!(out.iter().all(|(a, b)| *a == sum && *b == max));
}

#[test]
fn host_buffers_staged_or_on_the_cpu_backend() {
    for host in [HostBuffers::Stage, HostBuffers::Cpu] {
        let w = world_with(3, &DoubleOptions::default(), &config(false, host, Duration::from_secs(20)));
        let out = w.run(|c, _| {
            let mut v = input(c.rank(), 11);
            c.all_reduce(&mut v[..], ReduceOp::Sum).unwrap();
            let mut ag = [0f32; 3 * 4];
            c.all_gather_in_place(&mut ag[..]).map(|()| v).unwrap()
        });
        let want: Vec<f32> = (0..11).map(|i| (0..3).map(|r| input(r, 11)[i]).sum()).collect();
        assert!(out.iter().all(|v| *v == want), "{host:?}");
    }
}

#[test]
fn nothing_is_left_on_the_device_after_the_communicators_are_dropped() {
    let w = world(2);
    w.run(|c, g| {
        let mut a = g.zeros::<u8>(3).unwrap();
        c.all_reduce(&mut a, ReduceOp::Sum).unwrap();
        c.barrier().unwrap();
    });
    let rt = Arc::clone(&w.rt);
    drop(w);
    let census = rt.census();
    assert_eq!((census.streams, census.events, census.device_allocations), (0, 0, 0), "{census:?}");
}

#[test]
fn device_tensors_through_the_engine() {
    let w = world(3);
    let out = w.run(|c, g| {
        let me = c.rank();
        let t = crate::Tensor::from_vec(input(me, 6), &[2, 3]).unwrap().to_gpu(&g).unwrap();
        let mut sum = t.try_clone().unwrap();
        c.all_reduce_tensor(&mut sum, ReduceOp::Sum).unwrap();
        let gathered = c.all_gather_tensor(&t, 1).unwrap();
        assert_eq!(gathered.device(), g.device());
        (sum.to_vec::<f32>().unwrap(), gathered.shape().to_vec(), gathered.to_vec::<f32>().unwrap())
    });
    let want_sum: Vec<f32> = (0..6).map(|i| (0..3).map(|r| input(r, 6)[i]).sum()).collect();
    // Along dim 1: each row is the ranks' rows side by side.
    let want_gather: Vec<f32> =
        (0..2).flat_map(|row| (0..3).flat_map(move |r| input(r, 6)[row * 3..row * 3 + 3].to_vec())).collect();
    for (sum, shape, gathered) in out {
        assert_eq!(sum, want_sum);
        assert_eq!(shape, vec![2, 9]);
        assert_eq!(gathered, want_gather);
    }
}

/// Host memory that claims to be on `cuda:0`.
struct Liar(Vec<f32>);

// SAFETY: the description is of valid memory of `len` f32s (the lie is only its device,
// which is what the test checks is caught before any access).
unsafe impl crate::Buffer for Liar {
    type Elem = f32;
    fn as_raw(&self) -> crate::backend::RawBuf {
        crate::backend::RawBuf {
            ptr: self.0.as_ptr().cast(),
            count: self.0.len(),
            dtype: crate::DType::F32,
            device: crate::Device::Cuda(0),
        }
    }
}

// SAFETY: as above.
unsafe impl crate::BufferMut for Liar {
    fn as_raw_mut(&mut self) -> crate::backend::RawBufMut {
        let r = crate::Buffer::as_raw(self);
        crate::backend::RawBufMut { ptr: self.0.as_mut_ptr().cast(), count: r.count, dtype: r.dtype, device: r.device }
    }
}

#[test]
fn with_checks_on_a_buffer_claiming_the_wrong_device_is_caught() {
    let w = world_with(1, &DoubleOptions::default(), &config(true, HostBuffers::Refuse, Duration::from_secs(10)));
    let mut liar = Liar(vec![1.0; 4]);
    let e = w.comms[0].all_reduce(&mut liar, ReduceOp::Sum).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("host memory according to")), "{e}");
}

#[test]
fn operations_wait_for_the_callers_stream_and_can_run_on_it() {
    let w = world(1);
    let comm = &w.comms[0];
    let g = w.gpu(0);
    let rt: &HostRuntime = &w.rt;
    let caller = rt.stream_create(0).expect("stream");
    // SAFETY: a stream of the runtime the communicator uses, alive until the end of the test.
    let stream = unsafe { crate::Stream::from_raw(caller.0) };
    let mut buf = g.copy_from_host(&[1.0f32, 2.0]).unwrap();
    for handle in [comm.with_stream(stream), comm.on_stream(stream)] {
        // Work queued on the caller's stream before the call holds the operation back.
        let stall = rt.stall(caller).expect("stall");
        handle
            .scope(|s| {
                let work = s.all_reduce(&mut buf, ReduceOp::Sum)?;
                std::thread::sleep(Duration::from_millis(100));
                assert!(!work.is_completed(), "the operation ran before the caller's queued work");
                stall.release();
                work.wait().map(drop)
            })
            .expect("all_reduce after the caller's work");
    }
    // `on_stream`: later work on the caller's stream sees the result without waiting.
    assert_eq!(buf.to_vec().unwrap(), vec![1.0, 2.0]);
    // SAFETY: nothing is queued on it any more.
    unsafe { rt.stream_destroy(caller).expect("destroy") };
}

#[test]
fn a_device_mesh_over_the_engine() {
    // 2 x 2 mesh ("dp" x "tp"): each tp group sums, then each dp group takes the max.
    let w = world(4);
    let out = w.run(|c, g| {
        let mesh = crate::DeviceMesh::new(c, &[("dp", 2), ("tp", 2)]).unwrap();
        let mut buf = g.copy_from_host(&[c.rank() as i32 + 1]).unwrap();
        mesh.group("tp").unwrap().all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        let tp = buf.to_vec().unwrap()[0];
        mesh.group("dp").unwrap().all_reduce(&mut buf, ReduceOp::Max).unwrap();
        (mesh.coordinate().to_vec(), tp, buf.to_vec().unwrap()[0])
    });
    // Row-major: rank = dp * 2 + tp. tp groups {0,1} -> 3 and {2,3} -> 7; dp max -> 7.
    for (r, (coord, tp, dp)) in out.into_iter().enumerate() {
        assert_eq!(coord, vec![r / 2, r % 2]);
        assert_eq!(tp, if r < 2 { 3 } else { 7 });
        assert_eq!(dp, 7);
    }
}

/// Defect 3 of issue 42: NCCL's send waits for its peer's receive, so a ring of blocking
/// sends issued before the receives deadlocked; oxccl's send is buffered on the device.
#[test]
fn a_ring_of_blocking_sends_before_receives_completes() {
    for n in [3, 4] {
        let w = world(n);
        let len = 1000;
        let out = w.run(|c, g| {
            let (me, n) = (c.rank(), c.world_size());
            let data = g.copy_from_host(&input(me, len)).unwrap();
            let mut got = g.zeros::<f32>(len).unwrap();
            c.send(&data, (me + 1) % n, 5).expect("send before the peer receives");
            let k = c.recv(&mut got, (me + n - 1) % n, 5).expect("recv");
            // The sent buffer may be reused at once: the message was copied.
            let mut again = data;
            again.copy_from_host(&vec![-1.0f32; len]).unwrap();
            c.send(&again, (me + 1) % n, 6).expect("second send");
            let mut second = g.zeros::<f32>(len).unwrap();
            c.recv(&mut second, (me + n - 1) % n, 6).expect("second recv");
            (k, got.to_vec().unwrap(), second.to_vec().unwrap())
        });
        for (me, (k, got, second)) in out.into_iter().enumerate() {
            assert_eq!(k, len);
            assert_eq!(got, input((me + n - 1) % n, len), "n={n} rank {me}");
            assert!(second.iter().all(|&x| x == -1.0));
        }
    }
}

/// A rank that sends and then drops its communicator still delivers: buffered sends left
/// in the queue are issued when the communicator is dropped.
#[test]
fn a_buffered_send_is_delivered_when_the_sender_drops_its_communicator() {
    let w = world(2);
    let World { rt, comms } = w;
    let mut comms = comms.into_iter();
    let (c0, c1) = (comms.next().unwrap(), comms.next().unwrap());
    let g0 = Gpu::new(rt.clone() as Arc<dyn DeviceRuntime>, 0).unwrap();
    let g1 = Gpu::new(rt.clone() as Arc<dyn DeviceRuntime>, 1).unwrap();
    let got = std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            let mut got = g1.zeros::<i32>(3).unwrap();
            c1.recv(&mut got, 0, 1).map(|_| got.to_vec().unwrap())
        });
        let data = g0.copy_from_host(&[7i32, 8, 9]).unwrap();
        c0.send(&data, 1, 1).unwrap();
        drop(c0);
        receiver.join().unwrap()
    });
    assert_eq!(got.expect("delivered"), vec![7, 8, 9]);
}

/// Defect 7 of issue 42: in-place all_to_all_v on device buffers (an input that is the
/// output) went through a group whose receives overwrote blocks not yet sent.
#[test]
fn in_place_all_to_all_v_on_device_buffers() {
    use crate::backend::buffer::BufferMut;
    use crate::backend::{CallOptions, Mode, Op};
    let n = 3;
    let w = world(n);
    // Rank i sends c(i, j) elements to rank j; symmetric, so every rank's input and output
    // have the same length and blocks for one peer lie at the same offset.
    let c = |i: usize, j: usize| 1 + (i + j) % 3;
    let value = |from: usize, to: usize, k: usize| (from * 100 + to * 10 + k) as i32;
    let out = w.run(|comm, g| {
        let me = comm.rank();
        let counts: Vec<usize> = (0..n).map(|j| c(me, j)).collect();
        let host: Vec<i32> = (0..n).flat_map(|j| (0..c(me, j)).map(move |k| value(me, j, k))).collect();
        let mut buf = g.copy_from_host(&host).unwrap();
        let output = buf.as_raw_mut();
        let op = Op::AllToAllV {
            input: output.as_const(),
            send_counts: counts.clone(),
            output,
            recv_counts: counts.clone(),
        };
        let b = comm.backend_for_tests();
        // SAFETY: `buf` outlives the blocking wait below.
        let done = unsafe { b.submit(op, Mode::Blocking, &CallOptions::default()) }
            .and_then(|p| p.wait(None).unwrap_or_else(|| Err(Error::Internal("no result".into()))));
        done.map(|_| buf.to_vec().unwrap())
    });
    for (me, got) in out.into_iter().enumerate() {
        let want: Vec<i32> = (0..n).flat_map(|j| (0..c(j, me)).map(move |k| value(j, me, k))).collect();
        assert_eq!(got.expect("in-place all_to_all_v"), want, "rank {me}");
    }
}

/// A sender whose thread waits on something else after a send (here, on its receiver)
/// still delivers: the receiver pulls, and the engine's progress thread issues the send.
#[test]
fn a_buffered_send_reaches_a_receiver_while_the_sender_waits_elsewhere() {
    let w = world(2);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    let out = w.run(|c, g| {
        if c.rank() == 0 {
            let data = g.copy_from_host(&[1.5f64, 2.5, 3.5]).unwrap();
            c.send(&data, 1, 4).unwrap();
            // Blocks until rank 1 has the message: only the pull can deliver it.
            rx.lock().unwrap().recv_timeout(Duration::from_secs(15)).map(|()| Vec::new()).map_err(|e| e.to_string())
        } else {
            let mut got = g.zeros::<f64>(3).unwrap();
            let r = c.recv(&mut got, 0, 4).map(|_| got.to_vec().unwrap()).map_err(|e| e.to_string());
            let _ = tx.send(());
            r
        }
    });
    assert_eq!(out[0], Ok(Vec::new()), "the sender was released");
    assert_eq!(out[1], Ok(vec![1.5, 2.5, 3.5]));
}

/// Defect 6 of issue 42: the engine made its device current and left it so; PyTorch reads
/// its current device back. The caller's device is restored after every call.
#[test]
fn the_callers_current_device_is_restored_after_each_call() {
    let w = world(2);
    let rt = Arc::clone(&w.rt);
    let out = w.run(|c, g| {
        let mut buf = g.copy_from_host(&[c.rank() as f32 + 1.0; 4]).unwrap();
        let data = g.copy_from_host(&[9i32; 2]).unwrap();
        let mut got = g.zeros::<i32>(2).unwrap();
        // This thread works on the other rank's device between calls.
        let other = 1 - c.rank() as u32;
        rt.set_current(other).unwrap();
        c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        let after_collective = rt.current_device();
        let peer = 1 - c.rank();
        c.send(&data, peer, 1).unwrap();
        c.recv(&mut got, peer, 1).unwrap();
        let after_p2p = rt.current_device();
        (other, after_collective, after_p2p, buf.to_vec().unwrap())
    });
    for (other, a, b, sum) in out {
        assert_eq!((a, b), (other, other), "the engine left its own device current");
        assert_eq!(sum, vec![3.0; 4]);
    }
}

/// Agreement and a planned removal over the host side: the AND of the flags on every rank;
/// the two kept ranks get a new NCCL communicator (from a unique id over the shrunk host
/// side) whose device all_reduce sums their inputs; the removed rank gets `None`.
#[test]
fn agree_and_shrink_excluding_a_rank() {
    let w = world(3);
    let out = w.run(|c, g| {
        let me = c.rank();
        let a = c.agree(!(1u64 << me)).expect("agree");
        let small = c.shrink_excluding(&[1]).expect("shrink_excluding");
        let sum = small.map(|s| {
            let mut buf = g.copy_from_host(&[(me + 1) as i64]).unwrap();
            s.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
            (s.rank(), s.world_size(), buf.to_vec().unwrap()[0])
        });
        // The old communicator stays usable: a planned removal fails nothing.
        let mut all = g.copy_from_host(&[1i64]).unwrap();
        c.all_reduce(&mut all, ReduceOp::Sum).unwrap();
        (a, sum, all.to_vec().unwrap()[0])
    });
    for (me, (a, sum, all)) in out.into_iter().enumerate() {
        assert_eq!((a.flag, a.failed.len(), a.joiners), (!0b111, 0, 0), "rank {me}");
        assert_eq!(all, 3);
        match me {
            1 => assert_eq!(sum, None),
            _ => assert_eq!(sum, Some((me / 2, 2, 1 + 3)), "rank {me}"),
        }
    }
}

/// A revoke ends the collective the other ranks wait in (for the revoking rank, which never
/// joins it) with `Revoked` naming it; every rank then shrinks (nobody is dead: the same
/// three ranks) and computes on the new communicator.
#[test]
fn a_revoke_ends_the_peers_collective_and_the_communicator_still_shrinks() {
    let w = world(3);
    let out = w.run(|c, g| {
        let me = c.rank();
        let mut buf = g.copy_from_host(&[1.0f32; 64]).unwrap();
        let first = if me == 2 {
            std::thread::sleep(Duration::from_millis(200));
            c.revoke("rank 2 stops the step").map(|()| None)
        } else {
            c.all_reduce(&mut buf, ReduceOp::Sum).map(|()| Some(()))
        };
        let revoked = match (me, first) {
            (2, Ok(None)) => None,
            (_, Err(e)) => Some(e),
            (_, other) => panic!("rank {me}: {other:?}"),
        };
        let after = c.barrier().unwrap_err();
        let s = c.shrink().expect("shrink");
        let mut x = g.copy_from_host(&[(me + 1) as i64]).unwrap();
        s.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        (revoked, after, s.world_size(), x.to_vec().unwrap()[0])
    });
    for (me, (revoked, after, size, sum)) in out.into_iter().enumerate() {
        if me != 2 {
            let e = revoked.expect("the waiting ranks' collective failed");
            assert!(
                matches!(&e, Error::Revoked { rank: 2, reason } if reason.contains("stops the step")),
                "rank {me}: {e}"
            );
        }
        assert!(matches!(&after, Error::Revoked { .. }), "rank {me}: later calls are revoked too: {after}");
        assert_eq!((size, sum), (3, 6), "rank {me}");
    }
}
