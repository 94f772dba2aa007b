//! Tests of the host double.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::codes::{ILLEGAL_ADDRESS, INVALID_DEVICE, INVALID_HANDLE, INVALID_VALUE, LAUNCH_FAILED};
use super::memory::{ALIGN, POISON};
use super::*;
use crate::error::Error;

/// Long enough for anything that should happen to happen.
const LONG: Duration = Duration::from_secs(10);
/// Long enough for something that must not happen to have had its chance.
const SHORT: Duration = Duration::from_millis(50);

/// The code and message of a backend error.
fn backend(e: Error) -> (i64, String) {
    match e {
        Error::Backend { code, message } => (code, message),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

/// A closure that appends `v` to `log`.
fn push<T: Send + 'static>(log: &Arc<Mutex<Vec<T>>>, v: T) -> Closure {
    let log = Arc::clone(log);
    Box::new(move || {
        log.lock().map_err(|_| Error::Internal("poisoned".into()))?.push(v);
        Ok(())
    })
}

/// A closure that sets `flag`.
fn set(flag: &Arc<AtomicBool>) -> Closure {
    let flag = Arc::clone(flag);
    Box::new(move || {
        flag.store(true, Ordering::SeqCst);
        Ok(())
    })
}

/// The bytes of device memory at `addr`, copied out through the default stream.
fn read(rt: &HostRuntime, addr: u64, bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes];
    // SAFETY: `out` is valid for `bytes` bytes and outlives the synchronize below.
    unsafe { rt.copy_async(out.as_mut_ptr() as u64, addr, bytes, CopyKind::DeviceToHost, RawStream::DEFAULT) }
        .expect("copy out");
    rt.stream_synchronize(RawStream::DEFAULT).expect("synchronize");
    out
}

#[test]
fn jobs_on_one_stream_run_in_order() {
    let rt = HostRuntime::new(1);
    let s = rt.stream_create(0).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let half = rt.event_create(0).unwrap();
    // Queue everything behind a stall, so the worker finds a full queue.
    let guard = rt.stall(s).unwrap();
    for i in 0..100 {
        rt.enqueue(s, push(&log, i)).unwrap();
        if i == 49 {
            rt.event_record(half, s).unwrap();
        }
    }
    assert!(!rt.event_query(half).unwrap(), "the event fired before its stream reached it");
    assert!(log.lock().unwrap().is_empty(), "jobs ran behind a stall");
    guard.release();
    rt.stream_synchronize(s).unwrap();
    assert!(rt.event_query(half).unwrap());
    assert_eq!(*log.lock().unwrap(), (0..100).collect::<Vec<_>>());
}

#[test]
fn streams_run_concurrently_and_wait_on_each_others_events() {
    let rt = HostRuntime::new(1);
    let (a, b) = (rt.stream_create(0).unwrap(), rt.stream_create(0).unwrap());
    let (on_b, early, late) = (rt.event_create(0).unwrap(), rt.event_create(0).unwrap(), rt.event_create(0).unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));

    // B is held up; A has work of its own, then waits for B's event, then more work.
    let guard = rt.stall(b).unwrap();
    rt.enqueue(b, push(&log, "b")).unwrap();
    rt.event_record(on_b, b).unwrap();
    rt.enqueue(a, push(&log, "a before the wait")).unwrap();
    rt.event_record(early, a).unwrap();
    rt.stream_wait_event(a, on_b).unwrap();
    rt.enqueue(a, push(&log, "a after the wait")).unwrap();
    rt.event_record(late, a).unwrap();

    // None of these calls blocked the host (B is stalled for good until released), and A
    // ran its first job while B was stuck.
    assert!(rt.event_wait(early, LONG).unwrap(), "stream A did not run while B was stalled");
    assert!(!rt.event_wait(late, SHORT).unwrap(), "A went past its wait on B's event");
    assert!(!rt.event_query(late).unwrap());
    assert_eq!(*log.lock().unwrap(), ["a before the wait"]);

    guard.release();
    assert!(rt.event_wait(late, LONG).unwrap());
    assert_eq!(*log.lock().unwrap(), ["a before the wait", "b", "a after the wait"]);
    rt.stream_synchronize(a).unwrap();
    rt.stream_synchronize(b).unwrap();
}

