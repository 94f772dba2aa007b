//! Store tests: every operation, concurrency, waits, authentication, hostile clients.
//! All on 127.0.0.1 with port 0.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::protocol::{read_frame, Response};
use super::server::{refusal_line, Log, ServerOptions};
use super::*;
use crate::bootstrap::auth::{self, Secret};
use crate::bootstrap::Rendezvous;
use crate::error::Error;

const T: Duration = Duration::from_secs(10);

fn server() -> (StoreServer, Secret, String) {
    let secret = Secret::generate().unwrap();
    let s = StoreServer::bind("127.0.0.1:0", secret.clone()).unwrap();
    let addr = s.local_addr().to_string();
    (s, secret, addr)
}

fn store_msg(r: Result<impl std::fmt::Debug, Error>) -> String {
    match r {
        Err(Error::Store(m)) => m,
        other => panic!("expected Error::Store, got {other:?}"),
    }
}

/// An authenticated raw connection, for sending hand-made frames.
fn raw(addr: &str, secret: &Secret) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    auth::connect(&mut s, secret, AUTH_CONTEXT).unwrap();
    s
}

/// Reads until the server closes the connection; returns what it sent. Fails the test if
/// the server keeps the connection open for `T`.
fn until_closed(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(T)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("the server did not close the connection within {T:?}")
            }
            Err(_) => return got, // reset: closed too
        }
    }
}

fn error_response(bytes: &[u8]) -> String {
    match Response::decode(&read_frame(&mut &bytes[..]).unwrap().unwrap()).unwrap() {
        Response::Error(m) => m,
        other => panic!("expected an error response, got {other:?}"),
    }
}

fn still_serves(addr: &str, secret: &Secret) {
    let c = StoreClient::connect(addr, secret, T).unwrap();
    c.set("alive", b"yes").unwrap();
    assert_eq!(c.get("alive").unwrap().as_deref(), Some(&b"yes"[..]));
}

#[test]
fn every_operation() {
    let (_s, secret, addr) = server();
    let c = StoreClient::connect(&addr, &secret, T).unwrap();

    assert_eq!(c.get("k").unwrap(), None);
    c.set("k", b"v1").unwrap();
    assert_eq!(c.get("k").unwrap(), Some(b"v1".to_vec()));
    c.set("k", b"").unwrap();
    assert_eq!(c.get("k").unwrap(), Some(vec![]), "empty values are values");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    c.set("big", &big).unwrap();
    assert_eq!(c.get_wait("big", T).unwrap(), big);
    c.set("ключ/😀", &[0, 255, 1]).unwrap();
    assert_eq!(c.get("ключ/😀").unwrap(), Some(vec![0, 255, 1]));

    assert_eq!(c.add("n", 5).unwrap(), 5);
    assert_eq!(c.add("n", -7).unwrap(), -2);
    assert_eq!(c.get("n").unwrap(), Some(b"-2".to_vec()), "counters are decimal text");
    assert!(store_msg(c.add("k", 1)).contains("not a decimal integer"));
    c.set("max", i64::MAX.to_string().as_bytes()).unwrap();
    assert!(store_msg(c.add("max", 1)).contains("overflows"));

    assert_eq!(c.compare_set("cs", None, b"a").unwrap(), b"a", "absent as expected: set");
    assert_eq!(c.compare_set("cs", None, b"b").unwrap(), b"a", "not absent: unchanged");
    assert_eq!(c.compare_set("cs", Some(b"x"), b"b").unwrap(), b"a", "mismatch: unchanged");
    assert_eq!(c.compare_set("cs", Some(b"a"), b"b").unwrap(), b"b", "match: set");
    assert_eq!(c.compare_set("nope", Some(b"a"), b"b").unwrap(), b"", "absent and not expected so");
    assert_eq!(c.get("nope").unwrap(), None);

    assert!(c.delete("cs").unwrap());
    assert!(!c.delete("cs").unwrap());
    assert_eq!(c.get("cs").unwrap(), None);

    c.wait(&[], Duration::ZERO).unwrap();
    c.wait(&["k", "n", "big"], Duration::ZERO).unwrap();
    let many: Vec<String> = (0..MAX_WAIT_KEYS + 10).map(|i| format!("m{i}")).collect();
    for k in &many {
        c.set(k, b"").unwrap();
    }
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    c.wait(&refs, T).unwrap();

    let long = "k".repeat(MAX_KEY_LEN + 1);
    assert!(matches!(c.set(&long, b""), Err(Error::InvalidArgument(m)) if m.contains("key")));
    assert!(matches!(c.get(&long), Err(Error::InvalidArgument(_))));
    // The connection is still fine after a refused argument.
    assert_eq!(c.get("n").unwrap(), Some(b"-2".to_vec()));

    c.publish("rdv", b"addr").unwrap();
    assert_eq!(c.lookup("rdv", T).unwrap(), b"addr");
}

