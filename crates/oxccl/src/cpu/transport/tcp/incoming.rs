//! The receiving half of a connection as a decoder that can change hands: [`Incoming`] holds
//! the bytes read so far and the frame being filled, so the progress thread and
//! a receiving caller take turns reading the socket (behind the connection's mutex) without
//! either losing the other's place in the stream.
//!
//! [`Incoming::pump`] decodes frames into the mailbox, checking every field before use: data
//! with `deliver`, failure notices with `fail`, release notices with `close` (through
//! [`Mailbox::accept`]). A caller that waits for a frame names it ([`Direct`]): when that
//! frame is the next one on the stream its payload is read straight into the caller's
//! buffer, without a copy through the mailbox. A length field alone never makes it allocate
//! more than [`PREALLOC`](super::stripes::PREALLOC) bytes: a payload buffer grows as the bytes actually arrive, and the
//! bytes land in its uninitialised capacity (never zeroed first).
//!
//! A payload striped across the connection's lanes (`stripes`) is read from all of them at
//! once, each stripe into its place, and resumes where each stopped: whoever decodes its
//! header reads its stripes, so they never pass each other.

use std::io;
use std::mem::MaybeUninit;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use super::stripes::{Stripes, PREALLOC};
use super::{poll_fds, remaining};
use crate::cpu::transport::frame::{self, FrameHeader, FrameKind, HEADER_LEN, MAX_NOTICE_LEN};
use crate::cpu::transport::mailbox::Mailbox;
use crate::cpu::transport::{Channel, Received};

/// Bytes read ahead of the frame being decoded (headers and small payloads come in batches).
const READ_BUFFER: usize = 64 * 1024;
/// Longest single sleep of a read that waits until a deadline.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// How a stream ended.
#[derive(Debug)]
pub(super) enum End {
    /// EOF at a frame boundary.
    Closed,
    /// EOF inside a frame.
    Truncated,
    /// A read failed.
    Failed(io::Error),
    /// The peer sent something that is not a valid frame (the text says what).
    Malformed(String),
}

/// How long a read may wait for bytes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Wait {
    /// Not at all: `WouldBlock` when nothing is there.
    Now,
    /// Until the instant (then `WouldBlock`).
    Until(Instant),
}

/// Where the bytes come from: a socket, or (in tests) a slice.
pub(super) trait Source {
    /// Reads up to `buf.len()` bytes into `buf`, returning how many it initialised; `Ok(0)`
    /// at the end of the stream; `WouldBlock` when nothing arrived within `wait`.
    fn read_some(&mut self, buf: &mut [MaybeUninit<u8>], wait: Wait) -> io::Result<usize>;

    /// The descriptor to wait on for bytes, if the source has one.
    fn fd(&self) -> Option<RawFd> {
        None
    }
}

impl Source for &[u8] {
    fn read_some(&mut self, buf: &mut [MaybeUninit<u8>], _: Wait) -> io::Result<usize> {
        let n = buf.len().min(self.len());
        for (d, s) in buf.iter_mut().zip(&self[..n]) {
            d.write(*s);
        }
        *self = &self[n..];
        Ok(n)
    }
}

/// A connected socket read with `recv` (its own descriptor stays in blocking mode: waiting
/// or not is chosen per call).
pub(super) struct Socket<'a>(pub(super) &'a TcpStream);

impl Socket<'_> {
    fn recv(&self, buf: &mut [MaybeUninit<u8>], flags: libc::c_int) -> io::Result<usize> {
        loop {
            // SAFETY: `recv` writes at most `buf.len()` bytes into memory we hold exclusively
            // for the call (uninitialised bytes may be written to); the descriptor is open for
            // as long as the borrowed stream lives.
            let r = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Sleeps until the socket is readable (or has ended) or `for_` has passed.
    fn readable_within(&self, for_: Duration) -> io::Result<()> {
        poll_fds(&mut [libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 }], for_)
    }
}

impl Source for Socket<'_> {
    fn fd(&self) -> Option<RawFd> {
        Some(self.0.as_raw_fd())
    }

    fn read_some(&mut self, buf: &mut [MaybeUninit<u8>], wait: Wait) -> io::Result<usize> {
        match wait {
            Wait::Now => self.recv(buf, libc::MSG_DONTWAIT),
            Wait::Until(deadline) => loop {
                match self.recv(buf, libc::MSG_DONTWAIT) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let left = remaining(deadline);
                        if left.is_zero() {
                            return Err(e);
                        }
                        self.readable_within(left.min(WAIT_SLICE))?;
                    }
                    r => return r,
                }
            },
        }
    }
}

