//! The measured machine costs the selector's model reads: latency α, bandwidth and
//! per-message overhead and crowded wait per transport, TCP's acknowledgement, the step
//! cost of the shared-memory collectives (a CPU per rank, and two ranks on one CPU), and the
//! local copy and reduction throughputs. `oxccl tune` measures them and writes a profile file;
//! `OXCCL_TUNE_FILE` loads one. Without one, [`Profile::default`] holds the values `oxccl
//! tune` measured on the project's reference machine (2-core VM, see [`Profile::default`]).
//!
//! Bandwidth depends on the message size, as in Kielmann et al.'s parameterized LogP: a
//! message that fits a core's cache (`cache_kib`, the per-core L2) moves at `cached_gbps`,
//! a larger one streams from memory at `gbps`. Measurements: docs/selector.md.
//!
//! The file is `key = value` lines (`#` starts a comment); every key is optional and
//! overrides the default (a link's `gbps` given alone stands for its `cached_gbps` too):
//!
//! ```text
//! # oxccl tune, host node7, 2026-11-25
//! shm.alpha_us = 10         # an exchange between two ranks over the shared-memory rings
//! shm.gbps = 1.5            # their bandwidth in exchanges larger than the cache, GB/s
//! shm.cached_gbps = 1.5     # ... and in exchanges that fit it
//! shm.overhead_us = 0.6     # the sender's time per message when messages stream one way
//! shm.wait_us = 1.6         # the CPU time a message takes when ranks share CPUs
//! tcp.alpha_us = 15
//! tcp.gbps = 1.5
//! tcp.cached_gbps = 2.2
//! tcp.oneway_gbps = 6.5     # one way, no exchange (a tree's rounds), in the cache
//! tcp.oneway_alpha_us = 5   # the latency of such a message (half a ping-pong)
//! tcp.overhead_us = 2.8
//! tcp.ack_us = 2.2          # what a message costs more when nothing comes back (0 allowed)
//! tcp.wait_us = 4
//! memory.alpha_us = 4.7     # the in-process transport of the `local` backend
//! memory.gbps = 3
//! memory.cached_gbps = 3
//! memory.overhead_us = 0.42
//! memory.wait_us = 1.2
//! native.step_us = 0.23     # one step of the shared-memory collectives
//! native.crowded_step_us = 1.2  # ... with two ranks on one CPU
//! cache_kib = 512           # the largest message that moves at a link's cached bandwidth
//! copy.gbps = 11            # one core's memcpy past the cache
//! copy.cached_gbps = 40     # ... and within it
//! reduce.gbps = 6.3         # one core combining two f32 sources into a third
//! reduce.cached_gbps = 12
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The cost of one kind of link: `alpha + bytes / bandwidth` for a message someone waits
/// for (the bandwidth of its size, see [`LinkCost::transfer`]), `overhead` of CPU time per
/// message when messages stream one way (LogP's `o`: the sender does not wait for the
/// receiver).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCost {
    /// Latency of one message, in seconds, measured in exchanges (both ranks send at once).
    pub alpha: f64,
    /// Latency of one message that moves one way (its receiver sends nothing meanwhile), in
    /// seconds: half a ping-pong's round trip.
    pub oneway_alpha: f64,
    /// Bandwidth of messages larger than the cache, in bytes per second.
    pub bandwidth: f64,
    /// Bandwidth of messages that fit the cache ([`Profile::cache`]), in bytes per second.
    pub cached_bandwidth: f64,
    /// Bandwidth of messages that fit the cache when they move one way (the receiver sends
    /// nothing meanwhile, as in a tree's rounds), in bytes per second. The two bandwidths
    /// above are measured in exchanges, both ranks sending at once, which on a host with
    /// a CPU per rank share each CPU between the rank's sending and its receiving.
    pub oneway_bandwidth: f64,
    /// CPU time per message of a one-way stream, in seconds.
    pub overhead: f64,
    /// Seconds a message costs more when its connection carries nothing back within the
    /// operation (a ring's, where every rank sends to its successor only): TCP then
    /// acknowledges it with a segment of its own as soon as it is read, where data going
    /// back would have carried the acknowledgement (a ping-pong, an exchange). 0 for the
    /// links without acknowledgements (the shared-memory rings, the in-process transport).
    pub ack: f64,
    /// The CPU time a message takes in all when the ranks outnumber the CPUs, in seconds:
    /// its sender's and receiver's system calls, and the switches between ranks whose waits
    /// yield (a quarter of an 8-byte exchange between two ranks on one CPU, see
    /// the selector's cost model).
    pub wait: f64,
}

