//! The geometric sweep of message sizes `-b MIN -e MAX -f FACTOR`. The sizes themselves
//! (`8`, `64K`, `256M`, `1GiB`: binary multiples, like nccl-tests) are read and written by
//! the library's [`size`](oxccl::config::parse::size) and [`format_size`], the grammar of
//! every size setting.

use oxccl::config::parse::format_size;

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
    use oxccl::config::parse;

    use super::*;

    /// The sizes `-b` and `-e` have always accepted, as the library's parser reads them.
    #[test]
    fn the_options_read_sizes_as_before() {
        let size = parse::size;
        assert_eq!(size("8"), Ok(8));
        assert_eq!(size("64K"), Ok(64 << 10));
        assert_eq!(size("64k"), Ok(64 << 10));
        assert_eq!(size("256M"), Ok(256 << 20));
        assert_eq!(size("1G"), Ok(1 << 30));
        assert_eq!(size("1GiB"), Ok(1 << 30));
        assert_eq!(size("4KB"), Ok(4096));
        assert_eq!(size("2T"), Ok(2 << 40));
        assert_eq!(size("64 K"), Ok(64 << 10));
        assert_eq!(size(" 16 "), Ok(16));
        assert_eq!(size("0"), Ok(0));
        for bad in ["", "K", "1.5M", "-8", "12X", "M4", "ten", "8iB"] {
            assert!(size(bad).unwrap_err().contains("is not a size"), "{bad}");
        }
        for big in ["99999999999999999999999", "20000000000000T"] {
            assert!(size(big).unwrap_err().contains("does not fit"), "{big}");
        }
        for s in ["8", "1000", "64K", "256M", "2G"] {
            assert_eq!(format_size(size(s).unwrap()), s);
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
