//! Tests of the pinned pool: its size classes, reuse, limit, LRU eviction and errors, with
//! real `mlock`ed memory (small: pools of 1 MiB, buffers of 64 KiB to 512 KiB), and the
//! `RLIMIT_MEMLOCK` error with a fake pinner and, in a child process, with the real limit.
//!
//! The tests that lock real memory hold [`REAL`] so that they do not add up against a small
//! `RLIMIT_MEMLOCK` (at most 1 MiB is locked at a time) and so that `VmLck` is theirs to read.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::mlock::{locked_bytes, memlock_error};
use super::*;

const K: usize = 1 << 10;
const M: usize = 1 << 20;

/// Serializes the tests that lock real memory.
static REAL: Mutex<()> = Mutex::new(());

fn real() -> MutexGuard<'static, ()> {
    relock(&REAL)
}

fn mlock_pool(limit: usize) -> PinnedPool {
    PinnedPool::new(limit, Arc::new(MlockPinner))
}

/// A pinner that touches no memory: it counts what is pinned and refuses, like `mlock` over
/// `RLIMIT_MEMLOCK`, any pin that would take it over `allowance` bytes.
struct FakePinner {
    allowance: usize,
    errno: i32,
    pinned: AtomicUsize,
}

impl FakePinner {
    fn new(allowance: usize, errno: i32) -> Arc<FakePinner> {
        Arc::new(FakePinner { allowance, errno, pinned: AtomicUsize::new(0) })
    }
}

impl Pinner for FakePinner {
    fn name(&self) -> &str {
        "fake"
    }

    unsafe fn pin(&self, _ptr: *mut u8, len: usize) -> Result<()> {
        let now = self.pinned.load(Ordering::SeqCst);
        if now + len > self.allowance {
            return Err(memlock_error(len, &std::io::Error::from_raw_os_error(self.errno)));
        }
        self.pinned.fetch_add(len, Ordering::SeqCst);
        Ok(())
    }