impl LinkCost {
    /// Seconds the bytes of one `bytes`-byte message take on this link (α not included):
    /// at the cached bandwidth up to `cache` bytes, at the streaming bandwidth above.
    pub fn transfer(&self, bytes: f64, cache: f64) -> f64 {
        bytes / if bytes <= cache { self.cached_bandwidth } else { self.bandwidth }
    }

    /// The latency of a message that moves one way: never above an exchange's.
    pub fn alpha_oneway(&self) -> f64 {
        self.oneway_alpha.min(self.alpha)
    }

    /// [`LinkCost::transfer`] for a message that moves one way: at the one-way bandwidth up
    /// to half of `cache` (the size `oxccl tune` measures it at; never below the exchange's
    /// rate), above as an exchange (there memory is the limit).
    pub fn transfer_oneway(&self, bytes: f64, cache: f64) -> f64 {
        if bytes <= cache / 2.0 {
            bytes / self.oneway_bandwidth.max(self.cached_bandwidth)
        } else {
            self.transfer(bytes, cache)
        }
    }
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
    /// The same step with two ranks on one CPU (waits that yield, as on oversubscribed
    /// hosts), in seconds: both ranks must be switched in before a step completes.
    pub crowded_step: f64,
    /// The largest message, in bytes, that moves at a link's cached bandwidth (the per-core
    /// L2 cache where `oxccl tune` can read it).
    pub cache: f64,
    /// One core's copy bandwidth past the cache, bytes per second.
    pub copy: f64,
    /// One core's copy bandwidth within the cache, bytes per second.
    pub cached_copy: f64,
    /// One core's reduction throughput (two sources into a destination) past the cache,
    /// bytes per second.
    pub reduce: f64,
    /// The same within the cache, bytes per second.
    pub cached_reduce: f64,
    /// Where the values came from (a file, or the built-in defaults).
    pub source: String,
}

impl Default for Profile {
    /// The values `oxccl tune --ranks 2` measured on the reference machine (a 2-core VM,
    /// 2026-11-25). A machine unlike it is better served by its own profile. Where each
    /// value comes from: docs/selector.md.
    fn default() -> Self {
        Profile {
            shm: LinkCost {
                alpha: 0.98e-6,
                oneway_alpha: 0.98e-6,
                bandwidth: 2.3e9,
                cached_bandwidth: 8.4e9,
                oneway_bandwidth: 8.4e9,
                overhead: 0.55e-6,
                ack: 0.0,
                wait: 1.74e-6,
            },
            tcp: LinkCost {
                alpha: 15.0e-6,
                oneway_alpha: 15.0e-6,
                bandwidth: 1.55e9,
                cached_bandwidth: 2.5e9,
                oneway_bandwidth: 2.5e9,
                overhead: 2.7e-6,
                ack: 2.15e-6,
                wait: 4.58e-6,
            },
            memory: LinkCost {
                alpha: 4.3e-6,
                oneway_alpha: 4.3e-6,
                bandwidth: 3.7e9,
                cached_bandwidth: 10.0e9,
                oneway_bandwidth: 10.0e9,
                overhead: 0.46e-6,
                ack: 0.0,
                wait: 1.17e-6,
            },
            native_step: 0.17e-6,
            // Fitted to the step measured with 4 ranks on its 2 cores (docs/selector.md).
            crowded_step: 1.89e-6,
            cache: 512.0 * 1024.0,
            copy: 11.4e9,
            cached_copy: 53.7e9,
            reduce: 6.3e9,
            cached_reduce: 24.7e9,
            source: "built-in defaults (reference machine)".into(),
        }
    }
}

