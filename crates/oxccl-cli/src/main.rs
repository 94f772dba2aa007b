//! `oxccl`: the command-line companion of the oxccl library.
//!
//! - `oxccl run`: start the ranks of a program on this node, like torchrun ([`run`]);
//! - `oxccl bench`: measure collectives like nccl-tests ([`mod@bench`]);
//! - `oxccl plot`: draw the results of bench runs ([`bench::plot`]);
//! - `oxccl trace`: read the flight recorders' dumps, join the profiler's traces ([`trace`]);
//! - `oxccl info`: the doctor (`oxccl::info`).
//!
//! This file holds the command-line definitions and dispatches to those modules.

mod bench;
mod run;
mod trace;
mod tune;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use oxccl::config::parse;
use oxccl::{DType, ReduceOp};

use bench::ops::BenchOp;
use bench::progress::ProgressMode;
use run::spawn::Output;
use run::LaunchSpec;

/// Collective communications for distributed machine learning: launcher and benchmarks.
#[derive(Debug, Parser)]
#[command(name = "oxccl", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start N ranks of a program on this node, like torchrun.
    ///
    /// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    /// MASTER_PORT, OXCCL_STORE_ADDR, OXCCL_SECRET, OXCCL_NODE_RANK and OXCCL_LAUNCHER=oxccl;
    /// node 0 hosts the rendezvous store at MASTER_ADDR:MASTER_PORT. Output lines are prefixed
    /// with `[rank R] `. When a rank fails, the others get SIGTERM and, after the grace
    /// period, SIGKILL; a summary per rank is printed and oxccl exits with the failed rank's
    /// code (128+N for signal N, 124 after --timeout). SIGINT/SIGTERM/SIGHUP/SIGQUIT are
    /// forwarded to every rank (a second one kills them at once). SIGUSR1 is passed to every
    /// rank and the job goes on: oxccl's flight recorders write their dumps (`oxccl trace
    /// analyze` reads them).
    #[command(after_help = RUN_EXAMPLES)]
    Run(RunArgs),
    /// Measure collectives and print the nccl-tests table.
    ///
    /// With --ranks N, starts N ranks itself: threads of this process with --backend local,
    /// otherwise N processes (the default backend is then `cpu`), launched as `oxccl run`
    /// would. Without --ranks, this process is one rank of a job started by `oxccl run`,
    /// torchrun or mpirun (backend from --backend, else OXCCL_BACKEND, else the best
    /// available), or a world of one when started alone.
    ///
    /// Sizes are per-rank buffer bytes as nccl-tests defines them (all_gather: the output;
    /// reduce_scatter: the input). algbw = size / time; busbw = algbw × 2(n−1)/n for
    /// all_reduce, × (n−1)/n for all_gather, reduce_scatter and all_to_all, × 1 otherwise.
    /// Times are the maximum over ranks of the average per iteration.
    #[command(after_help = BENCH_EXAMPLES)]
    Bench(BenchArgs),
    /// Measure this machine's communication costs for the `cpu` backend's algorithm choice.
    ///
    /// Prints a profile (latency and bandwidth of shared memory and TCP, the shared-memory
    /// collectives' step, copy and reduction speed), writes it with -o, or keeps it as this
    /// host's with --save (loaded whenever OXCCL_TUNE_FILE is not set). Point
    /// OXCCL_TUNE_FILE at a file written with -o and the backend's cost model reads it
    /// (rank 0's profile decides for every rank). With --ranks N (default 2) it starts N local processes;
    /// under `oxccl run` across hosts it measures TCP over the real network.
    Tune(TuneArgs),
    /// Read flight-recorder dumps: what went wrong in a job that failed or hangs.
    ///
    /// Every communicator keeps its last operations (OXCCL_FR_SIZE) and writes them to
    /// OXCCL_FR_DIR (default: the temporary directory) on a timeout, a mismatch, a lost peer,
    /// an abort, or SIGUSR1 (`kill -USR1` every rank of a job that hangs without an error).
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Draw the `--json` results of one or more `oxccl bench` runs: bus bandwidth against
    /// size, one line per run and operation, with the memcpy reference where measured.
    ///
    /// Runs are named by backend and rank count in the legend, or by file name when two
    /// runs share them (two versions, two machines).
    #[command(after_help = PLOT_EXAMPLES)]
    Plot(PlotArgs),
    /// The doctor: what this machine and this build of oxccl can do, and why not.
    ///
    /// Each backend available or not and exactly why (paths tried, versions found); the GPU
    /// runtimes and NCCL/RCCL libraries; MPI and whether it is CUDA-aware; GPUs on the PCI
    /// bus with their NUMA node and nearest NIC; GPUDirect RDMA; the network interfaces and
    /// the one the TCP transport would use (OXCCL_SOCKET_IFNAME); /dev/shm; the memlock
    /// limit; every OXCCL_*/NCCL_* variable, checked; then the problems found. Exits 0.
    Info {
        /// Print the report as JSON (for tools)
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
struct PlotArgs {
    /// `oxccl bench --json` files
    #[arg(required = true, value_name = "JSON")]
    inputs: Vec<PathBuf>,
    /// The image to write: FILE.svg or FILE.png
    #[arg(short = 'o', long, value_name = "FILE")]
    output: PathBuf,
    /// The plot's title [default: what the runs are]
    #[arg(long)]
    title: Option<String>,
}

const PLOT_EXAMPLES: &str = "\
Examples:
  oxccl bench --ranks 4 -e 64M --json cpu.json
  oxccl bench --ranks 4 -e 64M --backend mpi --json mpi.json
  oxccl plot cpu.json mpi.json -o cpu-vs-mpi.svg";

/// `oxccl info [--json]`.
fn info_command(json: bool) -> ExitCode {
    let report = oxccl::info::Report::gather();
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(t) => println!("{t}"),
            Err(e) => {
                eprintln!("oxccl info: could not encode the report: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{report}");
    }
    ExitCode::SUCCESS
}

/// `oxccl plot A.json [B.json ...] -o FILE`.
fn plot_command(args: PlotArgs) -> ExitCode {
    let draw = || -> Result<(), String> {
        bench::plot::format_of(&args.output)?;
        let mut runs = args.inputs.iter().map(|p| bench::plot::read_run(p)).collect::<Result<Vec<_>, _>>()?;
        bench::plot::label_runs(&mut runs);
        let title = args.title.clone().unwrap_or_else(|| bench::plot::title(&runs));
        bench::plot::draw(&bench::plot::curves(&runs)?, &title, &args.output)
    };
    match draw() {
        Ok(()) => {
            println!("plot written to {}", args.output.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("oxccl plot: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Subcommand)]
enum TraceCommand {
    /// Say in plain words what a job's dumps show: the first collective where the ranks
    /// disagree, ranks that never entered a collective the others are in (and what they last
    /// did), ranks without a dump (dead), failed operations, and the slowest rank. Exits 1
    /// when it finds a problem.
    Analyze {
        /// The directory holding the dumps (oxccl-fr-*.json)
        dir: std::path::PathBuf,
    },
    /// Join the Chrome traces of every rank (OXCCL_PROFILE=trace:DIR writes one per rank and
    /// communicator) into one timeline, the ranks' clocks aligned at their communicators'
    /// creation; open it in Perfetto (ui.perfetto.dev) or chrome://tracing.
    Merge {
        /// The directory holding the traces (oxccl-trace-*.json)
        dir: std::path::PathBuf,
        /// Where to write the merged trace [default: DIR/merged.json]
        #[arg(short = 'o', long, value_name = "FILE")]
        output: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Args)]
struct TuneArgs {
    /// Ranks to start on this host (processes); leave out under a launcher
    #[arg(long, value_name = "N")]
    ranks: Option<u32>,
    /// Write the profile to FILE instead of printing it
    #[arg(short = 'o', long, value_name = "FILE", conflicts_with = "save")]
    output: Option<std::path::PathBuf>,
    /// Keep the profile as this host's ($XDG_CACHE_HOME or ~/.cache, oxccl/tune-HOST.txt):
    /// the cpu backend loads it whenever OXCCL_TUNE_FILE is not set
    #[arg(long)]
    save: bool,
    /// With --ranks, where the processes run, as for `oxccl bench` (measure the host as your
    /// jobs run on it: `none` for jobs the scheduler places)
    #[arg(long, value_enum, default_value = "auto", value_name = "WHERE")]
    bind_to: run::bind::BindTo,
}

fn tune_command(args: TuneArgs) -> ExitCode {
    let r = match args.ranks {
        Some(n) if n < 2 => Err("oxccl tune needs at least 2 ranks".to_string()),
        Some(n) => launch_tune(n, &args),
        None if std::env::var_os(oxccl::bootstrap::env::LAUNCHER_ENV).is_none()
            && std::env::var_os("RANK").is_none() =>
        {
            launch_tune(2, &args)
        }
        None => tune_rank(&args),
    };
    match r {
        Ok(code) => exit(code),
        Err(e) => {
            eprintln!("oxccl tune: {e}");
            ExitCode::FAILURE
        }
    }
}

fn launch_tune(n: u32, args: &TuneArgs) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("could not find this program's path: {e}"))?;
    let mut child: Vec<std::ffi::OsString> = vec!["tune".into()];
    if let Some(o) = &args.output {
        child.push("-o".into());
        child.push(o.clone().into_os_string());
    }
    if args.save {
        child.push("--save".into());
    }
    let mut spec = LaunchSpec::local(n as usize, exe.into_os_string(), child);
    spec.rank0_output = Output::Inherited;
    spec.bind = args.bind_to;
    let report = run::launch(&spec)?;
    if report.exit_code() != 0 {
        run::print_summary(&report);
    }
    Ok(report.exit_code())
}

fn tune_rank(args: &TuneArgs) -> Result<i32, String> {
    let cfg = oxccl::Config::new().backend("cpu");
    let Some(profile) = tune::run_rank(cfg)? else { return Ok(0) };
    let n = std::env::var("WORLD_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let text = profile.to_text(&tune::header(n));
    let (path, how) = match (&args.output, args.save) {
        (_, true) => {
            let path = oxccl::tuning::Profile::host_cache_path()
                .ok_or("--save needs $XDG_CACHE_HOME or $HOME (an absolute path) and a host name; use -o FILE")?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            }
            (path, "the cpu backend loads it on this host when OXCCL_TUNE_FILE is not set".to_string())
        }
        (Some(out), false) => (out.clone(), format!("use it with OXCCL_TUNE_FILE={}", out.display())),
        (None, false) => {
            print!("{text}");
            return Ok(0);
        }
    };
    std::fs::write(&path, &text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!("oxccl tune: wrote {}; {how}", path.display());
    Ok(0)
}

const RUN_EXAMPLES: &str = "\
Examples:
  oxccl run -n 4 -- python train.py --epochs 3
  oxccl run -n 8 --timeout 10m -- ./my_job
  # two nodes (the same secret on both; node 0 is 10.0.0.1):
  export OXCCL_SECRET=$(openssl rand -hex 32)
  oxccl run -n 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 -- ./my_job
  oxccl run -n 8 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 -- ./my_job";

const BENCH_EXAMPLES: &str = "\
Examples:
  oxccl bench --ranks 4                          all_reduce, 8 B to 8 MiB, cpu backend
  oxccl bench all --ranks 4 --backend local -e 1M
  oxccl bench all_gather -b 1K -e 256M -f 2 -d bfloat16 --ranks 8 --json ag.json --memcpy
  oxccl run -n 4 -- oxccl bench reduce_scatter -o max";

/// Parses a duration in seconds (`30`, `1.5`) or with a unit (`250ms`, `2m`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    oxccl::config::parse_duration(s)
}

/// Parses a duration that must be longer than zero.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("the timeout must be longer than zero; leave --timeout out for none".into()),
        d => Ok(d),
    }
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Ranks to start on this node.
    #[arg(
        short = 'n',
        long = "nproc-per-node",
        visible_alias = "nproc",
        alias = "nproc_per_node",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    nproc: u32,

    /// Number of nodes in the job (run the same command on each, with its --node-rank).
    #[arg(long, default_value_t = 1, value_name = "M", value_parser = clap::value_parser!(u32).range(1..))]
    nnodes: u32,

    /// This node's index in 0..M; node 0 hosts the rendezvous store.
    #[arg(long, alias = "node_rank", default_value_t = 0, value_name = "K")]
    node_rank: u32,

    /// Address of node 0, where the store runs [default on one node: 127.0.0.1].
    #[arg(long, alias = "master_addr", value_name = "HOST")]
    master_addr: Option<String>,

    /// Port of the store on node 0 [default on one node: a free port].
    #[arg(long, alias = "master_port", value_name = "PORT")]
    master_port: Option<u16>,

    /// Stop the job after this long (seconds, or 90s, 10m, 2h); exit code 124.
    #[arg(long, value_name = "SECS", value_parser = parse_timeout)]
    timeout: Option<Duration>,

    /// Time between SIGTERM and SIGKILL when stopping ranks.
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = parse_duration)]
    grace: Duration,

    /// The job secret, the same on every node (required with --nnodes > 1; prefer the
    /// environment variable: command lines are visible to other users). Generated when absent.
    #[arg(long, env = "OXCCL_SECRET", hide_env_values = true, value_name = "TEXT")]
    secret: Option<String>,

    /// Where the ranks run: `core`, each on a CPU of its own (and every thread it starts:
    /// data loaders and compute pools too), an error where they outnumber the CPUs; `auto`,
    /// `core` where every rank gets a CPU; `none`, wherever the scheduler puts them.
    #[arg(long, value_enum, default_value = "none", value_name = "WHERE")]
    bind_to: run::bind::BindTo,

    /// Elastic: when a rank fails, keep the others running and start a replacement in its
    /// slot (with OXCCL_JOIN=1: its `init` joins the survivors' `grow`), up to N times in
    /// all. The default, 0, stops the job at the first failure.
    #[arg(long, default_value_t = 0, value_name = "N")]
    max_restarts: u32,

    /// Elastic: with fewer ranks than this still running, a failure ends the job as
    /// without --max-restarts.
    #[arg(long, default_value_t = 1, value_name = "M", value_parser = clap::value_parser!(u32).range(1..))]
    min_ranks: u32,

    /// The program each rank runs, and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
    command: Vec<OsString>,
}

