//! The settings of the observability tools: the flight recorder (`OXCCL_FR_SIZE`,
//! `OXCCL_FR_DIR`), the profiler (`OXCCL_PROFILE`) and the log (`OXCCL_LOG`).

use std::path::PathBuf;

pub use super::parse::log_directives;
pub use super::profile::ProfileSettings;

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
