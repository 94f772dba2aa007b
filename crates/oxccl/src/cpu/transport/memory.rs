//! The in-memory transport of the `local` backend: every rank is a thread of one process,
//! and a send delivers the frame straight into the receiver's [`Mailbox`]. An endpoint is a
//! [`RoutedTransport`] whose links are [`MemoryLink`]s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::{FrameHeader, FrameKind};
use super::mailbox::Mailbox;
use super::routed::{Link, RoutedTransport};
use super::{Header, LinkKind, TransportError};
use crate::error::Error;

/// One endpoint of a [`MemoryHub`]: a [`RoutedTransport`] over [`MemoryLink`]s.
pub type MemoryTransport = RoutedTransport;

/// The shared state of an in-memory world: one mailbox per endpoint.
#[derive(Debug)]
pub struct MemoryHub {
    endpoints: Vec<Arc<Mailbox>>,
    /// Endpoints killed ([`MemoryHub::kill`]): their sends go nowhere.
    killed: Vec<AtomicBool>,
    /// For tests ([`MemoryHub::mute_after_agreement_sends`]): a rank, and how many more
    /// agreement messages it sends before the rest are dropped.
    #[cfg(test)]
    mute_plan: std::sync::Mutex<Option<(usize, usize)>>,
    /// How long a receiver looks for its frame, spinning and then yielding, before it sleeps
    /// (see [`Mailbox::recv_polling`]).
    poll_for: Duration,
    yield_for: Duration,
}

impl MemoryHub {
    /// A hub for `n` endpoints (take each with [`MemoryHub::endpoint`]) whose receivers
    /// look for their frame for up to `poll_for`, then for up to `yield_for` yielding their
    /// CPU between looks, before they sleep: where every rank's thread has a CPU, a frame
    /// comes within microseconds, and each sleep costs two thread wake-ups (see
    /// [`Mailbox::recv_polling`]); where the threads outnumber the CPUs, no spin, and a
    /// yield lets a sender run.
    pub fn polling(n: usize, poll_for: Duration, yield_for: Duration) -> Arc<MemoryHub> {
        Arc::new(MemoryHub {
            endpoints: (0..n).map(|_| Arc::new(Mailbox::new())).collect(),
            killed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            #[cfg(test)]
            mute_plan: std::sync::Mutex::new(None),
            poll_for,
            yield_for,
        })
    }

    /// Kills endpoint `rank` as a SIGKILL kills a process: from now on its sends go nowhere,
    /// and every other endpoint loses it (frames it sent before stay queued, as bytes in a
    /// socket outlive their sender). For tests of what survivors do.
    #[cfg(test)]
    pub fn kill(&self, rank: usize) {
        let Some(k) = self.killed.get(rank) else { return };
        k.store(true, Ordering::Release);
        for (r, mb) in self.endpoints.iter().enumerate() {
            if r != rank {
                mb.lose(rank, &format!("rank {rank} was killed"));
            }
        }
    }

    /// Makes endpoint `rank` drop every agreement message after its next `sends` ones, as
    /// if those never left it (it goes on otherwise; a test kills it later with
    /// [`MemoryHub::kill`]). For tests that stop a coordinator halfway through its commits.
    #[cfg(test)]
    pub fn mute_after_agreement_sends(&self, rank: usize, sends: usize) {
        *crate::sync::relock(&self.mute_plan) = Some((rank, sends));
    }

    /// Whether [`MemoryHub::mute_after_agreement_sends`] drops this message of `rank`.
    #[cfg(test)]
    fn muted(&self, rank: usize, header: &Header) -> bool {
        if header.fingerprint.op != crate::op_kind::OpKind::Agree {
            return false;
        }
        match crate::sync::relock(&self.mute_plan).as_mut() {
            Some((r, 0)) => *r == rank,
            Some((r, left)) if *r == rank => {
                *left -= 1;
                false
            }
            _ => false,
        }
    }

    /// Whether endpoint `rank` was killed: it tells nobody anything any more.
    fn killed(&self, rank: usize) -> bool {
        self.killed.get(rank).is_some_and(|k| k.load(Ordering::Acquire))
    }

    /// The transport of endpoint `rank`: every rank, itself included, is reached by one
    /// [`MemoryLink`] (through which frames to itself go too, so that a killed endpoint
    /// cannot send them, and a receive from itself waits as any other).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `rank` is not below the hub's size.
    pub fn endpoint(self: &Arc<Self>, rank: usize) -> Result<MemoryTransport, Error> {
        let n = self.endpoints.len();
        let Some(mailbox) = self.endpoints.get(rank) else {
            return Err(Error::invalid(format!("endpoint {rank} of a hub of {n}")));
        };
        let link: Arc<dyn Link> = Arc::new(MemoryLink { hub: Arc::clone(self), rank });
        RoutedTransport::new(rank, Arc::clone(mailbox), vec![Some(link); n])
    }
}

/// How endpoint `rank` of a [`MemoryHub`] reaches every endpoint: a frame is taken into the
/// receiver's mailbox on the sender's thread, as a link's reader takes in what arrived
/// ([`Mailbox::accept`]).
pub struct MemoryLink {
    hub: Arc<MemoryHub>,
    rank: usize,
}

impl Link for MemoryLink {
    fn kind(&self) -> LinkKind {
        LinkKind::Memory
    }

