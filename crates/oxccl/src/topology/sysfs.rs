//! [`Sysfs`]: the root that every topology reader reads `/sys` and `/proc` under (`/` on a
//! real machine; tests build a fake tree).

use std::path::{Path, PathBuf};

/// Where the kernel's files are read from: `/` on a real machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs { root: PathBuf::from("/") }
    }
}

impl Sysfs {
    /// The kernel's files under `root` instead of `/` (for tests).
    pub fn at(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// `path` (absolute, as on a real machine) under this root.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// The trimmed contents of a small file, if it can be read.
    pub fn read(&self, path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
    }

    /// The entries of a directory, sorted by name (empty when it does not exist).
    pub fn entries(&self, dir: &str) -> Vec<(String, PathBuf)> {
        let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(self.path(dir))
            .map(|rd| rd.flatten().map(|e| (e.file_name().to_string_lossy().into_owned(), e.path())).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}
