//! Shared-memory links between the ranks of one host: one SPSC [`Ring`] per ordered pair in
//! a segment shared by the host's ranks, and one progress thread per process that drains
//! its incoming rings into the [`Mailbox`].
//!
//! Because the progress thread always drains, a sender never waits on the receiver's
//! application thread, so no pattern of sends and receives can deadlock, whatever the ring
//! size. Senders wake the progress thread only when it sleeps (no system call while it is
//! spinning). Every peer's process id is in the segment: waits check that the peer is still
//! alive, so a killed rank becomes `PeerLost` within [`LIVENESS_CHECK`].
//!
//! **Caller-driven progress.** A caller waiting for a frame reads the rings itself
//! ([`Link::poll`], for as long as the host's waits spin) and announces that it polls, so
//! senders skip the progress thread's wake-up: a hand-off then costs no system call and no
//! thread switch. Whoever holds the incoming rings' lock reads them; a caller that
//! stops polling reads once more, for frames sent while it still counted as polling. The
//! frame the caller waits for, when it is next in its sender's ring and the mailbox holds
//! nothing, goes straight into the caller's buffer ([`Link::poll`]'s `Took`): no mailbox,
//! no payload buffer.
//!
//! A sender writes a frame's header and payload with one publication and one notice, and
//! reads the receiver's position in the ring only when the space it last saw is too small
//! ([`Ring::write_parts`]).
//!
//! **Senders wait for space the same way.** A sender whose ring is full reads its own
//! incoming rings while it waits, and spins only [`SPACE_SPIN`] before it sleeps until the
//! receiver makes room. Two ranks exchanging frames larger than a ring then drain each
//! other's rings themselves; and a sender never holds, for a whole spin of the host's wait
//! policy, the core that the receiver's progress thread needs to make room.
//!
//! Measurements: docs/performance.md.
//!
//! Layout: a 64-byte header (magic, rank count, ring size), one 64-byte line per local rank
//! (pid, doorbell, sleepers, pollers), then the rings, `ring[src * n + dst]`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::futex;
use super::inbox::{Inbox, Incoming, Reading};
use super::ring::Ring;
use super::segment::{unique_name, Segment};
use super::wait::WaitPolicy;
use crate::bootstrap::Rendezvous;
use crate::cpu::transport::frame::{encode_header, FrameKind, HEADER_LEN};
use crate::cpu::transport::mailbox::Mailbox;
use crate::cpu::transport::routed::{Link, Polled, Want};
use crate::cpu::transport::{Header, LinkKind, TransportError};
use crate::error::{Error, Result};

/// How often waits check that peers are alive.
pub const LIVENESS_CHECK: Duration = Duration::from_millis(100);
const MAGIC: u64 = u64::from_le_bytes(*b"OXSHMLK1");
/// How long the progress thread polls (yielding) for more frames before it sleeps. Short: a
/// polling progress thread is one more runnable thread per rank, and the ranks' own waits
/// assume one runnable thread per rank (measurements: docs/performance.md). The ranks' own
/// wait policy (`OXCCL_SPIN_US`, `OXCCL_YIELD_US`) does not apply to this thread.
const PROGRESS_YIELD: Duration = Duration::from_micros(50);

/// How long a sender whose ring is full spins (reading its own incoming rings) before it
/// sleeps until the receiver makes room: enough for a receiver that is draining the ring
/// right now, short of holding a core its progress thread may need.
const SPACE_SPIN: Duration = Duration::from_micros(50);

/// Settings of the shared-memory links.
#[derive(Debug, Clone)]
pub struct ShmOptions {
    /// Bytes per ring (`OXCCL_SHM_RING_BYTES`).
    pub ring_bytes: usize,
    /// Largest frame accepted.
    pub max_frame: usize,
    /// How long setup waits for the other local ranks.
    pub setup_timeout: Duration,
    /// How waits poll and sleep (from the host's ranks and CPUs, and `OXCCL_SPIN_US`,
    /// `OXCCL_YIELD_US`; set up by the `cpu` backend's setup).
    pub wait: WaitPolicy,
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            ring_bytes: 256 << 10,
            max_frame: 1 << 34,
            setup_timeout: Duration::from_secs(60),
            wait: WaitPolicy::default(),
        }
    }
}