/// The lanes of a connection besides lane 0, which carry nothing but stripes: the
/// connection's other sockets, or (in tests) any sources.
pub(super) trait Lanes {
    /// How many there are.
    fn count(&self) -> usize;
    /// Lane `j` (1 and up) as a source.
    fn lane(&mut self, j: usize) -> &mut dyn Source;
}

impl<S: Source> Lanes for [S] {
    fn count(&self) -> usize {
        self.len()
    }

    fn lane(&mut self, j: usize) -> &mut dyn Source {
        &mut self[j - 1]
    }
}

/// A connection's other sockets, read without a per-call allocation.
pub(super) struct LaneSockets<'a> {
    socks: &'a [TcpStream],
    current: Option<Socket<'a>>,
}

impl<'a> LaneSockets<'a> {
    pub(super) fn new(socks: &'a [TcpStream]) -> Self {
        LaneSockets { socks, current: None }
    }
}

impl Lanes for LaneSockets<'_> {
    fn count(&self) -> usize {
        self.socks.len()
    }

    fn lane(&mut self, j: usize) -> &mut dyn Source {
        self.current.insert(Socket(&self.socks[j - 1]))
    }
}

/// A frame whose header was read and whose payload is still arriving.
struct Partial {
    frame: FrameHeader,
    /// The payload so far: its first bytes, or (striped) the whole of it reserved, filled
    /// in its spare capacity.
    payload: Vec<u8>,
    /// A striped payload's progress.
    stripes: Option<Stripes>,
}

impl Partial {
    /// A frame whose payload goes to the mailbox, its stripes (`st`) as far as they came.
    fn new(frame: FrameHeader, st: Stripes, mailbox: &Mailbox) -> Partial {
        let mut payload = mailbox.spare_buffer(frame.payload_len);
        if st.lanes() > 1 {
            // At most PREALLOC (`lanes_for`): its stripes land anywhere in it.
            payload.reserve(frame.payload_len);
            return Partial { frame, payload, stripes: Some(st) };
        }
        Partial { frame, payload, stripes: None }
    }

    /// A frame whose payload was being read into `buf` (`st`: how far), continued in a
    /// buffer of the connection's own.
    fn from_caller(frame: FrameHeader, st: Stripes, buf: &[u8], mailbox: &Mailbox) -> Partial {
        let mut p = Partial::new(frame, st, mailbox);
        if p.stripes.is_some() {
            st.copy_moved(buf, &mut p.payload.spare_capacity_mut()[..frame.payload_len]);
        } else {
            p.payload.extend_from_slice(&buf[..st.done(0).min(buf.len())]);
        }
        p
    }
}

/// Reads into `dst[*at..]` from a lane that carries nothing but stripes, without waiting;
/// whether `dst` is full.
fn read_lane(lane: &mut dyn Source, dst: &mut [MaybeUninit<u8>], at: &mut usize) -> Result<bool, End> {
    while *at < dst.len() {
        match lane.read_some(&mut dst[*at..], Wait::Now) {
            Ok(0) => return Err(End::Truncated),
            Ok(n) => *at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(End::Failed(e)),
        }
    }
    Ok(true)
}

/// The frame a receiving caller waits for, and where its payload goes.
pub(super) struct Direct<'b> {
    pub(super) comm_id: u64,
    pub(super) channel: Channel,
    /// The payload lands here when its length is exactly this buffer's.
    pub(super) buf: &'b mut [u8],
    /// How long the caller may wait for the rest of a payload it began reading: until an
    /// instant ([`Wait::Until`]; then the rest goes to the mailbox, [`Pumped::TimedOut`]), or
    /// not at all ([`Wait::Now`]: the read resumes at the next pump with the same buffer, and
    /// the caller keeps the connection's incoming side locked until it completes or is
    /// [abandoned](Incoming::abandon_direct)).
    pub(super) wait: Wait,
}

/// What a [`Incoming::pump`] did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Pumped {
    /// Nothing was delivered (nothing had arrived, or only part of a frame).
    Nothing,
    /// Frames were delivered into the mailbox.
    Delivered,
    /// The [`Direct`] frame arrived into the caller's buffer.
    Took(Received),
    /// The [`Direct`] frame began but its payload did not all arrive by the deadline; the
    /// rest of it will be delivered into the mailbox, so the stream stays in step.
    TimedOut,
}

