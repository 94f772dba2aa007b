//! The recorders' clock: a point in time costs one instruction where it can. The flight
//! recorder and profiler (`perf`) time operations with it, and the backends their waits for
//! peers (`backend::peer_waits`).
//!
//! On x86-64, where the kernel keeps time by the CPU's time-stamp counter (clocksource
//! `tsc`: a constant rate, synchronized across cores), a [`Tick`] is that counter (about 7
//! ns to read on the reference machine, against 31 for `Instant::now`); elsewhere it is
//! nanoseconds of `Instant`. Ticks become microseconds only when a dump is written, scaled
//! by the counter's rate measured between the clock's first use and then.

use std::sync::OnceLock;
use std::time::Instant;

/// A point in time, in the clock's units (see the module documentation).
pub type Tick = u64;

struct Origin {
    at: Instant,
    tsc: Option<u64>,
}

static ORIGIN: OnceLock<Origin> = OnceLock::new();

/// Whether the kernel's clocksource is the time-stamp counter.
fn kernel_trusts_tsc() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|s| s.trim() == "tsc")
}

#[cfg(target_arch = "x86_64")]
fn read_tsc() -> u64 {
    // SAFETY: RDTSC exists on every x86-64 CPU, reads a counter and has no other effect.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn read_tsc() -> u64 {
    0
}

fn origin() -> &'static Origin {
    ORIGIN.get_or_init(|| Origin { at: Instant::now(), tsc: kernel_trusts_tsc().then(read_tsc) })
}

/// Now.
#[inline]
pub fn now() -> Tick {
    let o = origin();
    match o.tsc {
        Some(_) => read_tsc(),
        None => o.at.elapsed().as_nanos() as u64,
    }
}

/// A converter from ticks to microseconds since the clock's origin, valid for ticks up to
/// now (the counter's rate is measured over the time since the origin).
pub struct Scale {
    base: u64,
    us_per_tick: f64,
}

impl Scale {
    /// The scale as of now.
    pub fn now() -> Scale {
        let o = origin();
        match o.tsc {
            Some(tsc0) => {
                // Read the counter and the system clock as close together as possible.
                let (t, i) = (read_tsc(), Instant::now());
                let ticks = t.saturating_sub(tsc0).max(1) as f64;
                Scale { base: tsc0, us_per_tick: i.duration_since(o.at).as_secs_f64() * 1e6 / ticks }
            }
            None => Scale { base: 0, us_per_tick: 1e-3 },
        }
    }

    /// A scale measured at most about a second ago (cheap: for converting durations on the
    /// recording path; the rate of the counter does not change).
    pub fn now_cached() -> &'static Scale {
        static CACHED: OnceLock<Scale> = OnceLock::new();
        let s = CACHED.get_or_init(|| {
            // Measure the rate over a few milliseconds at least.
            let o = origin();
            let wait = std::time::Duration::from_millis(5).saturating_sub(o.at.elapsed());
            std::thread::sleep(wait);
            Scale::now()
        });
        s
    }

    /// Nanoseconds in `ticks` (a difference of two ticks).
    pub fn ns(&self, ticks: u64) -> f64 {
        ticks as f64 * self.us_per_tick * 1e3
    }

    /// Microseconds since the clock's origin at tick `t`.
    pub fn us(&self, t: Tick) -> f64 {
        t.saturating_sub(self.base) as f64 * self.us_per_tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_to_the_time_that_passed() {
        let a = now();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = now();
        let s = Scale::now();
        let us = s.us(b) - s.us(a);
        assert!((25_000.0..200_000.0).contains(&us), "30 ms measured as {us} us");
        assert!(s.us(a) >= 0.0 && s.us(a) <= s.us(b));
    }
}
