//! `oxccl bench`: measures collectives like nccl-tests and prints its table.
//!
//! For each operation and size, every rank runs warmup iterations, meets at a barrier, then
//! times a number of iterations out of place and as many in place (where the operation has
//! an in-place form): a fixed `-n`, or with `-n auto` as many as fit in about 50 ms after a
//! short calibration that every rank agrees on ([`Iters`]). The first measurement of a run
//! is preceded by [`STARTUP_US`](timing::STARTUP_US) of untimed calls. The time reported is the maximum over
//! ranks of the average time per iteration (gathered with an all_reduce); with `-c 1` one
//! more run on fresh inputs is checked element by element against a sequential reference
//! ([`check`]). `--algo all` measures every algorithm side by side instead ([`algos`]).
//!
//! - [`plan`]: what to measure and how;
//! - [`timing`]: the timing loop of one measurement;
//! - [`algos`]: `--algo all`, every algorithm of each operation side by side;
//! - [`ops`]: the operations, their buffers and one function per operation;
//! - [`elem`]: the element types and their expected reductions;
//! - [`sizes`]: the sweep of `64K`-style sizes;
//! - [`join`]: joining a launched job, and the advice when that fails;
//! - [`check`]: inputs, the buffers filled with them, and expected results;
//! - [`table`]: the nccl-tests table;
//! - [`json`]: `--json` output;
//! - [`plot`]: `--plot` and `oxccl plot`, bus bandwidth against size as SVG or PNG;
//! - [`progress`]: the progress indicator;
//! - [`output`]: rank 0's printing.

pub mod algos;
pub mod check;
pub mod elem;
pub mod join;
pub mod json;
pub mod ops;
pub mod output;
pub mod plan;
pub mod plot;
pub mod progress;
pub mod sizes;
pub mod table;
pub mod timing;

use std::time::Instant;

use oxccl::{with_dtype, Communicator, ReduceOp};

use check::CheckCtx;
use elem::BenchElem;
use ops::{BenchOp, OpArgs, Place};
use output::out;
pub use plan::{AlgoMode, BenchDevice, Iters, Plan};
use progress::{Progress, ProgressMode};
use table::{Measurement, Memcpy, Row};
use timing::timed;

/// The local rank of this process, as the launcher's environment says it
/// (`oxccl::bootstrap::env::LaunchInfo`: oxccl run, torchrun, Open MPI, MPICH, Slurm), else
/// the rank (`local` threads, or a launcher that says nothing).
fn local_rank(comm: &Communicator) -> usize {
    if comm.backend() == "local" {
        return comm.rank();
    }
    oxccl::bootstrap::env::LaunchInfo::from_env().map_or_else(|_| comm.rank(), |l| l.local_rank)
}

/// The GPU holding this rank's measured buffers, or `None` for host memory.
///
/// # Errors
/// The GPU cannot be opened (no runtime, no such device).
fn bench_gpu(comm: &Communicator, plan: &Plan) -> oxccl::Result<Option<oxccl::Gpu>> {
    match plan.device {
        None => match comm.device() {
            oxccl::Device::Cpu => Ok(None),
            d => Ok(Some(oxccl::Gpu::of(d)?)),
        },
        Some(BenchDevice::Host) => Ok(None),
        Some(BenchDevice::Fixed(d)) => Ok(Some(oxccl::Gpu::of(d)?)),
        Some(BenchDevice::PerRank(d)) => {
            let first = oxccl::Gpu::of(d)?;
            let count = first.device_count()?.max(1) as usize;
            let ordinal = (local_rank(comm) % count) as u32;
            let d = match d {
                oxccl::Device::Rocm(_) => oxccl::Device::Rocm(ordinal),
                _ => oxccl::Device::Cuda(ordinal),
            };
            Ok(Some(oxccl::Gpu::of(d)?))
        }
    }
}