/// A key of older profiles, accepted and passed over (see [`Profile::parse`]).
const RETIRED_SWITCH: &str = "switch_us";

const KEYS: [&str; 29] = [
    "shm.alpha_us",
    "shm.oneway_alpha_us",
    "shm.gbps",
    "shm.cached_gbps",
    "shm.oneway_gbps",
    "shm.overhead_us",
    "shm.wait_us",
    "tcp.alpha_us",
    "tcp.oneway_alpha_us",
    "tcp.gbps",
    "tcp.cached_gbps",
    "tcp.oneway_gbps",
    "tcp.overhead_us",
    "tcp.ack_us",
    "tcp.wait_us",
    "memory.alpha_us",
    "memory.oneway_alpha_us",
    "memory.gbps",
    "memory.cached_gbps",
    "memory.oneway_gbps",
    "memory.overhead_us",
    "memory.wait_us",
    "native.step_us",
    "native.crowded_step_us",
    "cache_kib",
    "copy.gbps",
    "copy.cached_gbps",
    "reduce.gbps",
    "reduce.cached_gbps",
];

impl Profile {
    /// Seconds per byte of copying a buffer of `bytes` (within the cache or past it).
    pub fn copy_time(&self, bytes: f64) -> f64 {
        1.0 / if bytes <= self.cache { self.cached_copy } else { self.copy }
    }

    /// Seconds per byte of combining buffers of `bytes`.
    pub fn reduce_time(&self, bytes: f64) -> f64 {
        1.0 / if bytes <= self.cache { self.cached_reduce } else { self.reduce }
    }

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

    /// Where `oxccl tune --save` keeps this host's profile, which the `cpu` backend loads
    /// when `OXCCL_TUNE_FILE` is not set: `$XDG_CACHE_HOME/oxccl/tune-HOST.txt`, else
    /// `$HOME/.cache/oxccl/tune-HOST.txt` (`None` without either variable, or without a
    /// host name).
    pub fn host_cache_path() -> Option<PathBuf> {
        Profile::cache_path_with(|k| std::env::var(k).ok(), &crate::topology::host::name()?)
    }

    /// [`Profile::host_cache_path`] from the variables `get` reads, for host `host`.
    fn cache_path_with(get: impl Fn(&str) -> Option<String>, host: &str) -> Option<PathBuf> {
        let host: String =
            host.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
        if host.is_empty() || host.starts_with('.') {
            return None;
        }
        let dir = match get("XDG_CACHE_HOME").filter(|v| Path::new(v).is_absolute()) {
            Some(d) => PathBuf::from(d),
            None => PathBuf::from(get("HOME").filter(|v| Path::new(v).is_absolute())?).join(".cache"),
        };
        Some(dir.join("oxccl").join(format!("tune-{host}.txt")))
    }

    /// The profile of this host when `OXCCL_TUNE_FILE` names none: the one `oxccl tune
    /// --save` cached ([`Profile::host_cache_path`]), else the built-in defaults. A cached
    /// file that no longer parses (written by another version) is passed over with a warning.
    pub fn for_this_host() -> Profile {
        let Some(path) = Profile::host_cache_path().filter(|p| p.is_file()) else { return Profile::default() };
        let parsed = std::fs::read_to_string(&path).map_err(|e| e.to_string()).and_then(|t| Profile::parse(&t));
        match parsed {
            Ok(mut p) => {
                p.source = format!("{} (cached by `oxccl tune --save`)", path.display());
                p
            }
            Err(why) => {
                tracing::warn!(
                    "passing over this host's cached profile {}: {why}; rerun `oxccl tune --save`",
                    path.display()
                );
                Profile::default()
            }
        }
    }

