//! Which connection a pair of ranks keeps, without I/O: [`PeerTable`], the state of this
//! rank's connection to each peer, and the rules that make two ranks that dial each other at
//! the same moment end with exactly one connection.
//!
//! Connections are made on demand: the first time a caller of this rank needs a peer (to
//! send to it, or to wait for it) it dials, unless the peer's connection is already here
//! or on its way. The dialing side runs on the caller's thread ([`PeerTable::want`], then
//! [`PeerTable::dialed`]); the accepting side on the progress thread
//! ([`PeerTable::hello`] for each lane's identity message, [`PeerTable::lane_arrived`] once
//! it is accepted). Every transition happens under the table's one lock, so:
//!
//! - a peer this rank is dialing that dials back is **refused when it is the higher rank**
//!   (`Crossed`: the lower rank's dial wins), and **accepted when it is the lower rank** (this
//!   rank's own dial will then be refused by the peer, and the caller takes the accepted
//!   connection);
//! - a connection that exists refuses a second one (`Duplicate`), a lost peer's dial is
//!   refused as lost (`Lost`: the dialer loses this rank too); a connection being accepted
//!   gives way to a new first lane from the same peer, which dials one connection at a time
//!   (the earlier dial was given up between two lanes);
//! - a server answers a connection's last lane and installs the connection under the
//!   table's lock, so its own callers cannot write on the lane before the answer, nor find
//!   the peer connected without the connection; a client counts a dial done when the answer
//!   arrives, and the server then holds the connection (or has lost the peer).
//!
//! A lost peer stays lost: connections are not re-established.

use std::time::{Duration, Instant};

use super::handshake::Verdict;

/// Where this rank stands with one peer.
#[derive(Debug)]
enum PeerState<S> {
    /// No connection, none on its way.
    Idle,
    /// A caller of this rank is dialing.
    Dialing,
    /// The peer dialed; these lanes were accepted so far (since the instant).
    Accepting { lanes: Vec<Option<S>>, since: Instant },
    /// The connection exists.
    Connected,
    /// The peer is gone (what was observed).
    Lost(String),
}

/// What a caller that needs a peer does next ([`PeerTable::want`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// The connection exists.
    Ready,
    /// Dial it (the table now counts this caller as dialing).
    Dial,
    /// Someone else is making it: wait for the table to change.
    Wait,
    /// The peer is lost.
    Gone(String),
}

/// How a dial ended, for [`PeerTable::dialed`].
#[derive(Debug)]
pub(super) enum Dialed {
    /// Every lane was accepted: the connection exists on both sides.
    Connected,
    /// The peer refused because a connection of its own is kept instead (`Crossed`,
    /// `Duplicate`): the caller waits for it.
    Yielded,
    /// The dial failed for good (the peer is lost): what was observed.
    Failed(String),
    /// The caller gave up (its deadline): the peer may be dialed again.
    GaveUp,
    /// The caller's deadline came while the peer's port refused connections, as it has
    /// since the instant: the peer may be dialed again, and the next dial counts the refusal
    /// from that instant ([`PeerTable::refused_since`]) until it is long enough to be final.
    Refused { since: Instant },
}

/// The connection state of every peer of one rank (see the module documentation).
#[derive(Debug)]
pub(super) struct PeerTable<S> {
    me: usize,
    slots: Vec<PeerState<S>>,
    /// Per peer: since when its port refused every dial, across dials that ended at their
    /// callers' deadlines (cleared by any other outcome).
    refused: Vec<Option<Instant>>,
}

impl<S> PeerTable<S> {
    /// The table of rank `me` in a world of `world`, nothing connected.
    pub(super) fn new(me: usize, world: usize) -> Self {
        PeerTable { me, slots: (0..world).map(|_| PeerState::Idle).collect(), refused: vec![None; world] }
    }