#[test]
fn client_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<StoreClient>();
    check::<StoreServer>();
}

#[test]
fn concurrent_adds_are_exact() {
    let (_s, secret, addr) = server();
    let shared = Arc::new(StoreClient::connect(&addr, &secret, T).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (addr, secret, shared) = (addr.clone(), secret.clone(), Arc::clone(&shared));
            thread::spawn(move || {
                // Half the threads have their own client, half share one.
                let own = StoreClient::connect(&addr, &secret, T).unwrap();
                let c = if t % 2 == 0 { &own } else { &*shared };
                for _ in 0..100 {
                    c.add("total", 3).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(shared.add("total", 0).unwrap(), 8 * 100 * 3);
}

#[test]
fn compare_set_races_have_one_winner() {
    let (_s, secret, addr) = server();
    let n = 8;
    let clients: Vec<Arc<StoreClient>> =
        (0..n).map(|_| Arc::new(StoreClient::connect(&addr, &secret, T).unwrap())).collect();
    for round in 0..10 {
        let barrier = Arc::new(Barrier::new(n));
        let key = format!("leader/{round}");
        let threads: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (c, barrier, key) = (Arc::clone(c), Arc::clone(&barrier), key.clone());
                thread::spawn(move || {
                    let mine = format!("rank{i}").into_bytes();
                    barrier.wait();
                    let after = c.compare_set(&key, None, &mine).unwrap();
                    (after == mine, after)
                })
            })
            .collect();
        let results: Vec<(bool, Vec<u8>)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.0).count(), 1, "round {round}: {results:?}");
        let winner = &results.iter().find(|r| r.0).unwrap().1;
        assert!(results.iter().all(|r| &r.1 == winner), "everyone sees the winner's value");
    }
}

#[test]
fn wait_succeeds_when_another_client_sets_later() {
    let (_s, secret, addr) = server();
    let waiter = StoreClient::connect(&addr, &secret, T).unwrap();
    let setter = StoreClient::connect(&addr, &secret, T).unwrap();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        setter.set("a", b"1").unwrap();
        thread::sleep(Duration::from_millis(50));
        setter.set("b", b"2").unwrap();
    });
    let start = Instant::now();
    waiter.wait(&["a", "b"], T).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert_eq!(waiter.get_wait("b", T).unwrap(), b"2");
    t.join().unwrap();
}

#[test]
fn a_shared_client_waits_without_blocking_its_other_threads() {
    let (_s, secret, addr) = server();
    let c = Arc::new(StoreClient::connect(&addr, &secret, T).unwrap());
    let c2 = Arc::clone(&c);
    let t = thread::spawn(move || c2.get_wait("late", T).unwrap());
    thread::sleep(Duration::from_millis(100));
    c.set("late", b"here").unwrap(); // would deadlock if the waiter held the only connection
    assert_eq!(t.join().unwrap(), b"here");
}

#[test]
fn wait_times_out_naming_the_missing_keys() {
    let (_s, secret, addr) = server();
    let c = StoreClient::connect(&addr, &secret, T).unwrap();
    c.set("present", b"").unwrap();
    let start = Instant::now();
    let m = store_msg(c.wait(&["present", "rank3/addr"], Duration::from_millis(200)));
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(200) && took < T, "{took:?}");
    assert!(m.contains("`rank3/addr`") && !m.contains("`present`") && m.contains("timed out"), "{m}");
    let m = store_msg(c.get_wait("rank7/addr", Duration::from_millis(50)));
    assert!(m.contains("`rank7/addr`"), "{m}");
    let m = store_msg(c.lookup("rank8/addr", Duration::ZERO));
    assert!(m.contains("`rank8/addr`"), "{m}");
}

