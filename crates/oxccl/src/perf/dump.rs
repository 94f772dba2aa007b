//! The file form of a flight recorder: one JSON document per rank and communicator,
//! written by [`FlightRecorder::dump_to`](super::FlightRecorder::dump_to) and read back by
//! `oxccl trace analyze` ([`Dump::read`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where an operation stood when the dump was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    /// Submitted behind an operation of the same communicator that had not finished.
    Queued,
    /// Running (or waiting for peers).
    Started,
    /// Finished successfully.
    Completed,
    /// Finished with an error.
    Failed,
}

/// One operation of a communicator, as the flight recorder saw it. Times are microseconds
/// since the communicator was created on this rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpRecord {
    /// The operation's position on its communicator (0, 1, ...), counted by every rank
    /// alike when they issue the same operations.
    pub seq: u64,
    /// The operation (`all_reduce`, `broadcast`, `send_recv` for a batch, ...).
    pub op: String,
    /// Element type.
    pub dtype: String,
    /// Element count, as the operation's fingerprint counts it.
    pub count: u64,
    /// Bytes of the operation's message (see `Op::message_bytes`).
    pub bytes: u64,
    /// The root, for rooted operations.
    pub root: Option<u32>,
    /// The reduce op, for reductions.
    pub reduce: Option<String>,
    /// Where it stood.
    pub state: OpState,
    /// When it was submitted.
    pub enqueued_us: f64,
    /// When it began to run (its predecessor on the communicator had finished).
    pub started_us: Option<f64>,
    /// When it finished.
    pub ended_us: Option<f64>,
    /// The rank (in this communicator) it was waiting for, where known.
    pub waiting_on: Option<usize>,
    /// The error it ended with.
    pub error: Option<String>,
}

/// Everything one rank's flight recorder knew about one communicator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dump {
    /// The file format's version.
    pub version: u32,
    /// The launcher's job id, where one is known.
    pub job: Option<String>,
    /// This rank, in the communicator.
    pub rank: usize,
    /// The communicator's size.
    pub world_size: usize,
    /// The communicator's number in this process (0: the first made, usually the world);
    /// ranks that create communicators in the same order number them alike.
    pub comm: u64,
    /// The backend's name.
    pub backend: String,
    /// The operating-system process id.
    pub pid: u32,
    /// Wall-clock time of the communicator's creation, microseconds since the Unix epoch
    /// (what aligns the ranks' clocks).
    pub created_unix_us: u64,
    /// Microseconds since the creation when the dump was written.
    pub dumped_us: f64,
    /// Why it was written (the error, `SIGUSR1`, an abort).
    pub reason: String,
    /// Operations the recorder dropped to keep its size (older than the first one listed).
    pub dropped: u64,
    /// The operations, oldest first.
    pub ops: Vec<OpRecord>,
}

/// The current version of the file format.
pub const VERSION: u32 = 1;

/// The job id as it appears in file names (`job` when there is none).
pub(crate) fn job_tag(job: Option<&str>) -> String {
    job.unwrap_or("job")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' })
        .collect()
}

impl Dump {
    /// The file name of rank `rank`'s dump of communicator `comm` in job `job`.
    pub fn file_name(job: Option<&str>, rank: usize, comm: u64) -> String {
        format!("oxccl-fr-{}-comm{comm}-rank{rank}.json", job_tag(job))
    }

    /// Reads a dump written by a flight recorder.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read; [`Error::InvalidArgument`] naming the
    /// file when it is not a dump of this version.
    pub fn read(path: &Path) -> Result<Dump> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(format!("reading {}", path.display()), &e))?;
        let d: Dump = serde_json::from_str(&text)
            .map_err(|e| Error::invalid(format!("{} is not an oxccl flight-recorder dump: {e}", path.display())))?;
        if d.version != VERSION {
            return Err(Error::invalid(format!(
                "{} is a dump of format {}; this oxccl reads format {VERSION}",
                path.display(),
                d.version
            )));
        }
        Ok(d)
    }

    /// Writes this dump as `dir`/[`Dump::file_name`], through a temporary file and a
    /// rename (a reader never sees half a dump); returns the path.
    ///
    /// # Errors
    /// [`Error::Io`] naming the directory.
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), &e))?;
        let path = dir.join(Dump::file_name(self.job.as_deref(), self.rank, self.comm));
        let tmp = path.with_extension(format!("json.{}.tmp", self.pid));
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Internal(format!("encoding a dump: {e}")))?;
        std::fs::write(&tmp, text).map_err(|e| Error::io(format!("writing {}", tmp.display()), &e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(format!("renaming {}", tmp.display()), &e))?;
        Ok(path)
    }
}