    unsafe fn unpin(&self, _ptr: *mut u8, len: usize) -> Result<()> {
        self.pinned.fetch_sub(len, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn leases_and_pools_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<PinnedBuf>();
    send_sync::<PinnedPool>();
}

#[test]
fn size_classes_are_powers_of_two_from_64k_within_the_limit() {
    let pool = PinnedPool::new(3 * M, FakePinner::new(usize::MAX, libc::ENOMEM));
    for (bytes, cap) in [(0, 64 * K), (1, 64 * K), (64 * K, 64 * K), (64 * K + 1, 128 * K), (M, M), (M + 1, 2 * M)] {
        assert_eq!(pool.capacity_for(bytes).unwrap(), cap, "{bytes}");
    }
    // 4 MiB would exceed the limit; the request itself fits, rounded to a page.
    let page = mapping::page_size();
    let want = (5 * M / 2).next_multiple_of(page);
    assert_eq!(pool.capacity_for(5 * M / 2 - 3).unwrap(), want);
    assert_eq!(pool.capacity_for(3 * M).unwrap(), 3 * M);
    for too_big in [3 * M + 1, usize::MAX] {
        let e = pool.capacity_for(too_big).unwrap_err().to_string();
        assert!(e.contains("OXCCL_PINNED_LIMIT=3M (3145728 bytes)") && e.contains("exceeds"), "{e}");
    }
    // Leases of the odd size work like any other.
    let b = pool.acquire(5 * M / 2).unwrap();
    assert_eq!((b.len(), b.capacity()), (5 * M / 2, want));
}

#[test]
fn a_returned_buffer_is_reused_without_pinning_more() {
    let _g = real();
    let pool = mlock_pool(M);
    let mut a = pool.acquire(100_000).unwrap();
    assert_eq!((a.len(), a.capacity()), (100_000, 128 * K));
    assert_eq!(a.as_ptr() as usize % mapping::page_size(), 0, "page aligned");
    assert!(a.iter().all(|&x| x == 0), "a new buffer is zeroed");
    a.as_mut_slice().fill(0xa5);
    let addr = a.as_ptr();
    drop(a);
    let s = pool.stats();
    assert_eq!((s.pinned_bytes, s.leased_bytes, s.buffers, s.hits, s.misses), (128 * K, 0, 1, 0, 1));

    // Same class (65 KiB..=128 KiB): the same buffer, a hit, nothing new pinned.
    let mut b = pool.acquire(70_000).unwrap();
    assert_eq!(b.as_ptr(), addr);
    assert_eq!((b.len(), b.capacity()), (70_000, 128 * K));
    assert!(b.iter().all(|&x| x == 0xa5), "the same memory, as the last lease left it");
    let s = pool.stats();
    assert_eq!((s.pinned_bytes, s.leased_bytes, s.buffers, s.hits, s.misses), (128 * K, 128 * K, 1, 1, 1));
    assert_eq!(s.pinner, "mlock");

    // The whole capacity can be used; not more.
    b.resize(128 * K).unwrap();
    assert_eq!(b.as_mut_slice().len(), 128 * K);
    assert!(b.resize(128 * K + 1).is_err());

    // Another class is a miss, with a buffer of its own.
    let c = pool.acquire(10).unwrap();
    assert_ne!(c.as_ptr(), addr);
    assert_eq!((c.len(), c.capacity(), pool.stats().misses), (10, 64 * K, 2));
    drop((b, c));
    pool.check_books();
    assert_eq!(pool.trim(), 192 * K);
    assert_eq!((pool.stats().pinned_bytes, pool.stats().buffers), (0, 0));
}

#[test]
fn the_least_recently_used_free_buffers_are_evicted_first() {
    let _g = real();
    let pool = mlock_pool(M);
    let bufs: Vec<PinnedBuf> = (0..4).map(|_| pool.acquire(256 * K).unwrap()).collect();
    let addr: Vec<*const u8> = bufs.iter().map(|b| b.as_ptr()).collect();
    assert_eq!(pool.stats().pinned_bytes, M, "at the limit");
    // Returned in the order 2, 0, 3, 1: 2 is the least recently used.
    let mut bufs: Vec<Option<PinnedBuf>> = bufs.into_iter().map(Some).collect();
    for i in [2, 0, 3, 1] {
        drop(bufs[i].take());
    }
    // 512 KiB more: 2 and 0 go.
    let big = pool.acquire(512 * K).unwrap();
    let s = pool.stats();
    assert_eq!((s.pinned_bytes, s.leased_bytes, s.buffers, s.evictions, s.misses), (M, 512 * K, 3, 2, 5));
    pool.check_books();
    // What is left are 3 and 1; a hit takes the most recently returned first.
    let x = pool.acquire(256 * K).unwrap();
    let y = pool.acquire(200 * K).unwrap();
    assert_eq!((x.as_ptr(), y.as_ptr()), (addr[1], addr[3]));
    assert_eq!((pool.stats().hits, pool.stats().evictions), (2, 2));
    // Everything is leased now: nothing can be evicted.
    let e = pool.acquire(64 * K).unwrap_err();
    assert!(e.to_string().contains("OXCCL_PINNED_LIMIT"), "{e}");
    // Return the big one; a 64 KiB lease evicts it (the only free buffer).
    drop(big);
    let small = pool.acquire(1).unwrap();
    let s = pool.stats();
    assert_eq!((s.pinned_bytes, s.buffers, s.evictions), (576 * K, 3, 3));
    drop((x, y, small));
    pool.check_books();
}

#[test]
fn leases_that_hold_the_limit_and_requests_above_it_are_refused() {
    let _g = real();
    let pool = mlock_pool(M);
    let held: Vec<PinnedBuf> = (0..3).map(|_| pool.acquire(256 * K).unwrap()).collect();
    let _free = pool.acquire(64 * K).unwrap(); // 832 KiB leased, 192 KiB left
    let before = pool.stats();
    let e = pool.acquire(200 * K).unwrap_err();
    let text = e.to_string();
    for want in [
        "OXCCL_PINNED_LIMIT=1M (1048576 bytes)",
        "832K (851968 bytes) leased in 4 buffers",
        "a 256K (262144 bytes) buffer",
        "raise OXCCL_PINNED_LIMIT",
        "smaller chunks",
    ] {
        assert!(text.contains(want), "`{want}` missing from: {text}");
    }
    assert!(matches!(e, Error::Io { kind: std::io::ErrorKind::OutOfMemory, .. }), "{e:?}");
    assert_eq!(pool.stats(), before, "a refused request changes nothing");
    // A request above the limit alone, even with nothing leased.
    drop(held);
    let e = pool.acquire(M + 1).unwrap_err().to_string();
    assert!(e.contains("OXCCL_PINNED_LIMIT=1M") && e.contains("alone exceeds") && e.contains("1048577"), "{e}");
    pool.check_books();
}

#[test]
fn a_memlock_refusal_names_rlimit_memlock_and_leaks_nothing() {
    let fake = FakePinner::new(0, libc::EPERM);
    let pool = PinnedPool::new(M, fake.clone());
    let e = pool.acquire(100 * K).unwrap_err();
    let text = e.to_string();
    for want in [
        "RLIMIT_MEMLOCK",
        "mlock",
        "Operation not permitted",
        "ulimit -l",
        "/etc/security/limits.conf",
        "--ulimit memlock=-1",
        "OXCCL_PINNED_LIMIT",
    ] {
        assert!(text.contains(want), "`{want}` missing from: {text}");
    }
    assert!(matches!(e, Error::Io { kind: std::io::ErrorKind::PermissionDenied, .. }), "{e:?}");
    // The current soft and hard limits are in the message.
    let soft = crate::topology::host::memlock().unwrap().soft;
    let soft = soft.map_or("unlimited".to_string(), |b| crate::config::parse::format_size_exact(b as usize));
    assert!(text.contains(&format!("soft {soft}")), "{text}");
    let s = pool.stats();
    assert_eq!((s.pinned_bytes, s.leased_bytes, s.buffers, s.misses), (0, 0, 0, 1));
    pool.check_books();

    // Over the kernel's allowance (ENOMEM) with free buffers: they are evicted and the pin
    // tried again; with none left to evict, the error comes back and the books stay even.
    let fake = FakePinner::new(512 * K, libc::ENOMEM);
    let pool = PinnedPool::new(M, fake.clone());
    drop((pool.acquire(256 * K).unwrap(), pool.acquire(256 * K).unwrap()));
    let big = pool.acquire(512 * K).unwrap();
    let s = pool.stats();
    assert_eq!((s.pinned_bytes, s.buffers, s.evictions), (512 * K, 1, 2));
    assert_eq!(fake.pinned.load(Ordering::SeqCst), 512 * K);
    let e = pool.acquire(64 * K).unwrap_err();
    assert!(matches!(e, Error::Io { kind: std::io::ErrorKind::OutOfMemory, .. }), "{e:?}");
    assert!(e.to_string().contains("RLIMIT_MEMLOCK"), "{e}");
    let s = pool.stats();
    assert_eq!((s.pinned_bytes, s.leased_bytes, s.buffers), (512 * K, 512 * K, 1));
    pool.check_books();
    // A lease outlives the pool's handle; the last one out unpins everything.
    drop(pool);
    assert_eq!(fake.pinned.load(Ordering::SeqCst), 512 * K);
    drop(big);
    assert_eq!(fake.pinned.load(Ordering::SeqCst), 0, "every pin was undone");
}

#[test]
fn other_mlock_errors_stay_plain_io_errors() {
    let e = memlock_error(4096, &std::io::Error::from_raw_os_error(libc::EINVAL)).to_string();
    assert!(e.contains("mlock") && !e.contains("RLIMIT_MEMLOCK"), "{e}");
}

#[cfg(target_os = "linux")]
#[test]
fn the_memory_really_is_locked() {
    let _g = real();
    let before = locked_bytes().expect("VmLck in /proc/self/status");
    let pool = mlock_pool(M);
    let buf = pool.acquire(512 * K).unwrap();
    let during = locked_bytes().unwrap();
    assert!(during >= before + 512 * K, "VmLck {before} -> {during}");
    drop(buf); // still pinned, free
    assert!(locked_bytes().unwrap() >= before + 512 * K);
    drop(pool);
    let after = locked_bytes().unwrap();
    assert!(after + 512 * K <= during, "VmLck {during} -> {after} after the pool is dropped");
}

#[test]
fn concurrent_leases_keep_the_books() {
    let _g = real();
    let pool = Arc::new(mlock_pool(M));
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                for i in 0..200usize {
                    // At most 4 leases of each of two classes at once: 768 KiB, within the
                    // limit, so after the first few misses every request is a hit.
                    let bytes = [64 * K, 100 * K, 1][(i + t as usize) % 3];
                    let mut b = pool.acquire(bytes).unwrap();
                    b.fill(t);
                    std::thread::yield_now();
                    assert!(b.iter().all(|&x| x == t), "another lease wrote into this one");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = pool.stats();
    assert_eq!(s.hits + s.misses, 800);
    assert_eq!(s.leased_bytes, 0);
    assert!(s.misses <= 8 && s.evictions == 0 && s.pinned_bytes <= 768 * K, "{s:?}");
    pool.check_books();
}

#[test]
fn a_bad_limit_names_the_variable() {
    let env = |v: &'static str| move |k: &str| (k == "OXCCL_PINNED_LIMIT").then(|| v.to_string());
    assert_eq!(limit_with(env("64M")).unwrap(), 64 * M);
    assert_eq!(limit_with(env(" ")).unwrap(), 1 << 30, "empty is unset");
    assert_eq!(limit_with(|_| None).unwrap(), 1 << 30, "default 1 GiB");
    for bad in ["lots", "512K", "2T", "-1"] {
        let e = limit_with(env(bad)).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        assert!(e.to_string().contains(&format!("OXCCL_PINNED_LIMIT={bad:?}")), "{e}");
    }
}

#[test]
fn the_process_wide_pool_keeps_its_pinner() {
    // The only test that touches the process-wide pool.
    let pool = match limit_from_env() {
        Ok(limit) => {
            let pool = global().unwrap();
            assert_eq!(pool.limit(), limit);
            pool
        }
        Err(e) => {
            assert!(global().unwrap_err().to_string().contains("OXCCL_PINNED_LIMIT"), "{e}");
            return;
        }
    };
    assert!(Arc::ptr_eq(&pool, &global().unwrap()));
    assert_eq!(pool.pinner_name(), "mlock");
    install_pinner(Arc::new(MlockPinner)).unwrap();
    let e = install_pinner(FakePinner::new(0, libc::EPERM)).unwrap_err().to_string();
    assert!(e.contains("already in use") && e.contains("mlock") && e.contains("fake"), "{e}");
    assert_eq!(global().unwrap().pinner_name(), "mlock");
}

/// The variable that makes [`rlimit_child`] run.
const CHILD: &str = "OXCCL_PINNED_TEST_RLIMIT_CHILD";

/// The real `RLIMIT_MEMLOCK` refusal, in a child process (lowering the limit of this one
/// would fail the other tests).
#[cfg(target_os = "linux")]
#[test]
fn the_real_rlimit_refusal_in_a_child_process() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "staging::pinned::tests::rlimit_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    if let Some(why) = stdout.lines().find(|l| l.starts_with("CHILD-SKIP")) {
        eprintln!("the real RLIMIT_MEMLOCK check was skipped: {why}");
        return;
    }
    assert!(stdout.contains("CHILD-OK"), "the child did not run the check:\n{stdout}\n{stderr}");
}

/// Run by [`the_real_rlimit_refusal_in_a_child_process`] in a child process: drops
/// `CAP_IPC_LOCK` (which lifts the limit, e.g. for root), lowers `RLIMIT_MEMLOCK` to 64 KiB
/// and asks for 256 KiB of `mlock`ed memory.
#[cfg(target_os = "linux")]
#[test]
#[ignore = "run in a child process by the_real_rlimit_refusal_in_a_child_process"]
fn rlimit_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    if let Err(why) = drop_cap_ipc_lock() {
        println!("CHILD-SKIP: {why}");
        return;
    }
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid rlimit for getrlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) }, 0);
    r.rlim_cur = (64 * K) as libc::rlim_t;
    // SAFETY: `r` is a valid rlimit; lowering the soft limit below the hard one is allowed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) }, 0, "{}", std::io::Error::last_os_error());
    let pool = mlock_pool(M);
    let e = pool.acquire(256 * K).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("RLIMIT_MEMLOCK (soft 64K (65536 bytes)") && text.contains("ulimit -l"), "{text}");
    assert!(matches!(e, Error::Io { kind: std::io::ErrorKind::OutOfMemory, .. }), "{e:?}");
    let s = pool.stats();
    assert_eq!((s.pinned_bytes, s.leased_bytes, s.buffers), (0, 0, 0));
    // The pool is still usable: the smallest class (64 KiB) fits the 64 KiB limit.
    let small = pool.acquire(1).unwrap();
    assert_eq!(locked_bytes(), Some(64 * K));
    drop(small);
    println!("CHILD-OK");
}

/// Removes `CAP_IPC_LOCK` from this process's effective capabilities.
#[cfg(target_os = "linux")]
fn drop_cap_ipc_lock() -> std::result::Result<(), String> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget with a version-3 header fills two Data records, which `data` holds.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header as *mut Header, data.as_mut_ptr()) } != 0 {
        return Err(format!("capget: {}", std::io::Error::last_os_error()));
    }
    if data[0].effective & (1 << CAP_IPC_LOCK) == 0 {
        return Ok(());
    }
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: capset reads the header and two Data records; dropping an effective
    // capability is always allowed.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) } != 0 {
        return Err(format!("capset: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}
