//! [`MpiConfig`]: the settings of the `mpi` backend, from the builder or the environment.

use std::collections::BTreeMap;

use super::parse;
use super::reader::{choice, Reader};
use super::registry as r;
use crate::error::Result;

/// The MPI thread support level asked for at `MPI_Init_thread`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ThreadLevel {
    /// `MPI_THREAD_SINGLE`.
    Single,
    /// `MPI_THREAD_FUNNELED`.
    Funneled,
    /// `MPI_THREAD_SERIALIZED`.
    Serialized,
    /// `MPI_THREAD_MULTIPLE` (the default: communicators may be used from any thread).
    Multiple,
}

impl ThreadLevel {
    /// The MPI name of the level.
    pub const fn name(self) -> &'static str {
        match self {
            ThreadLevel::Single => "MPI_THREAD_SINGLE",
            ThreadLevel::Funneled => "MPI_THREAD_FUNNELED",
            ThreadLevel::Serialized => "MPI_THREAD_SERIALIZED",
            ThreadLevel::Multiple => "MPI_THREAD_MULTIPLE",
        }
    }
}

/// How f16/bf16 `Sum`, `Prod` and `Avg` reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfReduce {
    /// Widen to f32 working buffers, reduce with MPI's own `MPI_SUM`/`MPI_PROD` on
    /// `MPI_FLOAT`, round once at the end (the default: as exact as the CPU backends, but
    /// twice the bytes on the wire).
    Widen,
    /// Reduce the 16-bit values with MPI user operations that compute every pairwise step in
    /// f32 and round it to nearest-even (half the bytes, one rounding per combining step).
    UserOp,
}

/// Whether device buffers are handed to MPI directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaAware {
    /// Ask the MPI library (`MPIX_Query_cuda_support`) and stage through host memory unless it
    /// says yes.
    Auto,
    /// Trust that the MPI library is CUDA-aware (device pointers go to MPI as they are).
    Yes,
    /// Always stage device buffers through host memory.
    No,
}

/// Settings of the `mpi` backend.
///
/// Read from the environment by [`MpiConfig::from_env`]; every field has a builder method.
///
/// | variable | field | values |
/// |---|---|---|
/// | `OXCCL_MPI_THREAD_LEVEL` | [`thread_level`](Self::thread_level) | `single`, `funneled`, `serialized`, `multiple` |
/// | `OXCCL_MPI_FINGERPRINT` | [`fingerprint`](Self::fingerprint) | `1`/`0` |
/// | `OXCCL_MPI_HALF_REDUCE` | [`half_reduce`](Self::half_reduce) | `widen`, `user_op` |
/// | `OXCCL_MPI_CUDA_AWARE` | [`cuda_aware`](Self::cuda_aware) | `auto`, `yes`, `no` |
/// | `OXCCL_MPI_FORCE_STAGING` | [`force_staging`](Self::force_staging) | `1`/`0` |
/// | `OXCCL_MPI_ENV` | [`tuning_env`](Self::tuning_env) | `NAME=value;NAME=value` |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiConfig {
    /// The thread level requested from `MPI_Init_thread`. When MPI grants less than
    /// `MPI_THREAD_MULTIPLE`, oxccl serialises every MPI call behind one process-wide lock
    /// (and says so once on stderr).
    pub thread_level: ThreadLevel,
    /// Exchange a fingerprint (sequence number, op, dtype, count, root, reduce op, algorithm)
    /// with every peer before each collective, so that ranks calling different collectives
    /// get [`Error::Mismatch`](crate::Error::Mismatch) instead of a hang or garbage, and timeouts name the rank that
    /// did not arrive. Costs one small message to and from every peer per collective (a
    /// latency of a few microseconds on one host); switch it off for speed-only runs.
    pub fingerprint: bool,
    /// How f16/bf16 sums and products reduce.
    pub half_reduce: HalfReduce,
    /// Whether device buffers go to MPI directly.
    pub cuda_aware: CudaAware,
    /// Stage *every* buffer through host temporaries, as device buffers are staged on an MPI
    /// that is not CUDA-aware (for testing that path without a GPU).
    pub force_staging: bool,
    /// Environment variables set before `MPI_Init_thread` (e.g. `OMPI_MCA_btl=self,vader`,
    /// `OMPI_MCA_coll_tuned_use_dynamic_rules=1`); ignored when MPI is already initialised.
    pub tuning_env: Vec<(String, String)>,
}

impl Default for MpiConfig {
    fn default() -> Self {
        MpiConfig {
            thread_level: ThreadLevel::Multiple,
            fingerprint: true,
            half_reduce: HalfReduce::Widen,
            cuda_aware: CudaAware::Auto,
            force_staging: false,
            tuning_env: Vec::new(),
        }
    }
}

