//! Every `OXCCL_*` variable, declared once: its name, the kind of value it takes (which
//! decides its parser), its default and a one-line doc. The library's settings are [`ALL`]:
//! [`Config`](super::Config) resolves them and [`Config::set`](super::Config::set) accepts
//! them by name. The conformance suite's are [`CONFORMANCE`]: `oxccl-conformance` reads
//! them itself. `oxccl info` checks both, and a test keeps `SETTINGS.md` (which the
//! README links) equal to [`markdown_table`].

use super::parse;

/// The kind of value a setting takes; each kind has one parser in [`parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One of a fixed set: pairs of accepted spelling and meaning.
    Choice(&'static [(&'static str, &'static str)]),
    /// A duration ([`parse::duration`]) of at least `min_ns` nanoseconds.
    Duration {
        /// The smallest value accepted, in nanoseconds.
        min_ns: u64,
    },
    /// A byte size ([`parse::size`]) in `min..=max`.
    Size {
        /// The smallest value accepted.
        min: usize,
        /// The largest value accepted.
        max: usize,
    },
    /// A whole number in `min..=max`.
    Count {
        /// The smallest value accepted.
        min: u64,
        /// The largest value accepted.
        max: u64,
    },
    /// `1`/`0` (also true/false, yes/no, on/off).
    Flag,
    /// A TCP port.
    Port,
    /// `host:port`.
    Address,
    /// Free text (interface lists, identities, secrets).
    Text,
    /// The `OXCCL_ALGO` grammar: `ring`, or `all_reduce:rabenseifner,all_gather:bruck`.
    Algorithms,
    /// `NAME=value;NAME=value`.
    Assignments,
    /// The `OXCCL_PROFILE` grammar: `summary`, `trace:DIR`, or both joined by a comma.
    Profile,
    /// The `OXCCL_LOG` grammar: `level` or `target=level` directives joined by commas.
    LogFilter,
}

/// Who normally sets a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The user (or the builder).
    User,
    /// The launcher (`oxccl run`), for the ranks it starts; a user may set it too.
    Launcher,
}

/// One setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The environment variable, which is also the setting's name for [`Config::set`](super::Config::set).
    pub name: &'static str,
    /// The kind of value.
    pub kind: Kind,
    /// The default as a value of the kind (parsed like any other), or `""` when there is none.
    pub default: &'static str,
    /// The default as the docs state it (what happens when the variable is unset).
    pub default_doc: &'static str,
    /// One line: what it does.
    pub doc: &'static str,
    /// Who normally sets it.
    pub origin: Origin,
}

impl Setting {
    /// This setting's value in the process environment, checked against its kind; `None`
    /// when unset or empty. For tools that need one setting alone; everything else goes
    /// through [`Config::resolve`](super::Config::resolve).
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) naming the variable and its value.
    pub fn from_env(&self) -> crate::error::Result<Option<String>> {
        match std::env::var(self.name) {
            Ok(v) if !v.trim().is_empty() => match self.check(&v) {
                Ok(()) => Ok(Some(v)),
                Err(why) => Err(crate::error::Error::Config(format!("{}={v:?}: {why}", self.name))),
            },
            _ => Ok(None),
        }
    }

    /// Checks `value` against the kind of this setting.
    ///
    /// # Errors
    /// What is wrong with the value (without the setting's name: the caller adds it).
    pub fn check(&self, value: &str) -> Result<(), String> {
        match self.kind {
            Kind::Choice(choices) => parse::choice(value, choices).map(drop),
            Kind::Duration { min_ns } => {
                let d = parse::duration(value)?;
                if d.as_nanos() < u128::from(min_ns) {
                    Err(if min_ns <= 1 {
                        "must be greater than zero".to_string()
                    } else {
                        format!("must be at least {min_ns} ns")
                    })
                } else {
                    Ok(())
                }
            }
            Kind::Size { min, max } => {
                let b = parse::size(value)?;
                if (min..=max).contains(&b) {
                    Ok(())
                } else {
                    Err(format!("{} bytes is outside {}..={}", b, parse::format_size(min), parse::format_size(max)))
                }
            }
            Kind::Count { min, max } => parse::count(value, min, max).map(drop),
            Kind::Flag => parse::flag(value).map(drop),
            Kind::Port => parse::port(value).map(drop),
            Kind::Address => parse::address(value).map(drop),
            Kind::Text => Ok(()),
            Kind::Algorithms => crate::algorithm::AlgorithmOverrides::parse(value).map(drop).map_err(|e| match e {
                crate::error::Error::Config(m) => m,
                e => e.to_string(),
            }),
            Kind::Assignments => parse::assignments(value).map(drop),
            Kind::Profile => super::profile::ProfileSettings::parse(value).map(drop),
            Kind::LogFilter => parse::log_directives(value).map(drop),
        }
    }
}

