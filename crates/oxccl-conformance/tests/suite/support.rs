//! Worlds of real processes for the tests: what `oxccl run` does, in miniature.
//!
//! [`World::spawn`] starts a [`StoreServer`] on `127.0.0.1:0` with a fresh [`Secret`] and
//! `n` child processes of a program, each with the variables the launcher sets (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` = n on one host, `OXCCL_STORE_ADDR`,
//! `OXCCL_SECRET`, `OXCCL_LAUNCHER=oxccl`, `OXCCL_TIMEOUT`), captures their output, and
//! reaps them as soon as they exit (a zombie still answers `kill(pid, 0)`, so an unreaped
//! dead rank would look alive to its peers). Every wait has the world's overall deadline: on
//! expiry every child is killed and the test fails with every rank's output. Dropping a
//! [`World`] (also while a failing test unwinds) kills and reaps the children left.
//!
//! Inherited `OXCCL_*` variables are removed (except `OXCCL_CONFORMANCE_*`, to narrow a run
//! by hand), so a developer's shell settings cannot change what a test means.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxccl::bootstrap::auth::Secret;
use oxccl::bootstrap::store::StoreServer;

/// How often children are polled for exit.
const POLL: Duration = Duration::from_millis(5);

/// How the ranks find each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// Like `oxccl run`: the launcher (this process) hosts the store, `OXCCL_STORE_ADDR`
    /// points at it, and `OXCCL_LAUNCHER=oxccl`.
    Oxccl,
    /// Like torchrun: `MASTER_ADDR`/`MASTER_PORT` and `TORCHELASTIC_RUN_ID`, no store
    /// address (rank 0 hosts the store on `MASTER_PORT + 1`), `OXCCL_SECRET` exported by hand.
    Torchrun,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct WorldSpec {
    /// The program every rank runs.
    pub program: PathBuf,
    /// Its arguments (the same for every rank).
    pub args: Vec<String>,
    /// Number of ranks.
    pub n: usize,
    /// Extra environment for every rank (applied after the launcher's variables).
    pub env: Vec<(String, String)>,
    /// Extra environment for one rank (applied last).
    pub rank_env: Vec<(usize, String, String)>,
    /// `OXCCL_TIMEOUT` of the ranks.
    pub oxccl_timeout: String,
    /// How long the whole world may run before it is killed and the test fails.
    pub deadline: Duration,
    /// A name for messages.
    pub label: String,
    /// Which launcher's environment the ranks get.
    pub launch: Launch,
}

impl WorldSpec {
    /// `n` ranks of `program`, `OXCCL_TIMEOUT=60s`, a deadline of 120 s.
    pub fn new(program: impl Into<PathBuf>, n: usize) -> WorldSpec {
        let program = program.into();
        let label =
            format!("{} x{n}", program.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default());
        WorldSpec {
            program,
            args: Vec::new(),
            n,
            env: Vec::new(),
            rank_env: Vec::new(),
            oxccl_timeout: "60s".into(),
            deadline: Duration::from_secs(120),
            label,
            launch: Launch::Oxccl,
        }
    }

    /// Chooses the launcher's environment.
    pub fn launch(mut self, launch: Launch) -> Self {
        self.launch = launch;
        self
    }

    /// Adds arguments.
    pub fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets a variable for every rank.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Sets a variable for one rank.
    pub fn rank_env(mut self, rank: usize, k: &str, v: &str) -> Self {
        self.rank_env.push((rank, k.into(), v.into()));
        self
    }

    /// Sets `OXCCL_TIMEOUT`.
    pub fn oxccl_timeout(mut self, t: &str) -> Self {
        self.oxccl_timeout = t.into();
        self
    }

    /// Sets the overall deadline.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = d;
        self
    }

    /// Sets the label used in messages.
    pub fn label(mut self, l: impl Into<String>) -> Self {
        self.label = l.into();
        self
    }
}

/// A child's captured output, filled by reader threads.
#[derive(Default)]
struct Captured {
    text: Mutex<(String, String)>,
    changed: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn reader(src: impl Read + Send + 'static, cap: Arc<Captured>, stderr: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let s = String::from_utf8_lossy(&line);
                    let mut t = lock(&cap.text);
                    if stderr {
                        t.1.push_str(&s)
                    } else {
                        t.0.push_str(&s)
                    }
                    drop(t);
                    cap.changed.notify_all();
                }
            }
        }
    })
}

struct Proc {
    rank: usize,
    pid: u32,
    child: Child,
    out: Arc<Captured>,
    readers: Vec<JoinHandle<()>>,
    exit: Option<(ExitStatus, Instant)>,
    /// Not reaped until every other rank has exited (see [`World::kill_without_reaping`]).
    hold: bool,
}