#[test]
fn wrong_secret_is_refused_on_both_sides() {
    let (_s, secret, addr) = server();
    let wrong = Secret::from_text("not the job's secret").unwrap();

    // The server refuses a client with another secret, and the client says why.
    let m = store_msg(StoreClient::connect(&addr, &wrong, T));
    assert!(m.contains("OXCCL_SECRET") && m.contains("differs"), "{m}");
    let mut s = TcpStream::connect(&addr).unwrap();
    assert!(matches!(auth::connect(&mut s, &wrong, AUTH_CONTEXT), Err(auth::AuthError::RefusedByServer)));
    // A client that knows the secret but speaks another context is refused too.
    let mut s = TcpStream::connect(&addr).unwrap();
    assert!(auth::connect(&mut s, &secret, b"oxccl-tcp").is_err());

    // The client refuses a server that cannot prove it knows the secret.
    let impostor = TcpListener::bind("127.0.0.1:0").unwrap();
    let iaddr = impostor.local_addr().unwrap().to_string();
    let t = thread::spawn(move || {
        let (mut s, _) = impostor.accept().unwrap();
        let mut hello = b"OXAUTH1\0".to_vec();
        hello.extend_from_slice(&[7u8; 32]);
        s.write_all(&hello).unwrap();
        let mut answer = [0u8; 72];
        s.read_exact(&mut answer).unwrap();
        s.write_all(&[1u8; 33]).unwrap(); // "accepted", with a made-up proof
    });
    let m = store_msg(StoreClient::connect(&iaddr, &secret, T));
    assert!(m.contains("could not prove"), "{m}");
    t.join().unwrap();

    // Something that is not a store at all.
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let oaddr = other.local_addr().unwrap().to_string();
    let t = thread::spawn(move || {
        let (mut s, _) = other.accept().unwrap();
        s.write_all(&[b'x'; 40]).unwrap();
    });
    let m = store_msg(StoreClient::connect(&oaddr, &secret, T));
    assert!(m.contains("not an oxccl store"), "{m}");
    t.join().unwrap();

    still_serves(&addr, &secret);
}

#[test]
fn refusals_are_logged_in_one_line_with_the_peer() {
    let peer = "10.1.2.3:4567".parse().unwrap();
    let line = refusal_line(peer, &auth::AuthError::ClientRefused);
    assert!(line.starts_with("oxccl store: refused 10.1.2.3:4567: "), "{line}");
    assert!(!line.contains('\n'));
}

/// A server whose log lines are captured, counting refusals every `every`.
fn logged_server(every: Duration) -> (StoreServer, Secret, String, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    let log = Log::to(move |l| sink.lock().unwrap().push(l.to_string()));
    let secret = Secret::generate().unwrap();
    let opts = ServerOptions { log, report_every: every, ..ServerOptions::default() };
    let s = StoreServer::bind_with("127.0.0.1:0", secret.clone(), opts).unwrap();
    let addr = s.local_addr().to_string();
    (s, secret, addr, lines)
}

/// `n` connections that the server refuses (a wrong secret, or garbage), each seen closed.
fn refused_connections(addr: &str, n: usize) {
    let wrong = Secret::from_text("not the job's secret").unwrap();
    for i in 0..n {
        let mut s = TcpStream::connect(addr).unwrap();
        if i % 2 == 0 {
            assert!(auth::connect(&mut s, &wrong, AUTH_CONTEXT).is_err());
        } else {
            let _ =
                s.write_all(b"GET / HTTP/1.1\r\nHost: store\r\nUser-Agent: curl\r\nAccept: */*\r\n\r\nxxxxxxxxxxxx");
        }
        // Closed only once the refusal is logged (or counted).
        until_closed(&mut s);
    }
}

/// The refusals the lines account for: 1 for the first, N for each "refused N more".
fn refusals_counted(lines: &[String]) -> u64 {
    lines
        .iter()
        .map(|l| match l.strip_prefix("oxccl store: refused ").and_then(|r| r.split_once(" more connection")) {
            Some((n, _)) => n.parse::<u64>().unwrap_or_else(|_| panic!("count in {l}")),
            None => 1,
        })
        .sum()
}