impl RunArgs {
    fn spec(self) -> LaunchSpec {
        let mut command = self.command.into_iter();
        let program = command.next().unwrap_or_default();
        LaunchSpec {
            nproc: self.nproc as usize,
            nnodes: self.nnodes as usize,
            node_rank: self.node_rank as usize,
            master_addr: self.master_addr,
            master_port: self.master_port,
            secret: self.secret,
            timeout: self.timeout,
            grace: self.grace,
            program,
            args: command.collect(),
            rank0_output: Output::Prefixed,
            extra_env: Vec::new(),
            bind: self.bind_to,
            max_restarts: self.max_restarts as usize,
            min_ranks: self.min_ranks as usize,
        }
    }
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Operations: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all,
    /// gather, scatter, send_recv, barrier, or all.
    #[arg(value_name = "OP", default_value = "all_reduce")]
    ops: Vec<String>,

    /// Ranks to start (threads with --backend local, processes otherwise).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    ranks: Option<u32>,

    /// Backend: local, cpu, nccl, rccl, mpi or auto [default: cpu with --ranks, else from the
    /// environment].
    #[arg(long, value_name = "B")]
    backend: Option<String>,

    /// With --ranks, where the processes run: `auto`, each on a CPU of its own where every
    /// rank gets one (as mpirun binds), else wherever the scheduler puts them; `core`, `none`
    /// (see `oxccl run --help`).
    #[arg(long, value_enum, default_value = "auto", value_name = "WHERE")]
    bind_to: run::bind::BindTo,