    /// Parses the `key = value` form (see the module documentation); keys left out keep
    /// their defaults. `switch_us`, which older versions wrote (the cost of handing a CPU
    /// from one waiting rank to another), is accepted and passed over, so their profiles
    /// still load.
    ///
    /// # Errors
    /// A message naming the line and what is wrong with it.
    pub fn parse(text: &str) -> std::result::Result<Profile, String> {
        let mut p = Profile::default();
        // The keys the file sets: some values follow others the file sets (below).
        let mut seen: Vec<&str> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let (key, value) =
                line.split_once('=').ok_or_else(|| format!("line {}: `{line}` is not `key = value`", i + 1))?;
            let (key, value) = (key.trim(), value.trim());
            // An acknowledgement may cost nothing; every other value is a time or a rate.
            let (in_range, what): (fn(f64) -> bool, _) = match key {
                "tcp.ack_us" => (|v| v >= 0.0, "a number of 0 or more"),
                _ => (|v| v > 0.0, "a positive number"),
            };
            let v: f64 = value
                .parse()
                .ok()
                .filter(|&v: &f64| v.is_finite() && in_range(v))
                .ok_or_else(|| format!("line {}: {key} = `{value}` is not {what}", i + 1))?;
            let us = v * 1e-6;
            let gbps = v * 1e9;
            match key {
                "shm.alpha_us" => p.shm.alpha = us,
                "shm.oneway_alpha_us" => p.shm.oneway_alpha = us,
                "shm.gbps" => p.shm.bandwidth = gbps,
                "shm.cached_gbps" => p.shm.cached_bandwidth = gbps,
                "shm.oneway_gbps" => p.shm.oneway_bandwidth = gbps,
                "shm.overhead_us" => p.shm.overhead = us,
                "shm.wait_us" => p.shm.wait = us,
                "tcp.alpha_us" => p.tcp.alpha = us,
                "tcp.oneway_alpha_us" => p.tcp.oneway_alpha = us,
                "tcp.gbps" => p.tcp.bandwidth = gbps,
                "tcp.cached_gbps" => p.tcp.cached_bandwidth = gbps,
                "tcp.oneway_gbps" => p.tcp.oneway_bandwidth = gbps,
                "tcp.overhead_us" => p.tcp.overhead = us,
                "tcp.ack_us" => p.tcp.ack = us,
                "tcp.wait_us" => p.tcp.wait = us,
                "memory.alpha_us" => p.memory.alpha = us,
                "memory.oneway_alpha_us" => p.memory.oneway_alpha = us,
                "memory.gbps" => p.memory.bandwidth = gbps,
                "memory.cached_gbps" => p.memory.cached_bandwidth = gbps,
                "memory.oneway_gbps" => p.memory.oneway_bandwidth = gbps,
                "memory.overhead_us" => p.memory.overhead = us,
                "memory.wait_us" => p.memory.wait = us,
                "native.step_us" => p.native_step = us,
                "native.crowded_step_us" => p.crowded_step = us,
                // Written by versions that priced crowded steps from it: those are now
                // measured (`native.crowded_step_us`, each link's `wait_us`).
                RETIRED_SWITCH => {}
                "cache_kib" => p.cache = v * 1024.0,
                "copy.gbps" => p.copy = gbps,
                "copy.cached_gbps" => p.cached_copy = gbps,
                "reduce.gbps" => p.reduce = gbps,
                "reduce.cached_gbps" => p.cached_reduce = gbps,
                other => return Err(format!("line {}: unknown key `{other}`; known: {}", i + 1, KEYS.join(", "))),
            }
            seen.push(key);
        }
        for (name, link) in [("shm", &mut p.shm), ("tcp", &mut p.tcp), ("memory", &mut p.memory)] {
            let set = |field: &str| seen.iter().any(|k| k.strip_prefix(name) == Some(field));
            // A link's `gbps` alone stands for every size; what moves one way, as in
            // exchanges unless the file says otherwise.
            if set(".gbps") && !set(".cached_gbps") {
                link.cached_bandwidth = link.bandwidth;
            }
            if !set(".oneway_gbps") {
                link.oneway_bandwidth = link.cached_bandwidth;
            }
            if !set(".oneway_alpha_us") {
                link.oneway_alpha = link.alpha;
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
            us(self.shm.oneway_alpha),
            gbps(self.shm.bandwidth),
            gbps(self.shm.cached_bandwidth),
            gbps(self.shm.oneway_bandwidth),
            us(self.shm.overhead),
            us(self.shm.wait),
            us(self.tcp.alpha),
            us(self.tcp.oneway_alpha),
            gbps(self.tcp.bandwidth),
            gbps(self.tcp.cached_bandwidth),
            gbps(self.tcp.oneway_bandwidth),
            us(self.tcp.overhead),
            us(self.tcp.ack),
            us(self.tcp.wait),
            us(self.memory.alpha),
            us(self.memory.oneway_alpha),
            gbps(self.memory.bandwidth),
            gbps(self.memory.cached_bandwidth),
            gbps(self.memory.oneway_bandwidth),
            us(self.memory.overhead),
            us(self.memory.wait),
            us(self.native_step),
            us(self.crowded_step),
            self.cache / 1024.0,
            gbps(self.copy),
            gbps(self.cached_copy),
            gbps(self.reduce),
            gbps(self.cached_reduce),
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
    fn the_host_cache_lives_under_the_users_cache_directory() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
        };
        let xdg = Profile::cache_path_with(env(&[("XDG_CACHE_HOME", "/c"), ("HOME", "/h")]), "node7");
        assert_eq!(xdg, Some(PathBuf::from("/c/oxccl/tune-node7.txt")));
        let home = Profile::cache_path_with(env(&[("HOME", "/h")]), "node7");
        assert_eq!(home, Some(PathBuf::from("/h/.cache/oxccl/tune-node7.txt")));
        // A relative XDG_CACHE_HOME is ignored (as the XDG spec says); odd host characters
        // cannot leave the directory.
        let rel = Profile::cache_path_with(env(&[("XDG_CACHE_HOME", "c"), ("HOME", "/h")]), "a/../b");
        assert_eq!(rel, Some(PathBuf::from("/h/.cache/oxccl/tune-a_.._b.txt")));
        assert_eq!(Profile::cache_path_with(env(&[]), "node7"), None);
        assert_eq!(Profile::cache_path_with(env(&[("HOME", "/h")]), ""), None);
    }