/// Runs `plan` on `n` ranks as threads of this process (the `local` backend). Returns the
/// number of wrong values.
///
/// # Errors
/// When the world cannot be created, or a rank fails (each failed rank's error).
pub fn run_threads(n: usize, plan: &Plan) -> Result<u64, String> {
    let results = oxccl::local::run_with(&oxccl::Config::new(), n, |comm| {
        let r = comm.rank();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_rank(&comm, plan)))
            .unwrap_or_else(|_| Err(format!("rank {r} panicked (a bug in oxccl; please report it)")))
    })
    .map_err(|e| format!("could not create {n} in-process ranks on backend `local`: {e}"))?;
    let mut errors: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().cloned()).collect();
    // Every rank refuses bad options with the same message: say it once.
    errors.dedup();
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    // Every rank knows the total (it is summed over ranks); rank 0's is as good as any.
    results.into_iter().next().unwrap_or(Ok(0))
}

/// Runs `plan` as one rank of a job launched by `oxccl run`, torchrun or mpirun (or alone, as
/// a world of one), on `backend` or the one the environment chooses. Returns the number of
/// wrong values.
///
/// # Errors
/// When this process cannot join the job (with advice that fits the error and the launcher,
/// see [`join`]), or an operation fails.
pub fn run_process(backend: Option<&str>, plan: &Plan) -> Result<u64, String> {
    let cfg = match backend {
        Some(b) => oxccl::Config::new().backend(b),
        None => oxccl::Config::new(),
    };
    // The benchmarked operations run on device buffers on a GPU backend; the bench's own
    // bookkeeping (times, wrong-value counts) is host data, which goes through the cpu
    // backend over the same ranks unless OXCCL_GPU_HOST_BUFFERS says otherwise.
    let host_buffers = oxccl::config::registry::GPU_HOST_BUFFERS;
    let cfg = match host_buffers.from_env().map_err(|e| e.to_string())? {
        Some(_) => cfg,
        None => cfg.set(host_buffers.name, "cpu").map_err(|e| e.to_string())?,
    };
    let comm = cfg.init().map_err(|e| join::join_error(&e, join::launcher(|k| std::env::var(k).ok())))?;
    run_rank(&comm, plan)
}

/// Runs `plan` as this rank of `comm`; rank 0 prints. Returns the number of wrong values
/// (summed over ranks, so every rank returns the same).
///
/// # Errors
/// An operation's error, prefixed with the rank; a JSON file that cannot be written.
pub fn run_rank(comm: &Communicator, plan: &Plan) -> Result<u64, String> {
    with_dtype!(plan.dtype, T => run_typed::<T>(comm, plan))
}

