//! The copies of the shared-memory collectives, between user buffers and the segment.
//!
//! - [`copy_streaming`]: stores that bypass the cache. A large collective writes its result
//!   into a user buffer far bigger than the cache. With ordinary stores every destination
//!   line is first read from memory (read-for-ownership), then written back: 1.5× the
//!   traffic of the copy itself. Streaming stores write whole lines straight to memory, the
//!   way glibc's `memcpy` does for copies larger than the cache, which is what
//!   `oxccl bench --memcpy` compares against. Small results keep ordinary stores: the
//!   caller is about to read them, and they fit in the cache.
//! - [`copy_cached`]: ordinary stores, avoiding one trap. glibc's `memcpy` copies mid-sized
//!   buffers with `rep movsb`, which on some CPUs (AMD Zen) runs far slower when the
//!   destination is 1 to 63 bytes ahead of the source modulo 4096. The segment's slots are
//!   page-aligned and a user buffer from `malloc` typically starts 16 bytes into a page:
//!   exactly that distance, for every chunk. In that window the copy uses an AVX2 loop
//!   instead (CPUs without AVX2 predate the trap and keep `memcpy`).
//!
//! Measurements: docs/performance.md.

/// Results at least this large are written with streaming stores.
pub const STREAM_FROM: usize = 4 << 20;

/// ... when written over their input (in place): the lines a chunk's result goes to were
/// read a chunk earlier and are still in the cache, where ordinary stores are cheaper and a
/// streaming store must first evict the line (the two are even at 64 MiB:
/// docs/performance.md).
pub const STREAM_IN_PLACE_FROM: usize = 64 << 20;

/// Whether a result of `bytes` is written with streaming stores (`in_place`: over the input).
pub fn streams(bytes: usize, in_place: bool) -> bool {
    bytes >= if in_place { STREAM_IN_PLACE_FROM } else { STREAM_FROM }
}

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

/// Copies below this size are left to `memcpy` whatever the alignment.
const CACHED_LOOP_FROM: usize = 2048;

/// Copies `len` bytes from `src` to `dst` with ordinary (cached) stores: `memcpy`, except
/// when `dst` is 1 to 63 bytes ahead of `src` modulo 4096 on a CPU with AVX2, where a
/// vector loop replaces it (see the module's documentation).
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` valid for reads and `dst` for writes of
/// `len` bytes, the two not overlapping.
pub unsafe fn copy_cached(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= CACHED_LOOP_FROM
        && (1..64).contains(&((dst as usize).wrapping_sub(src as usize) & 4095))
        && std::arch::is_x86_feature_detected!("avx2")
    {
        // SAFETY: the CPU has AVX2 (checked); the ranges are the caller's.
        unsafe { copy_loop_avx2(src, dst, len) };
        return;
    }
    // SAFETY: forwarded from this function's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// A plain copy in 128-byte steps of unaligned 32-byte loads and stores, then the tail.
///
/// # Safety
/// As [`copy_cached`], on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_loop_avx2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    let body = len / 128 * 128;
    let mut i = 0;
    // SAFETY: every access stays below `body <= len` bytes (caller's contract); unaligned
    // loads and stores have no alignment requirement.
    unsafe {
        while i < body {
            let a = _mm256_loadu_si256(src.add(i) as *const __m256i);
            let b = _mm256_loadu_si256(src.add(i + 32) as *const __m256i);
            let c = _mm256_loadu_si256(src.add(i + 64) as *const __m256i);
            let d = _mm256_loadu_si256(src.add(i + 96) as *const __m256i);
            _mm256_storeu_si256(dst.add(i) as *mut __m256i, a);
            _mm256_storeu_si256(dst.add(i + 32) as *mut __m256i, b);
            _mm256_storeu_si256(dst.add(i + 64) as *mut __m256i, c);
            _mm256_storeu_si256(dst.add(i + 96) as *mut __m256i, d);
            i += 128;
        }
        std::ptr::copy_nonoverlapping(src.add(body), dst.add(body), len - body);
    }
}

/// Copies with streaming stores when `stream` is set, else with [`copy_cached`].
///
/// # Safety
/// As [`copy_streaming`].
pub unsafe fn copy_out(src: *const u8, dst: *mut u8, len: usize, stream: bool) {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        if stream {
            copy_streaming(src, dst, len)
        } else {
            copy_cached(src, dst, len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_results_stream_only_when_far_larger_than_the_cache() {
        assert!(streams(STREAM_FROM, false) && !streams(STREAM_FROM - 1, false));
        assert!(!streams(STREAM_FROM, true) && streams(STREAM_IN_PLACE_FROM, true));
    }

    #[test]
    fn cached_copies_every_length_and_distance() {
        let src: Vec<u8> = (0..3 * 4096u32).map(|i| (i * 13 + 1) as u8).collect();
        // Distances 1..63 modulo 4096 take the vector loop (also tried directly).
        for off_d in [0usize, 1, 16, 40, 63, 64, 100] {
            for len in [0, 5, 2047, 2048, 2049, 4096 + 77, 8000] {
                let mut dst = vec![0x55u8; 4096 + 8000 + 64];
                let base = dst.as_ptr() as usize;
                // Place the copy so that dst - src is `off_d` modulo 4096.
                let want = (src.as_ptr() as usize + off_d).wrapping_sub(base) & 4095;
                // SAFETY: `want + len <= 4095 + 8000` fits in `dst`.
                unsafe { copy_cached(src.as_ptr(), dst.as_mut_ptr().add(want), len) };
                assert_eq!(&dst[want..want + len], &src[..len], "distance {off_d} len {len}");
                assert!(dst[..want].iter().chain(&dst[want + len..]).all(|&b| b == 0x55));
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    let mut d = vec![0u8; len];
                    // SAFETY: both ranges hold `len` bytes; AVX2 checked above.
                    unsafe { copy_loop_avx2(src.as_ptr(), d.as_mut_ptr(), len) };
                    assert_eq!(d, &src[..len]);
                }
            }
        }
    }

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
