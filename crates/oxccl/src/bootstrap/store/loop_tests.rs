//! The event loop's tests: thousands of clients on one thread, silent and greedy clients,
//! bounded buffers, timers, shutdown, and the client's `close_idle`. Helpers are the parent
//! module's.

use super::*;

/// Runs the calling test again, alone, in a child process (its own threads, descriptors and
/// memory, which tests running in parallel would disturb): `true` in the child, which runs
/// the body; `false` in the parent once the child passed.
fn alone(test: &str) -> bool {
    const CHILD: &str = "STORE_TEST_ALONE";
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let name = format!("{}::{test}", module_path!().split_once("::").map_or(module_path!(), |(_, rest)| rest));
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([name.as_str(), "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} failed alone:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{name} did not run alone:\n{stdout}\n{stderr}");
    false
}

/// Threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Threads of this process named `name` (as /proc shows it, at most 15 bytes).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|t| {
            let comm = std::fs::read_to_string(t.as_ref().unwrap().path().join("comm")).unwrap_or_default();
            comm.trim_end() == name
        })
        .count()
}

/// Open descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Waits up to `T` for `f` to return `want` (an exited thread leaves /proc/self/task a
/// moment after its join returns); returns the last value seen.
fn settles(want: usize, f: impl Fn() -> usize) -> usize {
    let start = Instant::now();
    loop {
        let got = f();
        if got == want || start.elapsed() > T {
            return got;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn two_thousand_clients_share_one_server_thread() {
    if !alone("two_thousand_clients_share_one_server_thread") {
        return;
    }
    crate::bootstrap::store::poll::raise_fd_limit().unwrap();
    // Each client costs two descriptors here (its end and the server's): fewer clients if
    // the hard limit is low.
    let hard = {
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
        line.split_whitespace().nth(3).and_then(|s| s.parse::<usize>().ok()).unwrap_or(usize::MAX)
    };
    let n = 2000.min(hard.saturating_sub(200) / 2);
    assert!(n >= 100, "the hard limit on open files ({hard}) is too low for this test");

    let before = threads();
    let (s, secret, addr) = server();
    assert_eq!(threads(), before + 1, "the server runs one thread");
    assert_eq!(settles(1, || threads_named("oxccl-store")), 1, "named by itself as it starts");

    let connected = Arc::new(Barrier::new(n + 1));
    let go = Arc::new(Barrier::new(n + 1));
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let (addr, secret, connected, go) = (addr.clone(), secret.clone(), Arc::clone(&connected), Arc::clone(&go));
            thread::Builder::new()
                .stack_size(64 << 10)
                .spawn(move || {
                    let c = StoreClient::connect(&addr, &secret, Duration::from_secs(60));
                    connected.wait();
                    go.wait();
                    let c = c?;
                    c.set(&format!("rank{i}"), i.to_string().as_bytes())?;
                    let next = (i + 1) % n;
                    let v = c.get_wait(&format!("rank{next}"), Duration::from_secs(60))?;
                    assert_eq!(v, next.to_string().as_bytes());
                    Ok::<(), Error>(())
                })
                .unwrap()
        })
        .collect();
    connected.wait();
    // Every client is connected and authenticated: the server has a descriptor for each,
    // and no thread but its one.
    assert_eq!(threads(), before + 1 + n, "client threads only");
    assert!(fds() >= 2 * n, "{} descriptors for {n} connected clients", fds());
    go.wait();
    for c in clients {
        c.join().unwrap().unwrap();
    }
    assert_eq!(settles(before + 1, threads), before + 1, "the server still has one thread");
    still_serves(&addr, &secret);
    drop(s);
    assert_eq!(settles(before, threads), before, "and no thread once stopped");
}

#[test]
fn a_silent_client_does_not_hold_up_others_and_is_dropped() {
    let secret = Secret::generate().unwrap();
    let auth_timeout = Duration::from_millis(500);
    let opts = ServerOptions { auth_timeout, ..ServerOptions::default() };
    let s = StoreServer::bind_with("127.0.0.1:0", secret.clone(), opts).unwrap();
    let addr = s.local_addr().to_string();
    let start = Instant::now();
    let mut silent: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    // Half-finished handshakes too: the answer's first bytes, then nothing.
    let mut partial = TcpStream::connect(&addr).unwrap();
    partial.write_all(b"OXAUTH1\0").unwrap();
    for _ in 0..5 {
        still_serves(&addr, &secret);
    }
    assert!(start.elapsed() < auth_timeout, "served while the silent clients wait: {:?}", start.elapsed());
    silent.push(partial);
    for s in &mut silent {
        assert_eq!(until_closed(s).len(), 40, "only the server's challenge");
    }
    assert!(start.elapsed() >= auth_timeout);
    still_serves(&addr, &secret);
}

#[test]
fn a_huge_length_field_is_refused_without_allocation() {
    if !alone("a_huge_length_field_is_refused_without_allocation") {
        return;
    }
    fn virtual_size() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
    }
    let (_s, secret, addr) = server();
    still_serves(&addr, &secret);
    let before = virtual_size();
    // Twenty connections that announce the largest frame allowed and send 10 bytes of it.
    let max = (crate::bootstrap::store::protocol::MAX_FRAME as u32).to_le_bytes();
    let mut hanging: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = raw(&addr, &secret);
            s.write_all(&max).unwrap();
            s.write_all(&[1; 10]).unwrap();
            s
        })
        .collect();
    still_serves(&addr, &secret);
    let grew = virtual_size().saturating_sub(before);
    assert!(grew < 64 << 20, "{grew} bytes more address space for 20 announced frames of 128 MiB");
    // An absurd length is answered at once and closes the connection.
    let mut s = raw(&addr, &secret);
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let m = error_response(&until_closed(&mut s));
    assert!(m.contains("frame length 4294967295 exceeds the limit"), "{m}");
    // The announced frames end truncated when their clients hang up.
    for h in &mut hanging {
        h.shutdown(Shutdown::Write).unwrap();
        assert!(until_closed(h).is_empty());
    }
    still_serves(&addr, &secret);
}