fn run_typed<T: BenchElem>(comm: &Communicator, plan: &Plan) -> Result<u64, String> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let printer = rank == 0;
    let gpu = bench_gpu(comm, plan).map_err(|e| format!("rank {rank}: --device: {e}"))?;
    let device = gpu.as_ref().map_or_else(|| "cpu".to_string(), |g| g.device().to_string());
    if plan.root >= n && plan.ops.iter().any(|op| op.is_rooted()) {
        let ranks = if n == 1 { "rank" } else { "ranks" };
        return Err(format!("--root {} is out of range for {n} {ranks}: use 0 to {}", plan.root, n - 1));
    }
    let steps = plan.ops.iter().map(|&op| plan.sizes_of(op).len()).sum();
    let mut progress = Progress::new(if printer { plan.progress } else { ProgressMode::Off }, steps);
    if printer {
        out(&format!(
            "# oxccl bench: {n} rank{} on backend {}, buffers on {device}  minBytes {} maxBytes {}  warmup iters: {}  iters: {}  validation: {}  rank 0 on CPUs {}\n",
            if n == 1 { "" } else { "s" },
            comm.backend(),
            plan.sizes.first().copied().unwrap_or(0),
            plan.sizes.last().copied().unwrap_or(0),
            plan.warmup,
            plan.iters,
            u8::from(plan.check),
            // Whether the ranks are bound (`--bind-to`) shows here: one CPU, or all.
            oxccl::tuning::format_cpus(&oxccl::tuning::allowed_cpus()),
        ));
    }
    let forced;
    let comm = match plan.algo {
        AlgoMode::Forced(a) => {
            forced = comm.with_algorithm(a);
            &forced
        }
        AlgoMode::All => return algos::sweep::<T>(comm, plan),
        AlgoMode::Auto => comm,
    };
    let mut first = true;
    let mut all_rows = Vec::new();
    let mut wrong = 0;
    for &op in &plan.ops {
        if printer {
            out(&format!("#\n# {op}\n{}", table::header(plan.memcpy)));
        }
        let mut rows = Vec::new();
        for size in plan.sizes_of(op) {
            progress.step(&format!("{op} {}", oxccl::config::parse::format_size(size)));
            let row = measure::<T>(comm, gpu.as_ref(), op, size, plan, std::mem::take(&mut first))
                .map_err(|e| format!("rank {rank}: {op} of {size} bytes: {e}"))?;
            if printer {
                progress.clear();
                out(&format!("{}\n", table::format_row(&row, plan.memcpy)));
            }
            rows.push(row);
        }
        if printer {
            out(&table::footer(&rows));
        }
        wrong += table::total_wrong(&rows).unwrap_or(0);
        all_rows.extend(rows);
    }
    progress.clear();
    if printer {
        let records = json::records(&all_rows);
        if let Some(path) = &plan.plot {
            let runs = [plot::Run {
                label: plot::backend_label(comm.backend(), &device),
                backend: plot::backend_label(comm.backend(), &device),
                world_size: n,
                samples: records.iter().map(plot::Sample::from).collect(),
            }];
            plot::draw(&plot::curves(&runs)?, &plot::title(&runs), path)?;
        }
        if let Some(path) = &plan.json {
            let report = json::Report {
                tool: "oxccl bench",
                version: env!("CARGO_PKG_VERSION"),
                backend: comm.backend().to_string(),
                world_size: n,
                device: device.clone(),
                iters: plan.iters.to_string(),
                warmup: plan.warmup,
                check: plan.check,
                rows: records,
            };
            json::write(path, &report)?;
        }
    }
    Ok(wrong)
}

