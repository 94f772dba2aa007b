//! Async work: operations in flight while the caller computes, and the safety nets of
//! `Work` and `Scope` (dropping or forgetting a handle never leaves a buffer in use).
//!
//! Overlap is shown without timing: rank 1 is held back (by a channel outside oxccl) until
//! rank 0 has started two all-reduces *and* finished its computation. If starting an async
//! all-reduce blocked, rank 0 would never release rank 1 and the operations would fail with
//! a timeout instead of completing.

use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use oxccl::{local, Error, ReduceOp};

#[test]
fn two_all_reduces_in_flight_while_the_caller_computes() {
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let results = local::run(2, |comm| -> oxccl::Result<(Vec<f32>, Vec<i64>, bool)> {
        let comm = comm.with_timeout(Duration::from_secs(20));
        let mut a: Vec<f32> = (0..10_000).map(|i| (i % 17) as f32 + comm.rank() as f32).collect();
        let mut b: Vec<i64> = (0..777).map(|i| i * (comm.rank() as i64 + 1)).collect();
        if comm.rank() == 1 {
            // Held back until rank 0 has both operations in flight and has computed.
            rx.lock().unwrap().recv_timeout(Duration::from_secs(20)).expect("rank 0 never released rank 1");
        }
        let in_flight_while_computing = comm.scope(|s| {
            let wa = s.all_reduce(&mut a, ReduceOp::Sum)?;
            let wb = s.all_reduce(&mut b, ReduceOp::Max)?;
            let mut overlapped = true;
            if comm.rank() == 0 {
                // Rank 1 has not joined: neither operation can have completed.
                overlapped = !wa.is_completed() && !wb.is_completed();
                let checksum: f64 = (0..200_000).map(|i| (i as f64).sqrt()).sum();
                assert!(checksum > 0.0);
                tx.send(()).expect("rank 1 is gone");
            }
            let a = wa.wait()?;
            let b = wb.wait()?;
            assert_eq!(a.len(), 10_000);
            assert_eq!(b.len(), 777);
            Ok(overlapped)
        })?;
        Ok((a, b, in_flight_while_computing))
    })
    .unwrap();
    for r in results {
        let (a, b, overlapped) = r.unwrap();
        assert!(overlapped, "an async all_reduce completed before its peer joined");
        for (i, x) in a.iter().enumerate() {
            assert_eq!(*x, 2.0 * (i % 17) as f32 + 1.0);
        }
        for (i, x) in b.iter().enumerate() {
            assert_eq!(*x, 2 * i as i64);
        }
    }
}

#[test]
fn a_forgotten_work_is_still_waited_for_by_its_scope() {
    let out = local::run(3, |comm| -> oxccl::Result<Vec<u32>> {
        let mut x = vec![comm.rank() as u32 + 1; 1000];
        comm.scope(|s| {
            let w = s.all_reduce(&mut x, ReduceOp::Sum)?;
            std::mem::forget(w);
            Ok(())
        })?;
        // The scope returned, so the operation has completed and `x` is ours again.
        Ok(x)
    })
    .unwrap();
    for r in out {
        assert_eq!(r.unwrap(), vec![6; 1000]);
    }
}

#[test]
fn dropping_work_waits_and_wait_timeout_reports_progress() {
    let out = local::run(2, |comm| -> oxccl::Result<(bool, Vec<f64>)> {
        let mut x = vec![1.5f64; 64];
        let mut still_running_seen = false;
        if comm.rank() == 1 {
            // The root joins late, so rank 0's first short wait cannot succeed.
            std::thread::sleep(Duration::from_millis(50));
        }
        comm.scope(|s| {
            let mut w = s.broadcast(&mut x, 1)?;
            if comm.rank() == 0 {
                still_running_seen = !w.wait_timeout(Duration::from_millis(1))?;
            }
            drop(w); // waits
            Ok(())
        })?;
        Ok((still_running_seen, x))
    })
    .unwrap();
    let (seen, x) = out[0].clone().unwrap();
    assert!(seen, "wait_timeout(1ms) returned true before the root joined");
    assert_eq!(x, vec![1.5; 64]);
}

#[test]
fn async_errors_surface_through_wait_and_scope() {
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let out = local::run(2, |comm| -> oxccl::Result<()> {
        let comm = comm.with_timeout(Duration::from_millis(200));
        let mut x = vec![0u8; 8];
        if comm.rank() == 0 {
            let r = comm.scope(|s| s.all_reduce(&mut x, ReduceOp::Sum)?.wait().map(drop));
            tx.send(()).expect("rank 1 is gone");
            match r {
                Err(Error::Timeout { peer: Some(1), seq: 0, .. }) => Ok(()),
                other => panic!("expected a timeout waiting on rank 1, got {other:?}"),
            }
        } else {
            // Rank 1 keeps its communicator alive but never joins the all_reduce.
            rx.lock().unwrap().recv_timeout(Duration::from_secs(20)).expect("rank 0 never finished");
            Ok(())
        }
    })
    .unwrap();
    for r in out {
        r.unwrap();
    }
}
