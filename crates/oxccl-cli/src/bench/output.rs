//! Rank 0's printing: text to stdout, flushed at once.

use std::io::Write;

/// Prints to stdout and flushes, ignoring a closed stdout (`| head`).
pub(crate) fn out(text: &str) {
    if cfg!(test) {
        // Through the test harness's capture, so unit tests stay quiet.
        print!("{text}");
        return;
    }
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes());
    let _ = o.flush();
}