fn align64(x: usize) -> usize {
    x.div_ceil(64) * 64
}

/// The shared view of a links segment.
struct Shared {
    seg: Segment,
    n: usize,
    cap: usize,
    /// How waits poll and sleep.
    wait: WaitPolicy,
}

impl Shared {
    fn size(n: usize, cap: usize) -> usize {
        64 + 64 * n + n * n * align64(Ring::footprint(cap))
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at + 4 <= self.seg.len() && at.is_multiple_of(4));
        // SAFETY: `at` is a 4-aligned offset inside the mapping (layout computed by `size`).
        unsafe { &*(self.seg.ptr().add(at) as *const AtomicU32) }
    }

    fn pid(&self, i: usize) -> &AtomicU32 {
        self.word(64 + 64 * i)
    }

    fn doorbell(&self, i: usize) -> &AtomicU32 {
        self.word(64 + 64 * i + 4)
    }

    fn sleepers(&self, i: usize) -> &AtomicU32 {
        self.word(64 + 64 * i + 8)
    }

    /// Threads of local rank `i` polling its incoming rings themselves: while there are any,
    /// senders do not wake its progress thread.
    fn pollers(&self, i: usize) -> &AtomicU32 {
        self.word(64 + 64 * i + 12)
    }

    fn ring(&self, src: usize, dst: usize) -> Ring {
        let at = 64 + 64 * self.n + (src * self.n + dst) * align64(Ring::footprint(self.cap));
        // SAFETY: the ring lies inside the mapping, 64-byte aligned; `src` produces and
        // `dst` consumes, one process each.
        unsafe { Ring::at(self.seg.ptr().add(at), self.cap) }
    }

    fn header(&self) -> (&AtomicU64, &AtomicU64, &AtomicU64) {
        // SAFETY: three 8-aligned u64s at the start of the mapping.
        unsafe {
            let p = self.seg.ptr() as *const AtomicU64;
            (&*p, &*p.add(1), &*p.add(2))
        }
    }
}

/// Whether process `pid` exists (0 means "not attached yet", treated as alive).
pub fn process_alive(pid: u32) -> bool {
    if pid == 0 {
        return true;
    }
    // SAFETY: signal 0 only checks for existence and permission; it sends nothing.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    // A killed process that its parent has not reaped yet (a zombie) still exists for kill();
    // its state in /proc says it is dead.
    exists && !is_zombie(pid)
}

/// Whether `/proc/<pid>/stat` shows the process as a zombie or dead.
fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses and may contain spaces.
    let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next());
    matches!(state, Some("Z" | "X" | "x"))
}

/// The shared-memory [`Link`] of one rank to the other ranks of its host.
pub struct ShmLinks {
    shared: Arc<Shared>,
    /// Local index -> transport rank.
    local: Vec<usize>,
    me: usize,
    /// Per peer: held while a frame goes out, with the consumer's position in the ring to
    /// that peer as last read ([`Ring::write_parts`]).
    out: Vec<Mutex<u64>>,
    /// The incoming rings, read by the progress thread or by a receiving caller.
    inbox: Arc<Inbox>,
    stop: Arc<AtomicBool>,
    progress: Option<JoinHandle<()>>,
}