    #[test]
    fn the_file_form_round_trips_and_keys_left_out_keep_defaults() {
        let p = Profile {
            tcp: LinkCost {
                alpha: 31e-6,
                oneway_alpha: 12e-6,
                bandwidth: 1.25e9,
                cached_bandwidth: 2.5e9,
                oneway_bandwidth: 7.5e9,
                overhead: 3e-6,
                ack: 1.5e-6,
                wait: 6e-6,
            },
            native_step: 0.75e-6,
            crowded_step: 2.5e-6,
            cache: 1024.0 * 1024.0,
            ..Profile::default()
        };
        let back = Profile::parse(&p.to_text("measured\nby a test")).unwrap();
        assert!((back.tcp.alpha - 31e-6).abs() < 1e-12 && (back.tcp.bandwidth - 1.25e9).abs() < 1.0);
        assert!((back.tcp.overhead - 3e-6).abs() < 1e-12 && (back.tcp.ack - 1.5e-6).abs() < 1e-12);
        // An acknowledgement that costs nothing is a value, not a malformed line.
        assert_eq!(Profile::parse("tcp.ack_us = 0").unwrap().tcp.ack, 0.0);
        assert_eq!(Profile::parse("").unwrap().tcp.ack, Profile::default().tcp.ack);
        assert!((back.native_step - 0.75e-6).abs() < 1e-12 && (back.crowded_step - 2.5e-6).abs() < 1e-12);
        assert!((back.tcp.cached_bandwidth - 2.5e9).abs() < 1.0 && (back.tcp.wait - 6e-6).abs() < 1e-12);
        assert!((back.tcp.oneway_bandwidth - 7.5e9).abs() < 1.0 && (back.tcp.oneway_alpha - 12e-6).abs() < 1e-12);
        let lat = Profile::parse("tcp.alpha_us = 40\n").unwrap();
        assert!((lat.tcp.alpha - 40e-6).abs() < 1e-12, "{}", lat.tcp.alpha);
        assert_eq!(lat.tcp.oneway_alpha, lat.tcp.alpha, "one way follows the exchange's α");
        assert_eq!(back.cache, 1024.0 * 1024.0);
        let partial = Profile::parse("# only one\n tcp.gbps = 10 # fast network\n\n").unwrap();
        assert_eq!(partial.tcp.bandwidth, 10e9);
        assert_eq!(partial.tcp.cached_bandwidth, 10e9, "a network's rate alone holds for every size");
        assert_eq!(partial.tcp.oneway_bandwidth, 10e9, "and one way");
        let both = Profile::parse("tcp.cached_gbps = 3\ntcp.gbps = 1\n").unwrap();
        assert_eq!((both.tcp.cached_bandwidth, both.tcp.bandwidth), (3e9, 1e9));
        assert_eq!(partial.shm, Profile::default().shm);
        // An older profile's retired key loads and changes nothing; it is written no more.
        let old = Profile::parse("switch_us = 0.78\ntcp.alpha_us = 40\n").unwrap();
        assert_eq!(old, lat);
        assert!(!p.to_text("").contains("switch"));
    }

