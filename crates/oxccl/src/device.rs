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

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Rocm(n) => write!(f, "rocm:{n}"),
        }
    }
}
