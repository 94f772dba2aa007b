//! The sending side of a connection: [`WriteState`] writes frames with plain `send`s under
//! a deadline, coalescing small ones into one write, and remembers a frame left half-written.

use std::io::{self, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::remaining;
use crate::cpu::transport::frame::HEADER_LEN;

/// Frames with payloads up to this size are copied behind their header and sent with one write.
const COALESCE: usize = 32 * 1024;
/// How far past its deadline a blocked write may run before the socket's timeout is re-armed.
const TIMEOUT_SLACK: Duration = Duration::from_millis(50);

/// The sending side of a connection, behind its mutex.
#[derive(Default)]
pub(super) struct WriteState {
    /// The socket's current write timeout.
    timeout: Option<Duration>,
    /// Header and payload of a small frame, written together.
    scratch: Vec<u8>,
    /// A frame was begun and not finished: the stream is out of step.
    pub(super) mid_frame: bool,
}

pub(super) enum WriteFail {
    Timeout,
    Io(io::Error),
}

impl WriteState {
    /// Writes `buf`, setting the socket's write timeout from `deadline` when needed.
    fn write_all(
        &mut self,
        mut sock: &TcpStream,
        mut buf: &[u8],
        deadline: Instant,
    ) -> std::result::Result<(), WriteFail> {
        while !buf.is_empty() {
            let left = remaining(deadline);
            if left.is_zero() {
                return Err(WriteFail::Timeout);
            }
            // Re-arming the timeout costs a system call: keep the one set while it overshoots
            // what is left by no more than TIMEOUT_SLACK.
            if self.timeout.is_none_or(|t| t > left + TIMEOUT_SLACK) {
                sock.set_write_timeout(Some(left.max(Duration::from_millis(1)))).map_err(WriteFail::Io)?;
                self.timeout = Some(left);
            }
            match sock.write(buf) {
                Ok(0) => return Err(WriteFail::Io(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    self.mid_frame = true;
                    buf = buf.get(n..).unwrap_or_default();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The socket's timeout may be shorter than what is left: set it afresh.
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    self.timeout = None;
                }
                Err(e) => return Err(WriteFail::Io(e)),
            }
        }
        Ok(())
    }

    pub(super) fn write_frame(
        &mut self,
        sock: &TcpStream,
        head: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> std::result::Result<(), WriteFail> {
        if payload.len() <= COALESCE {
            let mut buf = std::mem::take(&mut self.scratch);
            buf.clear();
            buf.extend_from_slice(head);
            buf.extend_from_slice(payload);
            let r = self.write_all(sock, &buf, deadline);
            self.scratch = buf;
            r?;
        } else {
            self.write_all(sock, head, deadline)?;
            self.write_all(sock, payload, deadline)?;
        }
        self.mid_frame = false;
        Ok(())
    }
}
