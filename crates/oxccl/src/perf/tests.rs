//! The flight recorder, fed by real operations on local worlds: what it keeps, and the
//! dumps a failure writes.

use std::path::PathBuf;
use std::time::Duration;

use super::{Dump, OpState};
use crate::backend::Backend;
use crate::{Config, Error, ReduceOp};

/// A fresh directory for one test's dumps.
fn dump_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("oxccl-fr-test-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn config(dir: &std::path::Path, size: usize) -> Config {
    Config::new()
        .timeout(Duration::from_secs(10))
        .set("OXCCL_FR_DIR", dir.to_str().unwrap())
        .unwrap()
        .set("OXCCL_FR_SIZE", &size.to_string())
        .unwrap()
}

#[test]
fn every_operation_is_recorded_in_order_and_only_the_last_ones_kept() {
    let dir = dump_dir("order");
    let dumps = crate::local::run_with(&config(&dir, 4), 3, |c| {
        let mut v = [c.rank() as f32; 7];
        for _ in 0..3 {
            c.all_reduce(&mut v[..], ReduceOp::Sum).unwrap();
        }
        let mut b = [0u64; 5];
        c.broadcast(&mut b[..], 2).unwrap();
        c.barrier().unwrap();
        let mine = [c.rank() as i32; 2];
        let mut out = vec![0i32; 3 * 2];
        c.scope(|s| s.all_gather(&mine[..], &mut out[..])?.wait().map(drop)).unwrap();
        assert_eq!(out, [0, 0, 1, 1, 2, 2]);
        c.flight_recorder().snapshot("test")
    })
    .unwrap();
    for (rank, d) in dumps.iter().enumerate() {
        assert_eq!((d.rank, d.world_size, d.reason.as_str()), (rank, 3, "test"));
        // 6 operations, the last 4 kept.
        assert_eq!(d.dropped, 2);
        let seen: Vec<(u64, &str)> = d.ops.iter().map(|o| (o.seq, o.op.as_str())).collect();
        assert_eq!(seen, [(2, "all_reduce"), (3, "broadcast"), (4, "barrier"), (5, "all_gather")]);
        let bc = &d.ops[1];
        assert_eq!((bc.dtype.as_str(), bc.count, bc.root, bc.bytes), ("u64", 5, Some(2), 40));
        assert_eq!(d.ops[0].reduce.as_deref(), Some("sum"));
        for o in &d.ops {
            assert_eq!(o.state, OpState::Completed, "{o:?}");
            let (s, e) = (o.started_us.unwrap(), o.ended_us.unwrap());
            assert!(o.enqueued_us <= s && s <= e && e <= d.dumped_us, "{o:?}");
        }
    }
    // Nothing failed: nothing was written.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_mismatch_writes_the_dumps_that_show_the_diverging_call() {
    let dir = dump_dir("mismatch");
    let errors = crate::local::run_with(&config(&dir, 100), 2, |c| {
        c.barrier().unwrap();
        // Rank 1 calls with another count: both ranks fail.
        let mut v = vec![1.0f32; 4 + c.rank()];
        c.all_reduce(&mut v[..], ReduceOp::Sum).err()
    })
    .unwrap();
    assert!(errors.iter().any(|e| matches!(e, Some(Error::Mismatch { .. }))), "{errors:?}");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert_eq!(files.len(), 2, "one dump per rank: {files:?}");
    for f in &files {
        let d = Dump::read(f).unwrap();
        assert_eq!(d.ops.len(), 2);
        let last = &d.ops[1];
        assert_eq!((last.seq, last.op.as_str(), last.count), (1, "all_reduce", 4 + d.rank as u64));
        assert_eq!(last.state, OpState::Failed);
        assert!(last.error.as_deref().is_some_and(|e| !e.is_empty()), "{last:?}");
        assert!(f.file_name().unwrap().to_str().unwrap().ends_with(&format!("-rank{}.json", d.rank)));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_recorder_of_size_0_writes_no_dump_on_a_failure() {
    // OXCCL_FR_SIZE=0 keeps no operations and writes no dumps (it once wrote empty ones).
    let dir = dump_dir("off");
    let errors = crate::local::run_with(&config(&dir, 0), 2, |c| {
        let mut v = vec![1.0f32; 4 + c.rank()];
        c.all_reduce(&mut v[..], ReduceOp::Sum).err()
    })
    .unwrap();
    assert!(errors.iter().any(|e| matches!(e, Some(Error::Mismatch { .. }))), "{errors:?}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_timeout_dump_names_the_peer_waited_on() {
    let dir = dump_dir("timeout");
    let results = crate::local::run_with(&config(&dir, 100), 2, |c| {
        if c.rank() == 0 {
            let mut v = [1u8; 3];
            let r = c.with_timeout(Duration::from_millis(300)).broadcast(&mut v[..], 1);
            c.abort("test over");
            r.err()
        } else {
            // Rank 1 never enters the broadcast.
            std::thread::sleep(Duration::from_millis(600));
            None
        }
    })
    .unwrap();
    assert!(matches!(results[0], Some(Error::Timeout { peer: Some(1), .. })), "{results:?}");
    let d = Dump::read(&dump_of(&dir, 0)).unwrap();
    let last = d.ops.last().unwrap();
    assert_eq!((last.op.as_str(), last.state, last.waiting_on), ("broadcast", OpState::Failed, Some(1)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Rank `rank`'s dump file in `dir`.
fn dump_of(dir: &std::path::Path, rank: usize) -> PathBuf {
    let suffix = format!("-rank{rank}.json");
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| p.to_str().is_some_and(|n| n.ends_with(&suffix)))
        .unwrap_or_else(|| panic!("no dump of rank {rank} in {}", dir.display()))
}

#[test]
fn the_profiler_counts_every_call_and_writes_one_trace_event_per_operation() {
    let dir = dump_dir("trace");
    let cfg = config(&dir, 100).set("OXCCL_PROFILE", &format!("summary,trace:{}", dir.display())).unwrap();
    let reports = crate::local::run_with(&cfg, 3, |c| {
        let mut v = [1.0f32; 2];
        for _ in 0..5 {
            c.all_reduce(&mut v[..], ReduceOp::Sum).unwrap();
        }
        let mut b = [0u8; 40];
        c.broadcast(&mut b[..], 0).unwrap();
        c.profile().expect("the profiler is on")
    })
    .unwrap();
    for (rank, r) in reports.iter().enumerate() {
        assert_eq!((r.rank, r.world_size), (rank, 3));
        let rows: Vec<(&str, u64, u64)> = r.rows.iter().map(|x| (x.op.as_str(), x.size, x.count)).collect();
        assert_eq!(rows, [("all_reduce", 8, 5), ("broadcast", 32, 1)], "{r}");
        let ar = &r.rows[0];
        assert!(ar.mean_us > 0.0 && ar.p50_us > 0.0 && ar.p99_us >= ar.p50_us, "{ar:?}");
        assert!((ar.busbw_gbps - ar.algbw_gbps * 4.0 / 3.0).abs() < 1e-9, "{ar:?}");
    }
    // The communicators are gone: each rank wrote its trace.
    for rank in 0..3 {
        let path = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| Some(e.ok()?.path()))
            .find(|p| {
                p.to_string_lossy().contains("oxccl-trace-")
                    && p.to_string_lossy().ends_with(&format!("-rank{rank}.json"))
            })
            .expect("a trace per rank");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let ops: Vec<String> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ops.len(), 6, "one event per operation on rank {rank}");
        assert_eq!(ops.iter().filter(|o| *o == "all_reduce").count(), 5);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn profiler_modes_parse_and_bad_ones_say_what_is_accepted() {
    use crate::config::ProfileSettings;
    let p = ProfileSettings::parse("summary").unwrap();
    assert!(p.summary && p.trace_dir.is_none() && p.enabled());
    let p = ProfileSettings::parse(" summary , trace:/tmp/x ").unwrap();
    assert_eq!((p.summary, p.trace_dir.as_deref()), (true, Some(std::path::Path::new("/tmp/x"))));
    assert!(!ProfileSettings::parse("off").unwrap().enabled());
    for bad in ["trace:", "trace", "loud"] {
        let e = ProfileSettings::parse(bad).unwrap_err();
        assert!(e.contains("summary") && e.contains("trace:DIR"), "{bad}: {e}");
    }
    let e = Config::new().set("OXCCL_PROFILE", "loud").unwrap_err().to_string();
    assert!(e.contains("OXCCL_PROFILE"), "{e}");
}

#[test]
fn log_levels_map_onto_oxccl_targets_and_bad_ones_are_named() {
    use crate::config::log_directives;
    assert_eq!(log_directives("debug").unwrap(), "oxccl=debug");
    assert_eq!(log_directives("warn, oxccl::cpu::selector=DEBUG").unwrap(), "oxccl=warn,oxccl::cpu::selector=debug");
    assert!(log_directives("chatty").unwrap_err().contains("not a level"));
    assert!(log_directives("hyper=debug").unwrap_err().contains("not one of oxccl's targets"));
    let e = Config::new().set("OXCCL_LOG", "loud").unwrap_err().to_string();
    assert!(e.contains("OXCCL_LOG"), "{e}");
}

#[test]
fn a_snapshot_of_a_blocked_receive_names_the_peer_it_waits_for() {
    use std::sync::{Arc, Mutex};
    let dir = dump_dir("blocked");
    let slot: Mutex<Option<Arc<super::FlightRecorder>>> = Mutex::new(None);
    let seen = crate::local::run_with(&config(&dir, 100), 2, |c| {
        if c.rank() == 0 {
            *slot.lock().unwrap() = Some(Arc::clone(c.flight_recorder()));
            let mut b = [0u32; 4];
            c.recv(&mut b[..], 1, 5).unwrap();
            assert_eq!(b, [7; 4]);
            None
        } else {
            // Rank 0 is blocked in its receive from rank 1 (us) by now.
            std::thread::sleep(Duration::from_millis(300));
            let rec = slot.lock().unwrap().clone().expect("rank 0's recorder");
            let d = rec.snapshot("SIGUSR1");
            c.send(&[7u32; 4][..], 0, 5).unwrap();
            Some(d)
        }
    })
    .unwrap();
    let d = seen[1].as_ref().unwrap();
    let last = d.ops.last().unwrap();
    assert_eq!((last.state, last.waiting_on), (OpState::Started, Some(1)), "{d:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_snapshot_of_a_collective_blocked_in_shared_memory_names_the_missing_rank() {
    use std::sync::{Arc, Mutex};
    let slot: Mutex<Option<Arc<super::FlightRecorder>>> = Mutex::new(None);
    let seen: Mutex<Option<super::Dump>> = Mutex::new(None);
    // Two ranks of a host with the shared-memory collectives: their waits are not on frames.
    crate::cpu::transport::shm::links::tests::world_with(2, 1 << 16, Some(1 << 16), |c| {
        let c = c.with_algorithm(crate::Algorithm::SharedMemory);
        let mut v = [1.0f32; 16];
        if c.rank() == 0 {
            *slot.lock().unwrap() = Some(Arc::clone(c.flight_recorder()));
            c.all_reduce(&mut v[..], ReduceOp::Sum).unwrap();
        } else {
            std::thread::sleep(Duration::from_millis(300));
            let d = slot.lock().unwrap().clone().expect("rank 0's recorder").snapshot("SIGUSR1");
            *seen.lock().unwrap() = Some(d);
            c.all_reduce(&mut v[..], ReduceOp::Sum).unwrap();
        }
        assert_eq!(v, [2.0; 16]);
    });
    let d = seen.lock().unwrap().take().unwrap();
    let last = d.ops.last().unwrap();
    assert_eq!((last.op.as_str(), last.state, last.waiting_on), ("all_reduce", OpState::Started, Some(1)), "{d:?}");
}

#[test]
fn the_profiler_charges_waits_to_the_late_peer() {
    let dir = dump_dir("waits");
    let cfg = config(&dir, 100).set("OXCCL_PROFILE", &format!("trace:{}", dir.display())).unwrap();
    let reports = crate::local::run_with(&cfg, 3, |c| {
        let mut v = [1.0f32; 64];
        // Rank 2 comes late to the all_reduce; then rank 1 sends to rank 0 late.
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(150));
        }
        c.all_reduce(&mut v[..], ReduceOp::Sum).unwrap();
        assert_eq!(v, [3.0; 64]);
        match c.rank() {
            0 => {
                let mut b = [0u8; 8];
                c.recv(&mut b[..], 1, 3).unwrap();
            }
            1 => {
                std::thread::sleep(Duration::from_millis(100));
                c.send(&[1u8; 8][..], 0, 3).unwrap();
            }
            _ => {}
        }
        c.profile().expect("the profiler is on")
    })
    .unwrap();
    let waits = reports[0].peer_waits.as_ref().expect("the cpu engine measures waits");
    let us = |peer: usize| waits.iter().find(|w| w.peer == peer).map_or(0.0, |w| w.total_us);
    // The all_reduce waited for rank 2 (directly, or through rank 1, which waited for it).
    assert!(us(1) + us(2) >= 140_000.0, "{}", reports[0]);
    assert!(us(1) >= 90_000.0, "the receive waited 100 ms for rank 1: {}", reports[0]);
    assert!(waits.windows(2).all(|w| w[0].total_us >= w[1].total_us), "most first: {waits:?}");
    assert!(format!("{}", reports[0]).contains("waited for peers"), "{}", reports[0]);
    // Rank 2 came last: it waited for nobody long.
    let late = reports[2].peer_waits.as_ref().unwrap();
    assert!(late.iter().all(|w| w.total_us < 100_000.0), "{}", reports[2]);
    // Rank 0's trace charges the receive's wait to rank 1, in that event.
    let path = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| p.to_string_lossy().contains("oxccl-trace-") && p.to_string_lossy().ends_with("-rank0.json"))
        .expect("rank 0's trace");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let recv = v["traceEvents"].as_array().unwrap().iter().find(|e| e["name"] == "recv").expect("a recv event");
    assert!(recv["args"]["waited_us"]["1"].as_f64().is_some_and(|w| w >= 90_000.0), "{recv}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shared_memory_waits_are_charged_to_the_last_rank_to_arrive() {
    crate::cpu::transport::shm::links::tests::world_with(3, 1 << 16, Some(1 << 16), |c| {
        let waits = c.backend_for_tests().peer_waits().expect("the cpu engine measures waits");
        waits.enable();
        let c = c.with_algorithm(crate::Algorithm::SharedMemory);
        let mut v = [1.0f32; 16];
        // Everyone waits for rank 0 to start before rank 2 sleeps, so the late one is rank 2.
        c.barrier().unwrap();
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(150));
        }
        c.all_reduce(&mut v[..], ReduceOp::Sum).unwrap();
        assert_eq!(v, [3.0; 16]);
        let ns: Vec<u64> =
            waits.per_peer_ticks().into_iter().map(|t| crate::backend::peer_waits::PeerWaits::ns(t) as u64).collect();
        if c.rank() != 2 {
            assert!(ns[2] >= 140_000_000, "rank {} waited {ns:?}", c.rank());
            assert!(ns[2] > ns[1 - c.rank().min(1)] * 4, "rank {}: the wait is rank 2's: {ns:?}", c.rank());
        } else {
            assert!(ns.iter().sum::<u64>() < 100_000_000, "rank 2 came last: {ns:?}");
        }
    });
}

/// The states a snapshot derives from the order of operations: the oldest unfinished one
/// runs, the ones behind it wait; a failure keeps its error and the peer it waited on.
#[test]
fn states_follow_the_order_in_which_operations_run() {
    use super::FlightRecorder;
    use crate::backend::Op;
    let r = FlightRecorder::new(4, 0, 2, "test");
    let states = |r: &FlightRecorder| {
        let d = r.snapshot("test");
        d.ops.iter().map(|o| (o.seq, o.state)).collect::<Vec<_>>()
    };
    let a = r.begin(&Op::Barrier);
    let b = r.begin(&Op::Barrier);
    let c = r.begin(&Op::Barrier);
    assert_eq!(states(&r), [(a, OpState::Started), (b, OpState::Queued), (c, OpState::Queued)]);
    let d = r.snapshot("test");
    assert!(d.ops[0].started_us.is_some() && d.ops[1].started_us.is_none(), "{d:?}");
    r.end(a, None);
    assert_eq!(states(&r), [(a, OpState::Completed), (b, OpState::Started), (c, OpState::Queued)]);
    // The next one started when the one before it ended.
    let d = r.snapshot("test");
    assert!(d.ops[1].started_us >= d.ops[0].ended_us, "{d:?}");
    r.end(b, Some((&Error::invalid("wrong count"), Some(1))));
    assert_eq!(states(&r), [(a, OpState::Completed), (b, OpState::Failed), (c, OpState::Started)]);
    let d = r.snapshot("test");
    assert_eq!((d.ops[1].error.as_deref(), d.ops[1].waiting_on), (Some("invalid argument: wrong count"), Some(1)));
    assert_eq!(d.ops[0].error, None);
    // The peer the running operation waits for.
    r.waiting_on(0);
    assert_eq!(r.snapshot("test").ops[2].waiting_on, Some(0));
    r.end(c, None);
    // Beyond the capacity the oldest go, and are counted.
    for _ in 0..3 {
        let s = r.begin(&Op::Barrier);
        r.end(s, None);
    }
    let d = r.snapshot("test");
    assert_eq!(d.dropped, 2);
    assert_eq!(d.ops.iter().map(|o| o.seq).collect::<Vec<_>>(), [2, 3, 4, 5]);
    assert!(d.ops.iter().all(|o| o.state == OpState::Completed), "{d:?}");
    // An end for an operation whose slot was reused records nothing.
    r.end(0, None);
    assert_eq!(r.snapshot("test").ops.len(), 4);
    // Capacity 0 records nothing.
    let off = FlightRecorder::new(0, 0, 2, "test");
    let s = off.begin(&Op::Barrier);
    off.end(s, None);
    assert!(off.snapshot("test").ops.is_empty());
}

/// Snapshots taken while another thread records read whole entries only: every entry's
/// times belong to it (a torn read would mix an operation's sequence number with another's
/// times).
#[test]
fn snapshots_during_recording_read_whole_entries() {
    use super::FlightRecorder;
    use crate::backend::Op;
    use std::sync::atomic::{AtomicBool, Ordering};
    let r = FlightRecorder::new(8, 0, 2, "test");
    let stop = AtomicBool::new(false);
    /// Stops the writer however the reader ends (a failed assertion too, or the scope hangs).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let q = r.begin(&Op::Barrier);
                r.end(q, None);
            }
        });
        let _stop = Stop(&stop);
        let mut seen = 0;
        let deadline = std::time::Instant::now() + Duration::from_millis(300);
        while std::time::Instant::now() < deadline {
            let d = r.snapshot("test");
            for w in d.ops.windows(2) {
                assert!(w[0].seq < w[1].seq, "{:?}", d.ops);
                if w[0].seq + 1 == w[1].seq {
                    assert!(w[0].enqueued_us <= w[1].enqueued_us, "{:?}", d.ops);
                }
            }
            for o in &d.ops {
                if let (Some(s), Some(e)) = (o.started_us, o.ended_us) {
                    assert!(o.enqueued_us <= s && s <= e, "{o:?}");
                }
            }
            seen += d.ops.len();
        }
        assert!(seen > 0);
    });
}