#[test]
fn a_wait_on_an_event_recorded_after_a_delay_holds_until_it_fires() {
    let rt = HostRuntime::new(1);
    let (a, b) = (rt.stream_create(0).unwrap(), rt.stream_create(0).unwrap());
    let (e, done) = (rt.event_create(0).unwrap(), rt.event_create(0).unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let slow = Arc::clone(&log);
    rt.enqueue(
        b,
        Box::new(move || {
            std::thread::sleep(Duration::from_millis(30));
            slow.lock().map_err(|_| Error::Internal("poisoned".into()))?.push("b");
            Ok(())
        }),
    )
    .unwrap();
    rt.event_record(e, b).unwrap();
    rt.stream_wait_event(a, e).unwrap();
    rt.enqueue(a, push(&log, "a")).unwrap();
    rt.event_record(done, a).unwrap();
    assert!(rt.event_wait(done, LONG).unwrap());
    assert_eq!(*log.lock().unwrap(), ["b", "a"]);
}

#[test]
fn a_wait_holds_the_record_current_when_it_was_queued() {
    let rt = HostRuntime::new(1);
    let (a, b, c) = (rt.stream_create(0).unwrap(), rt.stream_create(0).unwrap(), rt.stream_create(0).unwrap());
    let (e, done) = (rt.event_create(0).unwrap(), rt.event_create(0).unwrap());
    let guard = rt.stall(b).unwrap();
    rt.event_record(e, b).unwrap();
    rt.stream_wait_event(a, e).unwrap();
    rt.event_record(done, a).unwrap();
    // Recording the event again on a free stream fires it, but A waits for the first record.
    rt.event_record(e, c).unwrap();
    assert!(rt.event_wait(e, LONG).unwrap());
    assert!(!rt.event_wait(done, SHORT).unwrap(), "the wait moved to the later record");
    guard.release();
    assert!(rt.event_wait(done, LONG).unwrap());
}

#[test]
fn events_never_recorded_count_as_fired_and_recording_again_resets_them() {
    let rt = HostRuntime::new(1);
    let s = rt.stream_create(0).unwrap();
    let e = rt.event_create(0).unwrap();
    assert!(rt.event_query(e).unwrap());
    assert!(rt.event_wait(e, Duration::ZERO).unwrap());
    // Waiting on it holds nothing up.
    let after = rt.event_create(0).unwrap();
    rt.stream_wait_event(s, e).unwrap();
    rt.event_record(after, s).unwrap();
    assert!(rt.event_wait(after, LONG).unwrap());

    for _ in 0..2 {
        let guard = rt.stall(s).unwrap();
        rt.event_record(e, s).unwrap();
        assert!(!rt.event_query(e).unwrap(), "recording did not reset the event");
        drop(guard);
        assert!(rt.event_wait(e, LONG).unwrap());
        assert!(rt.event_query(e).unwrap());
    }
}

#[test]
fn an_event_of_another_device_cannot_be_recorded_on_a_stream() {
    let rt = HostRuntime::new(2);
    let s = rt.stream_create(0).unwrap();
    let e = rt.event_create(1).unwrap();
    let (code, message) = backend(rt.event_record(e, s).unwrap_err());
    assert_eq!(code, INVALID_HANDLE, "{message}");
    assert!(message.contains("device 1"), "{message}");
    // On the default stream, the thread's current device decides.
    rt.set_current(1).unwrap();
    rt.event_record(e, RawStream::DEFAULT).unwrap();
    assert!(rt.event_wait(e, LONG).unwrap());
}

#[test]
fn copies_move_the_right_bytes() {
    let rt = HostRuntime::new(1);
    let s = rt.stream_create(0).unwrap();
    let d = rt.alloc(0, 1000).unwrap();
    let host: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
    let pinned = rt.host_alloc(17).unwrap();
    // SAFETY: `pinned` is a live allocation of 17 bytes.
    unsafe { std::ptr::copy_nonoverlapping(host.as_ptr().add(500), pinned, 17) };
    let mut out = vec![0u8; 340];

    // SAFETY: every host range is inside `host`, `pinned` or `out`, which outlive the
    // synchronize below; every device range is inside `d`.
    unsafe {
        rt.copy_async(d + 13, host.as_ptr().add(7) as u64, 333, CopyKind::HostToDevice, s).unwrap();
        rt.copy_async(d + 500, d + 13, 333, CopyKind::DeviceToDevice, s).unwrap();
        rt.copy_async(out.as_mut_ptr().add(3) as u64, d + 500, 333, CopyKind::DeviceToHost, s).unwrap();
        rt.copy_async(d + 983, pinned as u64, 17, CopyKind::HostToDevice, s).unwrap();
        // Overlapping ranges in one allocation behave like memmove.
        rt.copy_async(d + 14, d + 13, 5, CopyKind::DeviceToDevice, s).unwrap();
        // An empty copy at the very end of the allocation is fine.
        rt.copy_async(d + 1000, host.as_ptr() as u64, 0, CopyKind::HostToDevice, s).unwrap();
    }
    rt.stream_synchronize(s).unwrap();

    assert_eq!(&out[..3], &[0, 0, 0]);
    assert_eq!(&out[3..336], &host[7..340]);
    assert_eq!(&out[336..], &[0, 0, 0, 0]);
    let all = read(&rt, d, 1000);
    assert!(all[..13].iter().all(|&b| b == POISON), "bytes before the first copy changed");
    assert_eq!(all[13], host[7]);
    assert_eq!(&all[14..19], &host[7..12], "the overlapping copy is not a memmove");
    assert_eq!(&all[19..346], &host[13..340]);
    assert!(all[346..500].iter().all(|&b| b == POISON), "bytes between the copies changed");
    assert_eq!(&all[500..833], &host[7..340]);
    assert!(all[833..983].iter().all(|&b| b == POISON));
    assert_eq!(&all[983..], &host[500..517]);
    // SAFETY: both came from this runtime and no work uses them any more.
    unsafe {
        rt.free(0, d).unwrap();
        rt.host_free(pinned).unwrap();
    }
}

#[test]
fn copies_that_are_not_what_their_kind_says_fail_at_once() {
    let rt = HostRuntime::new(2);
    let s = rt.stream_create(0).unwrap();
    let d0 = rt.alloc(0, 64).unwrap();
    let d1 = rt.alloc(1, 64).unwrap();
    let pinned = rt.host_alloc(16).unwrap() as u64;
    let host = [0u8; 64];
    let h = host.as_ptr() as u64;
    let cases = [
        (d0 + 60, h, 8, CopyKind::HostToDevice, "past the end of its allocation"),
        (d1, h, 8, CopyKind::HostToDevice, "memory of device 1"),
        (h, h, 8, CopyKind::HostToDevice, "not inside a live allocation of device 0"),
        (pinned, h, 8, CopyKind::HostToDevice, "pinned host memory"),
        (d0, d0 + 8, 8, CopyKind::DeviceToHost, "overlaps the allocation of device 0"),
        (d0, d1, 8, CopyKind::DeviceToDevice, "memory of device 1"),
        (d0, h, 8, CopyKind::DeviceToDevice, "not inside a live allocation"),
        (d0, 0, 8, CopyKind::HostToDevice, "source is null"),
        (d0, pinned, 32, CopyKind::HostToDevice, "past the end of its pinned allocation"),
        (h, d0, 65, CopyKind::DeviceToHost, "past the end of its allocation"),
        (d0, u64::MAX - 4, 8, CopyKind::HostToDevice, "not addressable"),
    ];
    for (dst, src, bytes, kind, why) in cases {
        // SAFETY: every one of these is refused before anything is queued.
        let got = unsafe { rt.copy_async(dst, src, bytes, kind, s) };
        let (code, message) = backend(got.expect_err(why));
        assert_eq!(code, INVALID_VALUE, "{message}");
        assert!(message.contains(why), "expected {why:?} in {message:?}");
    }
    // The refusals did not break the stream.
    rt.stream_synchronize(s).unwrap();

    // The default stream serves the calling thread's current device.
    rt.set_current(1).unwrap();
    // SAFETY: `host` outlives the synchronize below; `d1` is live.
    unsafe {
        assert!(rt.copy_async(d0, h, 8, CopyKind::HostToDevice, RawStream::DEFAULT).is_err());
        rt.copy_async(d1, h, 8, CopyKind::HostToDevice, RawStream::DEFAULT).unwrap();
    }
    rt.stream_synchronize(RawStream::DEFAULT).unwrap();
}

#[test]
fn a_copy_whose_memory_was_freed_before_it_ran_breaks_the_stream() {
    let rt = HostRuntime::new(1);
    let s = rt.stream_create(0).unwrap();
    let d = rt.alloc(0, 32).unwrap();
    let host = [1u8; 32];
    let guard = rt.stall(s).unwrap();
    // SAFETY: `host` outlives the synchronize; `d` is freed before the copy runs, which is
    // exactly the engine bug the double must catch (it checks again, under its lock).
    unsafe {
        rt.copy_async(d, host.as_ptr() as u64, 32, CopyKind::HostToDevice, s).unwrap();
        rt.free(0, d).unwrap();
    }
    drop(guard);
    let (code, message) = backend(rt.stream_synchronize(s).unwrap_err());
    assert_eq!(code, ILLEGAL_ADDRESS, "{message}");
    assert!(message.contains("job #2") && message.contains("freed"), "{message}");
}

#[test]
fn residence_inside_outside_and_after_free() {
    let rt = HostRuntime::new(2);
    let d = rt.alloc(1, 100).unwrap();
    let at = |a: u64| rt.residence(std::ptr::with_exposed_provenance(a as usize)).unwrap();
    assert_eq!(at(d), Residence::Device(1));
    assert_eq!(at(d + 57), Residence::Device(1));
    assert_eq!(at(d + 99), Residence::Device(1));
    assert_eq!(at(d + 100), Residence::Host);
    assert_eq!(at(d - 1), Residence::Host);
    let local = 5u8;
    assert_eq!(rt.residence(std::ptr::from_ref(&local).cast()).unwrap(), Residence::Host);
    assert_eq!(rt.residence(std::ptr::null()).unwrap(), Residence::Host);
    let pinned = rt.host_alloc(64).unwrap();
    assert_eq!(rt.residence(pinned.cast_const().cast()).unwrap(), Residence::Host);
    let empty = rt.alloc(0, 0).unwrap();
    assert_eq!(at(empty), Residence::Device(0));
    // SAFETY: all three came from this runtime; no work uses them.
    unsafe {
        rt.free(1, d).unwrap();
        rt.free(0, empty).unwrap();
        rt.host_free(pinned).unwrap();
    }
    assert_eq!(at(d), Residence::Host);
    assert_eq!(at(d + 57), Residence::Host);
    assert_eq!(at(empty), Residence::Host);
}

#[test]
fn allocations_are_aligned_distinct_and_poisoned() {
    let rt = HostRuntime::new(1);
    let sizes = [0usize, 1, 3, 255, 256, 257, 4097];
    let addrs: Vec<u64> = sizes.iter().map(|&n| rt.alloc(0, n).unwrap()).collect();
    let pinned = rt.host_alloc(0).unwrap();
    assert_eq!(pinned as usize % ALIGN, 0);
    for (&a, &n) in addrs.iter().zip(&sizes) {
        assert_eq!(a % ALIGN as u64, 0, "{a:#x} ({n} bytes) is not aligned");
        assert!(read(&rt, a, n.max(1)).iter().all(|&b| b == POISON));
    }
    let mut sorted = addrs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), addrs.len(), "two allocations share an address");
    assert_eq!(rt.census().device_allocations, sizes.len());
    assert_eq!(rt.census().pinned_allocations, 1);
    for a in addrs {
        // SAFETY: from this runtime, freed once, unused.
        unsafe { rt.free(0, a).unwrap() };
    }
    // SAFETY: as above.
    unsafe { rt.host_free(pinned).unwrap() };
    assert_eq!(rt.census(), Census::default());
}

