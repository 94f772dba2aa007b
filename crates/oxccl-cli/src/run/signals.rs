//! Signals: catching the ones the launcher forwards (SIGINT, SIGTERM, SIGHUP, SIGQUIT) and
//! passes on (SIGUSR1), signalling a rank's process group, and naming signals for the
//! summary.

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1};
use signal_hook::iterator::{Handle, Signals};

/// The signals the launcher catches and forwards to every rank, then stops the job.
pub const FORWARDED: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];
/// The signals the launcher passes on to every rank and goes on: SIGUSR1 makes oxccl's
/// flight recorders write their dumps (`kill -USR1` the launcher of a job that hangs).
pub const PASSED: [i32; 1] = [SIGUSR1];

/// The launcher's catcher of [`FORWARDED`] and [`PASSED`] signals.
///
/// From the moment it is installed these signals no longer end the launcher: a thread of
/// its own blocks until one arrives and hands it to the supervision loop, which wakes for
/// it. Nothing polls: a launcher that waits for its ranks takes no CPU time from them.
pub struct Catcher {
    /// Closes signal-hook's queue, which ends the thread's wait.
    handle: Handle,
    /// The thread that waits for signals.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Catcher {
    /// Starts catching the signals; `deliver` gets each one, oldest first, on the catcher's
    /// thread, and returns false once nobody listens (the thread then ends).
    ///
    /// # Errors
    /// When the handlers cannot be installed or the thread cannot start.
    pub fn install(mut deliver: impl FnMut(i32) -> bool + Send + 'static) -> std::io::Result<Catcher> {
        let mut signals = Signals::new(FORWARDED.iter().chain(&PASSED))?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new().name("oxccl-signals".into()).spawn(move || {
            // `forever` blocks in a read of signal-hook's self-pipe; `close` ends it.
            for sig in signals.forever() {
                if !deliver(sig) {
                    break;
                }
            }
        });
        match thread {
            Ok(t) => Ok(Catcher { handle, thread: Some(t) }),
            Err(e) => {
                handle.close();
                Err(e)
            }
        }
    }
}

impl Drop for Catcher {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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
    fn a_caught_signal_is_delivered_and_dropping_the_catcher_ends_its_thread() {
        use std::sync::mpsc;
        use std::time::Duration;
        let (tx, rx) = mpsc::channel();
        let catcher = Catcher::install(move |s| tx.send(s).is_ok()).expect("install");
        // Caught from now on: raising it does not end the test process.
        signal_hook::low_level::raise(SIGUSR1).expect("raise");
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(SIGUSR1));
        // Dropping joins the thread, which must wake from its blocking wait to end.
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            drop(catcher);
            let _ = done_tx.send(());
        });
        assert!(done_rx.recv_timeout(Duration::from_secs(10)).is_ok(), "the catcher's thread did not end");
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
