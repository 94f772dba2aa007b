//! What one communicator of the `mpi` backend is made of: [`Shared`], its queue of operations
//! ([`Active`]), their completion slots ([`Cell`]) and what abandoned ones leave behind
//! ([`Abandoned`]). Plain data: `engine.rs` runs it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::comm::Comm;
use super::ops::Posted;
use super::runtime::Runtime;
use super::side::{Msg, Outbox};
use crate::backend::completion::CompletionSlot;
use crate::backend::poison::Poison;
use crate::backend::{Completion, Op, RawBufMut};
use crate::config::ResolvedConfig;
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::staging::Staged;

/// The completion of one operation: its result, and the communicator a split creates.
#[derive(Default)]
pub(crate) struct Cell {
    slot: CompletionSlot,
    pub(super) split: Mutex<Option<Comm>>,
}

impl Cell {
    pub(crate) fn result(&self) -> Option<Result<Completion>> {
        self.slot.peek()
    }

    pub(super) fn complete(&self, r: Result<Completion>) {
        self.slot.complete(r);
    }
}

pub(super) struct RecvSpec {
    pub(super) buf: RawBufMut,
    /// The sender; `None` for a receive from any source, until its header is taken.
    pub(super) peer: Option<usize>,
    pub(super) tag: u32,
    pub(super) got: bool,
}

pub(super) enum Body {
    Coll(Op),
    Batch(Vec<RecvSpec>),
    Split { color: Option<u32>, key: i64 },
}

/// How far an active operation has gone.
pub(super) enum Progress {
    /// Waiting for the peers' fingerprints (index = rank).
    Exchange(Vec<Option<Msg>>),
    /// Ready to post once every earlier operation has posted.
    Ready,
    /// A batch waiting for the headers of its receives.
    Headers,
    /// Everything posted; waiting for the requests.
    Running,
}

pub(super) struct Active {
    pub(super) cell: Arc<Cell>,
    pub(super) body: Body,
    pub(super) fp: Fingerprint,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    pub(super) stage: Progress,
    pub(super) exchanged: Vec<Msg>,
    pub(super) posted: Posted,
    pub(super) staged: Staged,
    pub(super) received: Vec<usize>,
    /// The sender of each receive (`usize::MAX` for a receive from any source until its
    /// header is taken).
    pub(super) sources: Vec<usize>,
    pub(super) recv_from: usize,
}

/// What an abandoned operation leaves behind: requests MPI may still use, and their
/// temporaries.
pub(super) struct Abandoned {
    pub(super) _posted: Posted,
    pub(super) _staged: Staged,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) seq: u64,
    pub(super) poisoned: Poison,
    pub(super) stash: Vec<VecDeque<Msg>>,
    pub(super) queue: VecDeque<Active>,
    pub(super) outbox: Outbox,
    pub(super) abandoned: Vec<Abandoned>,
}

/// One rank's membership in one communicator.
pub(crate) struct Shared {
    pub rt: Arc<Runtime>,
    pub comm: Comm,
    pub rank: usize,
    pub n: usize,
    pub cfg: ResolvedConfig,
    /// Recovery's state (ULFM: `ulfm/`).
    pub recovery: super::ulfm::Recovery,
    pub(super) state: Mutex<State>,
}