/// The largest frame on 64-bit targets (16 GiB) and elsewhere (1 GiB).
#[cfg(target_pointer_width = "64")]
const MAX_FRAME_DEFAULT: &str = "16G";
#[cfg(not(target_pointer_width = "64"))]
const MAX_FRAME_DEFAULT: &str = "1G";

/// `OXCCL_BACKEND`.
pub const BACKEND: Setting = Setting {
    name: "OXCCL_BACKEND",
    kind: Kind::Choice(&[
        ("auto", "auto"),
        ("cpu", "cpu"),
        ("local", "local"),
        ("mpi", "mpi"),
        ("nccl", "nccl"),
        ("rccl", "rccl"),
    ]),
    default: "auto",
    default_doc: "`auto` (best available: `nccl`/`rccl` with host buffers on `cpu` on a GPU host, `mpi` under mpirun when built in, else `cpu`)",
    doc: "`auto`, `cpu`, `local`, `mpi`, `nccl`, `rccl`",
    origin: Origin::User,
};
/// `OXCCL_TIMEOUT`.
pub const TIMEOUT: Setting = Setting {
    name: "OXCCL_TIMEOUT",
    kind: Kind::Duration { min_ns: 1 },
    default: "300s",
    default_doc: "`300s`",
    doc: "deadline of every wait: `30`, `1.5s`, `250ms`, `2m`",
    origin: Origin::User,
};
/// `OXCCL_ALGO`.
pub const ALGO: Setting = Setting {
    name: "OXCCL_ALGO",
    kind: Kind::Algorithms,
    default: "",
    default_doc: "automatic",
    doc: "`ring` (every op it applies to), or `all_reduce:rabenseifner,all_gather:bruck`",
    origin: Origin::User,
};
/// `OXCCL_TRANSPORT`.
pub const TRANSPORT: Setting = Setting {
    name: "OXCCL_TRANSPORT",
    kind: Kind::Choice(&[("auto", "auto"), ("shm", "shm"), ("tcp", "tcp")]),
    default: "auto",
    default_doc: "`auto`",
    doc: "`auto` (shared memory within a host, TCP across), `tcp` (TCP everywhere, for testing), `shm`",
    origin: Origin::User,
};
/// `OXCCL_SOCKET_IFNAME`.
pub const SOCKET_IFNAME: Setting = Setting {
    name: "OXCCL_SOCKET_IFNAME",
    kind: Kind::Text,
    default: "",
    default_doc: "the NIC nearest the rank's GPU, else the first non-loopback IPv4",
    doc: "network interface for TCP, like `NCCL_SOCKET_IFNAME`: `eth0`, `eth,ib` (prefixes), `=eth0` (exact), `^docker` (exclude)",
    origin: Origin::User,
};
/// `OXCCL_SECRET`.
pub const SECRET: Setting = Setting {
    name: "OXCCL_SECRET",
    kind: Kind::Text,
    default: "",
    default_doc: "required across processes (derived from the launcher's job id on one host)",
    doc: "the job secret every connection proves it knows (set by `oxccl run`)",
    origin: Origin::Launcher,
};
/// `OXCCL_STORE_ADDR`.
pub const STORE_ADDR: Setting = Setting {
    name: "OXCCL_STORE_ADDR",
    kind: Kind::Address,
    default: "",
    default_doc: "rank 0 hosts one",
    doc: "`host:port` of a running store (set by `oxccl run`)",
    origin: Origin::Launcher,
};
/// `OXCCL_STORE_PORT`.
pub const STORE_PORT: Setting = Setting {
    name: "OXCCL_STORE_PORT",
    kind: Kind::Port,
    default: "",
    default_doc: "`MASTER_PORT + 1`",
    doc: "port of the store rank 0 hosts",
    origin: Origin::User,
};
/// `OXCCL_BOOTSTRAP`.
pub const BOOTSTRAP: Setting = Setting {
    name: "OXCCL_BOOTSTRAP",
    kind: Kind::Choice(&[("auto", "auto"), ("store", "store"), ("pmix", "pmix")]),
    default: "auto",
    default_doc: "`auto`",
    doc: "how the processes of a job find each other: `auto` (through the launcher's PMIx where it runs one: Slurm `srun --mpi=pmix`, `mpirun`, `prterun`; else oxccl's TCP store), `store`, `pmix` (fails when the process was not started under PMIx); `oxccl info` says which and why",
    origin: Origin::User,
};
/// `OXCCL_JOIN`.
pub const JOIN: Setting = Setting {
    name: "OXCCL_JOIN",
    kind: Kind::Flag,
    default: "0",
    default_doc: "",
    doc: "`init` joins a running job as a newcomer, admitted by the members' `grow` (set by `oxccl run --max-restarts` for the replacement of a dead rank)",
    origin: Origin::Launcher,
};
/// `OXCCL_PMIX_LIBRARY`.
pub const PMIX_LIBRARY: Setting = Setting {
    name: "OXCCL_PMIX_LIBRARY",
    kind: Kind::Text,
    default: "",
    default_doc: "searched: `libpmix.so.2`, `libpmix.so`",
    doc: "the PMIx client library to load (a file, or a folder holding `libpmix.so.2`) instead of searching",
    origin: Origin::User,
};
/// `OXCCL_SHM_SLOT_BYTES`.
pub const SHM_SLOT_BYTES: Setting = Setting {
    name: "OXCCL_SHM_SLOT_BYTES",
    kind: Kind::Size { min: 4 << 10, max: 1 << 40 },
    default: "256K",
    default_doc: "`256K`",
    doc: "chunk size of the shared-memory collectives (4 per rank per communicator), at least 4K",
    origin: Origin::User,
};
/// `OXCCL_SHM_SINGLE_COPY`.
pub const SHM_SINGLE_COPY: Setting = Setting {
    name: "OXCCL_SHM_SINGLE_COPY",
    kind: Kind::Flag,
    default: "1",
    default_doc: "`1`",
    doc: "`cpu`: large moves read straight from the peers' buffers (Linux cross-memory attach, one copy instead of two) where every rank may read and write every other and each has a CPU of its own: all_to_all from 8 KiB per peer, all_gather from 8 KiB times the other ranks per block, broadcast from 8 KiB between two ranks (the root of an in-place one of 128 KiB or more writes half into the peer), scatter from 64 KiB per block (from 5 ranks up where the root's input is 1 MiB or more); `0` keeps them in the shared-memory slots",
    origin: Origin::User,
};
/// `OXCCL_SHM_RING_BYTES`.
pub const SHM_RING_BYTES: Setting = Setting {
    name: "OXCCL_SHM_RING_BYTES",
    kind: Kind::Size { min: 4 << 10, max: 1 << 30 },
    default: "256K",
    default_doc: "`256K`",
    doc: "size of each shared-memory ring between two ranks (n² per host), 4K to 1G",
    origin: Origin::User,
};
/// `OXCCL_MAX_FRAME`.
pub const MAX_FRAME: Setting = Setting {
    name: "OXCCL_MAX_FRAME",
    kind: Kind::Size { min: 64 << 10, max: usize::MAX },
    default: MAX_FRAME_DEFAULT,
    default_doc: "`16G`",
    doc: "largest message accepted from a peer (at least 64K)",
    origin: Origin::User,
};
/// `OXCCL_SOCKETS_PER_PEER`.
pub const SOCKETS_PER_PEER: Setting = Setting {
    name: "OXCCL_SOCKETS_PER_PEER",
    kind: Kind::Count { min: 1, max: 8 },
    default: "2",
    default_doc: "`2`",
    doc: "TCP connections between two ranks on different hosts (like `NCCL_NSOCKS_PERTHREAD`): frames of 128K to 64M are striped across them, for links one stream cannot fill; the same on every rank, 1 to 8",
    origin: Origin::User,
};
/// `OXCCL_HOST_ID`.
pub const HOST_ID: Setting = Setting {
    name: "OXCCL_HOST_ID",
    kind: Kind::Text,
    default: "",
    default_doc: "hostname + network namespace",
    doc: "override the host identity (ranks with the same identity share memory)",
    origin: Origin::User,
};
/// `OXCCL_SPIN_US`.
pub const SPIN_US: Setting = Setting {
    name: "OXCCL_SPIN_US",
    kind: Kind::Count { min: 0, max: 1_000_000 },
    default: "",
    default_doc: "automatic: `10000` when every rank of the machine has a CPU, `0` when they outnumber their CPUs",
    doc: "how long a shared-memory wait busy-polls before it polls yielding the CPU (then sleeps), in µs",
    origin: Origin::User,
};
/// `OXCCL_TUNE_FILE`.
pub const TUNE_FILE: Setting = Setting {
    name: "OXCCL_TUNE_FILE",
    kind: Kind::Text,
    default: "",
    default_doc: "this host's profile if `oxccl tune --save` cached one (`$XDG_CACHE_HOME` or `~/.cache`, `oxccl/tune-HOST.txt`), else built-in costs of the reference machine",
    doc: "a profile of measured costs (`oxccl tune -o FILE` writes one) that the `cpu` backend's algorithm choice reads; rank 0's is used by every rank",
    origin: Origin::User,
};
/// `OXCCL_LOG`.
pub const LOG: Setting = Setting {
    name: "OXCCL_LOG",
    kind: Kind::LogFilter,
    default: "warn",
    default_doc: "`warn`",
    doc: "what oxccl logs through `tracing` (to stderr, unless the application has its own subscriber): a level (`error`, `warn`, `info`, `debug`, `trace`), or levels per target, e.g. `warn,oxccl::cpu::selector=debug` (each algorithm choice with its predicted costs); targets are oxccl's module paths (`oxccl::cpu`, `oxccl::perf`, `oxccl::bootstrap`, ...)",
    origin: Origin::User,
};
/// `OXCCL_FR_SIZE`.
pub const FR_SIZE: Setting = Setting {
    name: "OXCCL_FR_SIZE",
    kind: Kind::Count { min: 0, max: 1_000_000 },
    default: "2000",
    default_doc: "`2000`",
    doc: "operations each communicator's flight recorder keeps, up to 1000000 (its dump, written on a timeout, mismatch, lost peer, abort or `SIGUSR1`, is what `oxccl trace analyze` reads; its ring, 56 bytes per operation rounded up to a power of two, is allocated with the communicator); `0` keeps none",
    origin: Origin::User,
};
/// `OXCCL_FR_DIR`.
pub const FR_DIR: Setting = Setting {
    name: "OXCCL_FR_DIR",
    kind: Kind::Text,
    default: "",
    default_doc: "the system's temporary directory",
    doc:
        "where flight-recorder dumps are written, one file per rank and communicator (`oxccl-fr-JOB-commC-rankR.json`)",
    origin: Origin::User,
};
/// `OXCCL_PROFILE`.
pub const PROFILE: Setting = Setting {
    name: "OXCCL_PROFILE",
    kind: Kind::Profile,
    default: "",
    default_doc: "off",
    doc: "the profiler: `summary` prints per-op statistics (count, mean, p50, p99, algbw, busbw per size) when a communicator ends; `trace:DIR` writes a Chrome trace per rank (`oxccl trace merge DIR` joins them); or both, `summary,trace:DIR`",
    origin: Origin::User,
};
/// `OXCCL_YIELD_US`.
pub const YIELD_US: Setting = Setting {
    name: "OXCCL_YIELD_US",
    kind: Kind::Count { min: 0, max: 10_000_000 },
    default: "",
    default_doc: "automatic: `0` when every rank of the machine has a CPU, `2000` when they outnumber their CPUs",
    doc: "how long a shared-memory wait, or a receive over TCP, then polls with `sched_yield` (a peer sharing the CPU runs at once) before it sleeps, in µs",
    origin: Origin::User,
};
/// `OXCCL_LAUNCHER`.
pub const LAUNCHER: Setting = Setting {
    name: "OXCCL_LAUNCHER",
    kind: Kind::Text,
    default: "",
    default_doc: "",
    doc: "`oxccl` under `oxccl run`; `torchrun` declares that `RANK`/`WORLD_SIZE` come from the launcher that started this process",
    origin: Origin::Launcher,
};
/// `OXCCL_NODE_RANK`.
pub const NODE_RANK: Setting = Setting {
    name: "OXCCL_NODE_RANK",
    kind: Kind::Count { min: 0, max: u32::MAX as u64 },
    default: "",
    default_doc: "",
    doc: "this host's index among the job's hosts (set by `oxccl run`, for programs to read)",
    origin: Origin::Launcher,
};
/// `OXCCL_MPI_THREAD_LEVEL`.
pub const MPI_THREAD_LEVEL: Setting = Setting {
    name: "OXCCL_MPI_THREAD_LEVEL",
    kind: Kind::Choice(&[
        ("single", "single"),
        ("funneled", "funneled"),
        ("serialized", "serialized"),
        ("multiple", "multiple"),
        ("mpi_thread_single", "single"),
        ("mpi_thread_funneled", "funneled"),
        ("mpi_thread_serialized", "serialized"),
        ("mpi_thread_multiple", "multiple"),
    ]),
    default: "multiple",
    default_doc: "`multiple`",
    doc: "`mpi`: thread level asked of `MPI_Init_thread`: `single`, `funneled`, `serialized`, `multiple`",
    origin: Origin::User,
};
/// `OXCCL_MPI_FINGERPRINT`.
pub const MPI_FINGERPRINT: Setting = Setting {
    name: "OXCCL_MPI_FINGERPRINT",
    kind: Kind::Flag,
    default: "1",
    default_doc: "`1`",
    doc: "`mpi`: exchange a fingerprint before each collective, so mismatched calls fail instead of hanging",
    origin: Origin::User,
};
/// `OXCCL_MPI_HALF_REDUCE`.
pub const MPI_HALF_REDUCE: Setting = Setting {
    name: "OXCCL_MPI_HALF_REDUCE",
    kind: Kind::Choice(&[("widen", "widen"), ("user_op", "user_op"), ("userop", "user_op")]),
    default: "widen",
    default_doc: "`widen`",
    doc: "`mpi`: f16/bf16 sums and products: `widen` (to f32, round once) or `user_op` (16-bit on the wire)",
    origin: Origin::User,
};
/// `OXCCL_MPI_CUDA_AWARE`.
pub const MPI_CUDA_AWARE: Setting = Setting {
    name: "OXCCL_MPI_CUDA_AWARE",
    kind: Kind::Choice(&[
        ("auto", "auto"),
        ("yes", "yes"),
        ("no", "no"),
        ("1", "yes"),
        ("true", "yes"),
        ("0", "no"),
        ("false", "no"),
    ]),
    default: "auto",
    default_doc: "`auto`",
    doc: "`mpi`: hand device buffers to MPI directly: `auto` (ask MPI), `yes`, `no`",
    origin: Origin::User,
};