    /// Smallest size in bytes (K, M, G suffixes: binary).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_name = "MIN", value_parser = parse::size)]
    min: usize,

    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "8M", value_name = "MAX", value_parser = parse::size)]
    max: usize,

    /// Multiply the size by this between rows.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4, value_name = "FACTOR")]
    factor: usize,

    /// Element type: float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64
    /// (or f32, f16, bf16, ...).
    #[arg(short = 'd', long = "datatype", default_value = "float", value_name = "DTYPE", value_parser = parse_dtype)]
    dtype: DType,

    /// Reduce op of all_reduce, reduce and reduce_scatter: sum, prod, min, max, avg.
    #[arg(short = 'o', long = "op", default_value = "sum", value_name = "REDOP", value_parser = parse_redop)]
    redop: ReduceOp,

    /// Root of broadcast, reduce, gather and scatter.
    #[arg(short = 'r', long = "root", default_value_t = 0, value_name = "ROOT")]
    root: usize,

    /// Timed iterations per size (each out of place and in place): a number, or `auto`
    /// (about 50 ms of calls per measurement, 10 to 100000, agreed by every rank).
    #[arg(short = 'n', long = "iters", default_value = "auto", value_name = "ITERS|auto", value_parser = parse_iters)]
    iters: bench::Iters,

    /// Algorithms: the backend's choice (default), one algorithm by name for every
    /// operation it applies to, or `all` (every algorithm of each operation side by side,
    /// auto's choice marked; cpu and local backends).
    #[arg(long, value_name = "NAME|all", value_parser = parse_algo)]
    algo: Option<bench::AlgoMode>,

    /// Untimed iterations before timing (0: none, not even the first row's 200 ms start-up
    /// warm-up, to time from the very first call).
    #[arg(short = 'w', long = "warmup_iters", alias = "warmup", default_value_t = 5, value_name = "WARMUP")]
    warmup: u32,

    /// Check results (1) or not (0); wrong values make the exit code 1.
    #[arg(short = 'c', long = "check", default_value_t = 1, value_name = "0|1",
          value_parser = clap::value_parser!(u8).range(0..=1))]
    check: u8,

    /// Also write every measurement to FILE as JSON (rank 0).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,

    /// Add reference columns: memcpy bandwidth of the same bytes on rank 0 alone
    /// (single-threaded, the other ranks idle), and per rank with every rank copying at once.
    #[arg(long)]
    memcpy: bool,

    /// Draw bus bandwidth against size into FILE.svg or FILE.png (rank 0): one line per
    /// operation, out of place, with the memcpy reference (measured as with --memcpy).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,

    /// Where the measured buffers live: cpu, cuda:N or rocm:N (that GPU on every rank), or a
    /// bare cuda or rocm (each rank's local rank modulo the GPUs seen) [default: the
    /// backend's device: its GPU on nccl and rccl, host memory otherwise]. Device buffers on
    /// cpu, local and mpi are staged through pinned host memory (or passed to a CUDA-aware
    /// MPI).
    #[arg(long, value_name = "DEV")]
    device: Option<bench::BenchDevice>,
}

