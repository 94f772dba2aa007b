//! A transport assembled from per-peer [`Link`]s: sends go out through the link that reaches
//! the peer (shared memory on this host, TCP to other hosts); everything that arrives, by
//! any link, lands in one [`Mailbox`], where receives find it.
//!
//! Failure notices and release notices travel as frames of their own kinds, so a peer learns
//! that a communicator failed or ended here through the same ordered stream as the data.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::{encode_error, FrameKind};
use super::mailbox::Mailbox;
use super::{Channel, Header, LinkKind, Pieces, Received, Stage, Transport, TransportError};
use crate::error::Error;

/// How long a send that found a peer's connection closed waits for the failure notice the
/// peer may have sent ahead of closing (see [`RoutedTransport`]'s `send`).
const LAST_WORDS: std::time::Duration = std::time::Duration::from_millis(50);

/// Moves frames from this endpoint to peers. Implementations deliver what arrives from
/// their peers into the endpoint's [`Mailbox`] (data with `deliver`, failure notices with
/// `fail`, release notices with `close`, a broken connection with `lose`).
pub trait Link: Send + Sync {
    /// What kind of link this is.
    fn kind(&self) -> LinkKind;

    /// Sends one frame to `peer`, in order with every earlier frame to `peer`.
    ///
    /// # Errors
    /// [`TransportError::PeerLost`] when the peer is unreachable; `Timeout` at `deadline`.
    fn send_frame(
        &self,
        peer: usize,
        kind: FrameKind,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), TransportError>;

    /// Makes sure `peer` can be reached: a link that connects on demand connects now (a
    /// receiver calls it before it waits, so a peer that is gone is found even when it never
    /// sent anything). Links whose peers are always reachable have nothing to do.
    ///
    /// # Errors
    /// [`TransportError::PeerLost`] when the peer is gone; `Timeout` at `deadline`; `Other`
    /// when the connection is refused for another reason.
    fn reach(&self, _peer: usize, _deadline: Instant) -> Result<(), TransportError> {
        Ok(())
    }

    /// Moves frames that have arrived on this link into the mailbox on the caller's thread,
    /// for a receiver that waits as `want` says: [`Polled::Took`] when the frame it waits
    /// for was taken (a link may read its payload straight into `want.buf`, or find it in
    /// the mailbox); else whether any frame moved. Links whose frames arrive by themselves
    /// (through their own threads) have nothing to do here.
    ///
    /// # Errors
    /// As [`Mailbox::recv`]; `Timeout` when a payload the link began reading into
    /// `want.buf` did not all arrive by `want.deadline`.
    fn poll(&self, _want: &mut Want<'_>) -> Result<Polled, TransportError> {
        Ok(Polled::Nothing)
    }

    /// [`Transport::exchange`] between `to` and `from`, both reached by this link, on the
    /// caller's thread; `Ok(false)`, having done nothing, where the link does not.
    ///
    /// # Errors
    /// As [`Transport::exchange`].
    fn exchange(
        &self,
        _to: usize,
        _from: usize,
        _header: &Header,
        _at: Option<Stage>,
        _pieces: &mut dyn Pieces,
        _deadline: Instant,
    ) -> Result<bool, TransportError> {
        Ok(false)
    }

    /// Whether [`Link::poll`] can move frames (yes unless the link says otherwise). A link
    /// whose every frame is in the mailbox once its send returns says no: a receiver waiting
    /// on it then only watches the mailbox, for [`Link::poll_for`] and [`Link::yield_for`]
    /// as it would poll ([`Mailbox::recv_polling`], which takes the mailbox's lock only when
    /// something arrived, where a look for a poll's frame takes it every time).
    fn pollable(&self) -> bool {
        true
    }

    /// How long a receiver waiting for a frame from this link keeps calling [`Link::poll`]
    /// before it yields ([`Link::yield_for`]) or sleeps until the link delivers (zero: it
    /// goes on at once).
    fn poll_for(&self) -> Duration {
        Duration::ZERO
    }

    /// How long a receiver keeps calling [`Link::poll`] after [`Link::poll_for`], yielding
    /// its CPU between calls, before it sleeps (zero: it does not yield).
    fn yield_for(&self) -> Duration {
        Duration::ZERO
    }

