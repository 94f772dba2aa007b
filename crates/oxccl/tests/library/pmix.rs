//! The PMIx bootstrap under a real launcher: Open MPI's `mpirun` runs this test binary again
//! as 4 ranks, each of which starts a PMIx client, publishes, fences and looks up every
//! other rank's values (`pmix_child`). Skipped, with a line saying so, where `mpirun` is not
//! Open MPI's or not on `PATH`, or where no PMIx library loads (Debian: `openmpi-bin`, which
//! brings `libpmix2`).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oxccl::bootstrap::pmix::{self, Pmix};
use oxccl::bootstrap::Rendezvous;
use oxccl::config::BootstrapMode;
use oxccl::Error;

/// Set (to `1`) in the ranks `mpirun` starts.
const CHILD: &str = "OXCCL_PMIX_TEST_CHILD";
/// The ranks of the job.
const RANKS: usize = 4;
/// How long the whole `mpirun` may take.
const JOB_DEADLINE: Duration = Duration::from_secs(180);
/// How long a lookup of a value that will come may wait.
const PATIENT: Duration = Duration::from_secs(60);

/// `prog` on `PATH`.
fn on_path(prog: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(prog)).find(|p| p.is_file())
}

/// Why this machine cannot run the test, if it cannot.
fn cannot_run() -> Option<String> {
    let Some(mpirun) = on_path("mpirun") else {
        return Some("no mpirun on PATH (install openmpi-bin)".into());
    };
    let version = Command::new(&mpirun).arg("--version").output();
    let text = match version {
        Ok(o) => format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        Err(e) => return Some(format!("{} --version failed: {e}", mpirun.display())),
    };
    if !(text.contains("Open MPI") || text.contains("OpenRTE") || text.contains("PRRTE")) {
        return Some(format!("{} is not Open MPI's: {}", mpirun.display(), text.lines().next().unwrap_or("")));
    }
    // The library the ranks will load: OXCCL_PMIX_LIBRARY's where set.
    let library = match oxccl::config::registry::PMIX_LIBRARY.from_env() {
        Ok(l) => l.map(PathBuf::from),
        Err(e) => return Some(e.to_string()),
    };
    if let Err(e) = pmix::probe(library.as_deref()) {
        return Some(format!("no PMIx library loads: {e}"));
    }
    None
}

/// Reads a child's pipe to the end on a thread of its own.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let mut bytes = Vec::new();
        if pipe.read_to_end(&mut bytes).is_ok() {
            s = String::from_utf8_lossy(&bytes).into_owned();
        }
        s
    })
}

