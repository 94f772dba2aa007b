//! The settings of the observability tools: the flight recorder (`OXCCL_FR_SIZE`,
//! `OXCCL_FR_DIR`), the profiler (`OXCCL_PROFILE`) and the log (`OXCCL_LOG`).

use std::path::PathBuf;

/// The settings of the observability tools (see the registry: `OXCCL_FR_SIZE`,
/// `OXCCL_FR_DIR`, `OXCCL_PROFILE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfSettings {
    /// Operations each communicator's flight recorder keeps (0: none kept, no dumps).
    pub flight_records: usize,
    /// Where dumps go (`None`: the system's temporary directory).
    pub dump_dir: Option<PathBuf>,
    /// What the profiler does (off by default).
    pub profile: ProfileSettings,
}

/// `OXCCL_PROFILE`: `summary` prints each communicator's statistics when it is dropped (or
/// the process exits); `trace:DIR` writes a Chrome trace per rank and communicator into DIR;
/// both together as `summary,trace:DIR`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileSettings {
    /// Print the statistics at the end.
    pub summary: bool,
    /// Write Chrome traces here.
    pub trace_dir: Option<PathBuf>,
}

impl ProfileSettings {
    /// Whether the profiler records anything.
    pub fn enabled(&self) -> bool {
        self.summary || self.trace_dir.is_some()
    }

    /// Parses the `OXCCL_PROFILE` syntax.
    ///
    /// # Errors
    /// What is wrong with `text` (the caller names the variable).
    pub fn parse(text: &str) -> Result<ProfileSettings, String> {
        let mut p = ProfileSettings::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once(':') {
                None if part == "summary" => p.summary = true,
                None if part == "off" => {}
                Some(("trace", dir)) if !dir.trim().is_empty() => p.trace_dir = Some(PathBuf::from(dir.trim())),
                _ => {
                    return Err(format!(
                        "`{part}` is not a profiler mode; use `summary`, `trace:DIR` or `summary,trace:DIR`"
                    ))
                }
            }
        }
        Ok(p)
    }
}

impl Default for PerfSettings {
    fn default() -> Self {
        PerfSettings { flight_records: 2000, dump_dir: None, profile: ProfileSettings::default() }
    }
}

impl PerfSettings {
    /// `OXCCL_FR_SIZE` and `OXCCL_FR_DIR` from the environment, each where it is valid
    /// (its default where not: [`Config`](super::Config) is what reports a bad value).
    pub fn from_env_or_default() -> PerfSettings {
        use super::registry::{FR_DIR, FR_SIZE, PROFILE};
        let d = PerfSettings::default();
        PerfSettings {
            flight_records: FR_SIZE
                .from_env()
                .ok()
                .flatten()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(d.flight_records),
            dump_dir: FR_DIR.from_env().ok().flatten().map(PathBuf::from),
            profile: PROFILE
                .from_env()
                .ok()
                .flatten()
                .and_then(|v| ProfileSettings::parse(&v).ok())
                .unwrap_or_default(),
        }
    }

    /// The directory dumps are written to.
    pub fn dump_dir(&self) -> PathBuf {
        self.dump_dir.clone().unwrap_or_else(std::env::temp_dir)
    }
}

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// The `OXCCL_LOG` value as `tracing` filter directives over oxccl's own targets: a bare
/// level applies to every `oxccl` target (`debug` becomes `oxccl=debug`), `target=level`
/// to one module path of oxccl and what is below it.
///
/// # Errors
/// What is wrong with `text` (the caller names the variable): an unknown level, or a target
/// outside oxccl.
pub fn log_directives(text: &str) -> Result<String, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (target, level) = match part.split_once('=') {
            Some((t, l)) => (t.trim(), l.trim()),
            None => ("oxccl", part),
        };
        let level = level.to_ascii_lowercase();
        if !LEVELS.contains(&level.as_str()) {
            return Err(format!("`{level}` is not a level; use one of {}", LEVELS.join(", ")));
        }
        if target != "oxccl" && !target.starts_with("oxccl::") {
            return Err(format!("`{target}` is not one of oxccl's targets (`oxccl` or `oxccl::...`)"));
        }
        out.push(format!("{target}={level}"));
    }
    if out.is_empty() {
        return Err("no level given; use e.g. `warn` or `warn,oxccl::cpu::selector=debug`".into());
    }
    Ok(out.join(","))
}
