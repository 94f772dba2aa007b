//! Waiting on a 32-bit word in shared memory: spin briefly (the fast path, no system call),
//! poll while yielding the CPU, then sleep in the kernel with `futex(2)` until a writer wakes
//! us ([`WaitPolicy`] says how long each phase lasts). Writers only make the
//! wake system call when a waiter has announced itself, so an uncontended hand-off between
//! two busy processes costs no system call at all.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::wait::WaitPolicy;

/// Sleeps while `word == expected`, at most `timeout`. Spurious wake-ups are possible:
/// callers re-check their condition.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned 32-bit word that lives as long as this call;
    // the kernel only reads it. Shared (not PRIVATE) because other processes wake it.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec);
    }
}

/// Wakes every process sleeping on `word`.
pub fn wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned 32-bit word; the kernel does not access memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Waits until `ready()` holds, in the three phases of `policy` ([`WaitPolicy`]): spinning,
/// then polling with `sched_yield` between looks, then sleeping on `doorbell` (whose value
/// writers change, then wake, after making `ready()` true). `sleepers` counts sleeping
/// waiters so writers can skip the wake call. Every `check_every` (in the yield and sleep
/// phases), `check()` may end the wait with an error (deadline, abort, dead peer).
pub fn wait_until<E>(
    doorbell: &AtomicU32,
    sleepers: &AtomicU32,
    policy: &WaitPolicy,
    mut ready: impl FnMut() -> bool,
    check_every: Duration,
    mut check: impl FnMut() -> Result<(), E>,
) -> Result<(), E> {
    // The common case on a quiet host: the peers are already there, or come within a few
    // looks (a cache line crossing cores): no clock read.
    for _ in 0..if policy.spin.is_zero() { 1 } else { 64 } {
        if ready() {
            return Ok(());
        }
        std::hint::spin_loop();
    }
    let start = Instant::now();
    'spin: while start.elapsed() < policy.spin {
        // A clock read costs about as much as a look at the peers: look 64 times per read.
        for _ in 0..64 {
            if ready() {
                return Ok(());
            }
            std::hint::spin_loop();
            if policy.spin.is_zero() {
                break 'spin;
            }
        }
    }
    let mut last_check = Instant::now();
    let yielding = Instant::now();
    while yielding.elapsed() < policy.yield_for {
        if ready() {
            return Ok(());
        }
        if last_check.elapsed() >= check_every {
            check()?;
            last_check = Instant::now();
        }
        // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
        unsafe { libc::sched_yield() };
    }
    loop {
        let bell = doorbell.load(Ordering::Acquire);
        if ready() {
            return Ok(());
        }
        if last_check.elapsed() >= check_every {
            check()?;
            last_check = Instant::now();
        }
        sleepers.fetch_add(1, Ordering::SeqCst);
        // Pairs with the fence in `ring`: our increment or their condition is seen.
        std::sync::atomic::fence(Ordering::SeqCst);
        if !ready() {
            wait(doorbell, bell, check_every);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Rings `doorbell` after making a waiter's condition true: when someone sleeps, bumps it
/// and wakes the sleepers. With nobody asleep it writes nothing, so ranks that post in turn
/// do not pass the doorbell's cache line around.
///
/// Why no sleeper is missed: the fence orders our condition store before our load of
/// `sleepers`, and a waiter's `sleepers` increment (sequentially consistent) comes before
/// its last look at the condition. Either we see its increment, and bump and wake (a waiter
/// not yet in `futex_wait` then finds the doorbell changed and returns at once), or it sees
/// our condition and does not sleep.
pub fn ring(doorbell: &AtomicU32, sleepers: &AtomicU32) {
    std::sync::atomic::fence(Ordering::SeqCst);
    ring_fenced(doorbell, sleepers);
}

/// [`ring`] for a caller that issued the sequentially consistent fence itself, after making
/// the waiter's condition true and with no store since (a second fence would only drain an
/// empty store buffer again).
pub fn ring_fenced(doorbell: &AtomicU32, sleepers: &AtomicU32) {
    if sleepers.load(Ordering::SeqCst) != 0 {
        doorbell.fetch_add(1, Ordering::SeqCst);
        wake_all(doorbell);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn a_sleeping_waiter_is_woken() {
        let bell = Arc::new(AtomicU32::new(0));
        let sleepers = Arc::new(AtomicU32::new(0));
        let flag = Arc::new(AtomicBool::new(false));
        let (b, s, f) = (bell.clone(), sleepers.clone(), flag.clone());
        let t = std::thread::spawn(move || {
            wait_until(
                &b,
                &s,
                &WaitPolicy { spin: Duration::from_micros(200), yield_for: Duration::from_millis(2) },
                || f.load(Ordering::Acquire),
                Duration::from_secs(5),
                || Ok::<(), ()>(()),
            )
        });
        std::thread::sleep(Duration::from_millis(20)); // past the spin and yield phases
        flag.store(true, Ordering::Release);
        ring(&bell, &sleepers);
        assert_eq!(t.join().unwrap(), Ok(()));
    }

    #[test]
    fn the_check_ends_a_hopeless_wait() {
        let bell = AtomicU32::new(0);
        let sleepers = AtomicU32::new(0);
        let start = Instant::now();
        let r = wait_until(
            &bell,
            &sleepers,
            &WaitPolicy { spin: Duration::ZERO, yield_for: Duration::from_millis(20) },
            || false,
            Duration::from_millis(10),
            || {
                if start.elapsed() > Duration::from_millis(50) {
                    Err("gave up")
                } else {
                    Ok(())
                }
            },
        );
        assert_eq!(r, Err("gave up"));
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