#[test]
fn ranks_meet_through_pmix_under_mpirun() {
    if std::env::var_os(CHILD).is_some() {
        return; // a rank runs `pmix_child` only; this is a guard against recursion
    }
    if let Some(why) = cannot_run() {
        println!("skipped: the PMIx test under mpirun cannot run here: {why}");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new("mpirun")
        // Harmless when not root; needed as root (CI containers). Four ranks on any number
        // of CPUs.
        .args(["--allow-run-as-root", "--oversubscribe", "-n", &RANKS.to_string(), "-x", CHILD])
        .arg(&exe)
        .args(["--exact", "pmix::pmix_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    let out = drain(child.stdout.take().expect("piped stdout"));
    let err = drain(child.stderr.take().expect("piped stderr"));
    let start = Instant::now();
    let status = loop {
        match child.try_wait().expect("waiting for mpirun") {
            Some(s) => break Some(s),
            None if start.elapsed() > JOB_DEADLINE => {
                // Ours to end: the mpirun this test started (it ends its ranks).
                child.kill().ok();
                child.wait().ok();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let (stdout, stderr) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    let Some(status) = status else {
        panic!("mpirun ran past {JOB_DEADLINE:?}:\n{stdout}\n{stderr}");
    };
    assert!(status.success(), "mpirun failed ({status}):\n{stdout}\n{stderr}");
    for r in 0..RANKS {
        let ok = format!("PMIX-CHILD-OK rank {r} of {RANKS}");
        assert!(stdout.contains(&ok), "rank {r} did not finish:\n{stdout}\n{stderr}");
    }
    for line in stdout.lines().filter(|l| l.contains("PMIX-CHILD")) {
        println!("{line}");
    }
}

/// One rank of the job `ranks_meet_through_pmix_under_mpirun` starts.
#[test]
#[ignore = "run under mpirun by ranks_meet_through_pmix_under_mpirun"]
fn pmix_child() {
    let pmix = Pmix::from_env().expect("mpirun sets the PMIx variables").expect("the PMIx client starts");
    let (me, n) = (pmix.rank(), pmix.size());
    assert_eq!(n, RANKS, "PMIX_JOB_SIZE");
    assert_eq!(pmix.local_size(), RANKS, "all ranks are on this host");
    assert!(pmix.local_rank() < RANKS);
    assert!(!pmix.namespace().is_empty());
    let value = |what: &str, r: usize| format!("{what} of rank {r}").into_bytes();

    // OXCCL_BOOTSTRAP=auto picks PMIx here; a second client of the same process is counted
    // by PMIx, and dropping it leaves the first one working.
    let library = oxccl::config::registry::PMIX_LIBRARY.from_env().unwrap().map(PathBuf::from);
    let choice = pmix::choice(BootstrapMode::Auto, library.as_deref());
    assert!(choice.is_pmix(), "{choice:?}");
    let second = Pmix::for_mode(BootstrapMode::Auto, library.as_deref()).unwrap().expect("PMIx under auto");
    assert_eq!((second.rank(), second.size(), second.namespace()), (me, n, pmix.namespace()));
    drop(second);
    assert!(Pmix::for_mode(BootstrapMode::Store, library.as_deref()).unwrap().is_none());

    // Direct modex without any fence: a lookup waits for its owner's put (the last rank
    // publishes 2 s late).
    if me == n - 1 {
        std::thread::sleep(Duration::from_secs(2));
    }
    pmix.publish("oxccl-test/early", &value("early", me)).expect("publish");
    let t = Instant::now();
    for r in 0..n {
        let got = pmix.lookup_from(r, "oxccl-test/early", PATIENT).expect("lookup before any fence");
        assert_eq!(got, value("early", r), "rank {r}'s early value");
    }
    let waited = t.elapsed();

    // Every rank publishes the same key name with its own value; a fence; every value.
    pmix.publish("oxccl-test/addr", &value("addr", me)).expect("publish");
    pmix.fence().expect("fence without data collection");
    for r in 0..n {
        assert_eq!(pmix.lookup_from(r, "oxccl-test/addr", PATIENT).unwrap(), value("addr", r));
        // After the fence every value is with this host's server: a zero timeout finds it.
        assert_eq!(pmix.lookup_from(r, "oxccl-test/addr", Duration::ZERO).unwrap(), value("addr", r));
    }
    // Publishing again overwrites (once everybody has read the first values).
    pmix.fence().expect("fence");
    pmix.publish("oxccl-test/addr", &value("second addr", me)).unwrap();
    pmix.fence_collecting().expect("fence collecting data");
    for r in 0..n {
        assert_eq!(pmix.lookup_from(r, "oxccl-test/addr", PATIENT).unwrap(), value("second addr", r));
    }

    // A key nobody publishes: an error after the (short) timeout, not a hang.
    let peer = (me + 1) % n;
    let t = Instant::now();
    let e = pmix.lookup_from(peer, "oxccl-test/nobody", Duration::from_millis(500)).unwrap_err();
    let timed_out = t.elapsed();
    assert!(matches!(&e, Error::Store(m) if m.contains("did not publish") && m.contains("nobody")), "{e}");
    assert!(timed_out < Duration::from_secs(20), "a 1 s PMIx timeout took {timed_out:?}");
    let e = pmix.lookup_from(peer, "oxccl-test/nobody", Duration::ZERO).unwrap_err();
    assert!(matches!(&e, Error::Store(m) if m.contains("did not publish")), "{e}");
    // Without an owner, and with one outside the job: refused, saying why.
    let e = pmix.lookup("oxccl-test/addr", PATIENT).unwrap_err();
    assert!(matches!(&e, Error::Store(m) if m.contains("lookup_from")), "{e}");
    let e = pmix.lookup_from(n, "oxccl-test/addr", PATIENT).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = pmix.publish("pmix.reserved", b"x").unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");

    // Nobody leaves (and finalizes) before everybody is done with the others' values.
    pmix.fence().expect("last fence");
    println!(
        "PMIX-CHILD-OK rank {me} of {n} (namespace {}, local rank {}, {}; lookups before any fence took \
         {waited:.1?}, a missing key failed after {timed_out:.1?})",
        pmix.namespace(),
        pmix.local_rank(),
        pmix.version()
    );
}
