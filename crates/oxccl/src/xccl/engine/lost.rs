//! A grace for peers the host side reports lost, shared by every wait of the engine (for a
//! non-blocking call to settle, for an operation's completion event).
//!
//! A peer that finished an operation and then closed its communicator looks gone to the
//! host side at once, while this rank may still be settling or finishing the same
//! operation, which is complete: failing then would turn a success into `PeerLost`. A peer
//! that really died leaves the operation unable to finish, and after the grace the wait
//! fails with the host side's report, well within the 10 s a survivor has to notice. The
//! grace ends when both [`LOST_GRACE`] has passed and the waiting thread has looked again
//! [`LOST_WATCHES`] times: on a starved machine the wall clock runs while neither this
//! thread nor the one that would finish the operation runs.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The shortest grace.
pub(super) const LOST_GRACE: Duration = Duration::from_secs(2);
/// The fewest looks again (each wait looks at most every millisecond or two).
pub(super) const LOST_WATCHES: u32 = 500;

/// One wait's view of lost peers: the first report, when and how many looks ago.
#[derive(Debug, Default)]
pub(super) struct LostGrace {
    first: Option<(Instant, u32, Error)>,
}

impl LostGrace {
    /// What a wait does with what it saw at `now` (`watched`, the engine's check of its
    /// communicator and of the host side): `Ok` to go on (all well, or a lost peer still
    /// within the grace); the report once the grace is over; any other error at once.
    ///
    /// # Errors
    /// As said.
    pub(super) fn check(&mut self, now: Instant, watched: Result<()>) -> Result<()> {
        let e = match watched {
            Err(e @ Error::PeerLost { .. }) => e,
            other => return other,
        };
        let Some((since, looks, first)) = &mut self.first else {
            self.first = Some((now, 1, e));
            return Ok(());
        };
        *looks = looks.saturating_add(1);
        if now.duration_since(*since) >= LOST_GRACE && *looks >= LOST_WATCHES {
            return Err(first.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(rank: usize) -> Result<()> {
        Err(Error::PeerLost { rank, detail: "it closed this communicator".into() })
    }

    /// The first look that ends the grace, looking every `step`.
    fn ends_after(step: Duration) -> Option<(u32, Error)> {
        let (t0, mut g) = (Instant::now(), LostGrace::default());
        (0..10_000u32).find_map(|i| g.check(t0 + step * i, lost(if i == 0 { 3 } else { 4 })).err().map(|e| (i, e)))
    }

    #[test]
    fn the_grace_needs_both_its_time_and_its_looks() {
        // Looking every millisecond (an idle machine): the time ends it, with the first report.
        let (i, e) = ends_after(Duration::from_millis(1)).expect("the grace ends");
        assert_eq!(i, LOST_GRACE.as_millis() as u32);
        assert!(matches!(e, Error::PeerLost { rank: 3, .. }), "{e}");
        // A starved thread that looks once a second: the looks end it, long after the time
        // alone would have.
        let (i, _) = ends_after(Duration::from_secs(1)).expect("the grace ends");
        assert_eq!(i, LOST_WATCHES - 1);
    }

    #[test]
    fn other_errors_end_the_wait_at_once_and_health_goes_on() {
        let (t0, mut g) = (Instant::now(), LostGrace::default());
        assert!(g.check(t0, Ok(())).is_ok());
        assert!(g.check(t0, lost(1)).is_ok());
        let timeout = Err(Error::Aborted { reason: "rank 2 called abort".into() });
        assert!(matches!(g.check(t0, timeout), Err(Error::Aborted { .. })));
        assert!(g.check(t0 + Duration::from_millis(1), Ok(())).is_ok());
    }
}