fn parse_iters(s: &str) -> Result<bench::Iters, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(bench::Iters::Auto);
    }
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(bench::Iters::Fixed(n)),
        _ => Err(format!("`{s}` is not a number of iterations (1 or more) or `auto`")),
    }
}

fn parse_algo(s: &str) -> Result<bench::AlgoMode, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(bench::AlgoMode::All);
    }
    match s.parse::<oxccl::Algorithm>() {
        Ok(oxccl::Algorithm::Auto) => Ok(bench::AlgoMode::Auto),
        Ok(a) => Ok(bench::AlgoMode::Forced(a)),
        Err(e) => Err(format!("{e}; or `all`")),
    }
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse::<DType>().map_err(|e| e.to_string())
}

fn parse_redop(s: &str) -> Result<ReduceOp, String> {
    s.parse::<ReduceOp>().map_err(|e| e.to_string())
}

impl BenchArgs {
    fn plan(&self) -> Result<bench::Plan, String> {
        let mut ops = Vec::new();
        for s in self.ops.iter().flat_map(|s| s.split(',')).filter(|s| !s.trim().is_empty()) {
            for op in BenchOp::parse_list(s)? {
                if !ops.contains(&op) {
                    ops.push(op);
                }
            }
        }
        if ops.is_empty() {
            ops.push(BenchOp::AllReduce);
        }
        if let Some(p) = &self.plot {
            bench::plot::format_of(p)?;
            if self.algo == Some(bench::AlgoMode::All) {
                return Err(
                    "--plot draws the backend's choice; --algo all prints its comparison as a table only".into()
                );
            }
        }
        if self.algo == Some(bench::AlgoMode::All) && self.device.is_some_and(|d| d != bench::BenchDevice::Host) {
            return Err("--algo all compares the algorithms on host buffers; leave out --device".into());
        }
        let progress = if std::io::stderr().is_terminal() { ProgressMode::Terminal } else { ProgressMode::Lines };
        Ok(bench::Plan {
            ops,
            sizes: bench::sizes::sweep(self.min, self.max, self.factor)?,
            dtype: self.dtype,
            redop: self.redop,
            root: self.root,
            iters: self.iters,
            algo: self.algo.unwrap_or(bench::AlgoMode::Auto),
            warmup: self.warmup as usize,
            check: self.check == 1,
            memcpy: self.memcpy || self.plot.is_some(),
            json: self.json.clone(),
            plot: self.plot.clone(),
            progress,
            device: self.device,
        })
    }