    /// A caller needs `peer`: whether it dials, waits or goes on.
    pub(super) fn want(&mut self, peer: usize) -> Next {
        match &self.slots[peer] {
            PeerState::Connected => Next::Ready,
            PeerState::Lost(why) => Next::Gone(why.clone()),
            PeerState::Dialing | PeerState::Accepting { .. } => Next::Wait,
            PeerState::Idle => {
                self.slots[peer] = PeerState::Dialing;
                Next::Dial
            }
        }
    }

    /// The dial a caller began after [`Next::Dial`] ended as `how`.
    pub(super) fn dialed(&mut self, peer: usize, how: Dialed) {
        let slot = &mut self.slots[peer];
        // Only the dialer's own state is changed: an accepted connection (the peer was the
        // lower rank and its dial won) or a loss found meanwhile stand.
        if !matches!(slot, PeerState::Dialing) {
            return;
        }
        self.refused[peer] = None;
        *slot = match how {
            Dialed::Connected => PeerState::Connected,
            Dialed::Yielded | Dialed::GaveUp => PeerState::Idle,
            Dialed::Refused { since } => {
                self.refused[peer] = Some(since);
                PeerState::Idle
            }
            Dialed::Failed(why) => PeerState::Lost(why),
        };
    }

    /// Since when `peer`'s port refused every dial, if the dials so far ended so
    /// ([`Dialed::Refused`]).
    pub(super) fn refused_since(&self, peer: usize) -> Option<Instant> {
        self.refused[peer]
    }

    /// The verdict on lane `lane` (of `lanes`) of a connection from `peer`, whose identity
    /// already checked out; an accepted lane 0 starts accepting the connection.
    pub(super) fn hello(&mut self, peer: usize, lane: usize, lanes: usize, now: Instant) -> Verdict {
        let me = self.me;
        let slot = &mut self.slots[peer];
        if lane > 0 {
            return match slot {
                PeerState::Accepting { lanes: got, .. } if got.get(lane).is_some_and(Option::is_none) => {
                    Verdict::Accepted
                }
                _ => Verdict::Unexpected,
            };
        }
        match slot {
            PeerState::Connected => Verdict::Duplicate,
            // Answered so, the peer stops dialing: Duplicate would make it wait for a
            // connection of ours that never comes, and dial again, until its deadline.
            PeerState::Lost(_) => Verdict::Lost,
            PeerState::Dialing if peer > me => Verdict::Crossed,
            // A peer dials one connection at a time: a new first lane means it gave up on the
            // one being accepted (its caller's deadline passed between two lanes), whose
            // lanes are dropped.
            PeerState::Dialing | PeerState::Idle | PeerState::Accepting { .. } => {
                *slot = PeerState::Accepting { lanes: (0..lanes).map(|_| None).collect(), since: now };
                Verdict::Accepted
            }
        }
    }

    /// Lane `lane` of `peer`'s connection was accepted ([`PeerTable::hello`] said so): when
    /// it completes the connection, its lanes in order, and the peer counts as connected.
    pub(super) fn lane_arrived(&mut self, peer: usize, lane: usize, sock: S) -> Option<Vec<S>> {
        let PeerState::Accepting { lanes, .. } = &mut self.slots[peer] else { return None };
        let place = lanes.get_mut(lane)?;
        *place = Some(sock);
        if lanes.iter().any(Option::is_none) {
            return None;
        }
        let done = std::mem::replace(&mut self.slots[peer], PeerState::Connected);
        match done {
            PeerState::Accepting { lanes, .. } => Some(lanes.into_iter().flatten().collect()),
            _ => None,
        }
    }

    /// Gives up on connections whose lanes stopped arriving `patience` ago (the peer may dial
    /// again); the peers given up on.
    pub(super) fn expire(&mut self, now: Instant, patience: Duration) -> Vec<usize> {
        let mut gone = Vec::new();
        for (p, slot) in self.slots.iter_mut().enumerate() {
            if matches!(slot, PeerState::Accepting { since, .. } if now.duration_since(*since) >= patience) {
                *slot = PeerState::Idle;
                gone.push(p);
            }
        }
        gone
    }

