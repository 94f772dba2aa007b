//! A load generator for the rendezvous store: N simulated ranks (threads with 64 KiB stacks,
//! one `StoreClient` each) run the store traffic of a communicator's init against one
//! `StoreServer`, and a table says how long it took, how fast requests were answered, and
//! what the server cost in threads and descriptors.
//!
//! ```sh
//! cargo build --release -p oxccl --example store_load
//! target/release/examples/store_load --clients 1024
//! target/release/examples/store_load --clients 4096            # `old` skipped above --old-max
//! target/release/examples/store_load --addr 10.0.0.1:29500     # a server elsewhere
//! ```
//!
//! Two patterns, one fresh server each (in-process):
//! - `old`: each rank r does `add claim/r 1`, `set host/r` (100 bytes), `set tcp/r` (21 bytes),
//!   then `get_wait host/q` for every q: N² lookups. Skipped above `--old-max` (1024).
//! - `new`: the same three writes; rank 0 waits for every host key (in batches of at most
//!   `MAX_WAIT_KEYS`), gets each and sets `hosts` (N × 8 bytes); the others `get_wait hosts`;
//!   then every rank does `get_wait tcp/q` for its O(log N) peers of a ring and a
//!   recursive-doubling schedule (r ± 1, r XOR 2^k), and `close_idle()`.
//!
//! A request is one client call (`get_wait` is a wait and a get on the wire); its latency is
//! measured around the call. Server threads: the process's threads at the peak (every client
//! connected) less the clients' and those there before the server started. Server fds: the
//! descriptors of this process that are TCP sockets with the server's port as their local
//! port (the listener and one per connection; from /proc/self/fd and /proc/net/tcp), at the
//! peak and at the end (every rank done, its client still alive, once the count stops
//! changing). Both need the server in-process; with `--addr` they are not measured. The secret for `--addr` comes from
//! `--secret` or `OXCCL_SECRET`.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use oxccl::bootstrap::auth::Secret;
use oxccl::bootstrap::store::{StoreClient, StoreServer, MAX_WAIT_KEYS};

const STACK: usize = 64 << 10;
const TIMEOUT: Duration = Duration::from_secs(300);

struct Args {
    clients: usize,
    old_max: usize,
    addr: Option<String>,
    secret: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args { clients: 4096, old_max: 1024, addr: None, secret: None };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--clients" => args.clients = value("--clients")?.parse().map_err(|e| format!("--clients: {e}"))?,
            "--old-max" => args.old_max = value("--old-max")?.parse().map_err(|e| format!("--old-max: {e}"))?,
            "--addr" => args.addr = Some(value("--addr")?),
            "--secret" => args.secret = Some(value("--secret")?),
            "-h" | "--help" => {
                return Err("usage: store_load [--clients N] [--old-max N] [--addr HOST:PORT [--secret S]]".into())
            }
            other => return Err(format!("unknown argument `{other}` (try --help)")),
        }
    }
    if args.clients < 2 {
        return Err("--clients must be at least 2".into());
    }
    Ok(args)
}

#[derive(Clone, Copy, PartialEq)]
enum Pattern {
    Old,
    New,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::Old => "old",
            Pattern::New => "new",
        }
    }
}

/// One rank's calls, each timed.
struct Rank<'a> {
    c: &'a StoreClient,
    prefix: &'a str,
    lat: Vec<u64>,
}

