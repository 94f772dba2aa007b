//! Output forwarding: one thread per child pipe copies its output to the launcher's stdout
//! or stderr, prefixing every line with the rank (`[rank 2] `).
//!
//! Lines end at `\n` or `\r` (so progress bars that redraw with `\r` still work); a line is
//! written with its prefix in one locked write, so lines of different ranks never mix.
//! A line longer than [`MAX_LINE`] is written in pieces (the prefix only before the first).
//! The forwarder keeps reading when the launcher's own output is closed (`| head`), so a
//! rank never blocks on a full pipe.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::mpsc::{Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

/// The longest piece held back while waiting for the end of a line.
pub const MAX_LINE: usize = 64 * 1024;

/// Where forwarded output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// The launcher's stdout.
    Stdout,
    /// The launcher's stderr.
    Stderr,
}

impl Sink {
    /// Writes `prefix` then `data` in one locked write, then flushes.
    fn write(self, prefix: &[u8], data: &[u8]) {
        // Errors (a closed terminal, `| head`) are ignored: the rank's output is then lost,
        // but the rank keeps running and its pipe keeps draining.
        let _ = match self {
            Sink::Stdout => write_locked(&mut std::io::stdout().lock(), prefix, data),
            Sink::Stderr => write_locked(&mut std::io::stderr().lock(), prefix, data),
        };
    }
}

fn write_locked(w: &mut impl Write, prefix: &[u8], data: &[u8]) -> std::io::Result<()> {
    w.write_all(prefix)?;
    w.write_all(data)?;
    w.flush()
}

/// The prefix of rank `rank`'s lines.
pub fn prefix(rank: usize) -> String {
    format!("[rank {rank}] ")
}

/// Copies `input` to `emit` piece by piece: each piece is a line with its terminator (`\n`
/// or `\r`), or a run of [`MAX_LINE`] bytes of a longer line, or the unterminated end of the
/// input (given a `\n`). `emit` gets whether the piece starts a line. Returns at end of input
/// or on a read error.
pub fn split_lines(input: impl Read, mut emit: impl FnMut(bool, &[u8])) {
    let mut reader = BufReader::with_capacity(MAX_LINE, input);
    let mut pending: Vec<u8> = Vec::new();
    let mut at_start = true;
    loop {
        let buf = match reader.fill_buf() {
            Ok([]) => break,
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let len = buf.len();
        let mut start = 0;
        while let Some(pos) = buf[start..].iter().position(|&b| b == b'\n' || b == b'\r') {
            let end = start + pos + 1;
            pending.extend_from_slice(&buf[start..end]);
            emit(at_start, &pending);
            pending.clear();
            at_start = true;
            start = end;
        }
        pending.extend_from_slice(&buf[start..]);
        while pending.len() >= MAX_LINE {
            let rest = pending.split_off(MAX_LINE);
            emit(at_start, &pending);
            at_start = false;
            pending = rest;
        }
        reader.consume(len);
    }
    if !pending.is_empty() {
        pending.push(b'\n');
        emit(at_start, &pending);
    }
}

/// A running forwarder; see [`spawn`].
pub struct Forwarder {
    /// Its thread.
    handle: JoinHandle<()>,
}

/// Starts a thread that forwards `input` to `sink` with `prefix` before every line, and
/// sends `()` on `done` when the input ends (the child and everything it started closed it).
///
/// # Errors
/// When the thread cannot be started.
pub fn spawn(
    input: impl Read + Send + 'static,
    sink: Sink,
    prefix: String,
    done: Sender<()>,
) -> std::io::Result<Forwarder> {
    let handle = std::thread::Builder::new().name(format!("oxccl-output {}", prefix.trim())).spawn(move || {
        split_lines(input, |line_start, piece| {
            let p: &[u8] = if line_start { prefix.as_bytes() } else { b"" };
            sink.write(p, piece);
        });
        let _ = done.send(());
    })?;
    Ok(Forwarder { handle })
}

/// Waits until `count` forwarders have reported on `done` or `deadline` passes, then joins
/// those that finished. Forwarders still running (a program left a background process
/// holding its output open) are left behind rather than hanging the launcher.
pub fn finish(forwarders: Vec<Forwarder>, done: &Receiver<()>, deadline: Instant) {
    let mut left = forwarders.len();
    while left > 0 {
        let now = Instant::now();
        if now >= deadline || done.recv_timeout(deadline - now).is_err() {
            break;
        }
        left -= 1;
    }
    for f in forwarders {
        if f.handle.is_finished() {
            let _ = f.handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(input: &[u8]) -> Vec<(bool, String)> {
        let mut out = Vec::new();
        split_lines(input, |s, p| out.push((s, String::from_utf8_lossy(p).into_owned())));
        out
    }

    #[test]
    fn splits_at_newlines_and_carriage_returns() {
        assert_eq!(
            pieces(b"a\nbb\r\ncc\rdd"),
            vec![
                (true, "a\n".into()),
                (true, "bb\r".into()),
                (true, "\n".into()),
                (true, "cc\r".into()),
                (true, "dd\n".into())
            ]
        );
        assert!(pieces(b"").is_empty());
    }

    #[test]
    fn long_lines_come_in_pieces_with_one_prefix() {
        let mut long = vec![b'x'; MAX_LINE * 2 + 10];
        long.push(b'\n');
        let p = pieces(&long);
        assert_eq!(p.len(), 3);
        assert_eq!(p.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![true, false, false]);
        assert_eq!(p.iter().map(|(_, l)| l.len()).sum::<usize>(), long.len());
    }

    #[test]
    fn lines_split_across_reads_are_joined() {
        struct Slow(Vec<&'static [u8]>);
        impl Read for Slow {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0.is_empty() {
                    return Ok(0);
                }
                let chunk = self.0.remove(0);
                buf[..chunk.len()].copy_from_slice(chunk);
                Ok(chunk.len())
            }
        }
        let mut out = Vec::new();
        split_lines(Slow(vec![b"hel", b"lo\nwor", b"ld\n"]), |s, p| out.push((s, p.to_vec())));
        assert_eq!(out, vec![(true, b"hello\n".to_vec()), (true, b"world\n".to_vec())]);
    }
}
