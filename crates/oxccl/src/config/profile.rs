//! [`ProfileSettings`]: what the profiler does (`OXCCL_PROFILE`), and the syntax that
//! sets it.

use std::path::PathBuf;

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