impl Proc {
    /// Reaps the child if it has exited.
    fn poll(&mut self) {
        if self.exit.is_none() && !self.hold {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.exit = Some((st, Instant::now()));
            }
        }
    }

    fn kill_and_reap(&mut self) {
        self.hold = false;
        if self.exit.is_none() {
            let _ = self.child.kill();
            if let Ok(st) = self.child.wait() {
                self.exit = Some((st, Instant::now()));
            }
        }
    }
}

/// One rank's outcome.
#[derive(Debug, Clone)]
pub struct RankResult {
    /// Its rank.
    pub rank: usize,
    /// Its process id.
    pub pid: u32,
    /// How it ended.
    pub status: ExitStatus,
    /// When it was reaped.
    pub exited_at: Instant,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl RankResult {
    /// The exit code (None when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Every rank's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// What ran.
    pub label: String,
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankResult>,
    /// When the world was started.
    pub started: Instant,
    /// From start until the last rank was reaped.
    pub elapsed: Duration,
}

impl Outcome {
    /// Every rank's status and output, for failure messages.
    pub fn describe(&self) -> String {
        let mut s =
            format!("world `{}` ({} ranks, {:.2}s):\n", self.label, self.ranks.len(), self.elapsed.as_secs_f64());
        for r in &self.ranks {
            s.push_str(&describe_rank(r.rank, r.pid, &format!("{}", r.status), &r.stdout, &r.stderr));
        }
        s
    }

    /// Fails the test unless every rank exited with status 0.
    pub fn assert_all_succeeded(&self) {
        let bad: Vec<usize> = self.ranks.iter().filter(|r| r.code() != Some(0)).map(|r| r.rank).collect();
        assert!(bad.is_empty(), "rank(s) {bad:?} did not exit with status 0\n{}", self.describe());
    }
}

/// Keeps at most the last `max` bytes of `s` (on a character boundary).
fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut at = s.len() - max;
    while !s.is_char_boundary(at) {
        at += 1;
    }
    &s[at..]
}

fn describe_rank(rank: usize, pid: u32, status: &str, stdout: &str, stderr: &str) -> String {
    const MAX: usize = 6000;
    let mut s = format!("--- rank {rank} (pid {pid}): {status}\n");
    for (name, text) in [("stdout", stdout), ("stderr", stderr)] {
        if text.is_empty() {
            continue;
        }
        let t = tail(text, MAX);
        let cut =
            if t.len() < text.len() { format!(" (last {} of {} bytes)", t.len(), text.len()) } else { String::new() };
        s.push_str(&format!("  [{name}{cut}]\n"));
        for line in t.lines() {
            s.push_str(&format!("    {line}\n"));
        }
    }
    s
}

/// A running world. Dropping it kills and reaps every child still running.
pub struct World {
    label: String,
    store: Option<StoreServer>,
    secret: Secret,
    procs: Vec<Proc>,
    started: Instant,
    deadline: Instant,
}

impl World {
    /// Starts the store and the `spec.n` processes.
    ///
    /// # Panics
    /// When the store cannot be bound or a process cannot be started.
    pub fn spawn(spec: &WorldSpec) -> World {
        let secret = Secret::generate().expect("generating a secret");
        let (store, addr) = match spec.launch {
            Launch::Oxccl => {
                let store = StoreServer::bind("127.0.0.1:0", secret.clone()).expect("binding the store on 127.0.0.1:0");
                let addr = store.local_addr().to_string();
                (Some(store), addr)
            }
            // MASTER_PORT; rank 0 binds MASTER_PORT + 1, found free just now.
            Launch::Torchrun => (None, (free_port_after_another() - 1).to_string()),
        };
        let started = Instant::now();
        let mut world = World {
            label: spec.label.clone(),
            store,
            secret: secret.clone(),
            procs: Vec::new(),
            started,
            deadline: started + spec.deadline,
        };
        for rank in 0..spec.n {
            world.start(spec, &addr, rank, rank, &[]);
        }
        world
    }

