//! Where a buffer lives.

use std::fmt;

/// The memory a buffer lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory.
    #[default]
    Cpu,
    /// CUDA device memory on the GPU with this ordinal.
    Cuda(u32),
    /// ROCm/HIP device memory on the GPU with this ordinal.
    Rocm(u32),
}

impl Device {
    /// The GPU's ordinal (`None` for the host).
    pub fn ordinal(&self) -> Option<u32> {
        match self {
            Device::Cpu => None,
            Device::Cuda(n) | Device::Rocm(n) => Some(*n),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = crate::error::Error;

    /// `cpu`, `cuda:N`, `rocm:N` (the forms [`Display`](fmt::Display) writes), `hip:N` for
    /// `rocm:N`; a bare `cuda`, `rocm` or `hip` is ordinal 0. Case and surrounding spaces are
    /// ignored.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming the accepted forms.
    fn from_str(s: &str) -> Result<Device, crate::error::Error> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || crate::error::Error::invalid(format!("`{s}` is not a device: expected cpu, cuda:N or rocm:N"));
        let (kind, ordinal) = match t.split_once(':') {
            Some((k, n)) => (k, n.trim().parse::<u32>().map_err(|_| bad())?),
            None => (t.as_str(), 0),
        };
        match kind.trim() {
            "cpu" if !t.contains(':') => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(ordinal)),
            "rocm" | "hip" => Ok(Device::Rocm(ordinal)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Rocm(n) => write!(f, "rocm:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Device;

    #[test]
    fn parses_what_it_writes() {
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(7), Device::Rocm(3)] {
            assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
        }
        assert_eq!(" CUDA ".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("hip:2".parse::<Device>().unwrap(), Device::Rocm(2));
        for bad in ["", "gpu", "cuda:", "cuda:-1", "cpu:0", "cuda:x"] {
            let e = bad.parse::<Device>().unwrap_err().to_string();
            assert!(e.contains("cuda:N"), "{bad}: {e}");
        }
    }
}