/// Measures `op` at `size` bytes: one table row, agreed on by every rank. `startup`: the
/// first measurement of the run, which first warms the job up ([`STARTUP_US`](timing::STARTUP_US)).
fn measure<T: BenchElem>(
    comm: &Communicator,
    gpu: Option<&oxccl::Gpu>,
    op: BenchOp,
    size: usize,
    plan: &Plan,
    startup: bool,
) -> oxccl::Result<Row> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let elem = T::DTYPE.size();
    let count = op.count_for(size, elem, n);
    let bytes = count * elem;
    let places: &[Place] = if op.has_in_place() { &[Place::OutOfPlace, Place::InPlace] } else { &[Place::OutOfPlace] };
    // Out-of-place time, in-place time, memcpy time on rank 0 alone, memcpy time with every
    // rank copying at once (µs); wrong values per placement.
    let mut times = [0.0f64; 4];
    let mut iters = [0usize; 2];
    let mut wrong = [0u64; 2];
    // On a GPU (a GPU backend's device, or --device) the host buffers hold the inputs and
    // the checked results, and are copied over around the timed loops.
    for (k, &place) in places.iter().enumerate() {
        let a = OpArgs { place, redop: plan.redop, root: plan.root };
        let mut b = check::prepare::<T>(comm, op, count, &a);
        if let Some(gpu) = gpu {
            let mut input = gpu.copy_from_host(&b.input)?;
            let mut output = gpu.copy_from_host(&b.output)?;
            (times[k], iters[k]) =
                timed(comm, plan, startup && k == 0, || ops::run_on(comm, op, &input, &mut output, &a))?;
            if plan.check {
                check::refill(comm, op, count, &a, &mut b);
                input.copy_from_host(&b.input)?;
                output.copy_from_host(&b.output)?;
                ops::run_on(comm, op, &input, &mut output, &a)?;
                b.output = output.to_vec()?;
            }
        } else {
            (times[k], iters[k]) = timed(comm, plan, startup && k == 0, || ops::run(comm, op, &mut b, &a))?;
            if plan.check {
                check::refill(comm, op, count, &a, &mut b);
                ops::run(comm, op, &mut b, &a)?;
            }
        }
        if plan.check {
            let ctx = CheckCtx { op, redop: plan.redop, root: plan.root, rank, n, count };
            wrong[k] = check::count_wrong(&ctx, &b, place);
        }
    }
    // The bench's own agreements run with the backend's choice (see `timed`).
    let sync = comm.with_algorithm(oxccl::Algorithm::Auto);
    let with_memcpy = plan.memcpy && op != BenchOp::Barrier;
    if with_memcpy {
        let copies = iters[0].max(1);
        if rank == 0 {
            times[2] = memcpy_time(bytes, plan.warmup, copies);
        }
        sync.barrier()?;
        times[3] = memcpy_time(bytes, plan.warmup, copies);
    }
    sync.all_reduce(&mut times, ReduceOp::Max)?;
    if plan.check {
        sync.all_reduce(&mut wrong, ReduceOp::Sum)?;
    }
    let checked = |w: u64| plan.check.then_some(w);
    let barrier = op == BenchOp::Barrier;
    Ok(Row {
        op,
        bytes,
        count,
        dtype: (!barrier).then_some(T::DTYPE),
        redop: op.is_reduction().then_some(plan.redop),
        root: op.is_rooted().then_some(plan.root),
        out_of_place: Measurement::new(op, bytes, n, times[0], checked(wrong[0])).with_iters(iters[0]),
        in_place: op
            .has_in_place()
            .then(|| Measurement::new(op, bytes, n, times[1], checked(wrong[1])).with_iters(iters[1])),
        memcpy: with_memcpy.then(|| Memcpy {
            time_us: times[2],
            gbps: table::gbps(bytes, times[2]),
            all_ranks_gbps: table::gbps(bytes, times[3]),
        }),
        algorithm: match op.kind() {
            Some(kind) => comm.algorithm_for(kind, op.message_bytes(count, elem, n))?,
            None => None,
        },
    })
}

/// The average time in µs of a single-threaded `copy_from_slice` of `bytes` bytes.
fn memcpy_time(bytes: usize, warmup: usize, iters: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    for _ in 0..warmup {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    let t0 = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    t0.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl::DType;

    fn plan(ops: Vec<BenchOp>, dtype: DType, redop: ReduceOp) -> Plan {
        Plan {
            ops,
            sizes: vec![0, 8, 96, 1000],
            dtype,
            redop,
            root: 1,
            iters: Iters::Fixed(1),
            algo: AlgoMode::Auto,
            warmup: 0,
            check: true,
            memcpy: true,
            json: None,
            plot: None,
            progress: ProgressMode::Off,
            device: None,
        }
    }

    #[test]
    fn every_dtype_and_redop_checks_clean() {
        for dtype in DType::ALL {
            for redop in ReduceOp::ALL {
                let p = plan(vec![BenchOp::AllReduce, BenchOp::ReduceScatter], dtype, redop);
                assert_eq!(run_threads(3, &p), Ok(0), "{dtype} {redop}");
            }
        }
    }

    #[test]
    fn every_op_on_odd_and_even_worlds() {
        for n in [1, 2, 5] {
            let mut p = plan(BenchOp::ALL.to_vec(), DType::BF16, ReduceOp::Sum);
            p.root = n - 1;
            assert_eq!(run_threads(n, &p), Ok(0), "{n} ranks");
        }
    }

    #[test]
    fn a_root_out_of_range_is_refused_on_every_rank() {
        let mut p = plan(vec![BenchOp::Broadcast], DType::F32, ReduceOp::Sum);
        p.root = 7;
        let e = run_threads(2, &p).unwrap_err();
        assert!(e.contains("--root 7"), "{e}");
    }

    #[test]
    fn memcpy_reference_measures_something() {
        assert!(memcpy_time(1 << 16, 1, 3) > 0.0);
    }
}