    /// Starts process `rank` (its index in the outcome) in the launcher's slot `slot` (its
    /// `RANK`), with `extra` variables on top of the spec's.
    fn start(&mut self, spec: &WorldSpec, addr: &str, rank: usize, slot: usize, extra: &[(&str, &str)]) {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            // OXCCL_LOG passes through, so a failing world can be rerun with logs.
            if k.starts_with("OXCCL_") && !k.starts_with("OXCCL_CONFORMANCE_") && k != "OXCCL_LOG" {
                cmd.env_remove(&k);
            }
        }
        for k in ["MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK", "LOCAL_WORLD_SIZE"] {
            cmd.env_remove(k);
        }
        cmd.env("RANK", slot.to_string())
            .env("WORLD_SIZE", spec.n.to_string())
            .env("LOCAL_RANK", slot.to_string())
            .env("LOCAL_WORLD_SIZE", spec.n.to_string())
            .env("OXCCL_SECRET", self.secret.text())
            .env("OXCCL_TIMEOUT", &spec.oxccl_timeout)
            // The flight recorder dumps on every failed operation, and many cases fail on
            // purpose: into the build's scratch directory, not the system's temporary one
            // (a run left about a thousand files there). A case may name its own.
            .env("OXCCL_FR_DIR", concat!(env!("CARGO_TARGET_TMPDIR"), "/flight-records"))
            .env("RUST_BACKTRACE", "1");
        match spec.launch {
            Launch::Oxccl => cmd.env("OXCCL_STORE_ADDR", addr).env("OXCCL_LAUNCHER", "oxccl"),
            Launch::Torchrun => cmd
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", addr)
                .env("TORCHELASTIC_RUN_ID", "oxccl-conformance-test"),
        };
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        for (r, k, v) in &spec.rank_env {
            if *r == rank {
                cmd.env(k, v);
            }
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => panic!("starting rank {rank} of `{}` ({}): {e}", spec.label, spec.program.display()),
        };
        let out = Arc::new(Captured::default());
        let mut readers = Vec::new();
        if let Some(o) = child.stdout.take() {
            readers.push(reader(o, Arc::clone(&out), false));
        }
        if let Some(e) = child.stderr.take() {
            readers.push(reader(e, Arc::clone(&out), true));
        }
        let pid = child.id();
        self.procs.push(Proc { rank, pid, child, out, readers, exit: None, hold: false });
    }

    /// Starts a newcomer (`OXCCL_JOIN=1`) in the launcher's slot `slot`, as `oxccl run
    /// --max-restarts` starts a replacement; it is process `n + k` of the outcome (the k-th
    /// newcomer). Only with [`Launch::Oxccl`].
    pub fn spawn_joiner(&mut self, spec: &WorldSpec, slot: usize) -> usize {
        let addr = self.store_addr();
        assert!(!addr.is_empty(), "a newcomer joins through the world's store (Launch::Oxccl)");
        let rank = self.procs.len();
        self.start(spec, &addr, rank, slot, &[("OXCCL_JOIN", "1")]);
        rank
    }

    /// Starts the world and waits for every rank to exit.
    pub fn run(spec: &WorldSpec) -> Outcome {
        World::spawn(spec).wait()
    }

    /// The address of the world's store (empty with [`Launch::Torchrun`]).
    pub fn store_addr(&self) -> String {
        self.store.as_ref().map(|s| s.local_addr().to_string()).unwrap_or_default()
    }

    /// The world's secret.
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    fn poll_all(&mut self) {
        for p in &mut self.procs {
            p.poll();
        }
    }

    /// Kills every rank and fails the test with everyone's output.
    fn fail(&mut self, why: &str) -> ! {
        for p in &mut self.procs {
            p.kill_and_reap();
        }
        for p in &mut self.procs {
            for r in p.readers.drain(..) {
                let _ = r.join();
            }
        }
        let mut s = format!("world `{}`: {why} (after {:.2}s)\n", self.label, self.started.elapsed().as_secs_f64());
        for p in &self.procs {
            let t = lock(&p.out.text);
            let status = p.exit.as_ref().map_or("running".to_string(), |(st, _)| st.to_string());
            s.push_str(&describe_rank(p.rank, p.pid, &status, &t.0, &t.1));
        }
        panic!("{s}");
    }

    /// Waits until rank `rank` has written a line to stdout that contains `needle`,
    /// reaping exited children meanwhile, and returns that line.
    ///
    /// # Panics
    /// (Killing every rank first) when the rank exits without writing it, or at the deadline.
    pub fn wait_for_line(&mut self, rank: usize, needle: &str) -> String {
        loop {
            self.poll_all();
            let exited = self.procs[rank].exit.is_some();
            {
                let out = Arc::clone(&self.procs[rank].out);
                let t = lock(&out.text);
                if let Some(l) = t.0.lines().find(|l| l.contains(needle)) {
                    return l.to_string();
                }
                if exited {
                    drop(t);
                    // Let the readers finish what was already written.
                    for r in self.procs[rank].readers.drain(..) {
                        let _ = r.join();
                    }
                    let t = lock(&out.text);
                    if let Some(l) = t.0.lines().find(|l| l.contains(needle)) {
                        return l.to_string();
                    }
                    drop(t);
                    self.fail(&format!("rank {rank} exited without printing a line containing {needle:?}"));
                }
                if Instant::now() >= self.deadline {
                    drop(t);
                    self.fail(&format!("deadline passed while waiting for rank {rank} to print {needle:?}"));
                }
                let _ = out.changed.wait_timeout(t, POLL.max(Duration::from_millis(10)));
            }
        }
    }

    /// Sends SIGKILL to rank `rank` and reaps it; returns when it was sent.
    pub fn kill(&mut self, rank: usize) -> Instant {
        let at = Instant::now();
        self.procs[rank].kill_and_reap();
        at
    }

    /// Sends SIGKILL to rank `rank` but leaves it unreaped (a zombie) until every other rank
    /// has exited, as a launcher that waits for its children one by one would; returns when
    /// the signal was sent.
    pub fn kill_without_reaping(&mut self, rank: usize) -> Instant {
        let at = Instant::now();
        let p = &mut self.procs[rank];
        if p.exit.is_none() {
            p.hold = true;
            let _ = p.child.kill();
        }
        at
    }

    /// Waits for every rank to exit (at most until the deadline) and returns the outcome.
    ///
    /// # Panics
    /// (Killing every rank first) at the deadline, with everyone's output.
    pub fn wait(mut self) -> Outcome {
        loop {
            self.poll_all();
            if self.procs.iter().all(|p| p.exit.is_some() || p.hold) {
                for p in &mut self.procs {
                    p.hold = false;
                }
                self.poll_all();
            }
            if self.procs.iter().all(|p| p.exit.is_some()) {
                break;
            }
            if Instant::now() >= self.deadline {
                let running: Vec<usize> = self.procs.iter().filter(|p| p.exit.is_none()).map(|p| p.rank).collect();
                self.fail(&format!("deadline passed; rank(s) {running:?} still running (killed now)"));
            }
            std::thread::sleep(POLL);
        }
        let elapsed = self.started.elapsed();
        let mut ranks = Vec::new();
        for p in &mut self.procs {
            for r in p.readers.drain(..) {
                let _ = r.join();
            }
            let t = lock(&p.out.text);
            let (status, exited_at) = p.exit.unwrap_or_else(|| unreachable!("every rank has exited"));
            ranks.push(RankResult {
                rank: p.rank,
                pid: p.pid,
                status,
                exited_at,
                stdout: t.0.clone(),
                stderr: t.1.clone(),
            });
        }
        Outcome { label: self.label.clone(), ranks, started: self.started, elapsed }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for p in &mut self.procs {
            p.kill_and_reap();
        }
        // The store goes last: children still running could otherwise see it vanish.
        drop(self.store.take());
    }
}