impl MpiConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the `OXCCL_MPI_*` variables (see the type's docs) from the environment.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) naming the variable that cannot be used.
    pub fn from_env() -> Result<Self> {
        Self::from_env_with(|k| std::env::var(k).ok())
    }

    /// [`MpiConfig::from_env`] over any source of variables.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) naming the variable that cannot be used.
    pub fn from_env_with(env: impl Fn(&str) -> Option<String>) -> Result<Self> {
        resolve(None, &Reader { builder: &BTreeMap::new(), env })
    }

    /// Sets the requested thread level.
    pub fn thread_level(mut self, level: ThreadLevel) -> Self {
        self.thread_level = level;
        self
    }

    /// Switches the fingerprint exchange before each collective on or off.
    pub fn fingerprint(mut self, on: bool) -> Self {
        self.fingerprint = on;
        self
    }

    /// Chooses how f16/bf16 sums and products reduce.
    pub fn half_reduce(mut self, mode: HalfReduce) -> Self {
        self.half_reduce = mode;
        self
    }

    /// Chooses how device buffers reach MPI.
    pub fn cuda_aware(mut self, mode: CudaAware) -> Self {
        self.cuda_aware = mode;
        self
    }

    /// Stages every buffer through host temporaries (testing aid).
    pub fn force_staging(mut self, on: bool) -> Self {
        self.force_staging = on;
        self
    }

    /// Adds an environment variable to set before `MPI_Init_thread`.
    pub fn tuning_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.tuning_env.push((name.into(), value.into()));
        self
    }
}

/// The `mpi` settings: `base` (the builder's [`MpiConfig`]) or the defaults, overridden by
/// every `OXCCL_MPI_*` setting `rd` has (only builder values when `base` is given).
pub(super) fn resolve<E: Fn(&str) -> Option<String>>(base: Option<MpiConfig>, rd: &Reader<'_, E>) -> Result<MpiConfig> {
    let typed = base.is_some();
    let only_builder = Reader { builder: rd.builder, env: |_: &str| None };
    let rd: &dyn Fn(&r::Setting) -> Result<Option<String>> = &|s: &r::Setting| {
        let read = |v: &str| Ok(v.to_string());
        if typed {
            only_builder.get(s, read)
        } else {
            rd.get(s, read)
        }
    };
    let mut c = base.unwrap_or_default();
    if let Some(v) = rd(&r::MPI_THREAD_LEVEL)? {
        c.thread_level = match choice(&r::MPI_THREAD_LEVEL)(&v).unwrap_or("multiple") {
            "single" => ThreadLevel::Single,
            "funneled" => ThreadLevel::Funneled,
            "serialized" => ThreadLevel::Serialized,
            _ => ThreadLevel::Multiple,
        };
    }
    if let Some(v) = rd(&r::MPI_FINGERPRINT)? {
        c.fingerprint = parse::flag(&v).unwrap_or(true);
    }
    if let Some(v) = rd(&r::MPI_HALF_REDUCE)? {
        c.half_reduce =
            if choice(&r::MPI_HALF_REDUCE)(&v) == Ok("user_op") { HalfReduce::UserOp } else { HalfReduce::Widen };
    }
    if let Some(v) = rd(&r::MPI_CUDA_AWARE)? {
        c.cuda_aware = match choice(&r::MPI_CUDA_AWARE)(&v).unwrap_or("auto") {
            "yes" => CudaAware::Yes,
            "no" => CudaAware::No,
            _ => CudaAware::Auto,
        };
    }
    if let Some(v) = rd(&r::MPI_FORCE_STAGING)? {
        c.force_staging = parse::flag(&v).unwrap_or(false);
    }
    if let Some(v) = rd(&r::MPI_ENV)? {
        c.tuning_env.extend(parse::assignments(&v).unwrap_or_default());
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn defaults_and_environment() {
        let c = MpiConfig::from_env_with(|_| None).unwrap();
        assert_eq!(c, MpiConfig::default());
        assert_eq!(c.thread_level, ThreadLevel::Multiple);
        assert!(c.fingerprint);
        let c = MpiConfig::from_env_with(env(&[
            ("OXCCL_MPI_THREAD_LEVEL", "MPI_THREAD_SERIALIZED"),
            ("OXCCL_MPI_FINGERPRINT", "0"),
            ("OXCCL_MPI_HALF_REDUCE", "user-op"),
            ("OXCCL_MPI_CUDA_AWARE", "no"),
            ("OXCCL_MPI_FORCE_STAGING", "1"),
            ("OXCCL_MPI_ENV", "OMPI_MCA_btl=self,vader; OMPI_MCA_coll_tuned_use_dynamic_rules=1"),
        ]))
        .unwrap();
        assert_eq!(c.thread_level, ThreadLevel::Serialized);
        assert!(!c.fingerprint && c.force_staging);
        assert_eq!(c.half_reduce, HalfReduce::UserOp);
        assert_eq!(c.cuda_aware, CudaAware::No);
        assert_eq!(c.tuning_env.len(), 2);
        assert_eq!(c.tuning_env[0], ("OMPI_MCA_btl".to_string(), "self,vader".to_string()));
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("OXCCL_MPI_THREAD_LEVEL", "many"),
            ("OXCCL_MPI_FINGERPRINT", "maybe"),
            ("OXCCL_MPI_HALF_REDUCE", "fast"),
            ("OXCCL_MPI_CUDA_AWARE", "perhaps"),
            ("OXCCL_MPI_ENV", "novalue"),
        ] {
            let e = MpiConfig::from_env_with(env(&[(k, v)])).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
    }

    #[test]
    fn builder() {
        let c = MpiConfig::new()
            .thread_level(ThreadLevel::Funneled)
            .fingerprint(false)
            .half_reduce(HalfReduce::UserOp)
            .cuda_aware(CudaAware::Yes)
            .force_staging(true)
            .tuning_env("A", "1");
        assert_eq!(c.thread_level, ThreadLevel::Funneled);
        assert_eq!(c.tuning_env, vec![("A".into(), "1".into())]);
        assert!(ThreadLevel::Single < ThreadLevel::Multiple);
    }
}