impl ShmLinks {
    /// Sets up the links of transport rank `rank` to the other ranks of `local` (the transport
    /// ranks on this host, ascending; it must contain `rank`). The lowest creates the
    /// segment, publishes its name under `{prefix}/shm/...`, and unlinks it once every local
    /// rank has mapped it. Frames that arrive are delivered into `mailbox`.
    ///
    /// # Errors
    /// [`Error::Io`] for segment problems (including a /dev/shm that is too small);
    /// [`Error::Store`] when a local rank does not show up within the setup timeout.
    pub fn establish(
        rank: usize,
        local: &[usize],
        rdv: &dyn Rendezvous,
        prefix: &str,
        opts: &ShmOptions,
        mailbox: Arc<Mailbox>,
    ) -> Result<ShmLinks> {
        let me =
            local.iter().position(|&r| r == rank).ok_or_else(|| Error::invalid("rank is not in its host group"))?;
        let n = local.len();
        let cap = opts.ring_bytes.max(4096);
        let size = Shared::size(n, cap);
        let key = format!("{prefix}/shm/{}", local[0]);
        let seg = if me == 0 {
            let name = unique_name("links")?;
            let seg = Segment::create(&name, size)?;
            let shared = Shared { seg, n, cap, wait: opts.wait };
            let (m, nn, c) = shared.header();
            nn.store(n as u64, Ordering::Relaxed);
            c.store(cap as u64, Ordering::Relaxed);
            m.store(MAGIC, Ordering::Release);
            shared.pid(0).store(std::process::id(), Ordering::Release);
            if let Err(e) = rdv.publish(&format!("{key}/name"), name.as_bytes()) {
                shared.seg.unlink();
                return Err(e);
            }
            // Every local rank maps the segment, then its name goes away.
            let waited = (1..n).try_for_each(|i| {
                rdv.lookup_from(local[i], &format!("{key}/attached/{}", local[i]), opts.setup_timeout).map(drop)
            });
            shared.seg.unlink();
            waited?;
            rdv.publish(&format!("{key}/unlinked"), b"1")?;
            shared
        } else {
            let name = rdv.lookup_from(local[0], &format!("{key}/name"), opts.setup_timeout)?;
            let name = String::from_utf8(name).map_err(|_| Error::Store("segment name is not UTF-8".into()))?;
            let seg = Segment::open(&name, size)?;
            let shared = Shared { seg, n, cap, wait: opts.wait };
            let (m, nn, c) = shared.header();
            if m.load(Ordering::Acquire) != MAGIC
                || nn.load(Ordering::Relaxed) != n as u64
                || c.load(Ordering::Relaxed) != cap as u64
            {
                return Err(Error::invalid(format!(
                    "shared-memory segment {name} does not match this job (different rank count or OXCCL_SHM_RING_BYTES?)"
                )));
            }
            shared.pid(me).store(std::process::id(), Ordering::Release);
            rdv.publish(&format!("{key}/attached/{rank}"), b"1")?;
            rdv.lookup_from(local[0], &format!("{key}/unlinked"), opts.setup_timeout)?;
            shared
        };
        let shared = Arc::new(seg);
        let stop = Arc::new(AtomicBool::new(false));
        let incoming = (0..n)
            .filter(|&i| i != me)
            .map(|i| Incoming {
                ring: shared.ring(i, me),
                local: i,
                rank: local[i],
                state: Reading::Header { buf: [0; HEADER_LEN], have: 0 },
            })
            .collect();
        let inbox = Arc::new(Inbox { incoming: Mutex::new(incoming), max_frame: opts.max_frame, mailbox });
        let progress = {
            let (shared, stop, inbox) = (Arc::clone(&shared), Arc::clone(&stop), Arc::clone(&inbox));
            std::thread::Builder::new()
                .name(format!("oxccl-shm-r{rank}"))
                .spawn(move || progress_loop(&shared, me, &inbox, &stop))
                .map_err(|e| Error::io("starting the shared-memory progress thread", &e))?
        };
        Ok(ShmLinks {
            shared,
            local: local.to_vec(),
            me,
            out: (0..n).map(|_| Mutex::new(0)).collect(),
            inbox,
            stop,
            progress: Some(progress),
        })
    }

    /// Moves what arrived in the incoming rings into the mailbox on the caller's thread;
    /// whether any frame moved. When the progress thread holds the rings it is reading them:
    /// nothing to do here.
    fn poll_rings(&self) -> bool {
        self.inbox.try_rings().is_some_and(|mut incoming| self.inbox.pump_all(&mut incoming))
    }

    fn local_index(&self, peer: usize) -> Result<usize, TransportError> {
        self.local.iter().position(|&r| r == peer).ok_or_else(|| {
            TransportError::Other(Error::invalid(format!("rank {peer} is not on this host's shared-memory links")))
        })
    }
}

impl Link for ShmLinks {
    fn kind(&self) -> LinkKind {
        LinkKind::Shm
    }

