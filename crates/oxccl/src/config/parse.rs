//! One parser per kind of setting value. Every setting of a kind accepts the same grammar
//! (a size is a size everywhere), and every error says what is accepted; the caller adds
//! the variable's name and value.

use std::time::Duration;

/// Parses a byte size: a whole number with an optional binary unit, case-insensitive and
/// with optional space: `262144`, `256K`, `256KiB`, `256KB`, `1M`, `1MiB`, `4G`, `1T`, `512B`.
/// Units are powers of 1024 (as NCCL's buffer sizes and `ulimit` read them).
///
/// # Errors
/// A message saying what is accepted, or that the size does not fit.
pub fn size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("`{t}` is not a size; use e.g. 262144, 256K, 256KiB, 1M, 1MiB, 4G")),
    };
    if num.is_empty() {
        return Err(format!("`{t}` is not a size; use e.g. 262144, 256K, 256KiB, 1M, 1MiB, 4G"));
    }
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1usize.checked_shl(shift)?))
        .ok_or_else(|| format!("`{t}` does not fit in this machine's sizes"))
}

/// Writes a byte size the way [`size`] reads it, in the largest unit that divides it.
pub fn format_size(bytes: usize) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Parses `30`, `1.5`, `1.5s`, `250ms`, `100us`, `2m`, `1h` into a duration (bare numbers
/// are seconds).
///
/// # Errors
/// A message saying what is accepted.
pub fn duration(s: &str) -> Result<Duration, String> {
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

/// Parses a flag: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case).
///
/// # Errors
/// A message saying what is accepted.
pub fn flag(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("`{}` is not a flag; use 1 or 0 (also true/false, yes/no, on/off)", s.trim())),
    }
}

/// Parses a whole number in `min..=max`.
///
/// # Errors
/// A message saying what is accepted.
pub fn count(s: &str, min: u64, max: u64) -> Result<u64, String> {
    let t = s.trim();
    match t.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("`{t}` is not a whole number from {min} to {max}")),
    }
}

/// Parses a TCP port (1..=65535).
///
/// # Errors
/// A message saying what is accepted.
pub fn port(s: &str) -> Result<u16, String> {
    let t = s.trim();
    t.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| format!("`{t}` is not a port (1 to 65535)"))
}

/// Parses one of `choices` (pairs of accepted spelling and meaning): case-insensitive,
/// `-` read as `_`. Returns the meaning.
///
/// # Errors
/// A message listing the accepted spellings (the first spelling of each meaning).
pub fn choice(s: &str, choices: &[(&'static str, &'static str)]) -> Result<&'static str, String> {
    let norm = s.trim().to_ascii_lowercase().replace('-', "_");
    if let Some((_, meaning)) = choices.iter().find(|(spelling, _)| *spelling == norm) {
        return Ok(meaning);
    }
    let mut names: Vec<&str> = Vec::new();
    for (spelling, meaning) in choices {
        if spelling == meaning && !names.contains(spelling) {
            names.push(spelling);
        }
    }
    Err(format!("`{}` is not one of {}", s.trim(), names.join(", ")))
}

/// Parses `host:port` (a host name, an IPv4 address, or `[v6]`).
///
/// # Errors
/// A message saying what is accepted.
pub fn address(s: &str) -> Result<String, String> {
    let t = s.trim();
    let bad = || format!("`{t}` is not host:port (e.g. 10.0.0.1:29500 or node0:29500)");
    let (host, p) = t.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port(p).is_err() {
        return Err(bad());
    }
    Ok(t.to_string())
}

/// Parses `NAME=value;NAME=value` (empty items are skipped).
///
/// # Errors
/// A message naming the item that is not `NAME=value`.
pub fn assignments(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(';')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            item.split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .map(|(k, v)| (k.trim().to_string(), v.to_string()))
                .ok_or_else(|| format!("`{item}` is not NAME=value (items are separated by `;`)"))
        })
        .collect()
}

/// `n` bytes as the settings write sizes, with the exact count when they differ:
/// `4M (4194304 bytes)`, `1000 bytes`.
pub fn format_size_exact(n: usize) -> String {
    let short = format_size(n);
    if short == n.to_string() {
        format!("{n} bytes")
    } else {
        format!("{short} ({n} bytes)")
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
