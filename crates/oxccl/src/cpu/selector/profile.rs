//! The measured machine costs the selector's model reads: latency α, bandwidth and
//! per-message overhead per transport, the step cost of the shared-memory collectives, the
//! cost of switching a CPU between two ranks, and the local copy and reduction throughputs.
//! `oxccl tune` measures them and writes a profile file; `OXCCL_TUNE_FILE` loads one.
//! Without one, [`Profile::default`] holds the values `oxccl tune` measured on the project's
//! reference machine (2-core VM, see [`Profile::default`]).
//!
//! The file is `key = value` lines (`#` starts a comment); every key is optional and
//! overrides the default:
//!
//! ```text
//! # oxccl tune, host node7, 2026-11-25
//! shm.alpha_us = 10         # an exchange between two ranks over the shared-memory rings
//! shm.gbps = 1.5            # their bandwidth in such exchanges, GB/s
//! shm.overhead_us = 0.6     # the sender's time per message when messages stream one way
//! tcp.alpha_us = 15
//! tcp.gbps = 1.5
//! tcp.overhead_us = 2.8
//! memory.alpha_us = 4.7     # the in-process transport of the `local` backend
//! memory.gbps = 3
//! memory.overhead_us = 0.42
//! native.step_us = 0.23     # one step of the shared-memory collectives
//! switch_us = 0.78          # handing a CPU from one waiting rank to another
//! copy.gbps = 9             # one core's memcpy
//! reduce.gbps = 5.7         # one core combining two f32 sources into a third
//! ```

use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Error, Result};

/// The cost of one kind of link: `alpha + bytes / bandwidth` for a message someone waits
/// for, `overhead` of CPU time per message when messages stream one way (LogP's `o`: the
/// sender does not wait for the receiver).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCost {
    /// Latency of one message, in seconds.
    pub alpha: f64,
    /// Bandwidth, in bytes per second.
    pub bandwidth: f64,
    /// CPU time per message of a one-way stream, in seconds.
    pub overhead: f64,
}

/// Everything the cost model needs to know about a machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Frames over the shared-memory rings (through the progress thread).
    pub shm: LinkCost,
    /// Frames over TCP.
    pub tcp: LinkCost,
    /// Frames of the in-process transport (`local` backend).
    pub memory: LinkCost,
    /// One synchronized step of the shared-memory collectives, in seconds.
    pub native_step: f64,
    /// Handing a CPU from one waiting rank to another (a yield that lets the other run),
    /// in seconds: what every step costs per rank that must be scheduled in when the
    /// ranks outnumber the CPUs.
    pub switch: f64,
    /// One core's copy bandwidth, bytes per second.
    pub copy: f64,
    /// One core's reduction throughput (two sources into a destination), bytes per second.
    pub reduce: f64,
    /// Where the values came from (a file, or the built-in defaults).
    pub source: String,
}

impl Default for Profile {
    /// The values `oxccl tune --ranks 2` measured on the reference machine (a 2-core VM,
    /// 2026-11-25; the middle of three runs). A machine unlike it is better served by its
    /// own profile.
    fn default() -> Self {
        Profile {
            shm: LinkCost { alpha: 10.0e-6, bandwidth: 1.5e9, overhead: 0.6e-6 },
            tcp: LinkCost { alpha: 15.0e-6, bandwidth: 1.5e9, overhead: 2.8e-6 },
            memory: LinkCost { alpha: 4.7e-6, bandwidth: 3.0e9, overhead: 0.42e-6 },
            native_step: 0.23e-6,
            switch: 0.78e-6,
            copy: 9.0e9,
            reduce: 5.7e9,
            source: "built-in defaults (reference machine)".into(),
        }
    }
}

const KEYS: [&str; 13] = [
    "shm.alpha_us",
    "shm.gbps",
    "shm.overhead_us",
    "tcp.alpha_us",
    "tcp.gbps",
    "tcp.overhead_us",
    "memory.alpha_us",
    "memory.gbps",
    "memory.overhead_us",
    "native.step_us",
    "switch_us",
    "copy.gbps",
    "reduce.gbps",
];