#[test]
fn parked_waits_time_out_each_at_its_deadline_with_the_missing_keys() {
    let (_s, secret, addr) = server();
    let setter = StoreClient::connect(&addr, &secret, T).unwrap();
    setter.set("here", b"").unwrap();
    let waiters: Vec<_> = [300u64, 100, 200]
        .into_iter()
        .map(|ms| {
            let c = StoreClient::connect(&addr, &secret, T).unwrap();
            thread::spawn(move || {
                let start = Instant::now();
                let keys = ["here".to_string(), format!("late{ms}"), format!("never{ms}")];
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let r = c.wait(&refs, Duration::from_millis(ms));
                (ms, start.elapsed(), r)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(20));
    for ms in [100, 200, 300] {
        setter.set(&format!("late{ms}"), b"").unwrap();
    }
    for w in waiters {
        let (ms, took, r) = w.join().unwrap();
        let m = store_msg(r);
        assert!(took >= Duration::from_millis(ms) && took < Duration::from_millis(ms) + T / 4, "{ms}: {took:?}");
        assert!(m.contains(&format!("`never{ms}`")) && !m.contains("`here`") && !m.contains("`late"), "{m}");
    }
    still_serves(&addr, &secret);
}

#[test]
fn shutdown_wakes_every_parked_wait() {
    let (s, secret, addr) = server();
    let waiters: Vec<_> = (0..50)
        .map(|i| {
            let c = StoreClient::connect(&addr, &secret, T).unwrap();
            thread::spawn(move || c.wait(&[&format!("never{i}")], Duration::from_secs(600)))
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    s.shutdown();
    for w in waiters {
        let m = store_msg(w.join().unwrap());
        assert!(m.contains("shutting down") || m.contains("connection"), "{m}");
    }
    assert!(start.elapsed() < T / 2, "woken at once: {:?}", start.elapsed());
}

#[test]
fn close_idle_closes_the_pool_and_requests_reconnect() {
    let (_s, secret, addr) = server();
    let c = StoreClient::connect(&addr, &secret, T).unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(c.pooled(), 1);
    c.close_idle();
    assert_eq!(c.pooled(), 0, "nothing pooled");
    c.close_idle(); // twice is fine
    assert_eq!(c.get("k").unwrap(), Some(b"v".to_vec()), "a new connection, authenticated again");
    assert_eq!(c.pooled(), 1);
    // A wait in flight on another thread is not disturbed.
    let c = Arc::new(c);
    let c2 = Arc::clone(&c);
    let t = thread::spawn(move || c2.get_wait("later", T));
    thread::sleep(Duration::from_millis(100));
    c.close_idle();
    c.set("later", b"x").unwrap();
    assert_eq!(t.join().unwrap().unwrap(), b"x");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (_s, secret, addr) = server();
    let mut s = raw(&addr, &secret);
    let mut frames = Vec::new();
    for req in [
        crate::bootstrap::store::protocol::Request::Wait { keys: vec!["p".into()], timeout_ms: 10_000 },
        crate::bootstrap::store::protocol::Request::Get { key: "p".into() },
    ] {
        frames.extend(req.encode().unwrap());
    }
    s.write_all(&frames).unwrap();
    thread::sleep(Duration::from_millis(100));
    // The wait is parked; the get behind it waits its turn.
    let c = StoreClient::connect(&addr, &secret, T).unwrap();
    c.set("p", b"v").unwrap();
    let first = Response::decode(&read_frame(&mut s).unwrap().unwrap()).unwrap();
    let second = Response::decode(&read_frame(&mut s).unwrap().unwrap()).unwrap();
    assert_eq!((first, second), (Response::Done, Response::Value(Some(b"v".to_vec()))));
}

#[test]
fn a_client_that_does_not_read_cannot_block_the_others() {
    let (_s, secret, addr) = server();
    let c = StoreClient::connect(&addr, &secret, T).unwrap();
    c.set("big", &vec![3u8; 4 << 20]).unwrap();
    // 40 gets of 4 MiB, and never a read: the server sends what the socket takes, queues
    // a little more, and stops reading this client's requests.
    let mut greedy = raw(&addr, &secret);
    let get = crate::bootstrap::store::protocol::Request::Get { key: "big".into() }.encode().unwrap();
    for _ in 0..40 {
        greedy.write_all(&get).unwrap();
    }
    let start = Instant::now();
    for _ in 0..20 {
        still_serves(&addr, &secret);
    }
    assert!(start.elapsed() < T, "{:?}", start.elapsed());
    // When it reads at last, every answer is there, in full.
    for _ in 0..40 {
        match Response::decode(&read_frame(&mut greedy).unwrap().unwrap()).unwrap() {
            Response::Value(Some(v)) => assert_eq!(v.len(), 4 << 20),
            other => panic!("{other:?}"),
        }
    }
}

/// The server thread's /proc stat file, opened (reading it needs no further descriptor).
fn server_stat() -> std::fs::File {
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = t.unwrap().path();
        if std::fs::read_to_string(path.join("comm")).unwrap_or_default().trim_end() == "oxccl-store" {
            return std::fs::File::open(path.join("stat")).unwrap();
        }
    }
    panic!("no thread named oxccl-store");
}

/// CPU time the thread of `stat` has used so far.
fn cpu(stat: &mut std::fs::File) -> Duration {
    use std::io::Seek;
    stat.rewind().unwrap();
    let mut text = String::new();
    stat.read_to_string(&mut text).unwrap();
    // After the command name in parentheses: state is field 3, utime 14, stime 15.
    let fields: Vec<u64> =
        text.rsplit_once(')').unwrap().1.split_whitespace().skip(11).take(2).map(|f| f.parse().unwrap()).collect();
    // SAFETY: sysconf takes no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis((fields[0] + fields[1]) * 1000 / hz)
}

#[test]
fn out_of_descriptors_accept_backs_off_and_says_so_once() {
    if !alone("out_of_descriptors_accept_backs_off_and_says_so_once") {
        return;
    }
    let (s, secret, addr, lines) = logged_server(Duration::from_secs(3600));
    still_serves(&addr, &secret);
    // Every descriptor number under the limit taken, then one freed for a client: the
    // server cannot accept its connection.
    let highest = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap();
    let mut stat = server_stat();
    crate::bootstrap::store::poll::set_soft_fd_limit(highest + 64).unwrap();
    let mut fillers = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        fillers.push(f);
    }
    fillers.pop();
    let mut queued = TcpStream::connect(&addr).unwrap();
    thread::sleep(Duration::from_millis(300));
    let before = cpu(&mut stat);
    thread::sleep(Duration::from_secs(1));
    let spent = cpu(&mut stat) - before;
    assert!(spent < Duration::from_millis(200), "the server spun: {spent:?} of CPU in 1 s");
    let failed: Vec<String> = lines.lock().unwrap().iter().filter(|l| l.contains("accept failed")).cloned().collect();
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert!(failed[0].contains("Too many open files") && failed[0].contains("ulimit -Hn"), "{}", failed[0]);
    // Descriptors again: the queued connection is accepted and challenged.
    drop(fillers);
    crate::bootstrap::store::poll::raise_fd_limit().unwrap();
    queued.set_read_timeout(Some(T)).unwrap();
    let mut challenge = [0u8; 40];
    queued.read_exact(&mut challenge).unwrap();
    assert_eq!(&challenge[..8], b"OXAUTH1\0");
    still_serves(&addr, &secret);
    s.shutdown();
}