    /// Announces a receiver that calls [`Link::poll`] for frames from `peer` until
    /// [`Link::stop_polling`]: the link may then leave its own thread asleep.
    fn start_polling(&self, _peer: usize) {}

    /// Ends [`Link::start_polling`], and moves (or has the link's own thread move) what
    /// arrived while the link counted on the poller.
    fn stop_polling(&self, _peer: usize) {}
}

/// What a receiver waits for, given to [`Link::poll`].
#[derive(Debug)]
pub struct Want<'b> {
    /// The transport rank it waits on.
    pub peer: usize,
    /// The communicator.
    pub comm_id: u64,
    /// The channel within it.
    pub channel: Channel,
    /// The stage of the collective the wait belongs to (`None`: point-to-point).
    pub at: Option<Stage>,
    /// Where the payload goes.
    pub buf: &'b mut [u8],
    /// When the wait gives up.
    pub deadline: Instant,
}

/// What a [`Link::poll`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// Nothing moved.
    Nothing,
    /// Frames moved into the mailbox.
    Moved,
    /// The frame waited for was taken into the receiver's buffer.
    Took(Received),
}

/// A receiver's [`Link::start_polling`], ended when dropped (also on an early error).
struct Polling<'a>(&'a dyn Link, usize);

impl<'a> Polling<'a> {
    fn start(link: &'a dyn Link, peer: usize) -> Polling<'a> {
        link.start_polling(peer);
        Polling(link, peer)
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        self.0.stop_polling(self.1);
    }
}

/// A [`Transport`] that routes each peer to a [`Link`] and receives through one [`Mailbox`].
pub struct RoutedTransport {
    rank: usize,
    mailbox: Arc<Mailbox>,
    routes: Vec<Option<Arc<dyn Link>>>,
    /// The host of each rank (see [`Transport::host_of`]).
    hosts: Vec<usize>,
}

impl RoutedTransport {
    /// `routes[p]` reaches transport rank `p`. For this rank a route is optional: with
    /// none, frames to self are delivered directly, and receives from self wait on the
    /// mailbox alone.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a peer other than `rank` has no route.
    pub fn new(rank: usize, mailbox: Arc<Mailbox>, routes: Vec<Option<Arc<dyn Link>>>) -> Result<Self, Error> {
        if let Some(p) = (0..routes.len()).find(|&p| p != rank && routes[p].is_none()) {
            return Err(Error::invalid(format!("no link reaches rank {p}")));
        }
        if rank >= routes.len() {
            return Err(Error::invalid(format!("rank {rank} of a world of {}", routes.len())));
        }
        let hosts = vec![0; routes.len()];
        Ok(RoutedTransport { rank, mailbox, routes, hosts })
    }

    /// Says which host each rank is on (`hosts[p]`, numbered in order of first appearance);
    /// without it every rank counts as on one host.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `hosts` does not have one entry per rank.
    pub fn with_hosts(mut self, hosts: Vec<usize>) -> Result<Self, Error> {
        if hosts.len() != self.routes.len() {
            return Err(Error::invalid(format!("{} hosts for a world of {}", hosts.len(), self.routes.len())));
        }
        self.hosts = hosts;
        Ok(self)
    }

    fn link(&self, peer: usize) -> Result<&Arc<dyn Link>, TransportError> {
        self.routes.get(peer).and_then(Option::as_ref).ok_or_else(|| {
            TransportError::Other(Error::invalid(format!("rank {peer} is not reachable from rank {}", self.rank)))
        })
    }

    fn check_peer(&self, peer: usize) -> Result<(), TransportError> {
        if peer < self.routes.len() {
            Ok(())
        } else {
            Err(TransportError::Other(Error::invalid(format!(
                "rank {peer} is not in this world of {}",
                self.routes.len()
            ))))
        }
    }

    /// A send that found `peer`'s connection closed reports the failure `peer` announced for
    /// `comm_id`, if it did: a peer that failed sends its notice ahead of closing, and that
    /// cause names the rank to blame. The notice gets a moment to be taken in (the write may
    /// have found the connection broken before the reader got to it).
    fn blame<T>(&self, r: Result<T, TransportError>, comm_id: u64, deadline: Instant) -> Result<T, TransportError> {
        match r {
            Err(TransportError::PeerLost { peer, detail }) => {
                let until = deadline.min(Instant::now() + LAST_WORDS);
                match self.mailbox.failure_from(comm_id, peer, until) {
                    Some(error) => Err(TransportError::PeerFailed { peer, error }),
                    None => Err(TransportError::PeerLost { peer, detail }),
                }
            }
            r => r,
        }
    }

