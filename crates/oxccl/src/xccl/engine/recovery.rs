//! Recovery on the GPU engine, over its host side (a `cpu` communicator): a revoke reaches
//! every rank through it, `agree` is its agreement (on the `Backend` impl), and shrink and
//! grow agree on the membership there, fault-tolerantly. The new NCCL communicator then
//! comes from the old one where NCCL can make it so, with `ncclCommShrink` (NCCL 2.27.3+)
//! or `ncclCommGrow` (2.29.2+), which spare the bootstrap of a whole new communicator;
//! otherwise from a unique id sent over the new host communicator, as a world is made.
//!
//! # One choice for all
//! NCCL's shrink and grow are collective over the old communicator: a rank that took them
//! while another made a fresh communicator would wait for ever. So the ranks of the new host
//! communicator each give one bit, and all take NCCL's call only when every bit is set:
//! - shrink: the library has `ncclCommShrink`, at least one rank is excluded (NCCL refuses
//!   an empty list), nobody died (the new size is the old one less the excluded ranks:
//!   every survivor sees the same sizes, and a dead rank cannot call `ncclCommShrink`), and
//!   this rank's old communicator is healthy (not poisoned, no asynchronous error: after a
//!   failure or a revoke NCCL's shrink is not to be relied on). Excluded ranks call nothing.
//! - grow: a member's library has `ncclCommGrow` and `ncclCommGetUniqueId` and its old
//!   communicator is healthy; a newcomer's library has `ncclCommGrow`. Host rank 0 (old
//!   rank 0: the members come first) then makes the id, the grow's
//!   (`ncclCommGetUniqueId`) or a fresh one, and sends it with the way chosen in one
//!   broadcast (`meet.rs`), where a world sends its id; members keep their ranks. The id
//!   is made before anyone calls `ncclCommGrow`, as NCCL needs: `ncclCommGetUniqueId` also
//!   sends it to the old ranks 0 and N-1, whose `ncclCommGrow` waits for it.

use std::collections::BTreeSet;
use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::comm::{rank_for_nccl, Comm, Guard};
use super::meet::{everyone, exchange, fresh_id, Make};
use super::state::{Engine, Inner, Parts};
use crate::backend::{Backend, CallOptions};
use crate::error::{Error, Result};
use crate::sync::relock;
use crate::xccl::host_side::HostSide;
use crate::xccl::library::types::NcclUniqueId;
use crate::xccl::library::NcclResult;
use crate::xccl::runtime::enter;

impl Inner {
    /// What a new communicator over `host` is made of: this one's library, device and
    /// settings.
    pub(super) fn parts(&self, host: Arc<dyn Backend>) -> Parts {
        Parts {
            name: self.name,
            lib: Arc::clone(&self.lib),
            rt: Arc::clone(&self.rt),
            device: self.device,
            host,
            check: self.host.checks(),
            host_buffers: self.host_buffers,
            timeout: self.timeout,
            algorithms: self.algorithms.clone(),
        }
    }

    /// Revokes the host side, which every rank's waits watch (their next look at it ends
    /// them with `Revoked`, and aborts their NCCL communicator, which stops its kernels);
    /// this rank's communicator fails the same way now.
    pub(super) fn revoke(&self, reason: &str) -> Result<()> {
        self.host.comm().revoke(reason)?;
        let _ = self.fail(Error::Revoked { rank: self.rank, reason: reason.to_string() });
        Ok(())
    }

    /// Whether this rank's NCCL communicator can make another: not poisoned, and no
    /// asynchronous error.
    fn healthy(&self) -> bool {
        self.poisoned().is_ok() && matches!(self.comm.async_error(), Ok(None))
    }

    /// The survivors' communicator: membership agreed over the host side, then
    /// `ncclCommShrink` or a fresh communicator (see the module documentation).
    pub(super) fn shrink(self: &Arc<Self>, exclude: &[usize], opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        let Some(host) = self.host.comm().shrink(exclude, opts)? else { return Ok(None) };
        let timeout = opts.timeout_or(self.timeout);
        let excluded: BTreeSet<usize> = exclude.iter().copied().collect();
        let nobody_died = host.world_size() + excluded.len() == self.size;
        let able = self.lib.table.comm_shrink.is_some() && !excluded.is_empty() && nobody_died && self.healthy();
        if !everyone(host.as_ref(), able, timeout)? {
            return Ok(Some(Arc::new(Engine::create(self.parts(host))?)));
        }
        let list = excluded.iter().map(|&r| rank_for_nccl(r)).collect::<Result<Vec<c_int>>>()?;
        let _cur = enter(self.rt.as_ref(), self.device)?;
        self.from_parent(self.parts(host), "shrinking", timeout, |parent, guard, _| {
            // A failure here is the old communicator's (`Comm::shrink` aborted it).
            let child = parent.shrink(&list, guard).map_err(|e| self.fail(e))?;
            // Once the old communicator's part is done (the order lock goes), the new one's
            // own creation: its failure is the new communicator's, not the old one's, which
            // stays usable. Dropping the child on the way out aborts it.
            Ok((child, Some("ncclCommShrink")))
        })
        .map(Some)
    }

