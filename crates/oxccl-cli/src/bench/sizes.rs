//! Message sizes: parsing `8`, `64K`, `256M`, `1G` (binary multiples, like nccl-tests),
//! printing them back, and the geometric sweep `-b MIN -e MAX -f FACTOR`.

/// Parses a size in bytes: a whole number with an optional binary suffix `K`, `M`, `G`, `T`
/// (case-insensitive, optionally followed by `B` or `iB`): `8`, `64K`, `256M`, `1GiB`.
///
/// # Errors
/// A message saying what was wrong and what is accepted (for clap to show).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (digits, shift) = match body.char_indices().last() {
        Some((i, 'k')) => (&body[..i], 10),
        Some((i, 'm')) => (&body[..i], 20),
        Some((i, 'g')) => (&body[..i], 30),
        Some((i, 't')) => (&body[..i], 40),
        _ => (body, 0),
    };
    let digits = digits.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "`{s}` is not a size; use a whole number of bytes with an optional K, M or G suffix (8, 64K, 256M)"
        ));
    }
    let n: usize = digits.parse().map_err(|_| format!("`{s}` is too large"))?;
    n.checked_mul(1usize << shift).ok_or_else(|| format!("`{s}` is too large"))
}

/// Formats a byte count compactly with binary suffixes, the inverse of [`parse_size`] for
/// round sizes (`65536` → `64K`, `1000` → `1000`).
pub fn format_size(bytes: usize) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "T"), (30, "G"), (20, "M"), (10, "K")];
    for (shift, unit) in UNITS {
        let scale = 1usize << shift;
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// The sizes of a sweep: `min`, `min*factor`, `min*factor²`, … up to and including `max`.
///
/// # Errors
/// When `min > max` or `factor < 2` (a factor of 1 would never reach `max`).
pub fn sweep(min: usize, max: usize, factor: usize) -> Result<Vec<usize>, String> {
    if min > max {
        return Err(format!(
            "the minimum size ({}) is larger than the maximum ({}); check -b and -e",
            format_size(min),
            format_size(max)
        ));
    }
    if factor < 2 {
        return Err(format!("the size factor must be at least 2 (got {factor}); check -f"));
    }
    let mut out = vec![min];
    let mut s = min;
    // A minimum of 0 stays 0 however often it is multiplied: step on to 1 byte then.
    while let Some(next) = s.checked_mul(factor).map(|n| n.max(s + 1)) {
        if next > max {
            break;
        }
        out.push(next);
        s = next;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_suffixed_sizes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4KB"), Ok(4096));
        assert_eq!(parse_size(" 16 "), Ok(16));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn rejects_garbage_with_a_hint() {
        for bad in ["", "K", "1.5M", "-8", "12X", "M4", "ten"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains("64K") || e.contains("too large"), "{bad}: {e}");
        }
        assert!(parse_size("99999999999999999999999").unwrap_err().contains("too large"));
        assert!(parse_size("20000000000000T").unwrap_err().contains("too large"));
    }

    #[test]
    fn formats_round_sizes_with_suffixes() {
        assert_eq!(format_size(8), "8");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(65536), "64K");
        assert_eq!(format_size(3 << 20), "3M");
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(1536), "1536");
        for s in ["8", "64K", "256M", "2G"] {
            assert_eq!(format_size(parse_size(s).unwrap()), s);
        }
    }

    #[test]
    fn sweeps_are_geometric_and_inclusive() {
        assert_eq!(sweep(8, 64, 2), Ok(vec![8, 16, 32, 64]));
        assert_eq!(sweep(8, 100, 4), Ok(vec![8, 32]));
        assert_eq!(sweep(1024, 1024, 2), Ok(vec![1024]));
        assert_eq!(sweep(0, 4, 2), Ok(vec![0, 1, 2, 4]));
        assert_eq!(sweep(usize::MAX / 2, usize::MAX, 4), Ok(vec![usize::MAX / 2]));
        assert!(sweep(64, 8, 2).unwrap_err().contains("-b"));
        assert!(sweep(8, 64, 1).unwrap_err().contains("-f"));
    }
}
