//! The options of a suite run ([`SuiteOptions`]): which cases, the seed, the deadline, device
//! placement; read from the environment or built in code.

use std::time::Duration;

use oxccl::config::parse;
use oxccl::config::registry::{self, Setting};

/// The seed used when none is given.
pub const DEFAULT_SEED: u64 = 0x0C0F_FEE0_DDBA_11AD;

/// Which cases to run, and how.
///
/// Every rank must pass equal options: they decide the sequence of cases.
///
/// Equality compares [`gpu`](Self::gpu) by the device it names (`cuda:0`, ...), not by the
/// runtime behind it.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Seed of every input (a failure reproduces from the seed and the case name).
    pub seed: u64,
    /// Run only cases whose name matches one of these patterns (all cases when empty; see
    /// [`pattern_matches`]). Names look like `all_reduce/f32/sum/ring/in_place`, `p2p/batch_all_pairs/i32`,
    /// `errors/mismatch/dtype`.
    pub filter: Vec<String>,
    /// Skip cases whose name matches one of these patterns.
    pub skip: Vec<String>,
    /// A reduced matrix: fewer dtypes and element counts, every op, reduce op and algorithm.
    pub quick: bool,
    /// Deadline of every call the suite makes, except where a case sets its own
    /// (a failure shows up as a timeout instead of a hang).
    pub timeout: Duration,
    /// Device placement: when set, every buffer a case passes to a communicator call is
    /// first copied to this GPU ([`oxccl::DeviceBuffer`]), the call runs on the device
    /// copy, and the outputs are copied back to the host before they are checked. `None`
    /// (the default): the calls get the host buffers themselves. The suite's own
    /// bookkeeping calls and the error cases always use host buffers.
    pub gpu: Option<oxccl::Gpu>,
    /// Print each case's name to stderr as it starts, and its time when it ends
    /// (`OXCCL_CONFORMANCE_PROGRESS=1`): a run stopped from outside (a device check's time
    /// limit) then shows which case it was in.
    pub progress: bool,
}

impl PartialEq for SuiteOptions {
    fn eq(&self, other: &Self) -> bool {
        self.seed == other.seed
            && self.filter == other.filter
            && self.skip == other.skip
            && self.quick == other.quick
            && self.timeout == other.timeout
            && self.progress == other.progress
            && self.gpu.as_ref().map(oxccl::Gpu::device) == other.gpu.as_ref().map(oxccl::Gpu::device)
    }
}

impl Eq for SuiteOptions {}

impl Default for SuiteOptions {
    fn default() -> Self {
        SuiteOptions {
            seed: DEFAULT_SEED,
            filter: Vec::new(),
            skip: Vec::new(),
            quick: false,
            timeout: Duration::from_secs(60),
            gpu: None,
            progress: false,
        }
    }
}

impl SuiteOptions {
    /// Every case, default seed and timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Options from the environment, the variables that oxccl's settings registry declares for
    /// the suite ([`registry::CONFORMANCE`], where each is documented):
    /// `OXCCL_CONFORMANCE_FILTER` and `OXCCL_CONFORMANCE_SKIP` (comma-separated patterns),
    /// `OXCCL_CONFORMANCE_SEED` (integer), `OXCCL_CONFORMANCE_QUICK` and
    /// `OXCCL_CONFORMANCE_PROGRESS` (flags: `1`, `true`, `yes`, `on`, any case),
    /// `OXCCL_CONFORMANCE_TIMEOUT` (seconds, or `250ms`, `2m` ...), `OXCCL_CONFORMANCE_DEVICE`
    /// (device placement, see [`gpu`](Self::gpu): unset, empty or `cpu` for host buffers;
    /// `cuda`, `cuda:N`, `rocm`, `rocm:N` for that GPU, ordinal 0 when omitted).
    ///
    /// Unset or unparsable variables keep the defaults; a bad `OXCCL_CONFORMANCE_DEVICE`,
    /// or a GPU that cannot be opened, is reported on stderr and the suite runs on host
    /// buffers. Use [`try_from_env`](Self::try_from_env) to get that as an error instead.
    pub fn from_env() -> Self {
        let mut o = Self::from_env_host();
        match gpu_from_env() {
            Ok(gpu) => o.gpu = gpu,
            Err(e) => eprintln!("oxccl-conformance: {e}; running on host buffers"),
        }
        o
    }

    /// [`from_env`](Self::from_env), except that a bad `OXCCL_CONFORMANCE_DEVICE` is an error.
    ///
    /// # Errors
    /// `OXCCL_CONFORMANCE_DEVICE` is not one of `cpu`, `cuda`, `cuda:N`, `rocm`, `rocm:N`, or
    /// names a GPU that cannot be opened ([`oxccl::Gpu::of`] failed: no runtime, no such
    /// device); the message names the variable.
    pub fn try_from_env() -> Result<Self, String> {
        let mut o = Self::from_env_host();
        o.gpu = gpu_from_env()?;
        Ok(o)
    }