    /// The engine of a communicator NCCL makes from this one: `make` runs under the order
    /// lock (after a flush, so nothing of this communicator is queued), given the guard
    /// and the new host rank; when it names its call, the new communicator is then waited
    /// for outside the lock. Verified as the host side's rank of its size.
    fn from_parent(
        self: &Arc<Self>,
        parts: Parts,
        doing: &'static str,
        timeout: Duration,
        make: impl FnOnce(&Comm, &Guard<'_>, usize) -> Result<(Comm, Option<&'static str>)>,
    ) -> Result<Arc<dyn Backend>> {
        let side = HostSide::new(Arc::clone(&parts.host), parts.check);
        let (rank, size) = (side.comm().rank(), side.comm().world_size());
        let late = late(doing, &self.lib.describe(), rank, size);
        let watch = || self.poisoned().and_then(|()| side.liveness());
        let guard = Guard { deadline: Instant::now() + timeout, watch: &watch, late: &late };
        let mut order = relock(&self.order);
        order.touched = Instant::now();
        self.flush(&mut order)?;
        let made = make(&self.comm, &guard, rank);
        drop(order);
        let (child, settle) = made?;
        if let Some(call) = settle {
            child.wait_ready(call, &guard)?;
        }
        child.verify(size, rank, self.device)?;
        Ok(Arc::new(Engine::assemble(parts, side, child)?))
    }

    /// The members and newcomers, met over the host side's grow, then `ncclCommGrow` or a
    /// fresh communicator (see the module documentation; the newcomers' side is
    /// [`Engine::join`]).
    pub(super) fn grow(self: &Arc<Self>, joiners: usize, opts: &CallOptions) -> Result<Arc<dyn Backend>> {
        let host = self.host.comm().grow(joiners, opts)?;
        let timeout = opts.timeout_or(self.timeout);
        let t = &self.lib.table;
        let able = t.comm_grow.is_some() && t.comm_get_unique_id.is_some() && self.healthy();
        let _cur = enter(self.rt.as_ref(), self.device)?;
        let (how, id) = decide_grow(host.as_ref(), able, timeout, |how| match how {
            Make::Grow => self.comm.grow_id(),
            Make::Init => fresh_id(&self.lib),
        })?;
        let parts = self.parts(host);
        if how == Make::Init {
            return Ok(Arc::new(Engine::from_id(parts, &id)?));
        }
        let size = parts.host.world_size();
        // Under the order lock until the new communicator is ready: NCCL's grow job uses the
        // old communicator's bootstrap meanwhile.
        self.from_parent(parts, "growing", timeout, |parent, guard, rank| {
            Ok((parent.grow_member(size, (rank == 0).then_some(&id), guard)?, None))
        })
    }
}

impl Engine {
    /// A newcomer's communicator, over the host side its join made (a collective with the
    /// members' [`Backend::grow`]): `ncclCommGrow` with the id host rank 0 sends, or a fresh
    /// communicator, as every rank of the grown one decides together.
    ///
    /// # Errors
    /// As [`Engine::create`].
    pub(crate) fn join(parts: Parts) -> Result<Engine> {
        let rt = Arc::clone(&parts.rt);
        let _cur = enter(rt.as_ref(), parts.device)?;
        let able = parts.lib.table.comm_grow.is_some();
        let (how, id) = decide_grow(parts.host.as_ref(), able, parts.timeout, |_| {
            Err(Error::Internal("a newcomer is host rank 0 of the grown communicator: the members come first".into()))
        })?;
        if how == Make::Init {
            return Engine::from_id(parts, &id);
        }
        let side = HostSide::new(Arc::clone(&parts.host), parts.check);
        let (rank, size) = (side.comm().rank(), side.comm().world_size());
        let late = late("joining", &parts.lib.describe(), rank, size);
        let guard = Guard { deadline: Instant::now() + parts.timeout, watch: &|| side.liveness(), late: &late };
        let comm = Comm::grow_new(&parts.lib, size, &id, rank, &guard)?;
        comm.verify(size, rank, parts.device)?;
        Engine::assemble(parts, side, comm)
    }
}

/// How the members and newcomers over `host` make the grown communicator, and its id: every
/// rank says whether it is `able` to take `ncclCommGrow`; host rank 0 makes the id for the
/// way chosen with `root` and sends both.
///
/// # Errors
/// The host communicator's errors; `root`'s (on every rank).
fn decide_grow(
    host: &dyn Backend,
    able: bool,
    timeout: Duration,
    root: impl FnOnce(Make) -> Result<NcclUniqueId>,
) -> Result<(Make, NcclUniqueId)> {
    let how = if everyone(host, able, timeout)? { Make::Grow } else { Make::Init };
    let (sent, id) = exchange(host, timeout, || Ok((how, root(how)?)))?;
    if sent != how {
        return Err(Error::Internal(format!(
            "host rank 0 chose {sent:?} to make the grown communicator, but the ranks' answers say {how:?}"
        )));
    }
    Ok((how, id))
}

/// The error past the deadline of `doing` (shrinking, growing, joining) rank `rank` of
/// `size` of the communicator of `lib`.
fn late(doing: &'static str, lib: &str, rank: usize, size: usize) -> impl Fn(Duration) -> Error {
    let lib = lib.to_string();
    move |waited| Error::Backend {
        code: i64::from(NcclResult::TIMEOUT.0),
        message: format!(
            "{doing} the {lib} communicator (rank {rank} of {size}) did not finish within {waited:?}; every rank \
             must take part at the same time. Set NCCL_DEBUG=WARN for NCCL's view"
        ),
    }
}