#[test]
fn bad_frees_are_errors() {
    let rt = HostRuntime::new(2);
    let d = rt.alloc(1, 64).unwrap();
    let pinned = rt.host_alloc(64).unwrap();
    let expect = |got: Result<()>, code: i64, why: &str| {
        let (c, message) = backend(got.expect_err(why));
        assert_eq!(c, code, "{message}");
        assert!(message.contains(why), "expected {why:?} in {message:?}");
    };
    // SAFETY: these frees are wrong on purpose; the double must refuse them, not free.
    unsafe {
        expect(rt.free(0, d), INVALID_VALUE, "device 1's memory, not device 0's memory");
        expect(rt.free(1, d + 8), INVALID_VALUE, "inside the allocation");
        expect(rt.free(1, pinned as u64), INVALID_VALUE, "pinned host memory");
        expect(rt.host_free(with_addr(d)), INVALID_VALUE, "device 1's memory");
        expect(rt.free(2, d), INVALID_DEVICE, "device 2 does not exist");
        expect(rt.free(1, 0x1000), INVALID_VALUE, "not a live allocation");
        assert_eq!(rt.census().device_allocations, 1, "a refused free freed");
        rt.free(1, d).unwrap();
        expect(rt.free(1, d), INVALID_VALUE, "already freed");
        rt.host_free(pinned).unwrap();
        expect(rt.host_free(pinned), INVALID_VALUE, "already freed");
    }
    assert_eq!(rt.census(), Census::default());
}

