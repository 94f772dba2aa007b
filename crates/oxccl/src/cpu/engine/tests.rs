//! The engine's failure paths: a panic inside an operation aborts the communicator on every
//! rank, a queued one fails its work without killing the worker.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::communicator::Communicator;
use crate::error::Error;
use crate::reduce_op::ReduceOp;

/// A world of `n` whose rank `bad`'s next operation panics, as a bug inside would.
fn world_with_a_bug(n: usize, bad: usize) -> Vec<Communicator> {
    let cfg = crate::config::Config::new().resolve().unwrap();
    let world = crate::cpu::local::world(&cfg, n).unwrap();
    world[bad].inner.panic_next.store(true, Ordering::Relaxed);
    world.into_iter().map(|b| Communicator::from_backend(Arc::new(b))).collect()
}

#[test]
fn a_blocking_call_that_panics_aborts_the_communicator_on_every_rank() {
    // The panic reaches its caller; the peers fail at once (not at their 300 s deadline)
    // and every later call, the panicking rank's included, is refused instead of hanging.
    for n in [2, 3] {
        std::thread::scope(|s| {
            for c in world_with_a_bug(n, 1) {
                // Without the abort, the peers would fail at this deadline with a timeout.
                let c = c.with_timeout(Duration::from_secs(10));
                s.spawn(move || {
                    let t = Instant::now();
                    let mut x = [1.0f32; 5];
                    let r = catch_unwind(AssertUnwindSafe(|| c.all_reduce(&mut x, ReduceOp::Sum)));
                    match (c.rank(), r) {
                        (1, r) => assert!(r.is_err(), "rank 1 did not panic: {r:?}"),
                        (me, Ok(Err(Error::Aborted { reason }))) => {
                            assert!(reason.contains("panicked inside oxccl"), "rank {me}: {reason}")
                        }
                        (me, other) => panic!("rank {me} of {n}: {other:?}"),
                    }
                    assert!(t.elapsed() < Duration::from_secs(5), "rank {}: {:?}", c.rank(), t.elapsed());
                    assert!(c.barrier().is_err(), "rank {} went on after the abort", c.rank());
                });
            }
        });
    }
}

#[test]
fn a_queued_operation_that_panics_fails_its_work_instead_of_killing_the_worker() {
    // On the worker thread, the panic becomes the operation's Error::Internal; the peers
    // are aborted, and the rank's next calls are refused rather than queued forever.
    std::thread::scope(|s| {
        for c in world_with_a_bug(3, 2) {
            s.spawn(move || {
                let mut x = [2.0f32; 3];
                let r = c.scope(|sc| sc.all_reduce(&mut x, ReduceOp::Sum)?.wait().map(drop));
                match (c.rank(), r) {
                    (2, Err(Error::Internal(m))) => assert!(m.contains("injected by a test"), "{m}"),
                    (me, Err(Error::Aborted { .. })) if me != 2 => {}
                    (me, other) => panic!("rank {me}: {other:?}"),
                }
                let r = c.scope(|sc| sc.barrier()?.wait().map(drop));
                assert!(r.is_err(), "rank {}: the barrier after the abort: {r:?}", c.rank());
            });
        }
    });
}
