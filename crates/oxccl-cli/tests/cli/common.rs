//! Helpers shared by the integration tests: run the built `oxccl` with a deadline.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What a finished `oxccl` printed and how it ended.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Finished {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn all(&self) -> String {
        format!("--- stdout\n{}--- stderr\n{}", self.stdout, self.stderr)
    }
}

/// The `oxccl` binary under test, with OXCCL_* variables of the calling environment removed.
pub fn oxccl<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = Command::new(env!("CARGO_BIN_EXE_oxccl"));
    c.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("OXCCL_") || ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"].contains(&k.as_str()) {
            c.env_remove(k);
        }
    }
    c
}

fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    })
}

/// Waits for `child` (started with piped stdout and stderr) for at most `limit`; kills it and
/// fails the test past that.
pub fn wait(mut child: Child, limit: Duration) -> Finished {
    let start = Instant::now();
    let out = drain(child.stdout.take().expect("stdout piped"));
    let err = drain(child.stderr.take().expect("stderr piped"));
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("oxccl did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = start.elapsed();
    Finished { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default(), elapsed }
}

/// Runs `cmd` to completion within `limit`.
pub fn run(mut cmd: Command, limit: Duration) -> Finished {
    wait(cmd.spawn().expect("start oxccl"), limit)
}
