//! What a caller can set for one call ([`CallOptions`]), and how every engine turns it, with
//! the communicator's configuration, into the algorithm and deadline of that call.

use std::time::Duration;

use crate::algorithm::{not_applicable, Algorithm, AlgorithmOverrides};
use crate::error::Result;
use crate::op_kind::OpKind;

/// Options of one call, set on a communicator handle with `Communicator::with_algorithm`,
/// `Communicator::with_timeout` and `Communicator::with_stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallOptions {
    /// Forced algorithm (`Auto`: the configured override, else the selector's choice).
    pub algorithm: Algorithm,
    /// Deadline of this call's waits (None: the communicator's timeout).
    pub timeout: Option<Duration>,
    /// The caller's GPU stream and how device operations relate to it (GPU backends only;
    /// `None`: after the work queued on the device's default stream).
    pub stream: Option<StreamOrder>,
}

/// A GPU stream handle (`cudaStream_t`/`CUstream`, `hipStream_t`): the caller's, or a
/// foreign one such as PyTorch's current stream. Host backends ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream(*mut std::ffi::c_void);

// SAFETY: a stream handle is an opaque value that the vendor runtimes accept from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// The legacy default stream of the current device (the null handle).
    pub const DEFAULT: Stream = Stream(std::ptr::null_mut());

    /// Wraps a raw stream handle.
    ///
    /// # Safety
    /// `handle` is a stream of the device the communicator uses, of the vendor runtime the
    /// backend uses (CUDA for `nccl`, HIP for `rccl`), and stays alive while operations
    /// using it are in flight.
    pub unsafe fn from_raw(handle: *mut std::ffi::c_void) -> Stream {
        Stream(handle)
    }

    /// The raw handle.
    pub fn as_raw(&self) -> *mut std::ffi::c_void {
        self.0
    }
}

/// How a GPU operation is ordered with the caller's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamOrder {
    /// The communicator's own stream waits (on the device, through an event) for the work
    /// already queued on this stream, so the caller's stream is never blocked by
    /// communication: the default, as in torch.distributed.
    After(Stream),
    /// The operation is queued on this stream itself: no extra synchronization, and later
    /// work on the stream sees its result (NCCL's own model).
    On(Stream),
}

impl CallOptions {
    /// The algorithm forced for an operation of `kind`: this call's, else the configured
    /// override for `kind`, else [`Algorithm::Auto`] (the engine's selector decides).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the forced algorithm
    /// cannot run `kind`.
    pub fn forced_algorithm(&self, kind: OpKind, configured: &AlgorithmOverrides) -> Result<Algorithm> {
        let forced = if self.algorithm != Algorithm::Auto { self.algorithm } else { configured.for_op(kind) };
        if forced.applies_to(kind) {
            Ok(forced)
        } else {
            Err(not_applicable(kind, forced))
        }
    }

    /// The deadline of this call's waits: this call's timeout, else `default`.
    pub fn timeout_or(&self, default: Duration) -> Duration {
        self.timeout.unwrap_or(default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_call_wins_over_the_configuration_and_must_apply() {
        let cfg = AlgorithmOverrides::global(Algorithm::Bruck);
        let auto = CallOptions::default();
        assert_eq!(auto.forced_algorithm(OpKind::AllGather, &cfg).unwrap(), Algorithm::Bruck);
        assert_eq!(auto.forced_algorithm(OpKind::AllReduce, &cfg).unwrap(), Algorithm::Auto);
        let ring = CallOptions { algorithm: Algorithm::Ring, timeout: None, stream: None };
        assert_eq!(ring.forced_algorithm(OpKind::AllGather, &cfg).unwrap(), Algorithm::Ring);
        assert!(ring.forced_algorithm(OpKind::Barrier, &cfg).is_err());
        assert_eq!(ring.timeout_or(Duration::from_secs(3)), Duration::from_secs(3));
    }
}
