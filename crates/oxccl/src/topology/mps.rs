//! NVIDIA's Multi-Process Service (MPS): whether its control daemon runs for this user.
//!
//! Without MPS, processes that share one GPU take turns on it (time-slicing): a device copy
//! waits for the other processes' slices, which makes small staged operations many times
//! slower (measurements: docs/gpu.md). Several ranks on one GPU (a test box, a small job)
//! want MPS; a rank per GPU does not need it.
//!
//! The daemon is found by its control pipe, `control` in `CUDA_MPS_PIPE_DIRECTORY` (CUDA's
//! variable, read here as the CUDA driver reads it), default `/tmp/nvidia-mps`.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// What was found of MPS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mps {
    /// Whether the control daemon's pipe exists (the daemon runs).
    pub running: bool,
    /// The pipe directory looked in.
    pub pipe_dir: PathBuf,
}

impl Mps {
    /// Looks for the daemon's control pipe under `pipe_dir` (`CUDA_MPS_PIPE_DIRECTORY`'s
    /// value, or `None` for CUDA's default).
    pub fn find(pipe_dir: Option<&Path>) -> Mps {
        let pipe_dir = pipe_dir.map_or_else(|| PathBuf::from("/tmp/nvidia-mps"), Path::to_path_buf);
        let running = std::fs::symlink_metadata(pipe_dir.join("control")).is_ok();
        Mps { running, pipe_dir }
    }

    /// This process's view (`CUDA_MPS_PIPE_DIRECTORY` from the environment).
    pub fn detect() -> Mps {
        let dir = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").filter(|d| !d.is_empty()).map(PathBuf::from);
        Mps::find(dir.as_deref())
    }

    /// One line for `oxccl info`.
    pub fn describe(&self) -> String {
        if self.running {
            format!("running (control pipe in {}): ranks that share a GPU run on it together", self.pipe_dir.display())
        } else {
            format!(
                "not running (no control pipe in {}): ranks that share a GPU take turns on it, and each small \
                 device-buffer operation costs a few hundred µs; start it with `nvidia-cuda-mps-control -d` \
                 where several ranks use one GPU",
                self.pipe_dir.display()
            )
        }
    }
}