    #[test]
    fn messages_that_fit_the_cache_move_at_the_cached_bandwidth() {
        let link = LinkCost {
            alpha: 1e-6,
            oneway_alpha: 1e-6,
            bandwidth: 1e9,
            cached_bandwidth: 4e9,
            oneway_bandwidth: 8e9,
            overhead: 1e-6,
            ack: 0.0,
            wait: 0.0,
        };
        let cache = 1024.0;
        assert_eq!(link.transfer(1024.0, cache), 1024.0 / 4e9);
        assert_eq!(link.transfer(1025.0, cache), 1025.0 / 1e9);
        // One way: twice as fast within half the cache (measured there); past it, as an
        // exchange.
        assert_eq!(link.transfer_oneway(512.0, cache), 512.0 / 8e9);
        assert_eq!(link.transfer_oneway(513.0, cache), 513.0 / 4e9);
        assert_eq!(link.transfer_oneway(1025.0, cache), 1025.0 / 1e9);
        // Never slower than an exchange.
        let slow = LinkCost { oneway_bandwidth: 1e9, ..link };
        assert_eq!(slow.transfer_oneway(512.0, cache), link.transfer(512.0, cache));
        let p =
            Profile { cache, cached_copy: 40e9, copy: 10e9, cached_reduce: 20e9, reduce: 5e9, ..Profile::default() };
        assert_eq!((p.copy_time(1024.0), p.copy_time(2048.0)), (1.0 / 40e9, 1.0 / 10e9));
        assert_eq!((p.reduce_time(1024.0), p.reduce_time(2048.0)), (1.0 / 20e9, 1.0 / 5e9));
    }

    #[test]
    fn bad_files_are_errors_that_say_where() {
        for (text, says) in [
            ("shm.gbps 3", "line 1"),
            ("\nshm.gbps = fast", "line 2: shm.gbps"),
            ("tcp.gbps = -1", "positive"),
            ("tcp.gbps = inf", "positive"),
            ("tcp.gbps = 0", "positive"),
            ("tcp.ack_us = -1", "tcp.ack_us = `-1` is not a number of 0 or more"),
            ("nvlink.gbps = 900", "unknown key `nvlink.gbps`"),
        ] {
            let e = Profile::parse(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        let e = Profile::load(Path::new("/nonexistent/oxccl.tune")).unwrap_err();
        assert!(matches!(&e, Error::Config(m) if m.contains("OXCCL_TUNE_FILE") && m.contains("oxccl tune")), "{e}");
    }
}
