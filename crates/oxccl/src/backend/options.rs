//! What a caller can set for one call ([`CallOptions`]), and how every engine turns it, with
//! the communicator's configuration, into the algorithm and deadline of that call.

use std::time::Duration;

use crate::algorithm::{not_applicable, Algorithm, AlgorithmOverrides};
use crate::error::Result;
use crate::fingerprint::OpKind;

/// Options of one call, set on a communicator handle with `Communicator::with_algorithm` and
/// `Communicator::with_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallOptions {
    /// Forced algorithm (`Auto`: the configured override, else the selector's choice).
    pub algorithm: Algorithm,
    /// Deadline of this call's waits (None: the communicator's timeout).
    pub timeout: Option<Duration>,
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
        let ring = CallOptions { algorithm: Algorithm::Ring, timeout: None };
        assert_eq!(ring.forced_algorithm(OpKind::AllGather, &cfg).unwrap(), Algorithm::Ring);
        assert!(ring.forced_algorithm(OpKind::Barrier, &cfg).is_err());
        assert_eq!(ring.timeout_or(Duration::from_secs(3)), Duration::from_secs(3));
    }
}
