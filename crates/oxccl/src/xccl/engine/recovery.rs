//! Recovery on the GPU engine, over its host side (a `cpu` communicator): a revoke reaches
//! every rank through it, `agree` is its agreement (on the `Backend` impl), and shrink and
//! grow agree on the membership there, then make the new NCCL communicator from a unique id
//! sent over the new host communicator, as a world is made. `ncclCommShrink` is not used:
//! it needs every member's old communicator healthy, which a failure rules out.

use std::sync::Arc;

use super::{Engine, Inner, Parts};
use crate::backend::{Backend, CallOptions};
use crate::error::{Error, Result};

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

    /// The survivors' communicator: membership agreed over the host side.
    pub(super) fn shrink(&self, exclude: &[usize], opts: &CallOptions) -> Result<Option<Arc<dyn Backend>>> {
        let Some(host) = self.host.comm().shrink(exclude, opts)? else { return Ok(None) };
        Ok(Some(Arc::new(Engine::create(self.parts(host))?)))
    }

    /// The members and newcomers, met over the host side's grow.
    pub(super) fn grow(&self, joiners: usize, opts: &CallOptions) -> Result<Arc<dyn Backend>> {
        let host = self.host.comm().grow(joiners, opts)?;
        Ok(Arc::new(Engine::create(self.parts(host))?))
    }
}