/// `OXCCL_CPU_FORCE_STAGING`.
pub const CPU_FORCE_STAGING: Setting = Setting {
    name: "OXCCL_CPU_FORCE_STAGING",
    kind: Kind::Flag,
    default: "0",
    default_doc: "`0`",
    doc: "`cpu`/`local`: stage every buffer through host temporaries as device buffers are (tests the device path without a GPU)",
    origin: Origin::User,
};

/// `OXCCL_MPI_FORCE_STAGING`.
pub const MPI_FORCE_STAGING: Setting = Setting {
    name: "OXCCL_MPI_FORCE_STAGING",
    kind: Kind::Flag,
    default: "0",
    default_doc: "`0`",
    doc: "`mpi`: stage every buffer through host temporaries (tests the device path without a GPU)",
    origin: Origin::User,
};
/// `OXCCL_MPI_ENV`.
pub const MPI_ENV: Setting = Setting {
    name: "OXCCL_MPI_ENV",
    kind: Kind::Assignments,
    default: "",
    default_doc: "",
    doc: "`mpi`: `NAME=value;...` set before `MPI_Init` (e.g. `OMPI_MCA_btl=self,vader`)",
    origin: Origin::User,
};

/// `OXCCL_NCCL_LIBRARY`.
pub const NCCL_LIBRARY: Setting = Setting {
    name: "OXCCL_NCCL_LIBRARY",
    kind: Kind::Text,
    default: "",
    default_doc: "searched: `$NCCL_HOME`, `$CUDA_HOME`, the `nvidia-nccl` wheel of `$VIRTUAL_ENV`/`$CONDA_PREFIX`, `libnccl.so.2`",
    doc: "`nccl`: the NCCL library to load (a file, or a folder holding `libnccl.so.2`) instead of searching",
    origin: Origin::User,
};
/// `OXCCL_RCCL_LIBRARY`.
pub const RCCL_LIBRARY: Setting = Setting {
    name: "OXCCL_RCCL_LIBRARY",
    kind: Kind::Text,
    default: "",
    default_doc: "searched: `$ROCM_PATH/lib`, `librccl.so.1`",
    doc: "`rccl`: the RCCL library to load (a file, or a folder holding `librccl.so.1`) instead of searching",
    origin: Origin::User,
};
/// `OXCCL_GPU_DEVICE`.
pub const GPU_DEVICE: Setting = Setting {
    name: "OXCCL_GPU_DEVICE",
    kind: Kind::Count { min: 0, max: 1 << 16 },
    default: "",
    default_doc: "`LOCAL_RANK` modulo the visible devices",
    doc: "`nccl`/`rccl`: the device ordinal this process uses",
    origin: Origin::User,
};
/// `OXCCL_GPU_FINGERPRINT`.
pub const GPU_FINGERPRINT: Setting = Setting {
    name: "OXCCL_GPU_FINGERPRINT",
    kind: Kind::Flag,
    default: "0",
    default_doc: "`0`",
    doc: "`nccl`/`rccl`: exchange a fingerprint before each collective, so mismatched calls fail with `Mismatch` instead of hanging",
    origin: Origin::User,
};

