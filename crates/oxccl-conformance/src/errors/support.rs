//! What the error families share: the deadlines, the outcome codes and how an error maps
//! to one, what a rank observed ([`Local`]), what a case gets ([`ECx`]), and small helpers.

use std::time::Duration;

use oxccl::{Communicator, Error};

use crate::check::{Cx, Verdict};

/// Deadline of calls that are expected to fail quickly (a wrong acceptance then shows up
/// as a failure after this long instead of a hang).
pub(super) const FAIL_FAST: Duration = Duration::from_secs(10);
/// The deadline used by the timeout cases.
pub(super) const SHORT: Duration = Duration::from_millis(200);
/// The longest an error that should be prompt may take.
pub(super) const PROMPT: Duration = Duration::from_secs(10);

/// Outcome codes shared across ranks after each case.
pub(super) mod code {
    pub const OK: u8 = 0;
    pub const MISMATCH: u8 = 1;
    pub const ABORTED: u8 = 2;
    pub const TIMEOUT: u8 = 3;
    pub const PEER_LOST: u8 = 4;
    pub const INVALID: u8 = 5;
    pub const OTHER: u8 = 6;
    pub const NOT_RUN: u8 = 7;
}

/// A problem unless the next call on `c` returns `Aborted`, as every call on a communicator
/// that failed must (`after` says what failed, for the message).
pub(super) fn next_call_is_aborted(c: &Communicator, after: &str) -> Option<String> {
    match c.barrier() {
        Err(Error::Aborted { .. }) => None,
        other => Some(format!("after {after}, the next call returned {other:?} instead of Error::Aborted")),
    }
}

/// The outcome code of a call's result: OK, or its error's code.
pub(super) fn code_of_result<T>(r: &oxccl::Result<T>) -> u8 {
    r.as_ref().err().map_or(code::OK, code_of)
}

pub(super) fn code_of(e: &Error) -> u8 {
    match e {
        Error::Mismatch { .. } => code::MISMATCH,
        Error::Aborted { .. } => code::ABORTED,
        Error::Timeout { .. } => code::TIMEOUT,
        Error::PeerLost { .. } => code::PEER_LOST,
        Error::InvalidArgument(_) => code::INVALID,
        _ => code::OTHER,
    }
}

/// What one rank observed in one error case.
pub(super) struct Local {
    pub(super) verdict: Verdict,
    pub(super) code: u8,
}

impl Local {
    pub(super) fn new(verdict: Verdict, code: u8) -> Local {
        Local { verdict, code }
    }
}

/// What an error case gets besides its communicator.
pub(super) struct ECx<'a> {
    pub(super) cx: Cx<'a>,
    /// The suite's communicator (healthy; only for [`ECx::sync`]).
    pub(super) parent: &'a Communicator,
}

impl ECx<'_> {
    /// A barrier on the suite's communicator: every rank has got this far, whatever state
    /// the case's communicator is in. Every rank must call it at the same points.
    pub(super) fn sync(&self) -> Result<(), Local> {
        self.parent
            .barrier()
            .map_err(|e| Local::new(Err(format!("barrier on the suite's communicator failed: {e}")), code::OTHER))
    }
}

pub(super) fn comm_of(slot: &Option<Communicator>) -> Result<&Communicator, Local> {
    slot.as_ref().ok_or_else(|| Local::new(Err("the case's communicator is missing".into()), code::OTHER))
}

macro_rules! get_comm {
    ($slot:expr) => {
        match $crate::errors::support::comm_of($slot) {
            Ok(c) => c,
            Err(l) => return l,
        }
    };
}
// The family files are other modules, so they import the macro by path
// (`use super::support::get_comm`) rather than through textual scope.
pub(super) use get_comm;

pub(super) fn verdict_of(problems: Vec<String>) -> Verdict {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// A warm-up barrier on the case's communicator, then a barrier on the suite's, so that
/// every rank is past the warm-up before anything is expected to fail.
pub(super) fn warm_up(c: &Communicator, cx: &ECx) -> Result<(), Local> {
    let r = c.barrier();
    cx.sync()?;
    r.map_err(|e| Local::new(Err(format!("the warm-up barrier failed: {e}")), code_of(&e)))
}