#[test]
fn many_refusals_make_few_lines_and_a_count_at_shutdown() {
    let (s, secret, addr, lines) = logged_server(Duration::from_secs(3600));
    refused_connections(&addr, 100);
    // Authenticated clients are not refusals.
    still_serves(&addr, &secret);
    let before = lines.lock().unwrap().clone();
    assert_eq!(before.len(), 1, "{before:#?}");
    let first = &before[0];
    assert!(first.starts_with("oxccl store: refused 127.0.0.1:"), "{first}");
    assert!(first.contains("job secret (OXCCL_SECRET)") && first.contains("reported at most every 3600s"), "{first}");
    s.shutdown();
    let after = lines.lock().unwrap().clone();
    assert_eq!(after.len(), 2, "{after:#?}");
    assert!(after[1].starts_with("oxccl store: refused 99 more connections since the last report "), "{}", after[1]);
    assert!(after[1].contains("(the latest: 127.0.0.1:"), "{}", after[1]);
}

#[test]
fn refusals_are_counted_at_most_once_per_interval() {
    let every = Duration::from_millis(100);
    let (s, _secret, addr, lines) = logged_server(every);
    let start = Instant::now();
    for _ in 0..4 {
        refused_connections(&addr, 50);
        thread::sleep(every);
    }
    let elapsed = start.elapsed();
    s.shutdown();
    let lines = lines.lock().unwrap().clone();
    // The first line, at most one per interval since, and the final count.
    let bound = 2 + (elapsed.as_millis() / every.as_millis()) as usize;
    assert!(lines.len() <= bound && lines.len() >= 2, "{} lines in {elapsed:?}: {lines:#?}", lines.len());
    assert!(lines.iter().all(|l| l.starts_with("oxccl store: refused ")), "{lines:#?}");
    assert_eq!(refusals_counted(&lines), 200, "every refusal is accounted for: {lines:#?}");
}

#[test]
fn no_refusal_no_line_at_shutdown() {
    let (s, secret, addr, lines) = logged_server(Duration::from_millis(1));
    still_serves(&addr, &secret);
    s.shutdown();
    assert!(lines.lock().unwrap().is_empty());
    // One refusal: one line, nothing more at shutdown.
    let (s, _secret, addr, lines) = logged_server(Duration::from_millis(1));
    refused_connections(&addr, 1);
    s.shutdown();
    assert_eq!(lines.lock().unwrap().len(), 1);
}

#[test]
fn garbage_before_authentication_is_disconnected() {
    let (_s, secret, addr) = server();
    // An HTTP request, long enough to fill the handshake's first message.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: store\r\nUser-Agent: curl\r\nAccept: */*\r\n\r\nxxxxxxxxxxxx").unwrap();
    until_closed(&mut s);
    // A few bytes, then the client hangs up.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"hi").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    until_closed(&mut s);
    still_serves(&addr, &secret);
}

#[test]
fn a_silent_client_is_dropped_after_the_auth_timeout() {
    let secret = Secret::generate().unwrap();
    let opts = ServerOptions { auth_timeout: Duration::from_millis(300), ..ServerOptions::default() };
    let s = StoreServer::bind_with("127.0.0.1:0", secret.clone(), opts).unwrap();
    let addr = s.local_addr().to_string();
    let start = Instant::now();
    let mut silent = TcpStream::connect(&addr).unwrap();
    let got = until_closed(&mut silent);
    assert_eq!(got.len(), 40, "only the server's challenge");
    assert!(start.elapsed() >= Duration::from_millis(250));
    still_serves(&addr, &secret);
}

