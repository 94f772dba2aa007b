//! A communicator's poisoned state: after a timeout, mismatch, lost peer, abort or backend
//! error, every later call on the communicator fails at once with
//! [`Error::Aborted`], naming the first failure. Every engine keeps one.

use crate::error::{Error, Result};

/// The first failure of a communicator, once there was one.
#[derive(Debug, Default)]
pub struct Poison(Option<Error>);

impl Poison {
    /// `Ok` while nothing failed; afterwards the error every later call returns: the abort
    /// itself, or `Aborted` that names the earlier failure.
    ///
    /// # Errors
    /// [`Error::Aborted`] once the communicator is poisoned.
    pub fn check(&self) -> Result<()> {
        match &self.0 {
            None => Ok(()),
            Some(Error::Aborted { reason }) => Err(Error::Aborted { reason: reason.clone() }),
            Some(e @ Error::Revoked { .. }) => Err(e.clone()),
            Some(e) => Err(Error::Aborted { reason: format!("an earlier operation failed: {e}") }),
        }
    }

    /// Records `e` as the failure. Returns `true` when it is the first (then the engine
    /// tells its peers), `false` when the communicator was already poisoned (`e` is dropped).
    pub fn set(&mut self, e: Error) -> bool {
        if self.0.is_some() {
            return false;
        }
        self.0 = Some(e);
        true
    }

    /// Revokes: `e` (an [`Error::Revoked`]) replaces any earlier failure, since the revoke
    /// is what every later call reports. Whether it changed anything (a second revoke
    /// does not).
    pub fn revoke(&mut self, e: Error) -> bool {
        if matches!(self.0, Some(Error::Revoked { .. })) {
            return false;
        }
        self.0 = Some(e);
        true
    }

    /// The revoke, if the communicator was revoked.
    pub fn revoked(&self) -> Option<&Error> {
        self.0.as_ref().filter(|e| matches!(e, Error::Revoked { .. }))
    }

    /// Whether something failed.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_calls_see_the_first_failure_as_aborted() {
        let mut p = Poison::default();
        assert!(p.check().is_ok());
        assert!(p.set(Error::PeerLost { rank: 2, detail: "connection reset".into() }));
        assert!(!p.set(Error::Aborted { reason: "second".into() }));
        let e = p.check().unwrap_err().to_string();
        assert!(e.contains("earlier operation failed") && e.contains('2'), "{e}");
        let mut a = Poison::default();
        a.set(Error::Aborted { reason: "user said stop".into() });
        assert!(matches!(a.check(), Err(Error::Aborted { reason }) if reason == "user said stop"));
    }

    #[test]
    fn a_revoke_replaces_an_earlier_failure_and_is_reported_as_itself() {
        let mut p = Poison::default();
        p.set(Error::PeerLost { rank: 2, detail: "gone".into() });
        assert!(p.revoked().is_none());
        let r = Error::Revoked { rank: 1, reason: "rank 2 died".into() };
        assert!(p.revoke(r.clone()));
        assert!(!p.revoke(Error::Revoked { rank: 0, reason: "again".into() }), "the first revoke stays");
        assert!(!p.set(Error::Aborted { reason: "later".into() }));
        assert_eq!(p.check(), Err(r.clone()));
        assert_eq!(p.revoked(), Some(&r));
    }
}
