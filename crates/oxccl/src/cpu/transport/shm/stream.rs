//! Copies that bypass the cache on the way out (non-temporal stores).
//!
//! A large collective writes its result into a user buffer far bigger than the cache. With
//! ordinary stores every destination line is first read from memory (read-for-ownership),
//! then written back: 1.5× the traffic of the copy itself. Streaming stores write whole
//! lines straight to memory, the way glibc's `memcpy` does for copies larger than the cache,
//! which is what `oxccl bench --memcpy` compares against. Small results keep ordinary
//! stores: the caller is about to read them, and they fit in the cache.

/// Results at least this large are written with streaming stores.
pub const STREAM_FROM: usize = 4 << 20;

/// Copies `len` bytes from `src` to `dst` with streaming stores where the CPU has them
/// (x86-64: SSE2 `movntdq`, always present), else with an ordinary copy.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` valid for reads and `dst` for writes of
/// `len` bytes, the two not overlapping.
pub unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // Unaligned head, 64-byte body of aligned streaming stores, tail.
        let head = dst.align_offset(16).min(len);
        let body = (len - head) / 64 * 64;
        // SAFETY: every access below stays within `len` bytes of `src` and `dst` (caller's
        // contract); the streamed addresses are 16-byte aligned (`head` aligns `dst`);
        // SSE2 is part of the x86-64 baseline.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (s, d) = (src.add(head), dst.add(head));
            let mut i = 0;
            while i < body {
                let a = _mm_loadu_si128(s.add(i) as *const __m128i);
                let b = _mm_loadu_si128(s.add(i + 16) as *const __m128i);
                let c = _mm_loadu_si128(s.add(i + 32) as *const __m128i);
                let e = _mm_loadu_si128(s.add(i + 48) as *const __m128i);
                _mm_stream_si128(d.add(i) as *mut __m128i, a);
                _mm_stream_si128(d.add(i + 16) as *mut __m128i, b);
                _mm_stream_si128(d.add(i + 32) as *mut __m128i, c);
                _mm_stream_si128(d.add(i + 48) as *mut __m128i, e);
                i += 64;
            }
            // Streaming stores are weakly ordered: fence them before anything is published.
            _mm_sfence();
            std::ptr::copy_nonoverlapping(s.add(body), d.add(body), len - head - body);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: forwarded from this function's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// Copies with streaming stores when `stream` is set, else ordinarily.
///
/// # Safety
/// As [`copy_streaming`].
pub unsafe fn copy_out(src: *const u8, dst: *mut u8, len: usize, stream: bool) {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        if stream {
            copy_streaming(src, dst, len)
        } else {
            std::ptr::copy_nonoverlapping(src, dst, len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_length_and_alignment() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        for off_s in [0, 1, 5, 16] {
            for off_d in [0, 3, 8, 16] {
                for len in [0, 1, 15, 16, 63, 64, 65, 200, 1000, 4000] {
                    let mut dst = vec![0xAAu8; 4096 + 32];
                    // SAFETY: both ranges lie inside their vectors.
                    unsafe { copy_streaming(src.as_ptr().add(off_s), dst.as_mut_ptr().add(off_d), len) };
                    assert_eq!(&dst[off_d..off_d + len], &src[off_s..off_s + len], "{off_s} {off_d} {len}");
                    assert!(dst[..off_d].iter().chain(&dst[off_d + len..]).all(|&b| b == 0xAA));
                }
            }
        }
    }
}