/// A pointer with address `a` (for frees that must be refused).
fn with_addr(a: u64) -> *mut u8 {
    std::ptr::with_exposed_provenance_mut(a as usize)
}

#[test]
fn unknown_handles_are_errors() {
    let rt = HostRuntime::new(1);
    let other = HostRuntime::new(1);
    let s = rt.stream_create(0).unwrap();
    let e = rt.event_create(0).unwrap();
    let foreign_s = other.stream_create(0).unwrap();
    let foreign_e = other.event_create(0).unwrap();
    let made_up = RawStream(std::ptr::without_provenance_mut(0xdead_beef));
    let invalid = |got: Result<()>| assert_eq!(backend(got.expect_err("unknown handle")).0, INVALID_HANDLE);

    invalid(rt.stream_synchronize(made_up));
    invalid(rt.stream_synchronize(foreign_s));
    invalid(rt.stream_synchronize(RawStream(e.0)));
    invalid(rt.event_query(RawEvent(s.0)).map(drop));
    invalid(rt.event_query(foreign_e).map(drop));
    invalid(rt.event_record(foreign_e, s));
    invalid(rt.enqueue(made_up, Box::new(|| Ok(()))));
    invalid(rt.stall(foreign_s).map(drop));
    invalid(rt.event_wait(RawEvent(made_up.0), SHORT).map(drop));
    // SAFETY: destroying unknown or already destroyed handles is refused, never done.
    unsafe {
        invalid(rt.stream_destroy(RawStream::DEFAULT));
        invalid(rt.stream_destroy(foreign_s));
        rt.stream_destroy(s).unwrap();
        invalid(rt.stream_destroy(s));
        rt.event_destroy(e).unwrap();
        invalid(rt.event_destroy(e));
    }
    invalid(rt.stream_synchronize(s));
    invalid(rt.event_query(e).map(drop));
    invalid(rt.stream_wait_event(RawStream::DEFAULT, e));
    assert_eq!(rt.census(), Census::default());
    // The other runtime's handles still work there.
    other.event_record(foreign_e, foreign_s).unwrap();
    other.stream_synchronize(foreign_s).unwrap();
}

