//! Process-wide hooks: `SIGUSR1` dumps every live flight recorder of the process (for a job
//! that hangs without an error: `kill -USR1` every rank, then `oxccl trace analyze`), and at
//! exit the profilers of communicators still alive print and write what they hold.
//!
//! The watcher is a thread started with the first recorder. It is installed only where the
//! process leaves `SIGUSR1` at its default (which would end the process): an application
//! that handles the signal itself keeps it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::FlightRecorder;

/// The live recorders and their dump directories.
static LIVE: Mutex<Vec<(Weak<FlightRecorder>, PathBuf)>> = Mutex::new(Vec::new());
/// Whether the watcher runs (decided once).
static WATCHING: OnceLock<bool> = OnceLock::new();

/// Whether `SIGUSR1` is at its default disposition.
fn signal_is_free() -> bool {
    // SAFETY: sigaction is plain data; zeroed is a valid value to be overwritten.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only queries; `old` is a valid place to write the current one.
    let ok = unsafe { libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut old) } == 0;
    ok && old.sa_sigaction == libc::SIG_DFL
}

fn start() -> bool {
    if !signal_is_free() {
        return false;
    }
    let Ok(mut signals) = signal_hook::iterator::Signals::new([libc::SIGUSR1]) else { return false };
    std::thread::Builder::new()
        .name("oxccl-sigusr1".into())
        .spawn(move || {
            for _ in signals.forever() {
                let live: Vec<(Arc<FlightRecorder>, PathBuf)> =
                    crate::sync::relock(&LIVE).iter().filter_map(|(w, d)| Some((w.upgrade()?, d.clone()))).collect();
                for (rec, dir) in live {
                    rec.report(&dir, "SIGUSR1");
                }
            }
        })
        .is_ok()
}

/// Dumps `recorder` into `dir` on `SIGUSR1` from now on (for as long as it lives).
pub(super) fn watch(recorder: &Arc<FlightRecorder>, dir: &Path) {
    if !*WATCHING.get_or_init(start) {
        return;
    }
    let mut live = crate::sync::relock(&LIVE);
    live.retain(|(w, _)| w.strong_count() > 0);
    live.push((Arc::downgrade(recorder), dir.to_path_buf()));
}

/// Profilers to finish when the process exits (those whose communicator is still alive).
static AT_EXIT: Mutex<Vec<Weak<super::Profiler>>> = Mutex::new(Vec::new());
static AT_EXIT_REGISTERED: OnceLock<()> = OnceLock::new();

extern "C" fn finish_profilers() {
    // Nothing may unwind out of an exit handler.
    let _ = std::panic::catch_unwind(|| {
        let live: Vec<Arc<super::Profiler>> = crate::sync::relock(&AT_EXIT).iter().filter_map(Weak::upgrade).collect();
        for p in live {
            p.finish();
        }
    });
}

/// Finishes `profiler` (its summary, its trace) when the process exits, unless its
/// communicator was dropped before.
pub(super) fn finish_at_exit(profiler: &Arc<super::Profiler>) {
    AT_EXIT_REGISTERED.get_or_init(|| {
        // SAFETY: `finish_profilers` is an `extern "C" fn()` that never unwinds.
        unsafe { libc::atexit(finish_profilers) };
    });
    let mut live = crate::sync::relock(&AT_EXIT);
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(profiler));
}