/// `OXCCL_GPU_HOST_BUFFERS`.
pub const GPU_HOST_BUFFERS: Setting = Setting {
    name: "OXCCL_GPU_HOST_BUFFERS",
    kind: Kind::Choice(&[("auto", "auto"), ("refuse", "refuse"), ("cpu", "cpu"), ("stage", "stage")]),
    default: "auto",
    default_doc: "`auto`: `cpu` under `OXCCL_BACKEND=auto`, else `refuse`",
    doc: "`nccl`/`rccl`: host buffers are refused (`refuse`), run on the cpu backend (`cpu`) or copied through the GPU (`stage`)",
    origin: Origin::User,
};

/// `OXCCL_PINNED_LIMIT`.
pub const PINNED_LIMIT: Setting = Setting {
    name: "OXCCL_PINNED_LIMIT",
    kind: Kind::Size { min: 1 << 20, max: 1 << 40 },
    default: "1G",
    default_doc: "`1G`",
    doc: "most page-locked (pinned) host memory the process-wide staging pool holds, leased and free buffers together (GPU buffers on `cpu`/`mpi` are staged through it); free buffers are evicted least recently used first to stay under it; read from the environment when the pool is first used; 1M to 1T",
    origin: Origin::User,
};

/// `OXCCL_CONFORMANCE_FILTER`.
pub const CONFORMANCE_FILTER: Setting = Setting {
    name: "OXCCL_CONFORMANCE_FILTER",
    kind: Kind::Text,
    default: "",
    default_doc: "every case",
    doc: "`oxccl-conformance`: run only the cases whose name matches one of these comma-separated patterns: `^prefix` matches names that start with it, any other pattern names that contain it (`all_reduce/f32/sum/ring/in_place`, `p2p/batch_all_pairs/i32`, `errors/mismatch/dtype`)",
    origin: Origin::User,
};
/// `OXCCL_CONFORMANCE_SKIP`.
pub const CONFORMANCE_SKIP: Setting = Setting {
    name: "OXCCL_CONFORMANCE_SKIP",
    kind: Kind::Text,
    default: "",
    default_doc: "none",
    doc: "`oxccl-conformance`: skip the cases whose name matches one of these comma-separated patterns (as in `OXCCL_CONFORMANCE_FILTER`)",
    origin: Origin::User,
};
/// `OXCCL_CONFORMANCE_SEED`.
pub const CONFORMANCE_SEED: Setting = Setting {
    name: "OXCCL_CONFORMANCE_SEED",
    kind: Kind::Count { min: 0, max: u64::MAX },
    default: "",
    default_doc: "a fixed seed (`oxccl_conformance::DEFAULT_SEED`)",
    doc: "`oxccl-conformance`: the seed of every input (a failure reproduces from the seed and the case's name)",
    origin: Origin::User,
};
/// `OXCCL_CONFORMANCE_QUICK`.
pub const CONFORMANCE_QUICK: Setting = Setting {
    name: "OXCCL_CONFORMANCE_QUICK",
    kind: Kind::Flag,
    default: "0",
    default_doc: "`0`",
    doc: "`oxccl-conformance`: `1` runs a reduced matrix (fewer dtypes and element counts; every op, reduce op and algorithm)",
    origin: Origin::User,
};
/// `OXCCL_CONFORMANCE_PROGRESS`.
pub const CONFORMANCE_PROGRESS: Setting = Setting {
    name: "OXCCL_CONFORMANCE_PROGRESS",
    kind: Kind::Flag,
    default: "0",
    default_doc: "`0`",
    doc: "`oxccl-conformance`: `1` prints each case's name to stderr as it starts and its time when it ends, so a run stopped from outside shows which case it was in",
    origin: Origin::User,
};
/// `OXCCL_CONFORMANCE_TIMEOUT`.
pub const CONFORMANCE_TIMEOUT: Setting = Setting {
    name: "OXCCL_CONFORMANCE_TIMEOUT",
    kind: Kind::Duration { min_ns: 1 },
    default: "60s",
    default_doc: "`60s`",
    doc: "`oxccl-conformance`: deadline of every call the suite makes, except where a case sets its own: `30`, `1.5s`, `250ms`, `2m`",
    origin: Origin::User,
};
/// `OXCCL_CONFORMANCE_DEVICE`.
pub const CONFORMANCE_DEVICE: Setting = Setting {
    name: "OXCCL_CONFORMANCE_DEVICE",
    kind: Kind::Text,
    default: "",
    default_doc: "host buffers",
    doc: "`oxccl-conformance`: copy every buffer a case passes to a call to this device, and the outputs back before they are checked: `cpu` (host buffers), `cuda`, `cuda:N`, `rocm`, `rocm:N` (ordinal 0 when omitted)",
    origin: Origin::User,
};

