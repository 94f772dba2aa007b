//! Recovery on the cpu engine: agreements, shrinks and grows (see `cpu/agree/` and
//! `cpu/grow/` for the protocols; this is where a communicator calls them).

use std::sync::Arc;
use std::time::Instant;

use super::{derive_comm_id, CpuBackend, Inner, AGREE_ID, SHRINK_COLOR};
use crate::backend::{Agreement, CallOptions};
use crate::cpu::agree::protocol::Contribution;
use crate::cpu::agree::service::Agreements;
use crate::cpu::agree::shrink;
use crate::error::{Error, Result};
use crate::sync::relock;

impl Inner {
    /// This communicator's agreements (made at first use).
    pub(super) fn agreements(&self) -> &Arc<Agreements> {
        self.agreements.get_or_init(|| {
            let id = derive_comm_id(self.comm_id, AGREE_ID.0, AGREE_ID.1);
            Arc::new(Agreements::new(self.name, Arc::clone(&self.transport), id, Arc::clone(&self.ranks), self.rank))
        })
    }

    /// Keeps `parent`'s agreements answering until this communicator's first decision (see
    /// the `ancestor` field).
    fn keep_ancestor(&self, parent: &Arc<Agreements>) {
        *relock(&self.ancestor) = Some(Arc::clone(parent));
    }

    /// An agreement of this communicator decided: every live member has left the parent's
    /// call, so the parent's agreements may end.
    fn decided(&self) {
        let parent = relock(&self.ancestor).take();
        drop(parent);
    }

    /// See [`Backend::agree`]. Not in the collectives' order: it works on a communicator
    /// that failed, and while an operation of another thread waits on it.
    ///
    /// Rank 0 also asks the store how many newcomers wait and contributes the count as its
    /// OR word (every other rank 0), so every survivor learns the same count from the
    /// decision (the count, or 0 when rank 0's contribution did not make it) without
    /// polling the store itself.
    pub(super) fn agree(&self, flag: u64, opts: &CallOptions) -> Result<Agreement> {
        let deadline = Instant::now() + self.timeout(opts);
        let waiting = if self.rank == 0 { self.lineage.get().map_or(0, |l| l.waiting()) } else { 0 };
        let (_, d) = self.agreements().agree(Contribution { and: flag, or: waiting }, deadline)?;
        self.decided();
        let joiners = usize::try_from(d.or).unwrap_or(usize::MAX);
        Ok(Agreement { flag: d.and, failed: d.dead, joiners })
    }

    /// See [`Backend::shrink`].
    pub(super) fn shrink(&self, exclude: &[usize], opts: &CallOptions) -> Result<Option<CpuBackend>> {
        let deadline = Instant::now() + self.timeout(opts);
        let m = shrink::agree_membership(self.agreements(), self.ranks.len(), exclude, deadline)?;
        self.decided();
        let Some(rank) = m.kept.iter().position(|&r| r == self.rank) else { return Ok(None) };
        let ranks: Arc<[usize]> = m.kept.iter().map(|&r| self.ranks[r]).collect();
        let id = derive_comm_id(self.comm_id, m.number, SHRINK_COLOR);
        let child = self.child(id, ranks, rank, true)?;
        child.inner.keep_ancestor(self.agreements());
        if let Some(l) = self.lineage.get() {
            child.set_lineage(Arc::clone(l));
        }
        Ok(Some(child))
    }

    /// See [`Backend::grow`]: the members agree on the number of newcomers (every live
    /// member, the same number), then meet them in a new world.
    pub(super) fn grow(&self, joiners: usize, opts: &CallOptions) -> Result<CpuBackend> {
        let lineage = self.lineage.get().ok_or_else(|| Error::BackendUnavailable {
            backend: self.name.to_string(),
            why: "grow needs a communicator made through a rendezvous store (oxccl::init under `oxccl run`, \
                  torchrun or another launcher), or one shrunk or grown from it; this one was split off, or made \
                  without a store"
                .into(),
        })?;
        let deadline = Instant::now() + self.timeout(opts);
        let count = joiners as u64;
        let (_, d) = self.agreements().agree(Contribution { and: count, or: count }, deadline)?;
        self.decided();
        if let Some(&dead) = d.dead.first() {
            return Err(Error::PeerLost {
                rank: dead,
                detail: format!(
                    "found dead while growing (ranks {:?} are): shrink the communicator first, then grow the survivors",
                    d.dead
                ),
            });
        }
        if d.and != d.or {
            return Err(Error::invalid(
                "grow: the members passed different numbers of newcomers; every member must pass the same",
            ));
        }
        let grown = lineage.grow(self.rank, self.ranks.len(), joiners)?;
        grown.inner.keep_ancestor(self.agreements());
        grown.set_lineage(Arc::clone(lineage));
        Ok(grown)
    }
}