    /// The options of [`from_env`](Self::from_env) but the device.
    fn from_env_host() -> Self {
        // A variable's value when set, not empty, and of its kind; else the default stays.
        let var = |s: &Setting| s.from_env().ok().flatten();
        let list = |v: String| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        let flag = |s: &Setting| var(s).map(|v| parse::flag(&v) == Ok(true));
        let mut o = SuiteOptions::default();
        if let Some(v) = var(&registry::CONFORMANCE_FILTER) {
            o.filter = list(v);
        }
        if let Some(v) = var(&registry::CONFORMANCE_SKIP) {
            o.skip = list(v);
        }
        if let Some(s) = var(&registry::CONFORMANCE_SEED).and_then(|v| v.trim().parse().ok()) {
            o.seed = s;
        }
        if let Some(q) = flag(&registry::CONFORMANCE_QUICK) {
            o.quick = q;
        }
        if let Some(p) = flag(&registry::CONFORMANCE_PROGRESS) {
            o.progress = p;
        }
        if let Some(t) = var(&registry::CONFORMANCE_TIMEOUT).and_then(|v| parse::duration(&v).ok()) {
            o.timeout = t;
        }
        o
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Adds patterns to the filter: only cases whose name contains one of them run.
    pub fn only<S: Into<String>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.filter.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// Adds patterns of cases to skip.
    pub fn skipping<S: Into<String>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.skip.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// Chooses the reduced matrix.
    pub fn quick(mut self, quick: bool) -> Self {
        self.quick = quick;
        self
    }

    /// Sets the deadline of the suite's calls.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Chooses device placement on `gpu` (see [`gpu`](Self::gpu)): every buffer a case
    /// passes to a communicator call is copied to `gpu` first and its outputs copied back
    /// before they are checked. Every rank of a run should place its buffers on a GPU (its
    /// own, or the same one), or none.
    pub fn on_gpu(mut self, gpu: oxccl::Gpu) -> Self {
        self.gpu = Some(gpu);
        self
    }

    /// Whether the case named `name` runs under these options.
    pub fn selects(&self, name: &str) -> bool {
        (self.filter.is_empty() || self.filter.iter().any(|p| pattern_matches(p, name)))
            && !self.skip.iter().any(|p| pattern_matches(p, name))
    }
}

/// The GPU `OXCCL_CONFORMANCE_DEVICE` names (`None` for unset, empty or `cpu`), opened.
fn gpu_from_env() -> Result<Option<oxccl::Gpu>, String> {
    // Read here rather than through `Setting::from_env`, which takes a value that is not
    // UTF-8 for unset: this one is reported.
    const VAR: &str = registry::CONFORMANCE_DEVICE.name;
    let raw = match std::env::var(VAR) {
        Ok(v) => v,
        Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => return Err(format!("{VAR}={v:?} is not valid UTF-8")),
    };
    if raw.trim().is_empty() {
        return Ok(None);
    }
    let device = match raw.parse::<oxccl::Device>() {
        Ok(oxccl::Device::Cpu) => return Ok(None),
        Ok(d) => d,
        Err(e) => return Err(format!("{VAR}={raw:?}: {e}")),
    };
    oxccl::Gpu::of(device).map(Some).map_err(|e| format!("{VAR}={raw:?}: cannot open {device}: {e}"))
}

/// Whether a filter pattern matches a case name: `^prefix` matches names that start with
/// `prefix`, any other pattern names that contain it (`reduce/` also matches
/// `all_reduce/...`; `^reduce/` does not).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix('^') {
        Some(prefix) => name.starts_with(prefix),
        None => name.contains(pattern),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults the settings registry documents are the suite's.
    #[test]
    fn the_registry_documents_the_defaults() {
        let d = SuiteOptions::default();
        assert_eq!(parse::duration(registry::CONFORMANCE_TIMEOUT.default), Ok(d.timeout));
        assert_eq!(parse::flag(registry::CONFORMANCE_QUICK.default), Ok(d.quick));
        assert_eq!(parse::flag(registry::CONFORMANCE_PROGRESS.default), Ok(d.progress));
        assert_eq!(registry::CONFORMANCE.len(), 7);
    }

    #[test]
    fn equality_compares_the_gpu_by_device() {
        let gpu = oxccl::testing::host_gpu(1, 0).unwrap();
        let host = SuiteOptions::new();
        assert_eq!(host, SuiteOptions::new());
        assert_ne!(host, host.clone().on_gpu(gpu.clone()));
        assert_eq!(host.clone().on_gpu(gpu.clone()), host.on_gpu(gpu));
    }
}
