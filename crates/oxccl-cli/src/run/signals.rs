//! Signals: catching the ones the launcher forwards (SIGINT, SIGTERM, SIGHUP, SIGQUIT) and
//! passes on (SIGUSR1), signalling a rank's process group, and naming signals for the
//! summary.

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

/// The signals the launcher catches and forwards to every rank, then stops the job.
pub const FORWARDED: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];
/// The signals the launcher passes on to every rank and goes on: SIGUSR1 makes oxccl's
/// flight recorders write their dumps (`kill -USR1` the launcher of a job that hangs).
pub const PASSED: [i32; 1] = [SIGUSR1];

/// The launcher's catcher of [`FORWARDED`] signals, polled by the supervision loop.
///
/// From the moment it is installed these signals no longer end the launcher: they are
/// queued here instead, so the launcher can stop its ranks and report.
pub struct Catcher {
    /// signal-hook's queue of caught signals.
    signals: Signals,
}

impl Catcher {
    /// Starts catching the forwarded signals.
    ///
    /// # Errors
    /// When the handlers cannot be installed.
    pub fn install() -> std::io::Result<Catcher> {
        Ok(Catcher { signals: Signals::new(FORWARDED.iter().chain(&PASSED))? })
    }

    /// The signals received since the last call, oldest first; never blocks.
    pub fn pending(&mut self) -> Vec<i32> {
        self.signals.pending().collect()
    }
}

impl Drop for Catcher {
    fn drop(&mut self) {
        self.signals.handle().close();
    }
}

/// Sends `sig` to the process group led by `pid` (each rank runs in its own group, so this
/// reaches the programs it started too). Returns false when the group no longer exists.
pub fn signal_group(pid: u32, sig: i32) -> bool {
    let (Ok(pid), Ok(sig)) = (i32::try_from(pid), Signal::try_from(sig)) else {
        return false;
    };
    killpg(Pid::from_raw(pid), sig).is_ok()
}

/// The name of signal `sig` (`SIGKILL`), or `signal N` for one without a name here.
pub fn signal_name(sig: i32) -> String {
    match Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("signal {sig}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(2), "SIGINT");
        assert_eq!(signal_name(200), "signal 200");
    }

    #[test]
    fn signalling_a_group_that_is_gone_reports_it() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("true").process_group(0).spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!signal_group(pid, SIGTERM));
    }
}
