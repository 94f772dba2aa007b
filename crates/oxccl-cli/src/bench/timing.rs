//! The timing loop of a measurement ([`timed`]): the start-up warm-up, the warm-up, the
//! calibration of `-n auto` ([`auto_iters`]) and the timed iterations.

use std::time::Instant;

use oxccl::{Communicator, ReduceOp};

use super::plan::{Iters, Plan};

/// The time an automatic measurement aims at, µs.
pub const AUTO_TARGET_US: f64 = 50_000.0;
/// The fewest iterations of an automatic measurement.
pub const AUTO_MIN: usize = 10;
/// The most iterations of an automatic measurement.
pub const AUTO_MAX: usize = 100_000;
/// How long the start-up warm-up lasts at least (max over ranks), µs.
pub const STARTUP_US: f64 = 200_000.0;

/// The iterations an automatic measurement takes when one call took `per_op_us`.
pub fn auto_iters(per_op_us: f64) -> usize {
    if per_op_us.is_nan() || per_op_us <= 0.0 {
        return AUTO_MAX;
    }
    ((AUTO_TARGET_US / per_op_us).ceil() as usize).clamp(AUTO_MIN, AUTO_MAX)
}

/// Warms up with `run`, lines the ranks up, and returns the loop-mean time of `run` in µs
/// and the iterations it took. With `startup`, the warm-up first goes on until
/// [`STARTUP_US`] have passed on every rank (the first operations after start-up pay for
/// page faults, thread starts and a scheduler that has not settled; no row should show
/// that), unless the plan has no warm-up at all (`-w 0` times from the very first call, to
/// see what start-up costs). With [`Iters::Auto`], a calibration of a few calls, its maximum over ranks,
/// decides the count, so every rank runs the same number.
pub(crate) fn timed(
    comm: &Communicator,
    plan: &Plan,
    startup: bool,
    mut run: impl FnMut() -> oxccl::Result<()>,
) -> oxccl::Result<(f64, usize)> {
    // The bench's own barriers and agreements run with the backend's choice, whatever
    // algorithm the measured calls are forced to.
    let comm = &comm.with_algorithm(oxccl::Algorithm::Auto);
    if startup && plan.warmup > 0 {
        let t0 = Instant::now();
        loop {
            for _ in 0..10 {
                run()?;
            }
            let mut elapsed = [t0.elapsed().as_secs_f64() * 1e6];
            comm.all_reduce(&mut elapsed, ReduceOp::Max)?;
            if elapsed[0] >= STARTUP_US {
                break;
            }
        }
    }
    for _ in 0..plan.warmup {
        run()?;
    }
    let iters = match plan.iters {
        Iters::Fixed(n) => n,
        Iters::Auto => {
            comm.barrier()?;
            let calls = 3;
            let t0 = Instant::now();
            for _ in 0..calls {
                run()?;
            }
            let mut per_op = [t0.elapsed().as_secs_f64() * 1e6 / calls as f64];
            comm.all_reduce(&mut per_op, ReduceOp::Max)?;
            auto_iters(per_op[0])
        }
    };
    comm.barrier()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        run()?;
    }
    Ok((t0.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64, iters))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_iterations_fill_about_fifty_milliseconds_within_bounds() {
        assert_eq!(auto_iters(1.0), 50_000);
        assert_eq!(auto_iters(3.0), 16_667);
        assert_eq!(auto_iters(0.01), AUTO_MAX);
        assert_eq!(auto_iters(1e6), AUTO_MIN);
        for odd in [0.0, -1.0, f64::NAN] {
            assert_eq!(auto_iters(odd), AUTO_MAX, "{odd}");
        }
        assert_eq!(auto_iters(f64::INFINITY), AUTO_MIN);
    }
}
