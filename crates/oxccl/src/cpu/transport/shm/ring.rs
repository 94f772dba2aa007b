//! A single-producer single-consumer byte ring in shared memory.
//!
//! `head` and `tail` are monotonically increasing byte counters on their own cache lines:
//! the producer owns `head`, the consumer owns `tail`, and the bytes between them belong to
//! the consumer. Publishing is a release store of the counter; observing is an acquire load.
//! A frame longer than the ring streams through it in pieces.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes of a ring's control block (two cache lines, padded).
pub const CONTROL: usize = 128;

/// A view of one ring inside a mapped segment.
#[derive(Clone, Copy)]
pub struct Ring {
    control: *mut u8,
    data: *mut u8,
    cap: usize,
}

// SAFETY: a Ring points into a segment kept mapped by its owner; the head/tail protocol gives
// each byte range to exactly one side at a time.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

impl Ring {
    /// The ring whose control block is at `base` and whose `cap` data bytes follow it.
    ///
    /// # Safety
    /// `base` must point to `CONTROL + cap` mapped bytes, 64-byte aligned, that stay mapped
    /// while the ring is used, and only one process may produce and one consume.
    pub unsafe fn at(base: *mut u8, cap: usize) -> Ring {
        // SAFETY: within the mapping, per the contract.
        Ring { control: base, data: unsafe { base.add(CONTROL) }, cap }
    }

    /// Bytes needed for a ring of `cap` data bytes.
    pub const fn footprint(cap: usize) -> usize {
        CONTROL + cap
    }