    fn send_frame(
        &self,
        peer: usize,
        kind: FrameKind,
        header: &Header,
        payload: &[u8],
        _deadline: Instant,
    ) -> Result<(), TransportError> {
        #[cfg(test)]
        if kind == FrameKind::Data && self.hub.muted(self.rank, header) {
            return Ok(());
        }
        if self.hub.killed(self.rank) {
            // Its data sends fail; its notices (best effort) go nowhere.
            return match kind {
                FrameKind::Data => Err(TransportError::Aborted(format!("rank {} was killed", self.rank))),
                FrameKind::Failure | FrameKind::Release => Ok(()),
            };
        }
        let mailbox = self.hub.endpoints.get(peer).ok_or_else(|| {
            TransportError::Other(Error::invalid(format!(
                "rank {peer} is not in this world of {}",
                self.hub.endpoints.len()
            )))
        })?;
        let frame = FrameHeader { kind, header: *header, payload_len: payload.len() };
        // As the shared-memory and TCP readers do: a notice that cannot be decoded loses
        // its sender.
        if let Err(e) = mailbox.accept(self.rank, frame, payload.to_vec()) {
            mailbox.lose(self.rank, &e.to_string());
        }
        Ok(())
    }

    fn poll_for(&self) -> Duration {
        self.hub.poll_for
    }

    fn yield_for(&self) -> Duration {
        self.hub.yield_for
    }

    fn pollable(&self) -> bool {
        // Every frame is in the receiver's mailbox once its send returns.
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::transport::{Channel, Received, Stage, Transport};
    use crate::fingerprint::Fingerprint;
    use crate::op_kind::OpKind;

    fn header(op: OpKind) -> Header {
        let fingerprint = Fingerprint {
            seq: 3,
            op,
            dtype: crate::DType::U8,
            count: 1,
            root: None,
            reduce: None,
            algorithm: crate::Algorithm::Auto,
        };
        Header { comm_id: 7, channel: Channel::Collective, fingerprint }
    }

    fn recv(t: &MemoryTransport, peer: usize, at: Stage) -> Result<Received, TransportError> {
        let deadline = Instant::now() + Duration::from_millis(20);
        t.recv(peer, 7, Channel::Collective, Some(at), &mut [0u8; 1], deadline)
    }

    #[test]
    fn frames_notices_and_kills_reach_the_endpoints() {
        let hub = MemoryHub::polling(3, Duration::ZERO, Duration::from_micros(50));
        let t: Vec<MemoryTransport> = (0..3).map(|r| hub.endpoint(r).expect("endpoint")).collect();
        assert!(hub.endpoint(3).is_err());
        assert_eq!(t[0].link_kind(1), LinkKind::Memory);
        let far = Instant::now() + Duration::from_secs(5);
        for to in [0, 1] {
            t[0].send(to, &header(OpKind::AllReduce), b"x", far).expect("send");
            assert_eq!(recv(&t[to], 0, Stage::Collective(3)).map(|r| r.len), Ok(1));
        }
        assert!(matches!(t[0].send(3, &header(OpKind::AllReduce), b"x", far), Err(TransportError::Other(_))));
        // A failure notice ends waits from its stage on, carrying the error; a release
        // ends waits on its sender.
        let cause = Error::PeerLost { rank: 2, detail: "gone".into() };
        t[0].notify_failure(7, &[0, 1, 2], Stage::Collective(4), &cause);
        assert!(matches!(recv(&t[1], 2, Stage::Collective(3)), Err(TransportError::Timeout { .. })));
        match recv(&t[1], 2, Stage::Collective(4)) {
            Err(TransportError::PeerFailed { peer: 0, error }) => assert_eq!(error, cause),
            other => panic!("{other:?}"),
        }
        t[2].release(7, &[0, 1]);
        assert!(matches!(recv(&t[0], 2, Stage::Setup), Err(TransportError::PeerLost { peer: 2, .. })));
        // A killed endpoint sends nothing, to itself neither, and tells nothing; the others
        // lose it.
        hub.kill(1);
        let killed = Err(TransportError::Aborted("rank 1 was killed".into()));
        assert_eq!(t[1].send(0, &header(OpKind::AllReduce), b"x", far), killed);
        assert_eq!(t[1].send(1, &header(OpKind::AllReduce), b"x", far), killed);
        t[1].notify_failure(8, &[2], Stage::Setup, &cause);
        assert!(matches!(t[2].probe(1, 8, Channel::Collective, None), Err(TransportError::PeerLost { peer: 1, .. })));
        assert!(matches!(t[2].probe(0, 8, Channel::Collective, None), Ok(None)));
    }

    #[test]
    fn a_muted_endpoint_drops_agreement_messages_after_its_allowance() {
        let hub = MemoryHub::polling(2, Duration::ZERO, Duration::ZERO);
        let (a, b) = (hub.endpoint(0).expect("endpoint"), hub.endpoint(1).expect("endpoint"));
        hub.mute_after_agreement_sends(0, 1);
        let far = Instant::now() + Duration::from_secs(5);
        for op in [OpKind::Agree, OpKind::Agree, OpKind::AllReduce] {
            a.send(1, &header(op), b"x", far).expect("send");
        }
        let mut got = Vec::new();
        while let Ok(Some(r)) = b.try_recv(0, 7, Channel::Collective, None, &mut [0u8; 1]) {
            got.push(r.header.fingerprint.op);
        }
        assert_eq!(got, [OpKind::Agree, OpKind::AllReduce]);
    }
}
