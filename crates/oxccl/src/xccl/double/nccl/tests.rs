//! Tests of the NCCL double, driven through the table's function pointers with one thread
//! per rank, checked against results computed here.

use std::ffi::{c_int, c_void, CStr};
use std::time::{Duration, Instant};

use super::status::last_error;
use super::*;
use crate::xccl::library::search::Flavor;
use crate::xccl::library::types::{NcclComm, NcclConfig, NcclDataType, NcclRedOp, NcclScalarResidence, NcclUniqueId};
use crate::xccl::library::Library;
use crate::xccl::runtime::host::HostRuntime;
use crate::xccl::runtime::{DeviceRuntime, RawStream};

/// A communicator handle that may cross threads (the double's handles are thread-safe).
#[derive(Clone, Copy)]
struct C(NcclComm);
// SAFETY: the double's handles are looked up in a locked registry from any thread.
unsafe impl Send for C {}
// SAFETY: as above.
unsafe impl Sync for C {}

/// One rank's view in a test.
struct Rank<'a> {
    rank: usize,
    t: &'a Table,
    rt: &'a HostRuntime,
    comm: NcclComm,
    stream: *mut c_void,
}

impl Rank<'_> {
    /// Asserts success of a call on the rank's communicator (`ncclInProgress`, a first use
    /// on a non-blocking one, is polled to its end).
    fn ok(&self, what: &str, r: NcclResult) {
        self.ok_on(what, self.comm, r);
    }

    /// As [`ok`](Self::ok), for a call on `comm`.
    fn ok_on(&self, what: &str, comm: NcclComm, r: NcclResult) {
        let r = if r == NcclResult::IN_PROGRESS { settle(self.t, comm) } else { r };
        assert_eq!(r, NcclResult::SUCCESS, "rank {}: {what}: {}", self.rank, last_error());
    }

    /// Waits for the rank's stream.
    fn sync(&self) {
        self.rt.stream_synchronize(RawStream(self.stream)).expect("stream");
    }
}

/// A fresh id.
fn new_id(t: &Table) -> NcclUniqueId {
    let mut id = NcclUniqueId::zeroed();
    // SAFETY: the double's function, with a writable id.
    assert!(unsafe { (t.get_unique_id)(&mut id) }.is_success());
    id
}