/// Every setting of the library, in the order the docs list them.
pub const ALL: &[Setting] = &[
    BACKEND,
    TIMEOUT,
    ALGO,
    TRANSPORT,
    SOCKET_IFNAME,
    SECRET,
    STORE_ADDR,
    STORE_PORT,
    BOOTSTRAP,
    PMIX_LIBRARY,
    JOIN,
    SHM_SLOT_BYTES,
    SHM_SINGLE_COPY,
    SHM_RING_BYTES,
    MAX_FRAME,
    SOCKETS_PER_PEER,
    HOST_ID,
    SPIN_US,
    YIELD_US,
    CPU_FORCE_STAGING,
    TUNE_FILE,
    LOG,
    FR_SIZE,
    FR_DIR,
    PROFILE,
    LAUNCHER,
    NODE_RANK,
    MPI_THREAD_LEVEL,
    MPI_FINGERPRINT,
    MPI_HALF_REDUCE,
    MPI_CUDA_AWARE,
    MPI_FORCE_STAGING,
    MPI_ENV,
    NCCL_LIBRARY,
    RCCL_LIBRARY,
    GPU_DEVICE,
    GPU_FINGERPRINT,
    GPU_HOST_BUFFERS,
    PINNED_LIMIT,
];

/// The settings of the conformance suite, in the order the docs list them (after [`ALL`]).
/// `oxccl-conformance` reads them itself ([`Setting::from_env`]); the library does not:
/// [`Config::set`](super::Config::set) refuses them and [`Config::resolve`](super::Config::resolve)
/// leaves them alone.
pub const CONFORMANCE: &[Setting] = &[
    CONFORMANCE_FILTER,
    CONFORMANCE_SKIP,
    CONFORMANCE_SEED,
    CONFORMANCE_QUICK,
    CONFORMANCE_PROGRESS,
    CONFORMANCE_TIMEOUT,
    CONFORMANCE_DEVICE,
];

/// The setting of the library ([`ALL`]) called `name` (case-insensitive), if there is one.
pub fn find(name: &str) -> Option<&'static Setting> {
    ALL.iter().find(|s| s.name.eq_ignore_ascii_case(name.trim()))
}

/// Every variable declared here: the library's settings ([`ALL`]), then the conformance
/// suite's ([`CONFORMANCE`]).
pub fn declared() -> impl Iterator<Item = &'static Setting> {
    ALL.iter().chain(CONFORMANCE)
}

/// The variable called `name` (case-insensitive) among [`declared`] ones, if there is one.
pub fn find_declared(name: &str) -> Option<&'static Setting> {
    declared().find(|s| s.name.eq_ignore_ascii_case(name.trim()))
}

/// The settings table of `SETTINGS.md`, one row per [`declared`] variable.
pub fn markdown_table() -> String {
    let mut out = String::from("| variable | meaning | default |\n|---|---|---|\n");
    for s in declared() {
        out.push_str(&format!("| `{}` | {} | {} |\n", s.name, s.doc, s.default_doc));
    }
    out
}