#[test]
fn a_failing_job_breaks_the_stream_for_good() {
    let rt = HostRuntime::new(1);
    let s = rt.stream_create(0).unwrap();
    let (before, after) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let e = rt.event_create(0).unwrap();
    let guard = rt.stall(s).unwrap();
    rt.enqueue(s, set(&before)).unwrap();
    rt.enqueue(s, Box::new(|| Err(Error::invalid("boom")))).unwrap();
    rt.enqueue(s, set(&after)).unwrap();
    rt.event_record(e, s).unwrap();
    drop(guard);

    let (code, message) = backend(rt.stream_synchronize(s).unwrap_err());
    assert_eq!(code, LAUNCH_FAILED);
    assert!(message.contains("job #3 (closure) failed") && message.contains("boom"), "{message}");
    assert!(before.load(Ordering::SeqCst));
    assert!(!after.load(Ordering::SeqCst), "a job after the failure ran");
    // The event after the failure reports it, by query and by wait.
    let queried = rt.event_query(e).unwrap_err();
    assert_eq!(backend(queried.clone()), (code, message.clone()));
    assert_eq!(rt.event_wait(e, LONG).unwrap_err(), queried);
    // Sticky: later calls on the stream report it too, and queue nothing.
    assert_eq!(rt.stream_synchronize(s).unwrap_err(), queried);
    assert_eq!(rt.enqueue(s, set(&after)).unwrap_err(), queried);
    let later = rt.event_create(0).unwrap();
    assert_eq!(rt.event_record(later, s).unwrap_err(), queried);
    assert_eq!(rt.event_query(later).unwrap_err(), queried);
    assert_eq!(rt.stream_wait_event(s, later).unwrap_err(), queried);
    let host = [0u8; 4];
    let d = rt.alloc(0, 4).unwrap();
    // SAFETY: refused; nothing is queued.
    let copy = unsafe { rt.copy_async(d, host.as_ptr() as u64, 4, CopyKind::HostToDevice, s) };
    assert_eq!(copy.unwrap_err(), queried);
    assert!(!after.load(Ordering::SeqCst));

    // Other streams are not affected; a job's own backend code is kept.
    let t = rt.stream_create(0).unwrap();
    rt.enqueue(t, Box::new(|| Err(Error::Backend { code: 42, message: "nccl said no".into() }))).unwrap();
    let (code, message) = backend(rt.stream_synchronize(t).unwrap_err());
    assert_eq!(code, 42);
    assert!(message.contains("job #1 (closure) failed: nccl said no"), "{message}");
    rt.stream_synchronize(RawStream::DEFAULT).unwrap();
}