/// A connection's incoming bytes, between reads: see the module documentation.
pub(super) struct Incoming {
    buf: Box<[MaybeUninit<u8>]>,
    /// `buf[lo..hi]` is read and not yet decoded.
    lo: usize,
    hi: usize,
    partial: Option<Partial>,
    /// A payload being read into a caller's buffer without waiting ([`Direct::wait`]
    /// `Now`): its frame and how far each stripe has come.
    into_caller: Option<(FrameHeader, Stripes)>,
    /// The stream ended (and its end was reported): nothing more is read.
    pub(super) ended: bool,
}

impl Default for Incoming {
    fn default() -> Self {
        Incoming {
            buf: Box::new_uninit_slice(READ_BUFFER),
            lo: 0,
            hi: 0,
            partial: None,
            into_caller: None,
            ended: false,
        }
    }
}

impl Incoming {
    fn buffered(&self) -> &[u8] {
        // SAFETY: bytes lo..hi were initialised by a read (see `fill`).
        unsafe { std::slice::from_raw_parts(self.buf[self.lo..self.hi].as_ptr().cast::<u8>(), self.hi - self.lo) }
    }

    /// Reads more bytes behind the buffered ones; `Ok(false)` when none arrived within `wait`.
    fn fill(&mut self, src: &mut impl Source, wait: Wait) -> Result<bool, End> {
        if self.lo == self.hi {
            (self.lo, self.hi) = (0, 0);
        } else if self.lo > 0 {
            self.buf.copy_within(self.lo..self.hi, 0);
            (self.lo, self.hi) = (0, self.hi - self.lo);
        }
        match src.read_some(&mut self.buf[self.hi..], wait) {
            Ok(0) => Err(if self.hi == 0 && self.partial.is_none() { End::Closed } else { End::Truncated }),
            Ok(n) => {
                self.hi += n;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(End::Failed(e)),
        }
    }

    /// The next frame's header, checked; `None` when it has not all arrived (without waiting).
    fn header(&mut self, src: &mut impl Source, max_frame: usize) -> Result<Option<FrameHeader>, End> {
        while self.hi - self.lo < HEADER_LEN {
            if !self.fill(src, Wait::Now)? {
                return Ok(None);
            }
        }
        let f = frame::decode_header(&self.buffered()[..HEADER_LEN], max_frame)
            .map_err(|e| End::Malformed(format!("a malformed frame ({})", e.0)))?;
        self.lo += HEADER_LEN;
        match f.kind {
            FrameKind::Release if f.payload_len != 0 => {
                Err(End::Malformed(format!("a release notice with a {}-byte payload", f.payload_len)))
            }
            FrameKind::Failure if f.payload_len > MAX_NOTICE_LEN => {
                Err(End::Malformed(format!("a failure notice of {} bytes (at most {MAX_NOTICE_LEN})", f.payload_len)))
            }
            _ => Ok(Some(f)),
        }
    }

    /// Reads into `dst[*at..]`, advancing `*at`: the buffered bytes first, then straight from
    /// `src`. Returns whether `dst` is full; waits as `wait` says.
    fn read_into(
        &mut self,
        src: &mut impl Source,
        dst: &mut [MaybeUninit<u8>],
        at: &mut usize,
        wait: Wait,
    ) -> Result<bool, End> {
        let k = (dst.len() - *at).min(self.hi - self.lo);
        dst[*at..*at + k].copy_from_slice(&self.buf[self.lo..self.lo + k]);
        self.lo += k;
        *at += k;
        while *at < dst.len() {
            match src.read_some(&mut dst[*at..], wait) {
                Ok(0) => return Err(End::Truncated),
                Ok(n) => *at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(End::Failed(e)),
            }
        }
        Ok(true)
    }

    /// Reads the payload `dst` whose progress is `st` (lane 0's stripe from `src`, through
    /// the bytes read ahead, the others from `lanes`), waiting as `wait` says; whether it is
    /// complete.
    fn read_stripes(
        &mut self,
        src: &mut impl Source,
        lanes: &mut (impl Lanes + ?Sized),
        dst: &mut [MaybeUninit<u8>],
        st: &mut Stripes,
        wait: Wait,
    ) -> Result<bool, End> {
        if st.lanes() == 1 {
            let mut at = st.done(0);
            let full = self.read_into(src, dst, &mut at, wait);
            st.set_done(0, at);
            return full;
        }
        if lanes.count() + 1 < st.lanes() {
            return Err(End::Failed(io::Error::other("a payload striped across more lanes than the connection has")));
        }
        loop {
            let mut moved = false;
            for j in 0..st.lanes() {
                if !st.pending(j) {
                    continue;
                }
                let (r, before) = (st.range(j), st.done(j));
                let mut at = before;
                if j == 0 {
                    self.read_into(src, &mut dst[r], &mut at, Wait::Now)?;
                } else {
                    read_lane(lanes.lane(j), &mut dst[r], &mut at)?;
                }
                moved |= at > before;
                st.set_done(j, at);
            }
            if st.complete() {
                return Ok(true);
            }
            if moved {
                continue;
            }
            let sleep = match wait {
                Wait::Now => return Ok(false),
                Wait::Until(deadline) if remaining(deadline).is_zero() => return Ok(false),
                Wait::Until(deadline) => remaining(deadline).min(WAIT_SLICE),
            };
            let mut fds: Vec<libc::pollfd> = (0..st.lanes())
                .filter(|&j| st.pending(j))
                .filter_map(|j| if j == 0 { src.fd() } else { lanes.lane(j).fd() })
                .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
                .collect();
            if fds.is_empty() {
                // Sources without descriptors (slices) never have more to come.
                return Ok(false);
            }
            // A failed poll shows at the next read.
            let _ = poll_fds(&mut fds, sleep);
        }
    }

    /// Fills the partial frame's payload; whether it is complete.
    fn fill_partial(
        &mut self,
        src: &mut impl Source,
        lanes: &mut (impl Lanes + ?Sized),
        p: &mut Partial,
        wait: Wait,
    ) -> Result<bool, End> {
        let want = p.frame.payload_len;
        if let Some(mut st) = p.stripes {
            // The whole payload was reserved when its frame began (`Partial::new`).
            let full = self.read_stripes(src, lanes, &mut p.payload.spare_capacity_mut()[..want], &mut st, wait)?;
            p.stripes = Some(st);
            if full {
                // SAFETY: every stripe, so every byte of `..want`, was initialised by a read.
                unsafe { p.payload.set_len(want) };
            }
            return Ok(full);
        }
        while p.payload.len() < want {
            // Grow with the bytes: at most PREALLOC ahead of what arrived.
            p.payload.reserve((want - p.payload.len()).min(PREALLOC));
            let room = (want - p.payload.len()).min(p.payload.capacity() - p.payload.len());
            let mut got = 0;
            let start = p.payload.len();
            let full = self.read_into(src, &mut p.payload.spare_capacity_mut()[..room], &mut got, wait)?;
            // SAFETY: `read_into` initialised the first `got` bytes of the spare capacity.
            unsafe { p.payload.set_len(start + got) };
            if !full {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Decodes what arrived from `from` into `mailbox`, until no more bytes are there (a
    /// payload already begun is waited for as `payload_wait` says). With `direct`, its frame
    /// (same communicator and channel, and exactly its buffer's length), when it is the next
    /// one found, is read into its buffer (waiting for the rest of the payload until its
    /// deadline) and the pump stops there. A frame on that channel with another length ends
    /// `direct`: it and everything after it go to the mailbox, so the caller takes them in
    /// the order they were sent.
    ///
    /// # Errors
    /// How the stream ended (every later call returns [`End::Closed`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pump(
        &mut self,
        src: &mut impl Source,
        lanes: &mut (impl Lanes + ?Sized),
        from: usize,
        mailbox: &Mailbox,
        max_frame: usize,
        mut direct: Option<Direct<'_>>,
        payload_wait: Wait,
    ) -> Result<Pumped, End> {
        if self.ended {
            return Err(End::Closed);
        }
        let r = self.pump_inner(src, lanes, from, mailbox, max_frame, &mut direct, payload_wait);
        if r.is_err() {
            self.ended = true;
            self.into_caller = None;
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn pump_inner(
        &mut self,
        src: &mut impl Source,
        lanes: &mut (impl Lanes + ?Sized),
        from: usize,
        mailbox: &Mailbox,
        max_frame: usize,
        direct: &mut Option<Direct<'_>>,
        payload_wait: Wait,
    ) -> Result<Pumped, End> {
        let mut delivered = false;
        let done = |delivered| if delivered { Pumped::Delivered } else { Pumped::Nothing };
        if let Some((f, mut st)) = self.into_caller.take() {
            let Some(d) = direct.as_mut().filter(|d| d.buf.len() == f.payload_len) else {
                // The bytes read so far are in a buffer we were not given again.
                return Err(End::Failed(io::Error::other("a payload read into a caller's buffer was left half-read")));
            };
            if self.read_stripes(src, lanes, as_uninit(d.buf), &mut st, Wait::Now)? {
                return Ok(Pumped::Took(Received { header: f.header, len: f.payload_len }));
            }
            self.into_caller = Some((f, st));
            return Ok(Pumped::Nothing);
        }
        loop {
            if let Some(mut p) = self.partial.take() {
                if !self.fill_partial(src, lanes, &mut p, payload_wait)? {
                    self.partial = Some(p);
                    return Ok(done(delivered));
                }
                let ahead = p.frame.kind == FrameKind::Data
                    && direct
                        .as_ref()
                        .is_some_and(|d| (d.comm_id, d.channel) == (p.frame.header.comm_id, p.frame.header.channel));
                mailbox
                    .accept(from, p.frame, p.payload)
                    .map_err(|e| End::Malformed(format!("a failure notice that cannot be decoded ({})", e.0)))?;
                delivered = true;
                if ahead {
                    // A frame on the caller's channel just reached the mailbox (it was begun
                    // before this caller came): the caller takes it from there first, and
                    // what follows after it, in order.
                    *direct = None;
                }
            }
            let Some(f) = self.header(src, max_frame)? else { return Ok(done(delivered)) };
            let h = f.header;
            let on_its_channel =
                |d: &Direct<'_>| f.kind == FrameKind::Data && h.comm_id == d.comm_id && h.channel == d.channel;
            if direct.as_ref().is_some_and(|d| on_its_channel(d) && f.payload_len != d.buf.len()) {
                // A frame of another length ahead on the caller's channel: the caller takes
                // it first, from the mailbox, and every later frame after it, in order (a
                // later frame taken here would pass it, and the caller would miss that a
                // peer sent something else: a broadcast whose ranks named different roots).
                *direct = None;
            }
            if let Some(d) = direct.as_mut() {
                if on_its_channel(d) {
                    let mut st = Stripes::of(f.payload_len, lanes.count() + 1);
                    if self.read_stripes(src, lanes, as_uninit(d.buf), &mut st, d.wait)? {
                        return Ok(Pumped::Took(Received { header: h, len: f.payload_len }));
                    }
                    if matches!(d.wait, Wait::Now) {
                        self.into_caller = Some((f, st));
                        return Ok(done(delivered));
                    }
                    self.partial = Some(Partial::from_caller(f, st, d.buf, mailbox));
                    return Ok(Pumped::TimedOut);
                }
            }
            self.partial = Some(Partial::new(f, Stripes::of(f.payload_len, lanes.count() + 1), mailbox));
        }
    }
}

impl Incoming {
    /// Ends a payload being read into `buf` without waiting ([`Direct::wait`] `Now`), if one
    /// is: what was read moves into a buffer of the connection's own, and the rest will be
    /// delivered into the mailbox, so the stream stays in step. The caller must give the
    /// buffer it gave the pump, and call this before it lets the incoming side go.
    pub(super) fn abandon_direct(&mut self, buf: &[u8], mailbox: &Mailbox) {
        if let Some((f, st)) = self.into_caller.take() {
            self.partial = Some(Partial::from_caller(f, st, buf, mailbox));
        }
    }

    /// Whether the next bytes this side waits for come on lane `j`: the lanes of a striped
    /// payload still arriving, else lane 0.
    pub(super) fn awaits(&self, j: usize) -> bool {
        let striped =
            self.into_caller.as_ref().map(|c| &c.1).or(self.partial.as_ref().and_then(|p| p.stripes.as_ref()));
        match striped {
            Some(st) if st.lanes() > 1 => st.pending(j),
            _ => j == 0,
        }
    }

    /// Whether a payload is being read into a caller's buffer ([`Incoming::abandon_direct`]).
    pub(super) fn reading_direct(&self) -> bool {
        self.into_caller.is_some()
    }
}

/// `buf` as bytes that may be overwritten by a read.
fn as_uninit(buf: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: viewing initialised bytes as possibly uninitialised ones is sound as long as
    // only initialised bytes are written through the view, which holds for every read here
    // (the kernel's, and copies of initialised bytes).
    unsafe { &mut *(std::ptr::from_mut::<[u8]>(buf) as *mut [MaybeUninit<u8>]) }
}

/// Decodes the whole of `src` into `mailbox` as the progress thread would, until it ends.
#[cfg(test)]
pub(super) fn pump_to_end(mut src: &[u8], from: usize, mailbox: &Mailbox, max_frame: usize) -> End {
    let mut inc = Incoming::default();
    loop {
        if let Err(end) = inc.pump(&mut src, &mut [] as &mut [&[u8]], from, mailbox, max_frame, None, Wait::Now) {
            return end;
        }
    }
}