    fn head(&self) -> &AtomicU64 {
        // SAFETY: 64-byte aligned u64 inside the control block; shared memory accessed atomically.
        unsafe { &*(self.control as *const AtomicU64) }
    }

    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as above, second cache line.
        unsafe { &*(self.control.add(64) as *const AtomicU64) }
    }

    /// Producers waiting for space (the consumer wakes them through [`Ring::space_bell`]).
    pub fn space_sleepers(&self) -> &AtomicU32 {
        // SAFETY: 4-byte aligned u32 inside the control block.
        unsafe { &*(self.control.add(72) as *const AtomicU32) }
    }

    /// Rung by the consumer when it frees space.
    pub fn space_bell(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*(self.control.add(76) as *const AtomicU32) }
    }

    /// Bytes the consumer may read now. Also asked by a thread that is not reading (the
    /// progress thread's wake-up test, while a receiver reads): the tail is loaded before the
    /// head, both Acquire so the loads stay in that order, and the tail never passes the
    /// head, so the difference is never negative (loaded the other way round, a consumer
    /// catching up with a producer between the two loads made it so: an overflow panic seen
    /// in CI).
    pub fn readable(&self) -> usize {
        let tail = self.tail().load(Ordering::Acquire);
        let head = self.head().load(Ordering::Acquire);
        head.saturating_sub(tail) as usize
    }

    /// Bytes the producer may write now.
    pub fn writable(&self) -> usize {
        self.cap - (self.head().load(Ordering::Relaxed) - self.tail().load(Ordering::Acquire)) as usize
    }

    /// Producer: copies as much of `src` as fits; returns the number of bytes written.
    #[cfg(test)]
    pub fn write(&self, src: &[u8]) -> usize {
        let mut tail = self.tail().load(Ordering::Acquire);
        self.write_parts(&[src], 0, &mut tail)
    }

    /// Producer: copies as much as fits of the bytes of `parts` one after the other (a
    /// frame's header and payload), from byte `from` of them on, and publishes them with one
    /// store; returns the number of bytes written.
    ///
    /// `tail_seen` is the consumer's position as the producer last read it: the consumer's
    /// line is read again only where the space it leaves is too small for the rest of
    /// `parts`. The position only grows, so an old one understates the space and never lets
    /// unread bytes be overwritten; a ring that keeps up is read about once per ring's worth
    /// of bytes instead of at every write (the read is a cache miss each time the consumer
    /// moved, a large part of a sender's time in a stream of small frames).
    pub fn write_parts(&self, parts: &[&[u8]], from: usize, tail_seen: &mut u64) -> usize {
        let want = parts.iter().map(|p| p.len()).sum::<usize>().saturating_sub(from);
        let head = self.head().load(Ordering::Relaxed);
        let mut free = self.cap - (head - *tail_seen) as usize;
        if free < want {
            // Pairs with the consumer's release of `tail`: the bytes it freed were read.
            *tail_seen = self.tail().load(Ordering::Acquire);
            free = self.cap - (head - *tail_seen) as usize;
        }
        let n = want.min(free);
        if n == 0 {
            return 0;
        }
        let (mut pos, mut skip, mut left) = (head, from, n);
        for part in parts {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            let take = (part.len() - skip).min(left);
            let at = (pos % self.cap as u64) as usize;
            let first = take.min(self.cap - at);
            // SAFETY: [at, at+first) and [0, take-first) lie in the data area and are free
            // space (at most `free` bytes from `head` in all) owned by the producer until
            // `head` is published below; `part[skip..skip+take]` is in bounds.
            unsafe {
                let src = part.as_ptr().add(skip);
                super::copy::copy_cached(src, self.data.add(at), first);
                super::copy::copy_cached(src.add(first), self.data, take - first);
            }
            pos += take as u64;
            left -= take;
            skip = 0;
            if left == 0 {
                break;
            }
        }
        self.head().store(head + n as u64, Ordering::Release);
        n
    }

    /// Consumer: copies up to `dst.len()` readable bytes; returns the number read.
    pub fn read(&self, dst: &mut [u8]) -> usize {
        // SAFETY: `dst` is valid for writes of its whole length.
        unsafe { self.read_raw(dst.as_mut_ptr(), dst.len()) }
    }

    /// Consumer: appends up to `want` readable bytes to `dst`, into its spare capacity,
    /// which is never zeroed first (a payload buffer is about to be filled from the ring
    /// anyway); returns the number read.
    pub fn read_append(&self, dst: &mut Vec<u8>, want: usize) -> usize {
        dst.reserve(want);
        let spare = &mut dst.spare_capacity_mut()[..want];
        // SAFETY: `spare` is valid for writes of `want` bytes (reserved above).
        let n = unsafe { self.read_raw(spare.as_mut_ptr().cast(), want) };
        // SAFETY: `read_raw` initialized the first `n` bytes after the old length, within
        // the capacity reserved above.
        unsafe { dst.set_len(dst.len() + n) };
        n
    }

    /// Copies up to `len` readable bytes to `dst`; returns the number read.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes and not overlap the ring.
    unsafe fn read_raw(&self, dst: *mut u8, len: usize) -> usize {
        let n = len.min(self.readable());
        if n == 0 {
            return 0;
        }
        let tail = self.tail().load(Ordering::Relaxed);
        // SAFETY: `n` bytes are readable (acquire in `readable`); the caller vouches for
        // `dst`.
        unsafe { self.copy_from(tail, dst, n) };
        self.tail().store(tail + n as u64, Ordering::Release);
        n
    }

    /// Consumer: copies the next `dst.len()` bytes without consuming them; false (nothing
    /// copied) when fewer are readable.
    pub fn peek(&self, dst: &mut [u8]) -> bool {
        if self.readable() < dst.len() {
            return false;
        }
        let tail = self.tail().load(Ordering::Relaxed);
        // SAFETY: `dst.len()` bytes are readable (acquire in `readable`); `dst` is valid
        // for writes of its length.
        unsafe { self.copy_from(tail, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Consumer: consumes `n` bytes it has looked at ([`Ring::peek`]); at most what is
    /// readable.
    pub fn skip(&self, n: usize) {
        let n = n.min(self.readable());
        let tail = self.tail().load(Ordering::Relaxed);
        self.tail().store(tail + n as u64, Ordering::Release);
    }

    /// Copies `n` bytes from stream position `pos` (readable ones) to `dst`.
    ///
    /// # Safety
    /// The bytes `[pos, pos+n)` must be readable by this consumer (published by the
    /// producer and not yet consumed); `dst` must be valid for writes of `n` bytes and not
    /// overlap the ring.
    unsafe fn copy_from(&self, pos: u64, dst: *mut u8, n: usize) {
        let at = (pos % self.cap as u64) as usize;
        let first = n.min(self.cap - at);
        // SAFETY: [at, at+first) and [0, n-first) lie in the data area and hold the
        // readable bytes (contract), which the producer does not touch until `tail` passes
        // them.
        unsafe {
            super::copy::copy_cached(self.data.add(at), dst, first);
            super::copy::copy_cached(self.data, dst.add(first), n - first);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_more_than_its_capacity_in_order() {
        let mut mem = vec![0u64; (Ring::footprint(64) + 63) / 8];
        // SAFETY: `mem` is 8-aligned, large enough, and lives for the whole test; the test
        // plays both sides one after the other. (64-byte alignment matters for speed only.)
        let ring = unsafe { Ring::at(mem.as_mut_ptr().cast(), 64) };
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut out = Vec::new();
        let mut sent = 0;
        let mut buf = [0u8; 37];
        while out.len() < src.len() {
            sent += ring.write(&src[sent..]);
            let n = ring.read(&mut buf);
            out.extend_from_slice(&buf[..n]);
        }
        assert_eq!(out, src);
        assert_eq!(ring.readable(), 0);
        assert_eq!(ring.writable(), 64);
    }

    #[test]
    fn parts_go_in_as_one_stream_from_any_byte_and_an_old_tail_never_overwrites() {
        let mut mem = vec![0u64; (Ring::footprint(64) + 63) / 8];
        // SAFETY: as in the test above.
        let ring = unsafe { Ring::at(mem.as_mut_ptr().cast(), 64) };
        let head: Vec<u8> = (0..10).collect();
        let body: Vec<u8> = (100..200).collect();
        let whole: Vec<u8> = head.iter().chain(&body).copied().collect();
        // The producer never refreshes its view of the tail on its own: it starts at 0.
        let mut seen = 0;
        let mut sent = 0;
        let mut out = Vec::new();
        let mut buf = [0u8; 29];
        while sent < whole.len() {
            let n = ring.write_parts(&[&head, &body], sent, &mut seen);
            assert!(n <= 64);
            sent += n;
            // The consumer reads less than there is: the producer's view of the tail lags.
            let got = ring.read(&mut buf);
            out.extend_from_slice(&buf[..got]);
            assert!(ring.readable() <= 64);
        }
        while out.len() < whole.len() {
            let got = ring.read(&mut buf);
            out.extend_from_slice(&buf[..got]);
        }
        assert_eq!(out, whole);
        // Nothing left to write from the end of the parts.
        assert_eq!(ring.write_parts(&[&head, &body], whole.len(), &mut seen), 0);
    }

    #[test]
    fn a_peek_across_the_wrap_leaves_the_bytes_until_skipped() {
        let mut mem = vec![0u64; (Ring::footprint(64) + 63) / 8];
        // SAFETY: as in the first test.
        let ring = unsafe { Ring::at(mem.as_mut_ptr().cast(), 64) };
        // Move the stream position to 50, so the next 20 bytes wrap.
        assert_eq!(ring.write(&[0; 50]), 50);
        assert_eq!(ring.read(&mut [0; 50]), 50);
        let src: Vec<u8> = (1..=20).collect();
        assert_eq!(ring.write(&src), 20);
        let mut two = [0u8; 20];
        assert!(!ring.peek(&mut [0u8; 21]), "more than is readable");
        assert!(ring.peek(&mut two) && two[..] == src[..]);
        assert!(ring.peek(&mut two) && two[..] == src[..], "a peek consumes nothing");
        assert_eq!(ring.readable(), 20);
        ring.skip(15);
        let mut rest = [0u8; 5];
        assert_eq!(ring.read(&mut rest), 5);
        assert_eq!(rest[..], src[15..]);
        assert_eq!(ring.writable(), 64);
    }

    #[test]
    fn read_append_fills_a_buffer_in_pieces_across_the_wrap_and_takes_no_more_than_asked() {
        let mut mem = vec![0u64; (Ring::footprint(64) + 63) / 8];
        // SAFETY: as in the test above.
        let ring = unsafe { Ring::at(mem.as_mut_ptr().cast(), 64) };
        let src: Vec<u8> = (0..300u32).map(|i| (i * 13 % 251) as u8).collect();
        // A payload of 250 bytes into a buffer that already holds old contents elsewhere
        // (a recycled one, cleared): only what the ring gave ends up in it.
        let mut buf = Vec::with_capacity(8);
        buf.extend_from_slice(&[0xAA; 8]);
        buf.clear();
        let mut sent = 0;
        while buf.len() < 250 {
            sent += ring.write(&src[sent..]);
            let want = (250 - buf.len()).min(23);
            let n = ring.read_append(&mut buf, want);
            assert!(n <= want);
        }
        assert_eq!(buf, src[..250]);
        // The rest stays in the ring for the next frame.
        assert_eq!(ring.readable(), sent - 250);
        let mut rest = Vec::new();
        while rest.len() < 50 {
            sent += ring.write(&src[sent..]);
            let want = 50 - rest.len();
            ring.read_append(&mut rest, want);
        }
        assert_eq!(rest, src[250..]);
    }
}
