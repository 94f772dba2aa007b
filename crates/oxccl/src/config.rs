//! Configuration: a builder whose settings win over `OXCCL_*` environment variables,
//! which win over the defaults.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `OXCCL_BACKEND` | `auto`, `local`, `cpu`, `nccl`, `rccl`, `mpi` | `auto` |
//! | `OXCCL_TIMEOUT` | deadline of every blocking wait: `30`, `1.5s`, `250ms`, `2m` | `300s` |
//! | `OXCCL_ALGO` | algorithm override: `ring`, or `all_reduce:rabenseifner,all_gather:bruck` | automatic |

use std::time::Duration;

use crate::algorithm::{Algorithm, AlgorithmOverrides};
use crate::error::{Error, Result};
use crate::fingerprint::OpKind;

/// The default deadline of every blocking wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Which backend to use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The available backend with the highest priority.
    #[default]
    Auto,
    /// The backend with this name (`local`, `cpu`, `nccl`, `rccl`, `mpi`).
    Named(String),
}

impl BackendChoice {
    /// Parses `auto` or a backend name (case-insensitive).
    pub fn parse(s: &str) -> BackendChoice {
        let s = s.trim().to_ascii_lowercase();
        if s.is_empty() || s == "auto" {
            BackendChoice::Auto
        } else {
            BackendChoice::Named(s)
        }
    }
}

/// Builder for communicators. Unset fields fall back to `OXCCL_*` environment
/// variables, then to defaults; see the module documentation for the variables.
///
/// ```
/// use std::time::Duration;
/// let cfg = oxccl::Config::new().backend("local").timeout(Duration::from_secs(10));
/// let comms = cfg.init_world(2).unwrap();
/// assert_eq!(comms[1].rank(), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Config {
    backend: Option<BackendChoice>,
    timeout: Option<Duration>,
    algorithms: Option<AlgorithmOverrides>,
}

/// A configuration with every value decided (builder, else environment, else default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedConfig {
    /// The backend to use.
    pub backend: BackendChoice,
    /// Deadline of every blocking wait.
    pub timeout: Duration,
    /// Algorithm overrides.
    pub algorithms: AlgorithmOverrides,
}

impl Config {
    /// An empty builder: everything comes from the environment or defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Chooses the backend by name (`auto`, `local`, `cpu`, `nccl`, `rccl`, `mpi`).
    pub fn backend(mut self, name: &str) -> Self {
        self.backend = Some(BackendChoice::parse(name));
        self
    }

    /// Sets the deadline of every blocking wait (overridable per call).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Forces `algo` for every operation it applies to (the others choose automatically).
    pub fn algorithm(mut self, algo: Algorithm) -> Self {
        self.algorithms = Some(AlgorithmOverrides::global(algo));
        self
    }

    /// Forces `algo` for `op`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `algo` cannot run `op`.
    pub fn algorithm_for(mut self, op: OpKind, algo: Algorithm) -> Result<Self> {
        let mut o = self.algorithms.take().unwrap_or_default();
        o.set(op, algo)?;
        self.algorithms = Some(o);
        Ok(self)
    }

    /// Decides every value, reading the process environment for unset ones.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable whose value cannot be parsed.
    pub fn resolve(&self) -> Result<ResolvedConfig> {
        self.resolve_with(|k| std::env::var(k).ok())
    }

    /// Like [`Config::resolve`], reading variables through `env` (for tests and embedding).
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable whose value cannot be parsed.
    pub fn resolve_with(&self, env: impl Fn(&str) -> Option<String>) -> Result<ResolvedConfig> {
        let backend = match &self.backend {
            Some(b) => b.clone(),
            None => env("OXCCL_BACKEND").map(|v| BackendChoice::parse(&v)).unwrap_or_default(),
        };
        let timeout = match self.timeout {
            Some(t) => t,
            None => match env("OXCCL_TIMEOUT") {
                Some(v) => parse_duration(&v).map_err(|e| Error::Config(format!("OXCCL_TIMEOUT={v:?}: {e}")))?,
                None => DEFAULT_TIMEOUT,
            },
        };
        if timeout.is_zero() {
            return Err(Error::Config("the timeout must be greater than zero".into()));
        }
        let algorithms = match &self.algorithms {
            Some(a) => a.clone(),
            None => match env("OXCCL_ALGO") {
                Some(v) => AlgorithmOverrides::parse(&v)?,
                None => AlgorithmOverrides::none(),
            },
        };
        Ok(ResolvedConfig { backend, timeout, algorithms })
    }
}

/// Parses `30`, `1.5`, `1.5s`, `250ms`, `2m`, `1h` into a duration (bare numbers are seconds).
///
/// # Errors
/// A message saying what is accepted.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}` is not a duration; use e.g. 30, 1.5s, 250ms, 2m"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("`{s}` is not a non-negative duration"));
    }
    Duration::try_from_secs_f64(v * scale).map_err(|e| format!("`{s}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn builder_wins_over_environment() {
        let e = [("OXCCL_BACKEND", "cpu"), ("OXCCL_TIMEOUT", "250ms"), ("OXCCL_ALGO", "bruck")];
        let r = Config::new().resolve_with(env(&e)).unwrap();
        assert_eq!(r.backend, BackendChoice::Named("cpu".into()));
        assert_eq!(r.timeout, Duration::from_millis(250));
        assert_eq!(r.algorithms.for_op(OpKind::AllGather), Algorithm::Bruck);

        let r = Config::new()
            .backend("local")
            .timeout(Duration::from_secs(7))
            .algorithm(Algorithm::Ring)
            .resolve_with(env(&e))
            .unwrap();
        assert_eq!(r.backend, BackendChoice::Named("local".into()));
        assert_eq!(r.timeout, Duration::from_secs(7));
        assert_eq!(r.algorithms.for_op(OpKind::AllGather), Algorithm::Ring);
    }

    #[test]
    fn defaults_without_environment() {
        let r = Config::new().resolve_with(|_| None).unwrap();
        assert_eq!(r.backend, BackendChoice::Auto);
        assert_eq!(r.timeout, DEFAULT_TIMEOUT);
        assert_eq!(r.algorithms.for_op(OpKind::AllReduce), Algorithm::Auto);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = Config::new().resolve_with(env(&[("OXCCL_TIMEOUT", "soon")])).unwrap_err();
        assert!(e.to_string().contains("OXCCL_TIMEOUT"), "{e}");
        let e = Config::new().resolve_with(env(&[("OXCCL_ALGO", "all_reduce:pairwise")])).unwrap_err();
        assert!(e.to_string().contains("OXCCL_ALGO"), "{e}");
        assert!(Config::new().resolve_with(env(&[("OXCCL_TIMEOUT", "0")])).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("NaN").is_err());
    }
}
