//! What `oxccl bench` measures and how ([`Plan`]): the operations and sizes, the element
//! type, the iterations ([`Iters`]), the algorithms ([`AlgoMode`]) and where the buffers live
//! ([`BenchDevice`]).

use std::path::PathBuf;

use oxccl::{DType, ReduceOp};

use super::ops::BenchOp;
use super::progress::ProgressMode;

/// What to measure and how.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Operations, in order.
    pub ops: Vec<BenchOp>,
    /// Sizes in bytes, in order.
    pub sizes: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Reduce op of the reductions.
    pub redop: ReduceOp,
    /// Root of the rooted operations.
    pub root: usize,
    /// Timed iterations per measurement.
    pub iters: Iters,
    /// Which algorithms to measure.
    pub algo: AlgoMode,
    /// Untimed iterations before them.
    pub warmup: usize,
    /// Whether to check results.
    pub check: bool,
    /// Whether to add the memcpy reference column.
    pub memcpy: bool,
    /// Where rank 0 writes the JSON results.
    pub json: Option<PathBuf>,
    /// Where rank 0 draws the bus bandwidth plot (SVG or PNG).
    pub plot: Option<PathBuf>,
    /// How rank 0 shows progress.
    pub progress: ProgressMode,
    /// Where the measured buffers live (`--device`); `None`: where the backend computes
    /// (the communicator's GPU on `nccl`/`rccl`, host memory otherwise).
    pub device: Option<BenchDevice>,
}

/// `--device`: the GPU whose memory holds the measured buffers, on any backend (the host
/// backends stage device buffers through host memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchDevice {
    /// Host memory.
    Host,
    /// This GPU on every rank (`cuda:N`, `rocm:N`).
    Fixed(oxccl::Device),
    /// A GPU per rank (a bare `cuda` or `rocm`): the rank's local rank modulo the devices
    /// the runtime sees (the vendor's ordinal 0 names the runtime).
    PerRank(oxccl::Device),
}

impl std::str::FromStr for BenchDevice {
    type Err = String;

    fn from_str(s: &str) -> Result<BenchDevice, String> {
        let d: oxccl::Device = s.parse().map_err(|e: oxccl::Error| e.to_string())?;
        Ok(match d {
            oxccl::Device::Cpu => BenchDevice::Host,
            d if s.contains(':') => BenchDevice::Fixed(d),
            d => BenchDevice::PerRank(d),
        })
    }
}

impl std::fmt::Display for BenchDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchDevice::Host => f.write_str("cpu"),
            BenchDevice::Fixed(d) => write!(f, "{d}"),
            BenchDevice::PerRank(oxccl::Device::Rocm(_)) => f.write_str("rocm"),
            BenchDevice::PerRank(_) => f.write_str("cuda"),
        }
    }
}

/// How many timed iterations a measurement takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Iters {
    /// Exactly this many.
    Fixed(usize),
    /// As many as fit in about [`AUTO_TARGET_US`](super::timing::AUTO_TARGET_US) (at least
    /// [`AUTO_MIN`](super::timing::AUTO_MIN), at most [`AUTO_MAX`](super::timing::AUTO_MAX)),
    /// from a short calibration that every rank agrees on.
    Auto,
}

impl std::fmt::Display for Iters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Iters::Fixed(n) => write!(f, "{n}"),
            Iters::Auto => f.write_str("auto"),
        }
    }
}

/// Which algorithms a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgoMode {
    /// The backend's own choice (the nccl-tests table).
    Auto,
    /// This algorithm for every operation it applies to.
    Forced(oxccl::Algorithm),
    /// Every algorithm of each operation, side by side, with the one auto picks marked.
    All,
}

impl std::fmt::Display for AlgoMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AlgoMode::Auto => f.write_str("auto"),
            AlgoMode::Forced(a) => write!(f, "{a}"),
            AlgoMode::All => f.write_str("all"),
        }
    }
}

impl Plan {
    /// The sizes measured for `op` (barrier: one row).
    pub(crate) fn sizes_of(&self, op: BenchOp) -> Vec<usize> {
        if op == BenchOp::Barrier {
            vec![0]
        } else {
            self.sizes.clone()
        }
    }
}