    /// The arguments of the `oxccl bench` each launched rank runs: these, without --ranks.
    fn child_args(&self, backend: &str) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["bench".into()];
        a.extend(self.ops.iter().map(OsString::from));
        let pairs = [
            ("--backend", backend.to_string()),
            ("-b", self.min.to_string()),
            ("-e", self.max.to_string()),
            ("-f", self.factor.to_string()),
            ("-d", self.dtype.name().to_string()),
            ("-o", self.redop.name().to_string()),
            ("-r", self.root.to_string()),
            ("-n", self.iters.to_string()),
            ("--algo", self.algo.map_or_else(|| "auto".to_string(), |a| a.to_string())),
            ("-w", self.warmup.to_string()),
            ("-c", self.check.to_string()),
        ];
        for (k, v) in pairs {
            a.push(k.into());
            a.push(v.into());
        }
        if let Some(j) = &self.json {
            a.push("--json".into());
            a.push(j.clone().into_os_string());
        }
        if self.memcpy {
            a.push("--memcpy".into());
        }
        if let Some(p) = &self.plot {
            a.push("--plot".into());
            a.push(p.clone().into_os_string());
        }
        if let Some(d) = self.device {
            a.push("--device".into());
            a.push(d.to_string().into());
        }
        a
    }
}

