//! The progress indicator on stderr (`[3/22] all_reduce 64K…`), shown only once a sweep has
//! run for a while: redrawn in place on a terminal, otherwise an occasional line.

use std::io::Write;
use std::time::{Duration, Instant};

/// Where and how progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// stderr is a terminal: one line redrawn with `\r`.
    Terminal,
    /// stderr is a file or pipe: a `# progress` line now and then, for long sweeps only.
    Lines,
    /// Nothing.
    Off,
}

/// How long a sweep runs before progress appears on a terminal.
const TERMINAL_AFTER: Duration = Duration::from_secs(2);
/// How long a sweep runs before, and between, progress lines elsewhere.
const LINES_EVERY: Duration = Duration::from_secs(15);

/// The progress of one sweep.
#[derive(Debug)]
pub struct Progress {
    /// How progress is shown.
    mode: ProgressMode,
    /// Steps in the sweep.
    total: usize,
    /// Steps announced so far.
    done: usize,
    /// When the sweep started.
    start: Instant,
    /// When the last progress line was printed (`Lines` mode).
    last_line: Instant,
    /// Whether a redrawn line is on the terminal now.
    drawn: bool,
}

impl Progress {
    /// A sweep of `total` steps, starting now.
    pub fn new(mode: ProgressMode, total: usize) -> Progress {
        let now = Instant::now();
        Progress { mode, total, done: 0, start: now, last_line: now, drawn: false }
    }

    /// The text shown before step `step` (1-based) named `label`.
    pub fn text(step: usize, total: usize, label: &str) -> String {
        format!("[{step}/{total}] {label}…")
    }

    /// Announces the next step.
    pub fn step(&mut self, label: &str) {
        self.done += 1;
        let now = Instant::now();
        let text = Self::text(self.done, self.total, label);
        let mut err = std::io::stderr().lock();
        match self.mode {
            ProgressMode::Terminal if now.duration_since(self.start) >= TERMINAL_AFTER => {
                let _ = write!(err, "\r\x1b[K{text}");
                let _ = err.flush();
                self.drawn = true;
            }
            ProgressMode::Lines if now.duration_since(self.last_line) >= LINES_EVERY => {
                let _ = writeln!(err, "# progress {text}");
                self.last_line = now;
            }
            _ => {}
        }
    }

    /// Erases the drawn line (before the table prints a row on the same terminal).
    pub fn clear(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
            self.drawn = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_counts_steps() {
        assert_eq!(Progress::text(3, 22, "all_reduce 64K"), "[3/22] all_reduce 64K…");
    }

    #[test]
    fn short_sweeps_draw_nothing() {
        let mut p = Progress::new(ProgressMode::Terminal, 2);
        p.step("x");
        assert!(!p.drawn);
        p.clear();
    }
}