    /// `peer` is lost (its connection ended, or this rank shut down): nothing more is made.
    pub(super) fn lose(&mut self, peer: usize, why: &str) {
        if !matches!(self.slots[peer], PeerState::Lost(_)) {
            self.slots[peer] = PeerState::Lost(why.to_string());
        }
    }

    /// Whether `peer` is connected.
    pub(super) fn connected(&self, peer: usize) -> bool {
        matches!(self.slots[peer], PeerState::Connected)
    }

    /// The oldest connection being accepted, if any: when [`PeerTable::expire`] may next
    /// have work.
    #[cfg(test)]
    pub(super) fn oldest_accepting(&self) -> Option<Instant> {
        self.slots
            .iter()
            .filter_map(|s| match s {
                PeerState::Accepting { since, .. } => Some(*since),
                _ => None,
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Instant {
        Instant::now()
    }

    /// Two ranks' tables and the messages between them, played in a chosen order.
    struct Pair {
        low: PeerTable<&'static str>,
        high: PeerTable<&'static str>,
    }

    fn pair() -> Pair {
        Pair { low: PeerTable::new(0, 2), high: PeerTable::new(1, 2) }
    }

    #[test]
    fn simultaneous_dials_keep_the_lower_ranks_connection() {
        for lanes in [1, 3] {
            // Both dial at once; each server sees the other's hello while dialing.
            let mut p = pair();
            assert_eq!(p.low.want(1), Next::Dial);
            assert_eq!(p.high.want(0), Next::Dial);
            // The high rank's hello reaches the low rank, which is dialing: refused.
            assert_eq!(p.low.hello(1, 0, lanes, now()), Verdict::Crossed);
            p.high.dialed(0, Dialed::Yielded);
            // The low rank's hello reaches the high rank: accepted whatever its state.
            assert_eq!(p.high.hello(0, 0, lanes, now()), Verdict::Accepted);
            assert_eq!(p.high.want(0), Next::Wait);
            for lane in 1..lanes {
                assert_eq!(p.high.lane_arrived(0, lane - 1, "s"), None);
                assert_eq!(p.high.hello(0, lane, lanes, now()), Verdict::Accepted);
            }
            assert_eq!(p.high.lane_arrived(0, lanes - 1, "s").map(|v| v.len()), Some(lanes));
            p.low.dialed(1, Dialed::Connected);
            assert_eq!((p.low.want(1), p.high.want(0)), (Next::Ready, Next::Ready));
            assert!(p.low.connected(1) && p.high.connected(0));
        }
    }

    #[test]
    fn the_other_order_of_a_crossing_also_ends_with_one_connection() {
        // The low rank's hello reaches the high rank before the high rank's reaches it.
        let mut p = pair();
        assert_eq!(p.low.want(1), Next::Dial);
        assert_eq!(p.high.want(0), Next::Dial);
        assert_eq!(p.high.hello(0, 0, 1, now()), Verdict::Accepted);
        assert_eq!(p.high.lane_arrived(0, 0, "s"), Some(vec!["s"]));
        p.low.dialed(1, Dialed::Connected);
        // Then the high rank's own dial arrives: the low rank already holds a connection.
        assert_eq!(p.low.hello(1, 0, 1, now()), Verdict::Duplicate);
        // Its refusal does not undo the accepted connection.
        p.high.dialed(0, Dialed::Yielded);
        assert!(p.high.connected(0));
    }

    #[test]
    fn a_lone_dial_from_either_side_is_accepted() {
        let mut p = pair();
        assert_eq!(p.high.want(0), Next::Dial);
        assert_eq!(p.low.hello(1, 0, 1, now()), Verdict::Accepted);
        assert_eq!(p.low.want(1), Next::Wait);
        assert!(p.low.lane_arrived(1, 0, "s").is_some());
        p.high.dialed(0, Dialed::Connected);
        assert!(p.low.connected(1) && p.high.connected(0));
        // Only one dialer at a time per peer.
        let mut t: PeerTable<()> = PeerTable::new(0, 3);
        assert_eq!(t.want(2), Next::Dial);
        assert_eq!(t.want(2), Next::Wait);
        t.dialed(2, Dialed::GaveUp);
        assert_eq!(t.want(2), Next::Dial);
    }

    #[test]
    fn refusals_count_across_dials_until_another_outcome() {
        let mut t: PeerTable<()> = PeerTable::new(0, 2);
        let first = now();
        assert_eq!(t.refused_since(1), None);
        assert_eq!(t.want(1), Next::Dial);
        t.dialed(1, Dialed::Refused { since: first });
        assert_eq!(t.refused_since(1), Some(first));
        // The next dial is refused too: it reports the same first instant.
        assert_eq!(t.want(1), Next::Dial);
        t.dialed(1, Dialed::Refused { since: first });
        assert_eq!(t.refused_since(1), Some(first));
        // A dial that got further (its deadline came during the handshake) clears it.
        assert_eq!(t.want(1), Next::Dial);
        t.dialed(1, Dialed::GaveUp);
        assert_eq!(t.refused_since(1), None);
        // A dial that is not this caller's to end leaves it alone.
        t.dialed(1, Dialed::Refused { since: first });
        assert_eq!(t.refused_since(1), None);
    }

    #[test]
    fn lanes_must_follow_an_accepted_first_lane() {
        let mut t: PeerTable<u8> = PeerTable::new(0, 2);
        assert_eq!(t.hello(1, 1, 2, now()), Verdict::Unexpected);
        assert_eq!(t.hello(1, 0, 2, now()), Verdict::Accepted);
        assert_eq!(t.hello(1, 2, 2, now()), Verdict::Unexpected, "lane beyond the count");
        assert_eq!(t.lane_arrived(1, 1, 9), None);
        assert_eq!(t.hello(1, 1, 2, now()), Verdict::Unexpected, "lane 1 twice");
        assert_eq!(t.lane_arrived(1, 0, 8), Some(vec![8, 9]));
        // A dial given up between two lanes: the next dial's first lane starts afresh.
        let mut t: PeerTable<u8> = PeerTable::new(0, 2);
        assert_eq!(t.hello(1, 0, 2, now()), Verdict::Accepted);
        assert_eq!(t.lane_arrived(1, 0, 1), None);
        assert_eq!(t.hello(1, 0, 2, now()), Verdict::Accepted);
        assert_eq!(t.lane_arrived(1, 0, 2), None);
        assert_eq!(t.hello(1, 1, 2, now()), Verdict::Accepted);
        assert_eq!(t.lane_arrived(1, 1, 3), Some(vec![2, 3]));
        assert_eq!(t.hello(1, 0, 2, now()), Verdict::Duplicate, "connected");
    }

    #[test]
    fn stalled_acceptances_expire_and_losses_are_final() {
        let mut t: PeerTable<u8> = PeerTable::new(0, 3);
        let start = now();
        assert_eq!(t.hello(2, 0, 2, start), Verdict::Accepted);
        assert_eq!(t.oldest_accepting(), Some(start));
        assert!(t.expire(start + Duration::from_secs(1), Duration::from_secs(10)).is_empty());
        assert_eq!(t.expire(start + Duration::from_secs(10), Duration::from_secs(10)), vec![2]);
        assert_eq!(t.oldest_accepting(), None);
        assert_eq!(t.want(2), Next::Dial);
        t.dialed(2, Dialed::Failed("refused".into()));
        assert_eq!(t.want(2), Next::Gone("refused".into()));
        assert_eq!(t.hello(2, 0, 1, now()), Verdict::Lost);
        t.lose(1, "shut down");
        assert_eq!(t.want(1), Next::Gone("shut down".into()));
        // A loss found while dialing stands when the dial ends.
        assert_eq!(t.want(0), Next::Dial);
        t.lose(0, "gone");
        t.dialed(0, Dialed::Connected);
        assert_eq!(t.want(0), Next::Gone("gone".into()));
    }
}