/// A TCP port that was free a moment ago and is at least 1025 (so that the port before it,
/// torchrun's MASTER_PORT, is a valid unprivileged port too).
fn free_port_after_another() -> u16 {
    for _ in 0..100 {
        let l = std::net::TcpListener::bind("0.0.0.0:0").expect("binding a free port");
        let port = l.local_addr().expect("the bound address").port();
        if port > 1025 {
            return port;
        }
    }
    panic!("no free TCP port above 1025");
}

/// The `oxccl-*` names in /dev/shm.
pub fn shm_files() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("oxccl-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the `oxccl-*` files of /dev/shm created by `pids`, processes of a test that it
/// killed and reaped. A creator killed while its peers were still to map a segment leaves the
/// name behind (`cpu/transport/shm/segment.rs`), and the library removes such orphans only
/// after 10 minutes (from its side, a creator may live in another PID namespace); a test
/// whose kills may land in a set-up removes them itself, so that nothing outlives the test.
pub fn remove_shm_files_of(pids: &[u32]) {
    for name in shm_files_left(&BTreeSet::new(), pids) {
        let _ = std::fs::remove_file(std::path::Path::new("/dev/shm").join(name));
    }
}

/// The `oxccl-*` files of /dev/shm that are not in `before` and were created by one of
/// `pids` (segment names are `oxccl-<kind>-<creator pid>-<random>`).
pub fn shm_files_left(before: &BTreeSet<String>, pids: &[u32]) -> Vec<String> {
    shm_files()
        .into_iter()
        .filter(|n| !before.contains(n))
        .filter(|n| n.split('-').nth(2).and_then(|p| p.parse::<u32>().ok()).is_some_and(|p| pids.contains(&p)))
        .collect()
}