/// Polls the async error until it is not `ncclInProgress` (at most 5 s).
fn settle(t: &Table, comm: NcclComm) -> NcclResult {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut e = NcclResult::INTERNAL_ERROR;
        // SAFETY: the double's function, with a writable result.
        assert!(unsafe { (t.comm_get_async_error)(comm, &mut e) }.is_success());
        if e != NcclResult::IN_PROGRESS || Instant::now() > deadline {
            return e;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `f` on `n` rank threads, each with a communicator (blocking init, or non-blocking
/// checked to answer `ncclInProgress` first) and a stream on device `rank`; destroys the
/// communicators after.
fn ranks<T: Send>(n: usize, blocking: bool, f: impl Fn(&Rank) -> T + Sync) -> Vec<T> {
    let t = table(&DoubleOptions::default());
    let rt = HostRuntime::new(n as u32);
    let id = new_id(&t);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let (t, rt, f) = (&t, &rt, &f);
                s.spawn(move || {
                    rt.set_current(rank as u32).expect("set_current");
                    let stream = rt.stream_create(rank as u32).expect("stream").0;
                    let mut comm: NcclComm = std::ptr::null_mut();
                    let mut config = NcclConfig::with_blocking(blocking);
                    // SAFETY: the double's function, with valid pointers.
                    let r = unsafe { (t.comm_init_rank_config)(&mut comm, n as c_int, id, rank as c_int, &mut config) };
                    if blocking {
                        assert_eq!(r, NcclResult::SUCCESS, "{}", last_error());
                    } else {
                        assert_eq!(r, NcclResult::IN_PROGRESS);
                        assert_eq!(settle(t, comm), NcclResult::SUCCESS);
                    }
                    let me = Rank { rank, t, rt, comm, stream };
                    let out = f(&me);
                    // A test may have broken the stream on purpose.
                    let _ = rt.stream_synchronize(RawStream(stream));
                    // SAFETY: a live communicator, destroyed once.
                    me.ok("destroy", unsafe { (t.comm_destroy)(comm) });
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

#[test]
fn init_blocking_and_non_blocking_and_queries() {
    for blocking in [true, false] {
        let got = ranks(3, blocking, |r| {
            let (mut count, mut rank, mut dev) = (0, 0, -1);
            // SAFETY: the double's functions, with writable ints.
            unsafe {
                r.ok("count", (r.t.comm_count)(r.comm, &mut count));
                r.ok("rank", (r.t.comm_user_rank)(r.comm, &mut rank));
                r.ok("device", (r.t.comm_cu_device)(r.comm, &mut dev));
                r.ok("finalize", (r.t.comm_finalize)(r.comm));
            }
            (count, rank, dev)
        });
        assert_eq!(got, vec![(3, 0, 0), (3, 1, 1), (3, 2, 2)]);
    }
}

#[test]
fn version_ids_strings_and_optional_symbols() {
    let t = table(&DoubleOptions::default());
    let lib = Library::from_table(t.clone(), Flavor::Nccl, "double").expect("2.29.2 loads");
    assert_eq!(lib.version.to_string(), "2.29.2");
    assert_eq!(t.optional_present().len(), crate::xccl::library::version::OPTIONAL_SINCE.len(), "everything");
    let t228 = table(&DoubleOptions { version: 22803, grow: false, ..DoubleOptions::default() });
    let lib = Library::from_table(t228.clone(), Flavor::Nccl, "double").expect("2.28.3 loads");
    assert_eq!(lib.version.to_string(), "2.28.3");
    assert!(t228.comm_shrink.is_some() && t228.comm_grow.is_none() && t228.comm_get_unique_id.is_none());
    assert_ne!(new_id(&t), new_id(&t), "ids are fresh per call");
    // SAFETY: the double's function returns static strings.
    let s = unsafe { CStr::from_ptr((t.get_error_string)(NcclResult::INVALID_USAGE)) };
    assert!(s.to_string_lossy().contains("invalid usage"));
    let old = DoubleOptions {
        version: 21803,
        split: false,
        shrink: false,
        grow: false,
        all_to_all: false,
        gather_scatter: false,
        mem_alloc_register: false,
        pre_mul_sum: false,
    };
    let t = table(&old);
    assert!(t.comm_split.is_none() && t.all_to_all.is_none() && t.gather.is_none() && t.scatter.is_none());
    assert!(t.comm_shrink.is_none() && t.comm_grow.is_none() && t.comm_get_unique_id.is_none());
    assert!(t.mem_alloc.is_none() && t.comm_register.is_none() && t.red_op_create_pre_mul_sum.is_none());
    assert!(t.optional_present().is_empty());
    let too_old = table(&DoubleOptions { version: 21305, ..DoubleOptions::default() });
    let e = Library::from_table(too_old, Flavor::Nccl, "double").expect_err("2.13.5 is refused");
    assert!(e.to_string().contains("older than"), "{e}");
}

#[test]
fn bad_arguments_and_bad_comms_are_errors() {
    let t = table(&DoubleOptions::default());
    let id = new_id(&t);
    let mut comm: NcclComm = std::ptr::null_mut();
    let mut cfg = NcclConfig::with_blocking(false);
    // SAFETY: the double's functions, with valid pointers; bad handles are made-up numbers
    // the double never dereferences.
    unsafe {
        assert_eq!((t.comm_init_rank_config)(&mut comm, 0, id, 0, &mut cfg), NcclResult::INVALID_ARGUMENT);
        assert_eq!((t.comm_init_rank_config)(&mut comm, 2, id, 2, &mut cfg), NcclResult::INVALID_ARGUMENT);
        assert_eq!((t.comm_init_rank_config)(&mut comm, 2, id, 1, &mut cfg), NcclResult::IN_PROGRESS);
        let mut again: NcclComm = std::ptr::null_mut();
        assert_eq!((t.comm_init_rank_config)(&mut again, 2, id, 1, &mut cfg), NcclResult::INVALID_USAGE);
        assert!(last_error().contains("already joined"), "{}", last_error());
        assert_eq!((t.comm_init_rank_config)(&mut again, 3, id, 0, &mut cfg), NcclResult::INVALID_USAGE);
        let mut count = 0;
        assert_eq!((t.comm_count)(comm, &mut count), NcclResult::IN_PROGRESS);
        let bogus: NcclComm = std::ptr::without_provenance_mut(0x1234_5678);
        let mut e = NcclResult::SUCCESS;
        assert_eq!((t.comm_get_async_error)(bogus, &mut e), NcclResult::INVALID_ARGUMENT);
        assert_eq!((t.comm_count)(std::ptr::null_mut(), &mut count), NcclResult::INVALID_ARGUMENT);
        let msg = CStr::from_ptr((t.get_last_error)(std::ptr::null_mut())).to_string_lossy().into_owned();
        assert!(msg.contains("comm is null"), "{msg}");
        assert_eq!((t.comm_abort)(comm), NcclResult::SUCCESS);
        assert_eq!((t.comm_destroy)(comm), NcclResult::INVALID_ARGUMENT, "a freed comm is unknown");
        assert_eq!((t.group_end)(), NcclResult::INVALID_USAGE);
    }
    // A dtype or operator NCCL lacks, a root out of range.
    ranks(2, true, |r| {
        let x = [1.0f32; 4];
        let mut y = [0.0f32; 4];
        let (sp, rp) = (x.as_ptr().cast(), y.as_mut_ptr().cast());
        // SAFETY: the double's functions; nothing is queued.
        unsafe {
            let f = NcclDataType::FLOAT32;
            let e = (r.t.all_reduce)(sp, rp, 4, NcclDataType(42), NcclRedOp::SUM, r.comm, r.stream);
            assert_eq!(e, NcclResult::INVALID_ARGUMENT);
            let e = (r.t.all_reduce)(sp, rp, 4, f, NcclRedOp(99), r.comm, r.stream);
            assert_eq!(e, NcclResult::INVALID_ARGUMENT);
            let e = (r.t.broadcast)(sp, rp, 4, f, 2, r.comm, r.stream);
            assert_eq!(e, NcclResult::INVALID_ARGUMENT);
        }
    });
}

/// f32 inputs of rank `r`: `len` values.
fn input(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (r * 10 + i) as f32 + 0.5).collect()
}

#[test]
fn every_collective_matches_a_sequential_reference() {
    for n in [2usize, 3, 4] {
        let c = 3; // elements per rank
        let results = ranks(n, false, |r| {
            let f = NcclDataType::FLOAT32;
            let mine = input(r.rank, n * c);
            let mut ar = vec![0.0f32; c];
            let mut mx = vec![0i64; c];
            let ints: Vec<i64> = (0..c as i64).map(|i| (r.rank as i64 - 1) * (i + 1)).collect();
            let mut red = vec![-1.0f32; c];
            let mut bc = vec![0.0f32; c];
            let mut ag = vec![0.0f32; n * c];
            let mut rs = vec![0.0f32; c];
            let mut a2a = vec![0.0f32; n * c];
            let mut ga = vec![-1.0f32; n * c];
            let mut sc = vec![0.0f32; c];
            let root = (n - 1) as c_int;
            // SAFETY: the double's functions; every buffer outlives the sync below.
            unsafe {
                let (s, cm, st) = (mine.as_ptr().cast::<c_void>(), r.comm, r.stream);
                r.ok("ar", (r.t.all_reduce)(s, ar.as_mut_ptr().cast(), c, f, NcclRedOp::SUM, cm, st));
                let i64t = NcclDataType::INT64;
                r.ok(
                    "max",
                    (r.t.all_reduce)(ints.as_ptr().cast(), mx.as_mut_ptr().cast(), c, i64t, NcclRedOp::MAX, cm, st),
                );
                r.ok("reduce", (r.t.reduce)(s, red.as_mut_ptr().cast(), c, f, NcclRedOp::PROD, root, cm, st));
                r.ok("bcast", (r.t.broadcast)(s, bc.as_mut_ptr().cast(), c, f, 1, cm, st));
                r.ok("ag", (r.t.all_gather)(s, ag.as_mut_ptr().cast(), c, f, cm, st));
                r.ok("rs", (r.t.reduce_scatter)(s, rs.as_mut_ptr().cast(), c, f, NcclRedOp::MIN, cm, st));
                r.ok("a2a", (r.t.all_to_all.expect("a2a"))(s, a2a.as_mut_ptr().cast(), c, f, cm, st));
                r.ok("gather", (r.t.gather.expect("gather"))(s, ga.as_mut_ptr().cast(), c, f, 0, cm, st));
                r.ok("scatter", (r.t.scatter.expect("scatter"))(s, sc.as_mut_ptr().cast(), c, f, root, cm, st));
            }
            r.sync();
            (ar, mx, red, bc, ag, rs, a2a, ga, sc)
        });
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, n * c)).collect();
        for (rank, (ar, mx, red, bc, ag, rs, a2a, ga, sc)) in results.into_iter().enumerate() {
            let sum: Vec<f32> = (0..c).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
            assert_eq!(ar, sum, "all_reduce n={n}");
            let max: Vec<i64> = (0..c as i64).map(|i| (n as i64 - 2) * (i + 1)).collect();
            assert_eq!(mx, max, "all_reduce max i64 n={n}");
            let prod: Vec<f32> = (0..c).map(|i| inputs.iter().map(|x| x[i]).product()).collect();
            assert_eq!(red, if rank == n - 1 { prod } else { vec![-1.0; c] }, "reduce n={n}");
            assert_eq!(bc, inputs[1][..c].to_vec(), "broadcast n={n}");
            let gathered: Vec<f32> = inputs.iter().flat_map(|x| x[..c].to_vec()).collect();
            assert_eq!(ag, gathered, "all_gather n={n}");
            let mins: Vec<f32> =
                (0..c).map(|i| inputs.iter().map(|x| x[rank * c + i]).fold(f32::INFINITY, f32::min)).collect();
            assert_eq!(rs, mins, "reduce_scatter n={n}");
            let a2a_want: Vec<f32> = inputs.iter().flat_map(|x| x[rank * c..(rank + 1) * c].to_vec()).collect();
            assert_eq!(a2a, a2a_want, "all_to_all n={n}");
            assert_eq!(ga, if rank == 0 { gathered } else { vec![-1.0; n * c] }, "gather n={n}");
            assert_eq!(sc, inputs[n - 1][rank * c..(rank + 1) * c].to_vec(), "scatter n={n}");
        }
    }
}

#[test]
fn grouped_send_recv_ring_and_collectives_in_a_group() {
    for n in [2usize, 3, 5] {
        let got = ranks(n, true, |r| {
            let f = NcclDataType::FLOAT64;
            let mine: Vec<f64> = vec![r.rank as f64; 4];
            let mut from_left = vec![0.0f64; 4];
            let mut from_right = vec![0.0f64; 4];
            let mut total = [0.0f64; 1];
            let (left, right) = ((r.rank + n - 1) % n, (r.rank + 1) % n);
            // SAFETY: the double's functions; buffers outlive the sync.
            unsafe {
                r.ok("start", (r.t.group_start)());
                // Receives first in call order: the group queues sends before them.
                r.ok("recv l", (r.t.recv)(from_left.as_mut_ptr().cast(), 4, f, left as c_int, r.comm, r.stream));
                r.ok("recv r", (r.t.recv)(from_right.as_mut_ptr().cast(), 4, f, right as c_int, r.comm, r.stream));
                r.ok("start2", (r.t.group_start)());
                r.ok("send r", (r.t.send)(mine.as_ptr().cast(), 4, f, right as c_int, r.comm, r.stream));
                r.ok("send l", (r.t.send)(mine.as_ptr().cast(), 4, f, left as c_int, r.comm, r.stream));
                r.ok("end2", (r.t.group_end)());
                let ar = (r.t.all_reduce)(
                    mine.as_ptr().cast(),
                    total.as_mut_ptr().cast(),
                    1,
                    f,
                    NcclRedOp::SUM,
                    r.comm,
                    r.stream,
                );
                r.ok("ar", ar);
                r.ok("end", (r.t.group_end)());
            }
            r.sync();
            (from_left[0], from_right[0], total[0])
        });
        for (rank, (l, rt, total)) in got.into_iter().enumerate() {
            assert_eq!(l, ((rank + n - 1) % n) as f64);
            assert_eq!(rt, ((rank + 1) % n) as f64);
            assert_eq!(total, (0..n).sum::<usize>() as f64);
        }
    }
}

#[test]
fn a_recv_of_another_count_breaks_the_stream_with_invalid_usage() {
    let got = ranks(2, true, |r| {
        let f = NcclDataType::INT32;
        let buf = [7i32; 3];
        let mut into = [0i32; 2];
        // SAFETY: the double's functions; buffers outlive the stream work.
        unsafe {
            if r.rank == 0 {
                r.ok("send", (r.t.send)(buf.as_ptr().cast(), 3, f, 1, r.comm, r.stream));
            } else {
                r.ok("recv", (r.t.recv)(into.as_mut_ptr().cast(), 2, f, 0, r.comm, r.stream));
            }
        }
        let synced = r.rt.stream_synchronize(RawStream(r.stream));
        let e = settle(r.t, r.comm);
        (synced.is_ok(), e)
    });
    // The send meets its receive, finds another length, and both sides fail.
    assert_eq!(got, vec![(false, NcclResult::INVALID_USAGE); 2]);
}

#[test]
fn abort_from_another_thread_unblocks_a_mismatched_collective() {
    let t = table(&DoubleOptions::default());
    let rt = HostRuntime::new(2);
    let id = new_id(&t);
    let comms: Vec<C> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let t = &t;
                s.spawn(move || {
                    let mut comm: NcclComm = std::ptr::null_mut();
                    // SAFETY: the double's function, with valid pointers (null config: blocking).
                    let r = unsafe { (t.comm_init_rank_config)(&mut comm, 2, id, rank, std::ptr::null_mut()) };
                    assert_eq!(r, NcclResult::SUCCESS);
                    C(comm)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("init")).collect()
    });
    let streams: Vec<RawStream> = (0..2).map(|d| rt.stream_create(d).expect("stream")).collect();
    let x = [1.0f32; 4];
    let mut y = [0.0f32; 8];
    // Rank 0 all-reduces 4, rank 1 all-gathers: never completes.
    // SAFETY: the double's functions; the buffers outlive the streams' work (synced below).
    unsafe {
        let f = NcclDataType::FLOAT32;
        let r0 =
            (t.all_reduce)(x.as_ptr().cast(), y.as_mut_ptr().cast(), 4, f, NcclRedOp::SUM, comms[0].0, streams[0].0);
        assert!(r0.is_success());
        let r1 = (t.all_gather)(x.as_ptr().cast(), y.as_mut_ptr().cast(), 4, f, comms[1].0, streams[1].0);
        assert!(r1.is_success());
    }
    std::thread::sleep(Duration::from_millis(30));
    let ev = rt.event_create(0).expect("event");
    rt.event_record(ev, streams[0]).expect("record");
    assert!(!rt.event_query(ev).expect("query"), "a mismatched collective completed");
    let c0 = comms[0];
    let start = Instant::now();
    let abort = t.comm_abort;
    let aborted = std::thread::scope(|s| {
        s.spawn(move || {
            let c = c0;
            // SAFETY: a live communicator, aborted once, from another thread.
            unsafe { abort(c.0) }
        })
        .join()
        .expect("aborter")
    });
    assert!(aborted.is_success());
    assert!(rt.stream_synchronize(streams[0]).is_err(), "the aborted rank's stream broke");
    assert!(rt.stream_synchronize(streams[1]).is_err(), "the peer's stream broke");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(settle(&t, comms[1].0), NcclResult::REMOTE_ERROR);
    // SAFETY: the double's functions; a live and an aborted communicator.
    unsafe {
        let mut e = NcclResult::SUCCESS;
        assert_eq!((t.comm_get_async_error)(comms[0].0, &mut e), NcclResult::INVALID_ARGUMENT);
        assert_eq!((t.comm_destroy)(comms[1].0), NcclResult::SUCCESS);
    }
}

#[test]
fn hang_next_holds_an_operation_and_kill_gives_peers_remote_errors() {
    ranks(3, false, |r| {
        let x = [r.rank as u8 + 1; 2];
        let mut y = [0u8; 2];
        let guard = if r.rank == 0 { Some(hang_next(r.comm).expect("hang")) } else { None };
        // SAFETY: the double's function; buffers outlive the sync.
        let e = unsafe {
            (r.t.all_reduce)(
                x.as_ptr().cast(),
                y.as_mut_ptr().cast(),
                2,
                NcclDataType::UINT8,
                NcclRedOp::SUM,
                r.comm,
                r.stream,
            )
        };
        r.ok("ar", e);
        if let Some(g) = guard {
            std::thread::sleep(Duration::from_millis(30));
            let ev = r.rt.event_create(0).expect("event");
            r.rt.event_record(ev, RawStream(r.stream)).expect("record");
            assert!(!r.rt.event_query(ev).expect("query"), "the hung operation ran");
            g.release();
        }
        r.sync();
        assert_eq!(y, [6, 6]);
    });
    let got = ranks(3, true, |r| {
        let x = [1u8; 2];
        let mut y = [0u8; 2];
        if r.rank == 2 {
            assert!(kill(r.comm));
            return settle(r.t, r.comm);
        }
        // SAFETY: the double's function; buffers outlive the sync.
        let e = unsafe {
            (r.t.all_reduce)(
                x.as_ptr().cast(),
                y.as_mut_ptr().cast(),
                2,
                NcclDataType::UINT8,
                NcclRedOp::SUM,
                r.comm,
                r.stream,
            )
        };
        // Either refused at once (the death was seen) or failed on the stream.
        if e.is_success() {
            assert!(r.rt.stream_synchronize(RawStream(r.stream)).is_err());
        } else {
            assert_eq!(e, NcclResult::REMOTE_ERROR);
        }
        settle(r.t, r.comm)
    });
    assert_eq!(got, vec![NcclResult::REMOTE_ERROR, NcclResult::REMOTE_ERROR, NcclResult::SYSTEM_ERROR]);
}

#[test]
fn split_by_color_and_key_with_nocolor() {
    let got = ranks(4, false, |r| {
        // Colors: ranks 0, 2 → 0; rank 1 → 1; rank 3 → none. Keys reverse the order.
        let color = match r.rank {
            0 | 2 => 0,
            1 => 1,
            _ => -1,
        };
        let slot: *mut NcclComm = Box::into_raw(Box::new(std::ptr::null_mut()));
        let split = r.t.comm_split.expect("split");
        // SAFETY: the double's functions, with valid pointers; `slot` is freed once, below.
        unsafe {
            let e = split(r.comm, color, 10 - r.rank as c_int, slot, std::ptr::null_mut());
            assert_eq!(e, NcclResult::SUCCESS, "NCCL 2.28 answers success while the job runs");
            assert!(slot.read().is_null(), "the handle is written when the split is done, not at the call");
            assert_eq!(settle(r.t, r.comm), NcclResult::SUCCESS);
            let new = *Box::from_raw(slot);
            if color < 0 {
                assert!(new.is_null());
                return None;
            }
            assert!(!new.is_null(), "the handle was written once the parent settled");
            assert_eq!(settle(r.t, new), NcclResult::SUCCESS);
            let (mut count, mut rank) = (0, 0);
            r.ok("count", (r.t.comm_count)(new, &mut count));
            r.ok("rank", (r.t.comm_user_rank)(new, &mut rank));
            let x = [r.rank as i32; 1];
            let mut y = [0i32; 1];
            r.ok_on(
                "ar",
                new,
                (r.t.all_reduce)(
                    x.as_ptr().cast(),
                    y.as_mut_ptr().cast(),
                    1,
                    NcclDataType::INT32,
                    NcclRedOp::SUM,
                    new,
                    r.stream,
                ),
            );
            r.sync();
            r.ok("destroy", (r.t.comm_destroy)(new));
            Some((count, rank, y[0]))
        }
    });
    assert_eq!(got, vec![Some((2, 1, 2)), Some((1, 0, 1)), Some((2, 0, 2)), None]);
}

#[test]
fn mem_alloc_register_and_pre_mul_sum() {
    let got = ranks(2, true, |r| {
        let (alloc, free) = (r.t.mem_alloc.expect("alloc"), r.t.mem_free.expect("free"));
        let (reg, dereg) = (r.t.comm_register.expect("reg"), r.t.comm_deregister.expect("dereg"));
        let create = r.t.red_op_create_pre_mul_sum.expect("premul");
        let destroy = r.t.red_op_destroy.expect("op destroy");
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: the double's functions, with valid pointers; the allocation holds 4 f32 and
        // outlives the sync.
        unsafe {
            r.ok("alloc", alloc(&mut p, 16));
            assert_eq!(r.rt.residence(p).expect("residence"), crate::xccl::runtime::Residence::Device(r.rank as u32));
            let mut h: *mut c_void = std::ptr::null_mut();
            r.ok("register", reg(r.comm, p, 16, &mut h));
            r.ok("deregister", dereg(r.comm, h));
            assert_eq!(dereg(r.comm, h), NcclResult::INVALID_ARGUMENT);
            let data = [1.0f32, 2.0, 3.0, 4.0];
            std::ptr::copy_nonoverlapping(data.as_ptr(), p.cast::<f32>(), 4);
            let mut scalar = (r.rank + 2) as f32;
            let mut op = NcclRedOp::SUM;
            let f = NcclDataType::FLOAT32;
            r.ok("create", create(&mut op, (&raw mut scalar).cast(), f, NcclScalarResidence::HOST_IMMEDIATE, r.comm));
            r.ok("ar", (r.t.all_reduce)(p, p, 4, f, op, r.comm, r.stream));
            r.sync();
            let mut out = [0.0f32; 4];
            std::ptr::copy_nonoverlapping(p.cast::<f32>(), out.as_mut_ptr(), 4);
            r.ok("op destroy", destroy(op, r.comm));
            r.ok("free", free(p));
            assert_eq!(free(p), NcclResult::INVALID_ARGUMENT);
            out
        }
    });
    // (2 + 3) * x
    for out in got {
        assert_eq!(out, [5.0, 10.0, 15.0, 20.0]);
    }
}

/// The sum of `value` over `comm`'s ranks, on `stream` (waited for).
fn sum_on(t: &Table, rt: &HostRuntime, comm: NcclComm, stream: *mut c_void, value: i32) -> i32 {
    let x = [value];
    let mut y = [0i32];
    // SAFETY: the double's function; the buffers outlive the sync below.
    let e = unsafe {
        (t.all_reduce)(x.as_ptr().cast(), y.as_mut_ptr().cast(), 1, NcclDataType::INT32, NcclRedOp::SUM, comm, stream)
    };
    let e = if e == NcclResult::IN_PROGRESS { settle(t, comm) } else { e };
    assert_eq!(e, NcclResult::SUCCESS, "all_reduce: {}", last_error());
    rt.stream_synchronize(RawStream(stream)).expect("stream");
    y[0]
}

/// `(count, rank)` of `comm`.
fn count_and_rank(t: &Table, comm: NcclComm) -> (c_int, c_int) {
    let (mut count, mut rank) = (0, 0);
    // SAFETY: the double's functions, with writable ints.
    unsafe {
        assert!((t.comm_count)(comm, &mut count).is_success(), "{}", last_error());
        assert!((t.comm_user_rank)(comm, &mut rank).is_success(), "{}", last_error());
    }
    (count, rank)
}

#[test]
fn shrink_keeps_the_order_of_the_ranks_not_excluded_and_checks_its_list() {
    // Ranks 1 and 3 of 5 excluded: 0, 2, 4 become 0, 1, 2.
    let got = ranks(5, false, |r| {
        let shrink = r.t.comm_shrink.expect("ncclCommShrink");
        let mut new: NcclComm = std::ptr::null_mut();
        let me = r.rank as c_int;
        // SAFETY: the double's function with valid pointers (or the null ones tested); the
        // lists outlive the calls; `slot` lives until the parent settled.
        unsafe {
            let flags = 0;
            let mut with_me = [me, (me + 1) % 5];
            let e = shrink(r.comm, with_me.as_mut_ptr(), 2, &mut new, std::ptr::null_mut(), flags);
            assert_eq!(e, NcclResult::INVALID_ARGUMENT, "rank {me} excluded itself");
            assert!(last_error().contains("must not call"), "{}", last_error());
            let mut other = [(me + 1) % 5];
            let checks: [(&mut [c_int], c_int, c_int, &str); 4] = [
                (&mut [], 0, flags, "must be positive"),
                (&mut [5], 1, flags, "out of range"),
                (&mut [(me + 1) % 5, (me + 1) % 5], 2, flags, "excluded twice"),
                (&mut other, 1, 0x10, "unknown shrinkFlags"),
            ];
            for (list, count, f, why) in checks {
                let e = shrink(r.comm, list.as_mut_ptr(), count, &mut new, std::ptr::null_mut(), f);
                assert_eq!(e, NcclResult::INVALID_ARGUMENT, "{why}");
                assert!(last_error().contains(why), "{why}: {}", last_error());
            }
            let e = shrink(r.comm, std::ptr::null_mut(), 1, &mut new, std::ptr::null_mut(), flags);
            assert_eq!(e, NcclResult::INVALID_ARGUMENT);
            let e = shrink(r.comm, other.as_mut_ptr(), 1, std::ptr::null_mut(), std::ptr::null_mut(), flags);
            assert_eq!(e, NcclResult::INVALID_ARGUMENT);
            if r.rank % 2 == 1 {
                return None;
            }
            let slot: *mut NcclComm = Box::into_raw(Box::new(std::ptr::null_mut()));
            let mut list = [3, 1];
            let e = shrink(r.comm, list.as_mut_ptr(), 2, slot, std::ptr::null_mut(), flags);
            assert_eq!(e, NcclResult::SUCCESS, "{}", last_error());
            assert_eq!(list, [1, 3], "NCCL sorts the list in place");
            assert!(slot.read().is_null(), "the handle is written when the shrink is done, not at the call");
            assert_eq!(settle(r.t, r.comm), NcclResult::SUCCESS);
            let new = *Box::from_raw(slot);
            assert!(!new.is_null(), "the handle was written once the parent settled");
            assert_eq!(settle(r.t, new), NcclResult::SUCCESS);
            let out = (count_and_rank(r.t, new), sum_on(r.t, r.rt, new, r.stream, me + 1));
            r.ok("destroy", (r.t.comm_destroy)(new));
            Some(out)
        }
    });
    let want = 1 + 3 + 5;
    assert_eq!(got, vec![Some(((3, 0), want)), None, Some(((3, 1), want)), None, Some(((3, 2), want))]);

    // Lists that differ: the later rank's call is invalid usage, the earlier one's shrink
    // fails on the parent; rank 2 (excluded by both) calls nothing.
    let got = ranks(3, false, |r| {
        let shrink = r.t.comm_shrink.expect("ncclCommShrink");
        let mut list = [if r.rank == 0 { 2 } else { 0 }];
        if r.rank == 2 {
            return None;
        }
        let slot: *mut NcclComm = Box::into_raw(Box::new(std::ptr::null_mut()));
        // SAFETY: as above; `slot` is freed once the parent settled.
        unsafe {
            let e = shrink(r.comm, list.as_mut_ptr(), 1, slot, std::ptr::null_mut(), 0);
            let e = if e == NcclResult::SUCCESS { settle(r.t, r.comm) } else { e };
            assert!(Box::from_raw(slot).is_null());
            Some(e)
        }
    });
    let mut codes: Vec<NcclResult> = got.into_iter().flatten().collect();
    codes.sort_by_key(|c| c.0);
    assert_eq!(codes, vec![NcclResult::INVALID_USAGE, NcclResult::REMOTE_ERROR]);
}

#[test]
fn grow_meets_existing_and_new_ranks_and_checks_its_arguments() {
    let got = ranks(3, false, |r| {
        let (t, rt) = (r.t, r.rt);
        let (grow_fn, get_fn) =
            (t.comm_grow.expect("ncclCommGrow"), t.comm_get_unique_id.expect("ncclCommGetUniqueId"));
        // Every caller passes `new` null or writable and alive until its grow settled, and
        // `id` null or a live id.
        let grow = |comm: NcclComm, n: c_int, id: *const NcclUniqueId, rank: c_int, new: *mut NcclComm| {
            let mut config = NcclConfig::with_blocking(false);
            // SAFETY: the double's ncclCommGrow; the pointers as said above; the config lives
            // through the call.
            unsafe { grow_fn(comm, n, id, rank, new, &mut config) }
        };
        // SAFETY: the double's ncclCommGetUniqueId; every caller passes null or a writable id.
        let get_id = |comm: NcclComm, id: *mut NcclUniqueId| unsafe { get_fn(comm, id) };
        // SAFETY: the double's ncclCommDestroy, which takes any handle (unknown ones are an
        // error); every caller destroys its grown communicator once.
        let destroy = |comm: NcclComm| unsafe { (t.comm_destroy)(comm) };
        let null_id: *const NcclUniqueId = std::ptr::null();
        let mut new: NcclComm = std::ptr::null_mut();
        let e = grow(r.comm, 3, null_id, -1, &mut new);
        assert_eq!(e, NcclResult::INVALID_ARGUMENT, "not more ranks");
        assert!(last_error().contains("not more than"), "{}", last_error());
        let e = grow(r.comm, 5, null_id, 0, &mut new);
        assert_eq!(e, NcclResult::INVALID_ARGUMENT, "an existing rank passes -1");
        assert!(last_error().contains("rank -1"), "{}", last_error());
        let e = grow(r.comm, 5, null_id, -1, std::ptr::null_mut());
        assert_eq!(e, NcclResult::INVALID_ARGUMENT);
        let id = (r.rank == 0).then(|| {
            let mut id = NcclUniqueId::zeroed();
            assert!(get_id(r.comm, &mut id).is_success(), "{}", last_error());
            let mut again = NcclUniqueId::zeroed();
            assert_eq!(get_id(r.comm, &mut again), NcclResult::INVALID_USAGE, "one id at a time");
            assert_eq!(get_id(r.comm, std::ptr::null_mut()), NcclResult::INVALID_ARGUMENT);
            // A new rank's checks, none of which joins the grow.
            let plain = new_id(r.t);
            let checks: [(c_int, *const NcclUniqueId, c_int, &str); 6] = [
                (5, &id, -1, "rank >= 0"),
                (5, null_id, 3, "unique id, not null"),
                (5, &id, 5, "not below the total"),
                (5, &id, 1, "existing rank's"),
                (2, &id, 1, "not more than"),
                (5, &plain, 3, "not an id of ncclCommGetUniqueId"),
            ];
            for (n, which, rank, why) in checks {
                let e = grow(std::ptr::null_mut(), n, which, rank, &mut new);
                assert_eq!(e, NcclResult::INVALID_ARGUMENT, "{why}");
                assert!(last_error().contains(why), "{why}: {}", last_error());
            }
            let mut init: NcclComm = std::ptr::null_mut();
            let mut config = NcclConfig::with_blocking(false);
            // SAFETY: the double's function, with valid pointers.
            let e = unsafe { (t.comm_init_rank_config)(&mut init, 5, id, 3, &mut config) };
            assert_eq!(e, NcclResult::INVALID_ARGUMENT, "a grow id is not for init");
            id
        });
        std::thread::scope(|s| {
            // The newcomers, on the devices of ranks 0 and 1.
            let newcomers: Vec<_> = match &id {
                None => Vec::new(),
                Some(id) => (3..5)
                    .map(|rank: usize| {
                        let (grow, destroy, id) = (&grow, &destroy, *id);
                        s.spawn(move || {
                            rt.set_current((rank - 3) as u32).expect("set_current");
                            let stream = rt.stream_create((rank - 3) as u32).expect("stream").0;
                            let mut new: NcclComm = std::ptr::null_mut();
                            let e = grow(std::ptr::null_mut(), 5, &id, rank as c_int, &mut new);
                            assert_eq!(e, NcclResult::SUCCESS, "{}", last_error());
                            assert_eq!(settle(t, new), NcclResult::SUCCESS);
                            let out = (count_and_rank(t, new), sum_on(t, rt, new, stream, rank as i32));
                            assert!(destroy(new).is_success());
                            out
                        })
                    })
                    .collect(),
            };
            let which = id.as_ref().map_or(null_id, std::ptr::from_ref);
            let e = grow(r.comm, 5, which, -1, &mut new);
            assert_eq!(e, NcclResult::SUCCESS, "{}", last_error());
            assert!(!new.is_null(), "the handle is written at the call");
            assert_eq!(settle(r.t, new), NcclResult::SUCCESS);
            let mine = (count_and_rank(r.t, new), sum_on(r.t, r.rt, new, r.stream, r.rank as i32));
            r.ok("destroy", destroy(new));
            let theirs: Vec<_> = newcomers.into_iter().map(|h| h.join().expect("newcomer")).collect();
            if let Some(id) = &id {
                // Used: neither a newcomer nor this communicator's next grow can take it.
                let e = grow(std::ptr::null_mut(), 5, id, 3, &mut new);
                assert_eq!(e, NcclResult::INVALID_ARGUMENT);
                assert!(last_error().contains("used by a grow already"), "{}", last_error());
                let e = grow(r.comm, 5, id, -1, &mut new);
                assert_eq!(e, NcclResult::INVALID_ARGUMENT);
                assert!(last_error().contains("not the one"), "{}", last_error());
            }
            (mine, theirs)
        })
    });
    // Existing ranks keep their ranks, new ones take 3 and 4; the sum of the ranks is 10.
    for (rank, (mine, theirs)) in got.into_iter().enumerate() {
        assert_eq!(mine, ((5, rank as c_int), 10), "existing rank {rank}");
        if rank == 0 {
            assert_eq!(theirs, vec![((5, 3), 10), ((5, 4), 10)]);
        }
    }
}