    /// Sends a notice; its fingerprint's sequence number carries the stage (see
    /// [`Stage::seq`]).
    fn notice(&self, peers: &[usize], kind: FrameKind, comm_id: u64, at: Stage, payload: &[u8]) {
        let header = Header {
            comm_id,
            channel: Channel::Collective,
            fingerprint: crate::fingerprint::Fingerprint {
                seq: at.seq(),
                op: crate::op_kind::OpKind::Barrier,
                dtype: crate::dtype::DType::U8,
                count: 0,
                root: None,
                reduce: None,
                algorithm: crate::algorithm::Algorithm::Auto,
            },
        };
        // Notices are best effort and must not hang a failing rank: a short deadline.
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        for &p in peers.iter().filter(|&&p| p != self.rank) {
            if let Ok(link) = self.link(p) {
                let _ = link.send_frame(p, kind, &header, payload, deadline);
            }
        }
    }
}

impl Transport for RoutedTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn host_of(&self, peer: usize) -> usize {
        self.hosts.get(peer).copied().unwrap_or(0)
    }

    fn link_kind(&self, peer: usize) -> LinkKind {
        self.routes.get(peer).and_then(|r| r.as_ref()).map_or(LinkKind::Memory, |l| l.kind())
    }

    fn send(&self, peer: usize, header: &Header, payload: &[u8], deadline: Instant) -> Result<(), TransportError> {
        if let Some(reason) = self.mailbox.aborted(header.comm_id) {
            return Err(TransportError::Aborted(reason));
        }
        self.check_peer(peer)?;
        if peer == self.rank && matches!(self.routes.get(peer), Some(None)) {
            self.mailbox.deliver(peer, *header, payload.to_vec());
            return Ok(());
        }
        self.blame(
            self.link(peer)?.send_frame(peer, FrameKind::Data, header, payload, deadline),
            header.comm_id,
            deadline,
        )
    }