#[test]
fn a_broken_stream_breaks_the_streams_waiting_on_its_events() {
    let rt = HostRuntime::new(1);
    let (a, b) = (rt.stream_create(0).unwrap(), rt.stream_create(0).unwrap());
    let e = rt.event_create(0).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let guard = rt.stall(b).unwrap();
    rt.enqueue(b, Box::new(|| Err(Error::invalid("boom on b")))).unwrap();
    rt.event_record(e, b).unwrap();
    rt.stream_wait_event(a, e).unwrap();
    rt.enqueue(a, set(&ran)).unwrap();
    drop(guard);
    let (_, message) = backend(rt.stream_synchronize(a).unwrap_err());
    assert!(message.contains("wait on an event") && message.contains("boom on b"), "{message}");
    assert!(!ran.load(Ordering::SeqCst));
}

#[test]
fn a_panicking_job_breaks_the_stream() {
    let rt = HostRuntime::new(1);
    let s = rt.stream_create(0).unwrap();
    rt.enqueue(s, Box::new(|| panic!("the double must survive this"))).unwrap();
    let (code, message) = backend(rt.stream_synchronize(s).unwrap_err());
    assert_eq!(code, LAUNCH_FAILED);
    assert!(message.contains("panicked: the double must survive this"), "{message}");
}

#[test]
fn a_stall_holds_the_stream_until_released() {
    let rt = HostRuntime::new(1);
    let s = rt.stream_create(0).unwrap();
    let e = rt.event_create(0).unwrap();
    let guard = rt.stall(s).unwrap();
    rt.event_record(e, s).unwrap();
    assert!(!rt.event_wait(e, SHORT).unwrap(), "the stall did not hold the stream");
    guard.release();
    assert!(rt.event_wait(e, LONG).unwrap());
    // Dropping the guard releases it too.
    drop(rt.stall(s).unwrap());
    rt.event_record(e, s).unwrap();
    assert!(rt.event_wait(e, LONG).unwrap());
    rt.stream_synchronize(s).unwrap();
}

#[test]
fn stream_destroy_lets_queued_work_finish() {
    let rt = HostRuntime::new(1);
    let s = rt.stream_create(0).unwrap();
    let (tx, rx) = mpsc::channel();
    let guard = rt.stall(s).unwrap();
    rt.enqueue(
        s,
        Box::new(move || {
            tx.send("ran").map_err(|_| Error::Internal("receiver gone".into()))?;
            Ok(())
        }),
    )
    .unwrap();
    // SAFETY: `s` came from this runtime, is destroyed once and not used afterwards (other
    // than to check that it is refused).
    unsafe { rt.stream_destroy(s).unwrap() };
    assert_eq!(rt.census().streams, 0);
    assert!(rx.try_recv().is_err(), "the job ran behind a stall");
    drop(guard);
    assert_eq!(rx.recv_timeout(LONG), Ok("ran"));
    assert_eq!(backend(rt.enqueue(s, Box::new(|| Ok(()))).unwrap_err()).0, INVALID_HANDLE);
}