impl Rank<'_> {
    fn timed<T>(&mut self, f: impl FnOnce(&StoreClient) -> oxccl::Result<T>) -> Result<T, String> {
        let t = Instant::now();
        let r = f(self.c).map_err(|e| e.to_string());
        self.lat.push(t.elapsed().as_nanos() as u64);
        r
    }

    fn key(&self, k: &str) -> String {
        format!("{}{k}", self.prefix)
    }

    fn publish(&mut self, r: usize) -> Result<(), String> {
        let (claim, host, tcp) =
            (self.key(&format!("claim/{r}")), self.key(&format!("host/{r}")), self.key(&format!("tcp/{r}")));
        self.timed(|c| c.add(&claim, 1))?;
        self.timed(|c| c.set(&host, &[b'h'; 100]))?;
        self.timed(|c| c.set(&tcp, b"10.0.0.1:50000/eth0.1"))?;
        Ok(())
    }

    fn old_pattern(&mut self, r: usize, n: usize) -> Result<(), String> {
        self.publish(r)?;
        for q in 0..n {
            let k = self.key(&format!("host/{q}"));
            let v = self.timed(|c| c.get_wait(&k, TIMEOUT))?;
            if v.len() != 100 {
                return Err(format!("{k}: {} bytes", v.len()));
            }
        }
        Ok(())
    }

    fn new_pattern(&mut self, r: usize, n: usize) -> Result<(), String> {
        self.publish(r)?;
        let hosts = self.key("hosts");
        if r == 0 {
            let keys: Vec<String> = (0..n).map(|q| self.key(&format!("host/{q}"))).collect();
            for batch in keys.chunks(MAX_WAIT_KEYS) {
                let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
                self.timed(|c| c.wait(&refs, TIMEOUT))?;
            }
            let mut table = Vec::with_capacity(n * 8);
            for k in &keys {
                let v = self.timed(|c| c.get(k))?.ok_or_else(|| format!("{k} vanished"))?;
                table.extend_from_slice(&(v.len() as u64).to_le_bytes());
            }
            self.timed(|c| c.set(&hosts, &table))?;
        } else {
            let v = self.timed(|c| c.get_wait(&hosts, TIMEOUT))?;
            if v.len() != n * 8 {
                return Err(format!("hosts: {} bytes", v.len()));
            }
        }
        for q in peers(r, n) {
            let k = self.key(&format!("tcp/{q}"));
            self.timed(|c| c.get_wait(&k, TIMEOUT))?;
        }
        self.c.close_idle();
        Ok(())
    }
}

/// The peers of `r` in a ring (r ± 1) and in recursive doubling (r XOR 2^k).
fn peers(r: usize, n: usize) -> Vec<usize> {
    let mut p = vec![(r + 1) % n, (r + n - 1) % n];
    let mut bit = 1;
    while bit < n {
        if r ^ bit < n {
            p.push(r ^ bit);
        }
        bit <<= 1;
    }
    let mut seen = HashSet::new();
    p.retain(|&q| q != r && seen.insert(q));
    p
}

/// Threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Descriptors of this process that are TCP sockets bound locally to `port`.
fn server_fds(port: u16) -> usize {
    let mut inodes = HashSet::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1).and_then(|a| a.rsplit(':').next()).and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) {
                if let Some(inode) = f.get(9) {
                    inodes.insert(format!("socket:[{inode}]"));
                }
            }
        }
    }
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| inodes.contains(l.to_string_lossy().as_ref()))
                .count()
        })
        .unwrap_or(0)
}

/// [`server_fds`] once it stops changing (at most 10 s).
fn settled_fds(port: u16) -> usize {
    let start = Instant::now();
    let mut last = server_fds(port);
    loop {
        thread::sleep(Duration::from_millis(100));
        let now = server_fds(port);
        if now == last || start.elapsed() > Duration::from_secs(10) {
            return now;
        }
        last = now;
    }
}

/// Raises the soft descriptor limit to the hard one (the clients need one each; the server
/// does this itself when it binds in-process).
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit the kernel fills in, then reads.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

struct Measured {
    pattern: Pattern,
    clients: usize,
    connect: Duration,
    wall: Duration,
    lat: Vec<u64>,
    server_threads: Option<usize>,
    fds_peak: Option<usize>,
    fds_end: Option<usize>,
}