impl Profile {
    /// Reads a profile file (`OXCCL_TUNE_FILE`).
    ///
    /// # Errors
    /// [`Error::Config`] naming `OXCCL_TUNE_FILE`, the file and what is wrong with it (it
    /// cannot be read, a line is malformed, a key is unknown, a value is not a positive
    /// number).
    pub fn load(path: &Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!(
                "OXCCL_TUNE_FILE={}: cannot read it: {e}; write one with `oxccl tune`",
                path.display()
            ))
        })?;
        let mut p =
            Profile::parse(&text).map_err(|why| Error::Config(format!("OXCCL_TUNE_FILE={}: {why}", path.display())))?;
        p.source = path.display().to_string();
        Ok(p)
    }

    /// Parses the `key = value` form (see the module documentation); keys left out keep
    /// their defaults.
    ///
    /// # Errors
    /// A message naming the line and what is wrong with it.
    pub fn parse(text: &str) -> std::result::Result<Profile, String> {
        let mut p = Profile::default();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let (key, value) =
                line.split_once('=').ok_or_else(|| format!("line {}: `{line}` is not `key = value`", i + 1))?;
            let (key, value) = (key.trim(), value.trim());
            let v: f64 = value
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("line {}: {key} = `{value}` is not a positive number", i + 1))?;
            let us = v * 1e-6;
            let gbps = v * 1e9;
            match key {
                "shm.alpha_us" => p.shm.alpha = us,
                "shm.gbps" => p.shm.bandwidth = gbps,
                "shm.overhead_us" => p.shm.overhead = us,
                "tcp.alpha_us" => p.tcp.alpha = us,
                "tcp.gbps" => p.tcp.bandwidth = gbps,
                "tcp.overhead_us" => p.tcp.overhead = us,
                "memory.alpha_us" => p.memory.alpha = us,
                "memory.gbps" => p.memory.bandwidth = gbps,
                "memory.overhead_us" => p.memory.overhead = us,
                "native.step_us" => p.native_step = us,
                "switch_us" => p.switch = us,
                "copy.gbps" => p.copy = gbps,
                "reduce.gbps" => p.reduce = gbps,
                other => return Err(format!("line {}: unknown key `{other}`; known: {}", i + 1, KEYS.join(", "))),
            }
        }
        Ok(p)
    }

    /// The profile in the file form, `comment` as its first line.
    pub fn to_text(&self, comment: &str) -> String {
        let mut s = String::new();
        for line in comment.lines() {
            let _ = writeln!(s, "# {line}");
        }
        let us = |x: f64| x * 1e6;
        let gbps = |x: f64| x / 1e9;
        let values = [
            us(self.shm.alpha),
            gbps(self.shm.bandwidth),
            us(self.shm.overhead),
            us(self.tcp.alpha),
            gbps(self.tcp.bandwidth),
            us(self.tcp.overhead),
            us(self.memory.alpha),
            gbps(self.memory.bandwidth),
            us(self.memory.overhead),
            us(self.native_step),
            us(self.switch),
            gbps(self.copy),
            gbps(self.reduce),
        ];
        for (k, v) in KEYS.iter().zip(values) {
            let _ = writeln!(s, "{k} = {v:.4}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_form_round_trips_and_keys_left_out_keep_defaults() {
        let p = Profile {
            tcp: LinkCost { alpha: 31e-6, bandwidth: 1.25e9, overhead: 3e-6 },
            native_step: 0.75e-6,
            switch: 4e-6,
            ..Profile::default()
        };
        let back = Profile::parse(&p.to_text("measured\nby a test")).unwrap();
        assert!((back.tcp.alpha - 31e-6).abs() < 1e-12 && (back.tcp.bandwidth - 1.25e9).abs() < 1.0);
        assert!((back.tcp.overhead - 3e-6).abs() < 1e-12 && (back.switch - 4e-6).abs() < 1e-12);
        assert!((back.native_step - 0.75e-6).abs() < 1e-12);
        let partial = Profile::parse("# only one\n tcp.gbps = 10 # fast network\n\n").unwrap();
        assert_eq!(partial.tcp.bandwidth, 10e9);
        assert_eq!(partial.shm, Profile::default().shm);
    }

    #[test]
    fn bad_files_are_errors_that_say_where() {
        for (text, says) in [
            ("shm.gbps 3", "line 1"),
            ("\nshm.gbps = fast", "line 2: shm.gbps"),
            ("tcp.gbps = -1", "positive"),
            ("tcp.gbps = inf", "positive"),
            ("nvlink.gbps = 900", "unknown key `nvlink.gbps`"),
        ] {
            let e = Profile::parse(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        let e = Profile::load(Path::new("/nonexistent/oxccl.tune")).unwrap_err();
        assert!(matches!(&e, Error::Config(m) if m.contains("OXCCL_TUNE_FILE") && m.contains("oxccl tune")), "{e}");
    }
}
