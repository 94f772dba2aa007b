//! Where the store server's diagnostics go ([`Log`]), and the rate limit on lines about
//! refused connections ([`Refusals`]): anyone who can reach the port can cause refusals, and
//! each would otherwise be a line in the job's output.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a store server writes its diagnostics, one line at a time (without the newline).
/// Each server has its own; the default is stderr.
#[derive(Clone)]
pub(crate) struct Log(Arc<dyn Fn(&str) + Send + Sync>);

impl Log {
    /// Lines to the log (`tracing`, warn level: the store reports refused clients).
    pub(crate) fn stderr() -> Log {
        Log(Arc::new(|line| tracing::warn!("{line}")))
    }

    /// Lines to `sink` (tests capture them).
    #[cfg(test)]
    pub(crate) fn to(sink: impl Fn(&str) + Send + Sync + 'static) -> Log {
        Log(Arc::new(sink))
    }

    pub(crate) fn line(&self, line: &str) {
        (self.0)(line)
    }
}

/// The line logged when a connection is refused during authentication.
pub(crate) fn refusal_line(peer: SocketAddr, reason: &dyn fmt::Display) -> String {
    format!("oxccl store: refused {peer}: {reason}")
}

/// `10s`, `1.5s`.
pub(crate) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s:.1}s")
    }
}

/// Rate-limited reporting of refused connections: the first is said in full (peer and
/// reason); the later ones are counted, and the count is said (with the latest peer and
/// reason) with the first refusal at least `every` after the previous line, and when the
/// server stops ([`flush`](Self::flush)). Owned by the event loop, so no lock.
pub(crate) struct Refusals {
    every: Duration,
    /// When the last line about refusals was written (`None`: no refusal yet).
    last_line: Option<Instant>,
    /// Refusals since that line.
    unreported: u64,
    /// The latest of them: its peer and reason.
    latest: Option<(SocketAddr, String)>,
}

impl Refusals {
    pub(crate) fn new(every: Duration) -> Refusals {
        Refusals { every, last_line: None, unreported: 0, latest: None }
    }

    /// Counts a refusal of `peer` for `reason`, and says so on `log` if one is due.
    pub(crate) fn refused(&mut self, log: &Log, peer: SocketAddr, reason: &dyn fmt::Display) {
        let now = Instant::now();
        let Some(last) = self.last_line else {
            self.last_line = Some(now);
            log.line(&format!(
                "{} (further refusals are counted, reported at most every {})",
                refusal_line(peer, reason),
                secs(self.every)
            ));
            return;
        };
        self.unreported += 1;
        self.latest = Some((peer, reason.to_string()));
        if now.saturating_duration_since(last) >= self.every {
            self.report(log, now);
        }
    }

    /// Says how many refusals went unreported, if any (the server is stopping).
    pub(crate) fn flush(&mut self, log: &Log) {
        self.report(log, Instant::now());
    }

    fn report(&mut self, log: &Log, now: Instant) {
        let Some(last) = self.last_line else { return };
        if self.unreported == 0 {
            return;
        }
        let Some((peer, reason)) = self.latest.take() else { return };
        let n = self.unreported;
        log.line(&format!(
            "oxccl store: refused {n} more connection{} since the last report {} ago (the latest: {peer}: {reason})",
            if n == 1 { "" } else { "s" },
            secs(now.saturating_duration_since(last))
        ));
        self.unreported = 0;
        self.last_line = Some(now);
    }
}

/// At most one line per `every` about a recurring failure (accept running out of
/// descriptors): the first occurrence is said, later ones are counted into the next line.
pub(crate) struct Throttled {
    every: Duration,
    last_line: Option<Instant>,
    unreported: u64,
}

impl Throttled {
    pub(crate) fn new(every: Duration) -> Throttled {
        Throttled { every, last_line: None, unreported: 0 }
    }

    /// Counts one occurrence; says `what` (with the count of those not said) if a line is due.
    pub(crate) fn note(&mut self, log: &Log, now: Instant, what: &dyn fmt::Display) {
        let due = self.last_line.is_none_or(|last| now.saturating_duration_since(last) >= self.every);
        if !due {
            self.unreported += 1;
            return;
        }
        let more = match self.unreported {
            0 => String::new(),
            n => format!(" ({n} more since the last line)"),
        };
        log.line(&format!("oxccl store: {what}{more}"));
        self.unreported = 0;
        self.last_line = Some(now);
    }
}