fn run(pattern: Pattern, n: usize, args: &Args) -> Result<Measured, String> {
    let threads_before = threads();
    let (server, addr, secret) = match &args.addr {
        Some(a) => {
            let secret = match &args.secret {
                Some(s) => Secret::from_text(s).map_err(|e| e.to_string())?,
                None => {
                    Secret::from_env().map_err(|e| e.to_string())?.ok_or("--addr needs --secret or OXCCL_SECRET")?
                }
            };
            (None, a.clone(), secret)
        }
        None => {
            let secret = Secret::generate().map_err(|e| e.to_string())?;
            let s = StoreServer::bind("127.0.0.1:0", secret.clone()).map_err(|e| e.to_string())?;
            let addr = s.local_addr().to_string();
            (Some(s), addr, secret)
        }
    };
    let port = server.as_ref().map(|s| s.local_addr().port());
    let prefix = format!("load/{}/{}/", std::process::id(), pattern.name());
    // connected: every client is up; go: start; done: every rank finished; release: clients may go.
    let [connected, go, done, release] = [(); 4].map(|()| Arc::new(Barrier::new(n + 1)));
    let start = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for r in 0..n {
        let (addr, secret, prefix) = (addr.clone(), secret.clone(), prefix.clone());
        let (connected, go, done, release) = (connected.clone(), go.clone(), done.clone(), release.clone());
        let h = thread::Builder::new()
            .stack_size(STACK)
            .spawn(move || {
                let c = StoreClient::connect(&addr, &secret, TIMEOUT).map_err(|e| e.to_string());
                connected.wait();
                go.wait();
                let result = c.as_ref().map_err(Clone::clone).and_then(|c| {
                    let mut rank = Rank { c, prefix: &prefix, lat: Vec::new() };
                    match pattern {
                        Pattern::Old => rank.old_pattern(r, n),
                        Pattern::New => rank.new_pattern(r, n),
                    }
                    .map(|()| rank.lat)
                });
                done.wait();
                release.wait();
                drop(c);
                result.map_err(|e| format!("rank {r}: {e}"))
            })
            .map_err(|e| format!("spawning client thread {r}: {e}"))?;
        handles.push(h);
    }
    connected.wait();
    let connect = start.elapsed();
    let peak_threads = threads();
    let fds_peak = port.map(server_fds);
    let t0 = Instant::now();
    go.wait();
    done.wait();
    let wall = t0.elapsed();
    // The server closes its ends as it reads the clients' (close_idle): let it catch up.
    let fds_end = port.map(settled_fds);
    release.wait();
    let mut lat = Vec::new();
    let mut first_error = None;
    for h in handles {
        match h.join().map_err(|_| "a client thread panicked".to_string()).and_then(|r| r) {
            Ok(l) => lat.extend(l),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    drop(server);
    lat.sort_unstable();
    let server_threads = port.map(|_| peak_threads.saturating_sub(threads_before + n));
    Ok(Measured { pattern, clients: n, connect, wall, lat, server_threads, fds_peak, fds_end })
}

fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

fn micros(ns: u64) -> String {
    if ns >= 10_000_000 {
        format!("{:.0}ms", ns as f64 / 1e6)
    } else {
        format!("{:.0}µs", ns as f64 / 1e3)
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn opt(v: Option<usize>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    raise_fd_limit();
    let cpus = thread::available_parallelism().map_or(0, |n| n.get());
    let server = match &args.addr {
        Some(a) => format!("the server at {a}"),
        None => "an in-process server (one per pattern)".into(),
    };
    println!("store_load: {} clients (threads with {} KiB stacks), {server}, {cpus} CPUs", args.clients, STACK >> 10);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for pattern in [Pattern::Old, Pattern::New] {
        if pattern == Pattern::Old && args.clients > args.old_max {
            notes.push(format!(
                "old: skipped at {} clients (above --old-max {}; it makes {} get_wait calls)",
                args.clients,
                args.old_max,
                args.clients * args.clients
            ));
            continue;
        }
        match run(pattern, args.clients, &args) {
            Ok(m) => rows.push(m),
            Err(e) => {
                eprintln!("{}: {e}", pattern.name());
                return ExitCode::FAILURE;
            }
        }
    }
    println!();
    println!(
        "| pattern | clients | connect | wall | requests | requests/s | p50 | p99 | server threads | server fds peak | server fds end |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for m in &rows {
        let n = m.lat.len();
        println!(
            "| {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
            m.pattern.name(),
            m.clients,
            secs(m.connect),
            secs(m.wall),
            n,
            n as f64 / m.wall.as_secs_f64(),
            micros(percentile(&m.lat, 0.50)),
            micros(percentile(&m.lat, 0.99)),
            opt(m.server_threads),
            opt(m.fds_peak),
            opt(m.fds_end),
        );
    }
    for n in notes {
        println!("\n{n}");
    }
    ExitCode::SUCCESS
}