    fn send_frame(
        &self,
        peer: usize,
        kind: FrameKind,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let p = self.local_index(peer)?;
        let ring = self.shared.ring(self.me, p);
        let hdr = encode_header(kind, header, payload.len());
        let mut tail_seen = crate::sync::relock(&self.out[p]);
        let parts = [&hdr[..], payload];
        let total = hdr.len() + payload.len();
        let mut done = 0;
        while done < total {
            // Header and payload together where they fit: one publication, one notice.
            let n = ring.write_parts(&parts, done, &mut tail_seen);
            done += n;
            if n > 0 {
                // Pairs with the fence in `stop_polling`: we see its poller leave, or it
                // sees these bytes; and with the progress thread's sleep (`ring_fenced`).
                std::sync::atomic::fence(Ordering::SeqCst);
                if self.shared.pollers(p).load(Ordering::SeqCst) == 0 {
                    futex::ring_fenced(self.shared.doorbell(p), self.shared.sleepers(p));
                }
                continue;
            }
            let space_wait =
                WaitPolicy { spin: self.shared.wait.spin.min(SPACE_SPIN), yield_for: self.shared.wait.yield_for };
            futex::wait_until(
                ring.space_bell(),
                ring.space_sleepers(),
                &space_wait,
                // Our peer may be waiting for room in its ring to us: drain ours.
                || ring.writable() > 0 || (self.poll_rings() && ring.writable() > 0),
                LIVENESS_CHECK,
                || {
                    if !process_alive(self.shared.pid(p).load(Ordering::Acquire)) {
                        return Err(TransportError::PeerLost { peer, detail: "its process exited".into() });
                    }
                    if Instant::now() >= deadline {
                        return Err(TransportError::Timeout { peer });
                    }
                    Ok(())
                },
            )?;
        }
        Ok(())
    }

    fn poll(&self, want: &mut Want<'_>) -> Result<Polled, TransportError> {
        // Where the progress thread is reading the rings, nothing to do here.
        let Some(mut incoming) = self.inbox.try_rings() else { return Ok(Polled::Nothing) };
        if let Some(got) = self.inbox.take_direct(&mut incoming, want) {
            return Ok(Polled::Took(got));
        }
        Ok(if self.inbox.pump_all(&mut incoming) { Polled::Moved } else { Polled::Nothing })
    }

    fn poll_for(&self) -> Duration {
        // As long as the host's waits spin: zero where the ranks outnumber their CPUs (a
        // polling receiver would hold the core its sender needs).
        self.shared.wait.spin
    }

    fn start_polling(&self, _: usize) {
        self.shared.pollers(self.me).fetch_add(1, Ordering::SeqCst);
    }

    fn stop_polling(&self, _: usize) {
        self.shared.pollers(self.me).fetch_sub(1, Ordering::SeqCst);
        // Pairs with the fence in `send_frame`: a sender that still saw us polling (and did
        // not wake the progress thread) wrote its bytes before that look, so this pump,
        // after our leave and the fence, reads them. It waits for the progress thread if
        // that is reading.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.inbox.pump_all(&mut crate::sync::relock(&self.inbox.incoming));
    }
}

impl Drop for ShmLinks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        futex::ring(self.shared.doorbell(self.me), self.shared.sleepers(self.me));
        if let Some(t) = self.progress.take() {
            let _ = t.join();
        }
    }
}