fn known_backend(b: &str) -> Result<(), String> {
    let b = b.trim().to_ascii_lowercase();
    if b == "auto" || oxccl::backend::factory::KNOWN.contains(&b.as_str()) {
        Ok(())
    } else {
        Err(format!("unknown backend `{b}`; expected auto or one of {}", oxccl::backend::factory::KNOWN.join(", ")))
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

fn run_command(args: RunArgs) -> ExitCode {
    match run::launch(&args.spec()) {
        Ok(report) => {
            run::print_summary(&report);
            exit(report.exit_code())
        }
        Err(e) => {
            eprintln!("oxccl run: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn bench_command(args: BenchArgs) -> ExitCode {
    let result = bench_dispatch(&args);
    match result {
        Ok(BenchEnd::Wrong(0)) => ExitCode::SUCCESS,
        Ok(BenchEnd::Wrong(w)) => {
            eprintln!("oxccl bench: {w} value{} differed from the expected results", if w == 1 { "" } else { "s" });
            ExitCode::from(1)
        }
        Ok(BenchEnd::Job(code)) => exit(code),
        Err(e) => {
            eprintln!("oxccl bench: error: {e}");
            ExitCode::from(1)
        }
    }
}

/// How a benchmark ended.
enum BenchEnd {
    /// Ran here: this many wrong values.
    Wrong(u64),
    /// Ran as launched processes: the launcher's exit code (the summary is printed).
    Job(i32),
}

fn bench_dispatch(args: &BenchArgs) -> Result<BenchEnd, String> {
    if let Some(b) = &args.backend {
        known_backend(b)?;
    }
    let plan = args.plan()?;
    match (args.ranks, args.backend.as_deref()) {
        (Some(n), Some(b)) if b.eq_ignore_ascii_case("local") => {
            bench::run_threads(n as usize, &plan).map(BenchEnd::Wrong)
        }
        (Some(n), backend) => {
            let backend = backend.unwrap_or("cpu");
            let exe = std::env::current_exe()
                .map_err(|e| format!("could not find this program's path to start its ranks: {e}"))?;
            let mut spec = LaunchSpec::local(n as usize, exe.into_os_string(), args.child_args(backend));
            // Rank 0 prints the table (and progress on a terminal) itself.
            spec.rank0_output = Output::Inherited;
            spec.bind = args.bind_to;
            let report = run::launch(&spec)?;
            run::print_summary(&report);
            Ok(BenchEnd::Job(report.exit_code()))
        }
        (None, backend) => bench::run_process(backend, &plan).map(BenchEnd::Wrong),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run_command(args),
        Command::Bench(args) => bench_command(args),
        Command::Tune(args) => tune_command(args),
        Command::Trace(TraceCommand::Analyze { dir }) => trace::analyze_command(&dir),
        Command::Trace(TraceCommand::Merge { dir, output }) => trace::merge_command(&dir, output),
        Command::Plot(args) => plot_command(args),
        Command::Info { json } => info_command(json),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use oxccl::Algorithm;

    use crate::bench::{AlgoMode, Iters};

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_program_after_the_options() {
        let cli = Cli::try_parse_from(["oxccl", "run", "-n", "3", "--", "sh", "-c", "echo $RANK"]).unwrap();
        let Command::Run(args) = cli.command else { panic!("not run") };
        let spec = args.spec();
        assert_eq!(spec.nproc, 3);
        assert_eq!(spec.program, "sh");
        assert_eq!(spec.args, vec![OsString::from("-c"), OsString::from("echo $RANK")]);
        let cli = Cli::try_parse_from(["oxccl", "run", "--nproc", "2", "python", "-u", "x.py"]).unwrap();
        let Command::Run(args) = cli.command else { panic!("not run") };
        assert_eq!(args.command, vec![OsString::from("python"), "-u".into(), "x.py".into()]);
        assert!(Cli::try_parse_from(["oxccl", "run", "-n", "0", "--", "true"]).is_err());
        assert!(Cli::try_parse_from(["oxccl", "run", "-n", "2"]).is_err());
        assert!(Cli::try_parse_from(["oxccl", "run", "-n", "2", "--timeout", "0", "--", "true"]).is_err());
        assert!(Cli::try_parse_from(["oxccl", "run", "-n", "2", "--timeout", "1.5m", "--", "true"]).is_ok());
    }

    #[test]
    fn bench_iterations_and_algorithms_parse_and_reach_the_children() {
        let bench = |args: &[&str]| {
            let cli = Cli::try_parse_from(["oxccl", "bench"].iter().chain(args)).map_err(|e| e.to_string())?;
            let Command::Bench(a) = cli.command else { return Err("not bench".to_string()) };
            Ok::<_, String>(a)
        };
        let a = bench(&["--ranks", "3", "-n", "100", "--algo", "ring"]).unwrap();
        let plan = a.plan().unwrap();
        assert_eq!((plan.iters, plan.algo), (Iters::Fixed(100), AlgoMode::Forced(Algorithm::Ring)));
        let child = a.child_args("cpu");
        let again = Cli::try_parse_from(std::iter::once(OsString::from("oxccl")).chain(child)).unwrap();
        let Command::Bench(again) = again.command else { panic!("not bench") };
        let p2 = again.plan().unwrap();
        assert_eq!((p2.iters, p2.algo), (Iters::Fixed(100), AlgoMode::Forced(Algorithm::Ring)));
        assert_eq!(bench(&["--algo", "ALL", "-n", "Auto"]).unwrap().plan().unwrap().algo, AlgoMode::All);
        assert_eq!(bench(&["--algo", "auto"]).unwrap().plan().unwrap().algo, AlgoMode::Auto);
        for bad in [&["-n", "0"][..], &["-n", "many"], &["--algo", "fastest"]] {
            let e = bench(bad).unwrap_err();
            assert!(e.contains(bad[1]), "{bad:?}: {e}");
        }
    }

    #[test]
    fn bench_defaults_and_child_arguments_round_trip() {
        let cli =
            Cli::try_parse_from(["oxccl", "bench", "--ranks", "4", "-e", "64K", "-d", "bf16", "--memcpy"]).unwrap();
        let Command::Bench(args) = cli.command else { panic!("not bench") };
        let plan = args.plan().unwrap();
        assert_eq!(plan.ops, vec![BenchOp::AllReduce]);
        assert_eq!(plan.sizes, vec![8, 32, 128, 512, 2048, 8192, 32768]);
        assert_eq!((plan.iters, plan.algo, plan.warmup, plan.check), (Iters::Auto, AlgoMode::Auto, 5, true));
        let child = args.child_args("cpu");
        let reparsed = Cli::try_parse_from(std::iter::once(OsString::from("oxccl")).chain(child)).unwrap();
        let Command::Bench(again) = reparsed.command else { panic!("not bench") };
        assert_eq!(again.ranks, None);
        assert_eq!(again.backend.as_deref(), Some("cpu"));
        let p2 = again.plan().unwrap();
        assert_eq!((p2.sizes, p2.dtype, p2.redop, p2.memcpy), (plan.sizes, DType::BF16, ReduceOp::Sum, true));
        assert_eq!((p2.iters, p2.algo), (Iters::Auto, AlgoMode::Auto));
    }

    #[test]
    fn bench_rejects_bad_values_with_advice() {
        for bad in [
            vec!["oxccl", "bench", "-b", "1.5K"],
            vec!["oxccl", "bench", "-d", "float128"],
            vec!["oxccl", "bench", "-o", "mean"],
            vec!["oxccl", "bench", "-c", "2"],
            vec!["oxccl", "bench", "-n", "0"],
        ] {
            assert!(Cli::try_parse_from(&bad).is_err(), "{bad:?}");
        }
        let cli = Cli::try_parse_from(["oxccl", "bench", "allreduse"]).unwrap();
        let Command::Bench(args) = cli.command else { panic!("not bench") };
        assert!(args.plan().unwrap_err().contains("all_reduce"));
        assert!(known_backend("warp").unwrap_err().contains("local"));
        assert!(known_backend("LOCAL").is_ok());
    }
}