    fn recv(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<Received, TransportError> {
        self.check_peer(peer)?;
        if let Some(Some(link)) = self.routes.get(peer) {
            link.reach(peer, deadline)?;
        }
        // Caller-driven progress: on a link that can be polled, the receiver moves the frame
        // itself instead of waiting for the link's own thread to deliver it and wake us:
        // spinning for the link's poll, then yielding the CPU between looks (where ranks
        // share CPUs, a peer that has work runs at once), then asleep.
        if let Some(Some(link)) = self.routes.get(peer) {
            let budget = link.poll_for();
            let yields = link.yield_for();
            if !link.pollable() {
                // Nothing for the receiver to move: it watches the mailbox for as long.
                return self.mailbox.recv_polling(peer, comm_id, channel, at, buf, deadline, budget, yields);
            }
            if !budget.is_zero() || !yields.is_zero() {
                let _polling = Polling::start(link.as_ref(), peer);
                let mut started = None;
                loop {
                    if let Some(r) = self.mailbox.try_recv(peer, comm_id, channel, at, buf)? {
                        return Ok(r);
                    }
                    let mut want = Want { peer, comm_id, channel, at, buf: &mut *buf, deadline };
                    match link.poll(&mut want)? {
                        Polled::Took(r) => return Ok(r),
                        Polled::Moved => continue,
                        Polled::Nothing => {}
                    }
                    let now = Instant::now();
                    let waited = now.duration_since(*started.get_or_insert(now));
                    if waited >= budget + yields || now >= deadline {
                        break;
                    }
                    if waited >= budget {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
        self.mailbox.recv(peer, comm_id, channel, at, buf, deadline)
    }

    fn try_recv(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
        buf: &mut [u8],
    ) -> Result<Option<Received>, TransportError> {
        self.check_peer(peer)?;
        self.mailbox.try_recv_queued(peer, comm_id, channel, at, buf)
    }

    fn recv_any(
        &self,
        peers: &[usize],
        first: usize,
        comm_id: u64,
        channel: Channel,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<(usize, Received), TransportError> {
        for &p in peers {
            self.check_peer(p)?;
        }
        // Every source can be reached (links that connect on demand connect now), so a
        // source that is gone is found although it never sent anything.
        for &p in peers.iter().filter(|&&p| p != self.rank) {
            if let Some(Some(link)) = self.routes.get(p) {
                link.reach(p, deadline)?;
            }
        }
        // No caller-driven progress here: the frame may come by any link, and every link
        // delivers by itself (the shared-memory progress thread, the TCP progress thread).
        self.mailbox.recv_any(self.rank(), peers, first, comm_id, channel, buf, deadline)
    }

    fn reach(&self, peer: usize, deadline: Instant) -> Result<(), TransportError> {
        self.check_peer(peer)?;
        match self.routes.get(peer) {
            Some(Some(link)) if peer != self.rank => link.reach(peer, deadline),
            _ => Ok(()),
        }
    }

    fn recv_any_arrived(
        &self,
        peers: &[usize],
        first: usize,
        comm_id: u64,
        channel: Channel,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<(usize, Received), TransportError> {
        for &p in peers {
            self.check_peer(p)?;
        }
        self.mailbox.recv_any(self.rank(), peers, first, comm_id, channel, buf, deadline)
    }

    fn exchange(
        &self,
        to: usize,
        from: usize,
        header: &Header,
        at: Option<Stage>,
        pieces: &mut dyn Pieces,
        deadline: Instant,
    ) -> Result<bool, TransportError> {
        self.check_peer(to)?;
        self.check_peer(from)?;
        let (Some(Some(a)), Some(Some(b))) = (self.routes.get(to), self.routes.get(from)) else { return Ok(false) };
        if !Arc::ptr_eq(a, b) {
            return Ok(false);
        }
        a.reach(to, deadline)?;
        a.reach(from, deadline)?;
        if let Some(reason) = self.mailbox.aborted(header.comm_id) {
            return Err(TransportError::Aborted(reason));
        }
        self.blame(a.exchange(to, from, header, at, pieces, deadline), header.comm_id, deadline)
    }

    fn probe(
        &self,
        peer: usize,
        comm_id: u64,
        channel: Channel,
        at: Option<Stage>,
    ) -> Result<Option<Received>, TransportError> {
        self.check_peer(peer)?;
        self.mailbox.probe(peer, comm_id, channel, at)
    }

    fn abort(&self, comm_id: u64, reason: &str) {
        self.mailbox.abort(comm_id, reason);
    }

    fn waiting_on(&self, comm_id: u64) -> Option<usize> {
        self.mailbox.waiting_on(comm_id)
    }

    fn notify_failure(&self, comm_id: u64, peers: &[usize], at: Stage, error: &Error) {
        self.notice(peers, FrameKind::Failure, comm_id, at, &encode_error(error));
    }

    fn release(&self, comm_id: u64, peers: &[usize]) {
        self.mailbox.forget(comm_id);
        self.notice(peers, FrameKind::Release, comm_id, Stage::Setup, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::op_kind::OpKind;

    /// A link whose every peer has closed its connection.
    struct Closed;

    impl Link for Closed {
        fn kind(&self) -> LinkKind {
            LinkKind::Tcp
        }

        fn send_frame(
            &self,
            peer: usize,
            _: FrameKind,
            _: &Header,
            _: &[u8],
            _: Instant,
        ) -> Result<(), TransportError> {
            Err(TransportError::PeerLost { peer, detail: format!("the connection to rank {peer} closed") })
        }
    }

    /// A link whose frames arrive only when a receiver polls it: the third poll moves a
    /// frame from rank 0 into the mailbox. It counts the polls and the receivers polling.
    struct PolledOnly {
        mailbox: Arc<Mailbox>,
        yield_for: std::time::Duration,
        polls: std::sync::atomic::AtomicUsize,
        pollers: std::sync::atomic::AtomicIsize,
    }

    impl Link for PolledOnly {
        fn kind(&self) -> LinkKind {
            LinkKind::Tcp
        }

        fn send_frame(&self, _: usize, _: FrameKind, _: &Header, _: &[u8], _: Instant) -> Result<(), TransportError> {
            Ok(())
        }

        fn poll(&self, _: &mut Want<'_>) -> Result<Polled, TransportError> {
            use std::sync::atomic::Ordering::SeqCst;
            assert_eq!(self.pollers.load(SeqCst), 1, "a poll outside start_polling/stop_polling");
            if self.polls.fetch_add(1, SeqCst) == 2 {
                self.mailbox.deliver(0, header(7), b"polled".to_vec());
                return Ok(Polled::Moved);
            }
            Ok(Polled::Nothing)
        }

        fn yield_for(&self) -> std::time::Duration {
            self.yield_for
        }

        fn start_polling(&self, _: usize) {
            self.pollers.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }

        fn stop_polling(&self, _: usize) {
            self.pollers.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A receiver whose link has no spin but a yield phase (ranks that outnumber their
    /// CPUs) reads the link itself between yields: the frame that only a poll brings
    /// arrives. Without the phase it sleeps until the link's own thread delivers, which this
    /// one never does.
    #[test]
    fn a_yielding_receiver_polls_its_link_itself() {
        use std::sync::atomic::Ordering::SeqCst;
        use std::time::Duration;
        for (yield_for, polled) in [(Duration::from_secs(5), true), (Duration::ZERO, false)] {
            let mailbox = Arc::new(Mailbox::new());
            let link = Arc::new(PolledOnly {
                mailbox: Arc::clone(&mailbox),
                yield_for,
                polls: Default::default(),
                pollers: Default::default(),
            });
            let dyn_link: Arc<dyn Link> = Arc::clone(&link) as Arc<dyn Link>;
            let t = RoutedTransport::new(1, mailbox, vec![Some(dyn_link), None]).expect("routes");
            let mut buf = [0u8; 6];
            let deadline = Instant::now() + Duration::from_millis(300);
            let got = t.recv(0, 7, Channel::Collective, None, &mut buf, deadline);
            if polled {
                assert_eq!(got.map(|r| r.len).ok(), Some(6));
                assert_eq!(&buf, b"polled");
                assert_eq!(link.polls.load(SeqCst), 3);
            } else {
                assert!(matches!(got, Err(TransportError::Timeout { peer: 0 })), "{got:?}");
                assert_eq!(link.polls.load(SeqCst), 0);
            }
            assert_eq!(link.pollers.load(SeqCst), 0, "every start_polling is ended");
        }
    }

    fn header(comm_id: u64) -> Header {
        let fingerprint = Fingerprint {
            seq: 4,
            op: OpKind::AllReduce,
            dtype: crate::DType::F32,
            count: 1,
            root: None,
            reduce: None,
            algorithm: crate::Algorithm::Ring,
        };
        Header { comm_id, channel: Channel::Collective, fingerprint }
    }

    /// Rank 0 lost rank 1, told rank 2 so, and exited: rank 2's next send to rank 0 finds the
    /// connection closed and must report rank 0's notice (which names rank 1), not the close.
    #[test]
    fn a_send_to_a_peer_that_announced_its_failure_reports_the_cause() {
        let mailbox = Arc::new(Mailbox::new());
        let link: Arc<dyn Link> = Arc::new(Closed);
        let t = RoutedTransport::new(2, Arc::clone(&mailbox), vec![Some(Arc::clone(&link)), Some(link), None])
            .expect("routes");
        let cause = Error::PeerLost { rank: 1, detail: "killed".into() };
        mailbox.fail(7, 0, Stage::Collective(4), cause.clone());
        let deadline = Instant::now() + std::time::Duration::from_secs(1);
        match t.send(0, &header(7), b"x", deadline) {
            Err(TransportError::PeerFailed { peer: 0, error }) => assert_eq!(error.to_string(), cause.to_string()),
            other => panic!("expected rank 0's failure, got {other:?}"),
        }
        // Without a notice (rank 1 itself, another communicator) the closed connection is
        // what there is to say.
        assert!(matches!(t.send(1, &header(7), b"x", deadline), Err(TransportError::PeerLost { peer: 1, .. })));
        assert!(matches!(t.send(0, &header(8), b"x", deadline), Err(TransportError::PeerLost { peer: 0, .. })));
    }
}