#[test]
fn dropping_the_runtime_with_stalled_streams_and_queued_work_returns() {
    let rt = HostRuntime::new(1);
    let (a, b) = (rt.stream_create(0).unwrap(), rt.stream_create(0).unwrap());
    let e = rt.event_create(0).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let token = Arc::new(());
    // A is stalled with work behind it; B waits on an event A will never reach; the default
    // stream is stalled too; one more stream is destroyed with work still stuck on it.
    let guard = rt.stall(a).unwrap();
    let held = Arc::clone(&token);
    rt.enqueue(
        a,
        Box::new(move || {
            drop(held);
            Err(Error::invalid("must not run"))
        }),
    )
    .unwrap();
    rt.enqueue(a, set(&ran)).unwrap();
    rt.event_record(e, a).unwrap();
    rt.stream_wait_event(b, e).unwrap();
    rt.enqueue(b, set(&ran)).unwrap();
    let default_guard = rt.stall(RawStream::DEFAULT).unwrap();
    let c = rt.stream_create(0).unwrap();
    rt.stream_wait_event(c, e).unwrap();
    // SAFETY: `c` came from this runtime and is not used afterwards.
    unsafe { rt.stream_destroy(c).unwrap() };
    let d = rt.alloc(0, 1 << 20).unwrap();
    assert_ne!(d, 0);
    let memory = Arc::downgrade(&rt.memory);

    let (tx, rx) = mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(rt);
        let _ = tx.send(());
    });
    assert_eq!(rx.recv_timeout(LONG), Ok(()), "dropping the runtime hung");
    dropper.join().unwrap();
    assert!(!ran.load(Ordering::SeqCst), "queued work ran during the drop");
    assert_eq!(Arc::strong_count(&token), 1, "a queued closure was not dropped");
    assert!(memory.upgrade().is_none(), "the memory registry outlived the runtime");
    // The guards outlive their runtime harmlessly.
    drop(guard);
    drop(default_guard);
}

#[test]
fn the_current_device_is_per_thread_and_per_runtime() {
    let rt = HostRuntime::new(3);
    assert_eq!(rt.current_device(), 0);
    rt.set_current(2).unwrap();
    assert_eq!(rt.current_device(), 2);
    let (code, _) = backend(rt.set_current(3).unwrap_err());
    assert_eq!(code, INVALID_DEVICE);
    assert_eq!(rt.current_device(), 2, "a refused set_current changed the device");
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                assert_eq!(rt.current_device(), 0, "the current device leaked to another thread");
                rt.set_current(1).unwrap();
                assert_eq!(rt.current_device(), 1);
            })
            .join()
            .unwrap();
    });
    assert_eq!(rt.current_device(), 2);
    // Calls taking a device use it, and leave the caller's current device as it was.
    let d = rt.alloc(1, 8).unwrap();
    assert_eq!(rt.current_device(), 2);
    let _ = rt.stream_create(0).unwrap();
    assert_eq!(rt.current_device(), 2);
    let other = HostRuntime::new(3);
    assert_eq!(other.current_device(), 0, "the current device leaked to another runtime");
    // SAFETY: from this runtime, unused.
    unsafe { rt.free(1, d).unwrap() };
    assert_eq!(rt.device_count().unwrap(), 3);
    assert_eq!(rt.vendor(), Vendor::Host);
    assert!(rt.describe().contains("3 fake device"), "{}", rt.describe());
}