fn progress_loop(shared: &Shared, me: usize, inbox: &Inbox, stop: &AtomicBool) {
    let progress_wait = WaitPolicy { spin: Duration::ZERO, yield_for: PROGRESS_YIELD };
    // The rings and their senders, for looking without the lock.
    let incoming: Vec<(Ring, usize, usize)> =
        crate::sync::relock(&inbox.incoming).iter().map(|i| (i.ring, i.local, i.rank)).collect();
    let mailbox = &inbox.mailbox;
    let mut lost = vec![false; shared.n];
    while !stop.load(Ordering::Acquire) {
        if inbox.pump_all(&mut crate::sync::relock(&inbox.incoming)) {
            continue;
        }
        // Never a busy spin here: the thread that needs the CPU next is usually this
        // process's own caller, woken by the frame just delivered; a spinning progress
        // thread would hold the core it needs for the whole spin.
        let _ = futex::wait_until(
            shared.doorbell(me),
            shared.sleepers(me),
            &progress_wait,
            || stop.load(Ordering::Acquire) || incoming.iter().any(|(ring, ..)| ring.readable() > 0),
            LIVENESS_CHECK,
            || {
                for &(ring, local, rank) in &incoming {
                    if !lost[local] && !process_alive(shared.pid(local).load(Ordering::Acquire)) {
                        // Frames it sent before dying are still delivered first.
                        if ring.readable() == 0 {
                            lost[local] = true;
                            mailbox.lose(rank, "its process exited (seen through shared memory)");
                        }
                    }
                }
                Ok::<(), ()>(())
            },
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::bootstrap::MemoryRendezvous;
    use crate::cpu::engine::{CpuBackend, WORLD_COMM_ID};
    use crate::cpu::transport::routed::RoutedTransport;
    use crate::{Algorithm, Communicator, Config, ReduceOp};

    /// A world of `n` ranks (threads) over shared-memory links with tiny rings.
    fn world(n: usize, ring_bytes: usize, f: impl Fn(Communicator) + Sync) {
        world_with(n, ring_bytes, None, f)
    }

    /// A world of `n` ranks over shared-memory links, with shared-memory collectives of
    /// `native_slot` bytes per slot when given.
    pub(crate) fn world_with(n: usize, ring_bytes: usize, native_slot: Option<usize>, f: impl Fn(Communicator) + Sync) {
        // The policy a job of n ranks on this machine's CPUs gets (tests run on 2 cores).
        world_with_settings(n, ring_bytes, native_slot, &[], f)
    }

    /// [`world_with`] with `settings` (`OXCCL_*` name, value) applied to every rank.
    pub(crate) fn world_with_settings(
        n: usize,
        ring_bytes: usize,
        native_slot: Option<usize>,
        settings: &[(&str, &str)],
        f: impl Fn(Communicator) + Sync,
    ) {
        let wait = WaitPolicy::for_host(n, super::super::wait::allowed_cpus().len(), None, None);
        world_waiting(n, ring_bytes, native_slot, wait, settings, f)
    }

    /// [`world_with`] whose ranks wait by `wait`.
    fn world_waiting(
        n: usize,
        ring_bytes: usize,
        native_slot: Option<usize>,
        wait: WaitPolicy,
        settings: &[(&str, &str)],
        f: impl Fn(Communicator) + Sync,
    ) {
        backend_world(n, ring_bytes, wait, settings, |b| {
            if let Some(slot) = native_slot {
                b.enable_shared_memory(slot, wait).unwrap();
            }
            f(Communicator::from_backend(Arc::new(b)));
        })
    }

    /// The ranks' backends of a world over shared-memory links, before anything is set up
    /// on them.
    fn backend_world(
        n: usize,
        ring_bytes: usize,
        wait: WaitPolicy,
        settings: &[(&str, &str)],
        f: impl Fn(CpuBackend) + Sync,
    ) {
        let rdv = MemoryRendezvous::default();
        let cfg = settings
            .iter()
            .fold(Config::new().timeout(Duration::from_secs(20)), |c, (k, v)| c.set(k, v).unwrap())
            .resolve_with(|_| None)
            .unwrap();
        let local: Vec<usize> = (0..n).collect();
        std::thread::scope(|s| {
            for r in 0..n {
                let (rdv, cfg, local, f) = (&rdv, cfg.clone(), local.clone(), &f);
                s.spawn(move || {
                    let mb = Arc::new(Mailbox::new());
                    let opts = ShmOptions { ring_bytes, wait, ..ShmOptions::default() };
                    let links: Arc<dyn Link> =
                        Arc::new(ShmLinks::establish(r, &local, rdv, "t", &opts, Arc::clone(&mb)).unwrap());
                    let routes = (0..n).map(|p| (p != r).then(|| Arc::clone(&links))).collect();
                    let t = Arc::new(RoutedTransport::new(r, mb, routes).unwrap());
                    let ranks: Arc<[usize]> = (0..n).collect();
                    f(CpuBackend::new("shm-test", t, WORLD_COMM_ID, ranks, r, cfg).unwrap());
                });
            }
        });
    }

    /// The shared-memory collectives' segments of this process that stay in /dev/shm for
    /// half a second (a set-up running beside in another test unlinks its own at once).
    fn lasting_collective_segments() -> Vec<String> {
        let prefix = format!("oxccl-coll-{}-", std::process::id());
        let list = || -> Vec<String> {
            let names = std::fs::read_dir("/dev/shm").into_iter().flatten().flatten();
            names.filter_map(|e| e.file_name().into_string().ok()).filter(|n| n.starts_with(&prefix)).collect()
        };
        let first = list();
        std::thread::sleep(Duration::from_millis(500));
        let later = list();
        first.into_iter().filter(|n| later.contains(n)).collect()
    }

    #[test]
    fn a_polling_receiver_takes_its_frame_from_the_ring_only_when_it_is_next_and_fits() {
        use crate::cpu::transport::Channel;
        use crate::fingerprint::Fingerprint;
        use crate::op_kind::OpKind;
        let rdv = MemoryRendezvous::default();
        let mbs = [Arc::new(Mailbox::new()), Arc::new(Mailbox::new())];
        let opts = ShmOptions { ring_bytes: 4096, ..ShmOptions::default() };
        let links: Vec<ShmLinks> = std::thread::scope(|s| {
            let set_up: Vec<_> = (0..2)
                .map(|r| {
                    let (rdv, mb, opts) = (&rdv, Arc::clone(&mbs[r]), &opts);
                    s.spawn(move || ShmLinks::establish(r, &[0, 1], rdv, "d", opts, mb).unwrap())
                })
                .collect();
            set_up.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let fingerprint = Fingerprint {
            seq: 0,
            op: OpKind::Send,
            dtype: crate::DType::U8,
            count: 0,
            root: None,
            reduce: None,
            algorithm: Algorithm::Auto,
        };
        let far = Instant::now() + Duration::from_secs(20);
        let send = |tag, payload: &[u8]| {
            let header = Header { comm_id: 5, channel: Channel::PointToPoint(tag), fingerprint };
            links[1].send_frame(0, FrameKind::Data, &header, payload, far).unwrap();
        };
        let inbox = &links[0].inbox;
        // Holding the rings' lock keeps rank 0's progress thread from reading them.
        let mut rings = crate::sync::relock(&inbox.incoming);
        let mut buf = [0u8; 4];
        let take = |rings: &mut [Incoming], tag, buf: &mut [u8]| {
            let mut want =
                Want { peer: 1, comm_id: 5, channel: Channel::PointToPoint(tag), at: None, buf, deadline: far };
            inbox.take_direct(rings, &mut want).map(|r| r.len)
        };
        let queued =
            |tag, buf: &mut [u8]| mbs[0].try_recv(1, 5, Channel::PointToPoint(tag), None, buf).unwrap().map(|r| r.len);
        // Another tag's frame is next in the ring: the wanted one stays where it is.
        send(1, &[1]);
        send(2, &[2, 2]);
        assert_eq!(take(&mut rings, 2, &mut buf), None);
        assert!(inbox.pump_all(&mut rings));
        // A frame of the same tag waits in the mailbox: the later one in the ring is not
        // taken first.
        send(2, &[3, 3, 3]);
        assert_eq!(take(&mut rings, 2, &mut buf), None);
        assert_eq!((queued(1, &mut buf), buf[0]), (Some(1), 1));
        assert_eq!((queued(2, &mut buf), &buf[..2]), (Some(2), &[2, 2][..]));
        // Now it is next and nothing is queued: read straight into the buffer.
        assert_eq!((take(&mut rings, 2, &mut buf), &buf[..3]), (Some(3), &[3, 3, 3][..]));
        assert_eq!(take(&mut rings, 2, &mut buf), None, "taken once");
        // Longer than the buffer: left for the mailbox, which reports its length.
        send(2, &[9; 6]);
        assert_eq!(take(&mut rings, 2, &mut buf), None);
        assert!(inbox.pump_all(&mut rings));
        assert_eq!(queued(2, &mut buf), Some(6));
    }

    #[test]
    fn a_shared_memory_set_up_that_fails_leaves_no_segment() {
        // Rank 0 creates the collectives' segment; rank 1 never joins, so sending it the
        // segment's name times out. The name must not stay in /dev/shm.
        let wait = WaitPolicy::for_host(2, super::super::wait::allowed_cpus().len(), None, None);
        backend_world(2, 1 << 16, wait, &[("OXCCL_TIMEOUT", "300ms")], |b| {
            if b.rank() == 0 {
                let r = b.enable_shared_memory(16 * 1024, wait);
                assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
            } else {
                std::thread::sleep(Duration::from_millis(600));
            }
        });
        assert_eq!(lasting_collective_segments(), Vec::<String>::new());
    }

    #[test]
    fn collectives_over_small_rings() {
        for n in [2, 3, 5] {
            world(n, 4096, |comm| {
                let r = comm.rank();
                for algo in [Algorithm::Ring, Algorithm::RecursiveDoubling, Algorithm::Rabenseifner] {
                    let mut x: Vec<i64> = (0..50_001).map(|i| i * (r as i64 + 1)).collect();
                    comm.with_algorithm(algo).all_reduce(&mut x, ReduceOp::Sum).unwrap();
                    let k = (n * (n + 1) / 2) as i64;
                    assert!(x.iter().enumerate().all(|(i, v)| *v == i as i64 * k), "{algo}");
                }
                let mut g = vec![0u8; 3 * n];
                comm.all_gather(&[r as u8; 3], &mut g).unwrap();
                assert_eq!(g, (0..n).flat_map(|i| [i as u8; 3]).collect::<Vec<_>>());
                comm.barrier().unwrap();
            });
        }
    }

    #[test]
    fn large_sends_to_everyone_do_not_deadlock() {
        // Every rank sends 1 MiB to every other rank before receiving anything, through
        // 4 KiB rings: only possible because progress threads drain the rings.
        world(4, 4096, |comm| {
            let (r, n) = (comm.rank(), comm.world_size());
            let out: Vec<Vec<u32>> = (0..n).map(|p| vec![(r * 10 + p) as u32; 1 << 18]).collect();
            let mut inb: Vec<Vec<u32>> = (0..n).map(|_| vec![0u32; 1 << 18]).collect();
            let mut batch = comm.batch();
            for (p, buf) in out.iter().enumerate().filter(|(p, _)| *p != r) {
                batch.send(buf, p, 5).unwrap();
            }
            for (p, buf) in inb.iter_mut().enumerate().filter(|(p, _)| *p != r) {
                batch.recv(buf, p, 5).unwrap();
            }
            comm.run_batch(batch).unwrap();
            for (p, buf) in inb.iter().enumerate().filter(|(p, _)| *p != r) {
                assert!(buf.iter().all(|&v| v == (p * 10 + r) as u32));
            }
        });
    }

    #[test]
    fn ping_pong_with_receivers_that_poll_briefly() {
        // Receivers poll for 2 us, then sleep: frames are read by the caller, by its stop,
        // or by the progress thread, whichever comes first, and none waits for the progress
        // thread's 100 ms liveness look.
        let wait = WaitPolicy { spin: Duration::from_micros(2), yield_for: Duration::ZERO };
        world_waiting(2, 4096, None, wait, &[], |comm| {
            let r = comm.rank();
            let mut worst = Duration::ZERO;
            let mut v = [0u32; 2];
            for i in 0..3000u32 {
                let t = Instant::now();
                if r == 0 {
                    comm.send(&[i, i + 1], 1, 0).unwrap();
                    comm.recv(&mut v, 1, 0).unwrap();
                    assert_eq!(v, [i + 7, i + 8]);
                } else {
                    comm.recv(&mut v, 0, 0).unwrap();
                    assert_eq!(v, [i, i + 1]);
                    comm.send(&[i + 7, i + 8], 0, 0).unwrap();
                }
                worst = worst.max(t.elapsed());
            }
            assert!(worst < Duration::from_millis(60), "a round trip took {worst:?}: a frame sat unread");
        });
    }

    /// Two links of a 2-rank host with 4 KiB rings, whose ranks wait by `wait`, and their
    /// mailboxes.
    fn pair(wait: WaitPolicy) -> (Vec<ShmLinks>, Vec<Arc<Mailbox>>) {
        let rdv = MemoryRendezvous::default();
        let local = [0usize, 1];
        let opts = ShmOptions { ring_bytes: 4096, wait, ..ShmOptions::default() };
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let (rdv, opts) = (&rdv, &opts);
                    s.spawn(move || {
                        let mb = Arc::new(Mailbox::new());
                        (ShmLinks::establish(r, &local, rdv, "p", opts, Arc::clone(&mb)).unwrap(), mb)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).unzip()
        })
    }

    /// Stops the progress thread of `links`: from now on only its callers read its rings.
    fn stop_progress(links: &ShmLinks) {
        links.stop.store(true, Ordering::SeqCst);
        futex::ring(links.shared.doorbell(links.me), links.shared.sleepers(links.me));
        // The progress thread's wait ends at its next look (LIVENESS_CHECK) at the latest.
        while links.progress.as_ref().is_some_and(|h| !h.is_finished()) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn senders_with_full_rings_drain_each_other() {
        use crate::cpu::transport::Channel;
        use crate::fingerprint::Fingerprint;
        use crate::op_kind::OpKind;
        // Both progress threads stopped: two ranks sending each other frames 16 times
        // their ring only finish if each drains its incoming ring while it waits for room.
        let (links, mailboxes) = pair(WaitPolicy::default());
        links.iter().for_each(stop_progress);
        const LEN: usize = 64 << 10;
        let header = Header {
            comm_id: 4,
            channel: Channel::Collective,
            fingerprint: Fingerprint::of_p2p(OpKind::Send, 0, crate::DType::U8, LEN),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let sent = AtomicU32::new(0);
        std::thread::scope(|s| {
            for (me, l) in links.iter().enumerate() {
                let payload: Vec<u8> = (0..LEN).map(|i| (i * 7 + me) as u8).collect();
                let sent = &sent;
                s.spawn(move || {
                    l.send_frame(1 - me, FrameKind::Data, &header, &payload, deadline).unwrap();
                    sent.fetch_add(1, Ordering::SeqCst);
                    // Then it reads, as a receiver does, until the other one is done.
                    while sent.load(Ordering::SeqCst) < 2 {
                        l.poll_rings();
                    }
                });
            }
        });
        for (me, mb) in mailboxes.iter().enumerate() {
            links[me].poll_rings();
            let mut buf = vec![0u8; LEN];
            let got = mb.try_recv(1 - me, 4, Channel::Collective, None, &mut buf).unwrap();
            assert_eq!(got.map(|g| g.len), Some(LEN), "rank {me} has no whole frame");
            assert!(buf.iter().enumerate().all(|(i, &b)| b == (i * 7 + 1 - me) as u8), "rank {me}: wrong bytes");
        }
    }

    #[test]
    fn a_polling_receiver_reads_the_ring_itself() {
        use crate::cpu::transport::{Channel, Transport};
        use crate::fingerprint::Fingerprint;
        use crate::op_kind::OpKind;
        // With the receiver's progress thread stopped, only the receiving caller can move
        // the frame from the ring into the mailbox.
        let (mut links, mailboxes) = pair(WaitPolicy { spin: Duration::from_secs(5), yield_for: Duration::ZERO });
        let rx = links.pop().unwrap();
        let tx = links.pop().unwrap();
        stop_progress(&rx);
        let header = |seq| Header {
            comm_id: 9,
            channel: Channel::Collective,
            fingerprint: Fingerprint::of_p2p(OpKind::Send, seq, crate::DType::U8, 3),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        // A frame sent while the receiver announced polling wakes nobody: the receiver's
        // stop reads it.
        rx.start_polling(0);
        tx.send_frame(1, FrameKind::Data, &header(0), &[1, 2, 3], deadline).unwrap();
        rx.stop_polling(0);
        let mut buf = [0u8; 3];
        let got = mailboxes[1].try_recv(0, 9, Channel::Collective, None, &mut buf).unwrap();
        assert_eq!(got.map(|g| (g.len, buf)), Some((3, [1, 2, 3])), "the stop did not read the ring");
        // A receiver waiting in `recv` reads the ring itself, long before its 5 s of polling
        // end.
        tx.send_frame(1, FrameKind::Data, &header(1), &[4, 5], deadline).unwrap();
        let rx: Arc<dyn Link> = Arc::new(rx);
        let t = RoutedTransport::new(1, Arc::clone(&mailboxes[1]), vec![Some(rx), None]).unwrap();
        let started = Instant::now();
        let got = t.recv(0, 9, Channel::Collective, None, &mut buf, deadline).unwrap();
        assert_eq!((got.len, &buf[..2]), (2, &[4u8, 5][..]));
        assert!(started.elapsed() < Duration::from_secs(2), "recv took {:?}", started.elapsed());
    }
}