#[test]
fn malformed_frames_close_only_that_connection() {
    let (_s, secret, addr) = server();
    let bystander = StoreClient::connect(&addr, &secret, T).unwrap();
    bystander.set("before", b"1").unwrap();

    // A frame whose body is garbage: error response, then closed.
    let mut s = raw(&addr, &secret);
    s.write_all(&[5, 0, 0, 0, 0xee, 1, 2, 3, 4]).unwrap();
    let m = error_response(&until_closed(&mut s));
    assert!(m.contains("malformed request") && m.contains("unknown operation"), "{m}");

    // A well-formed get with a key length far past the frame.
    let mut s = raw(&addr, &secret);
    s.write_all(&[5, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0x7f]).unwrap();
    let m = error_response(&until_closed(&mut s));
    assert!(m.contains("exceeds the limit"), "{m}");

    // An absurd frame length: refused without reading (or allocating) the body.
    let mut s = raw(&addr, &secret);
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let m = error_response(&until_closed(&mut s));
    assert!(m.contains("exceeds the limit"), "{m}");

    // A truncated frame: the client promises 100 bytes, sends 10 and hangs up.
    let mut s = raw(&addr, &secret);
    s.write_all(&[100, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    until_closed(&mut s);

    // Random bytes (a fixed xorshift sequence), then the client hangs up.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for len in [1usize, 3, 4, 7, 64, 1000, 5000] {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut s = raw(&addr, &secret);
        // The server may hang up before it has read everything (an absurd length field is
        // refused at once): writing and half-closing may then fail, which is fine.
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(Shutdown::Write);
        until_closed(&mut s);
    }

    // The other client's connection and the data are untouched.
    assert_eq!(bystander.get("before").unwrap(), Some(b"1".to_vec()));
    bystander.set("after", b"2").unwrap();
    still_serves(&addr, &secret);
}

#[test]
fn connect_retries_until_the_server_starts() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let secret = Secret::generate().unwrap();
    let (a, s) = (addr.clone(), secret.clone());
    let client = thread::spawn(move || StoreClient::connect(&a, &s, T));
    thread::sleep(Duration::from_millis(300));
    let server = StoreServer::bind(&addr, secret).unwrap();
    let c = client.join().unwrap().unwrap();
    c.set("k", b"v").unwrap();
    drop(server);
}

#[test]
fn a_rested_client_whose_store_ended_fails_soon_naming_it() {
    let (s, secret, addr) = server();
    let c = StoreClient::connect(&addr, &secret, T).unwrap();
    c.set("k", b"v").unwrap();
    c.close_idle();
    drop(s);
    let start = Instant::now();
    let m = store_msg(c.get("k"));
    // Refusals are tried again for 2 s, not for the 120 s a busy store gets.
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    assert!(m.contains(&addr) && m.contains("exited"), "{m}");
}

#[test]
fn a_rested_client_reconnects_to_a_store_back_on_its_port() {
    let (s, secret, addr) = server();
    let c = StoreClient::connect(&addr, &secret, T).unwrap();
    c.close_idle();
    drop(s);
    // A request while nothing listens, the store back 300 ms later: the request succeeds.
    let (a, sec) = (addr.clone(), secret.clone());
    let back = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        StoreServer::bind(&a, sec).unwrap()
    });
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k").unwrap(), Some(b"v".to_vec()));
    drop(back.join().unwrap());
}

#[test]
fn connect_gives_up_after_the_timeout_naming_the_address() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let secret = Secret::generate().unwrap();
    let start = Instant::now();
    let m = store_msg(StoreClient::connect(&addr, &secret, Duration::from_millis(200)));
    assert!(start.elapsed() >= Duration::from_millis(200) && start.elapsed() < T);
    assert!(m.contains(&addr) && m.contains("MASTER_ADDR"), "{m}");
    let m = store_msg(StoreClient::connect("no-port-here", &secret, T));
    assert!(m.contains("host:port"), "{m}");
}

#[test]
fn bind_errors_are_io_errors_that_name_the_address() {
    let (s, secret, addr) = server();
    match StoreServer::bind(&addr, secret) {
        Err(Error::Io { context, .. }) => assert!(context.contains(&addr) && context.contains("MASTER_PORT")),
        other => panic!("{other:?}"),
    }
    drop(s);
}

#[test]
fn shutdown_fails_clients_fast() {
    let (s, secret, addr) = server();
    let c = Arc::new(StoreClient::connect(&addr, &secret, T).unwrap());
    c.set("k", b"v").unwrap();
    let waiter = {
        let c = Arc::clone(&c);
        thread::spawn(move || c.wait(&["never"], Duration::from_secs(60)))
    };
    thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    s.shutdown();
    let m = store_msg(waiter.join().unwrap());
    assert!(start.elapsed() < T, "the waiter was woken");
    assert!(m.contains("shutting down") || m.contains("connection"), "{m}");
    assert!(matches!(c.get("k"), Err(Error::Store(_))));
    assert!(matches!(c.set("k", b"v"), Err(Error::Store(_))));
    // The port is free again.
    let again = StoreServer::bind(&addr, secret).unwrap();
    again.shutdown();
}

// The event loop's own tests: one thread for every client, bounded buffers, timers.
#[path = "loop_tests.rs"]
mod event_loop;