#[test]
fn the_default_stream_runs_copies_closures_and_events() {
    let rt = HostRuntime::new(1);
    let d = rt.alloc(0, 16).unwrap();
    let src: Vec<u8> = (1..=16).collect();
    let log = Arc::new(Mutex::new(Vec::new()));
    let e = rt.event_create(0).unwrap();
    // SAFETY: `src` outlives the synchronize; `d` is live.
    unsafe { rt.copy_async(d, src.as_ptr() as u64, 16, CopyKind::HostToDevice, RawStream::DEFAULT).unwrap() };
    rt.enqueue(RawStream::DEFAULT, push(&log, 1)).unwrap();
    rt.event_record(e, RawStream::DEFAULT).unwrap();
    let s = rt.stream_create(0).unwrap();
    rt.stream_wait_event(s, e).unwrap();
    rt.enqueue(s, push(&log, 2)).unwrap();
    rt.stream_synchronize(s).unwrap();
    rt.stream_synchronize(RawStream::DEFAULT).unwrap();
    assert_eq!(*log.lock().unwrap(), [1, 2]);
    assert_eq!(read(&rt, d, 16), src);
}

#[test]
fn enqueue_anywhere_finds_streams_of_every_runtime_and_only_live_ones() {
    let (a, b) = (HostRuntime::new(1), HostRuntime::new(2));
    let (sa, sb) = (a.stream_create(0).unwrap(), b.stream_create(1).unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    enqueue_anywhere(sa, push(&log, 'a')).unwrap();
    b.stream_synchronize(sb).unwrap();
    a.stream_synchronize(sa).unwrap();
    enqueue_anywhere(sb, push(&log, 'b')).unwrap();
    b.stream_synchronize(sb).unwrap();
    assert_eq!(*log.lock().unwrap(), vec!['a', 'b']);
    assert!(stream_is_live(sa) && stream_is_live(sb));
    // The default stream belongs to no runtime in particular; made-up handles are unknown.
    let (code, msg) = backend(enqueue_anywhere(RawStream::DEFAULT, push(&log, 'x')).unwrap_err());
    assert_eq!(code, INVALID_HANDLE);
    assert!(msg.contains("default stream"), "{msg}");
    assert!(!stream_is_live(RawStream(with_addr(u64::MAX - 7).cast())));
    // Destroyed streams and streams of a dropped runtime are gone.
    // SAFETY: made above, destroyed once.
    unsafe { a.stream_destroy(sa).unwrap() };
    assert_eq!(backend(enqueue_anywhere(sa, push(&log, 'x')).unwrap_err()).0, INVALID_HANDLE);
    drop(b);
    assert!(!stream_is_live(sb));
    assert_eq!(backend(enqueue_anywhere(sb, push(&log, 'x')).unwrap_err()).0, INVALID_HANDLE);
    // A broken stream reports its sticky error.
    let s = a.stream_create(0).unwrap();
    enqueue_anywhere(s, Box::new(|| Err(Error::Internal("boom".into())))).unwrap();
    assert!(a.stream_synchronize(s).is_err());
    assert!(backend(enqueue_anywhere(s, push(&log, 'x')).unwrap_err()).1.contains("boom"));
    assert_eq!(log.lock().unwrap().len(), 2);
}

#[test]
fn the_current_device_is_that_of_the_runtime_last_used_on_the_thread() {
    std::thread::spawn(|| {
        assert!(CurrentDevice::get().is_none(), "a fresh thread has no current runtime");
        let a = HostRuntime::new(2);
        let b = HostRuntime::new(3);
        a.set_current(1).unwrap();
        let cur = CurrentDevice::get().expect("a made a device current");
        assert_eq!(cur.device(), 1);
        let p = cur.alloc(64).unwrap();
        assert_eq!(a.residence(with_addr(p).cast_const().cast()).unwrap(), Residence::Device(1));
        assert_eq!(a.census().device_allocations, 1);
        b.set_current(2).unwrap();
        assert_eq!(CurrentDevice::get().unwrap().device(), 2);
        // The handle keeps pointing at a's memory: it frees there.
        // SAFETY: allocated above, freed once, unused.
        unsafe { cur.free(p).unwrap() };
        assert_eq!(a.census().device_allocations, 0);
        // SAFETY: as above (already freed: an error, not undefined behaviour).
        assert_eq!(backend(unsafe { cur.free(p) }.unwrap_err()).0, INVALID_VALUE);
        drop(b);
        assert!(CurrentDevice::get().is_none(), "the dropped runtime is still current");
        drop(a);
        assert!(cur.alloc(8).is_err(), "allocated in a dropped runtime");
    })
    .join()
    .unwrap();
}
