//! `oxccl run`, the launcher: environment, output prefixes, fail-fast, signals, timeouts.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use crate::common::{oxccl, run, wait};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn every_rank_gets_its_environment_and_a_prefix() {
    let f = run(
        oxccl([
            "run",
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            "echo hi from $RANK of $WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE via $OXCCL_LAUNCHER \
             node $OXCCL_NODE_RANK store $OXCCL_STORE_ADDR master $MASTER_ADDR:$MASTER_PORT; echo oops >&2",
        ]),
        LIMIT,
    );
    assert_eq!(f.code(), Some(0), "{}", f.all());
    let lines: Vec<&str> = f.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", f.all());
    for r in 0..3 {
        let line =
            lines.iter().find(|l| l.starts_with(&format!("[rank {r}] "))).unwrap_or_else(|| panic!("{}", f.all()));
        assert!(line.contains(&format!("hi from {r} of 3 local {r}/3 via oxccl node 0 store 127.0.0.1:")), "{line}");
        // The store is where MASTER_ADDR:MASTER_PORT say.
        let store = line.split(" store ").nth(1).and_then(|s| s.split(' ').next()).unwrap_or_default();
        assert!(line.ends_with(&format!("master {store}")), "{line}");
        assert!(f.stderr.contains(&format!("[rank {r}] oops")), "{}", f.all());
    }
    assert!(!f.stderr.contains("oxccl run:"), "no summary on success: {}", f.all());
}

#[test]
fn a_failing_rank_stops_the_others_fast() {
    let f = run(oxccl(["run", "-n", "3", "--", "sh", "-c", r#"if [ "$RANK" = 1 ]; then exit 3; fi; sleep 30"#]), LIMIT);
    assert_eq!(f.code(), Some(3), "{}", f.all());
    assert!(f.elapsed < Duration::from_secs(10), "took {:?}", f.elapsed);
    assert!(f.stderr.contains("rank 1: exit code 3"), "{}", f.all());
    for r in [0, 2] {
        assert!(f.stderr.contains(&format!("rank {r}: terminated by the launcher after rank 1 failed")), "{}", f.all());
    }
}

#[test]
fn max_restarts_starts_a_joining_replacement_and_the_job_succeeds() {
    // Rank 1 kills itself unless it is the replacement (OXCCL_JOIN=1); the others wait for
    // the replacement's file, as survivors wait for it to join.
    let dir = std::env::temp_dir().join(format!("oxccl-run-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        r#"if [ "$RANK" = 1 ] && [ -z "$OXCCL_JOIN" ]; then kill -9 $$; fi
if [ -n "$OXCCL_JOIN" ]; then touch {d}/joined; echo "replacement of $RANK joins"; exit 0; fi
i=0; while [ ! -e {d}/joined ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; echo "rank $RANK saw it: $(ls {d})""#,
        d = dir.display()
    );
    let f = run(oxccl(["run", "-n", "3", "--max-restarts", "1", "--", "sh", "-c", &script]), LIMIT);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(f.code(), Some(0), "{}", f.all());
    assert!(f.stdout.contains("[rank 1] replacement of 1 joins"), "{}", f.all());
    for r in [0, 2] {
        assert!(f.stdout.contains(&format!("[rank {r}] rank {r} saw it: joined")), "{}", f.all());
    }
    assert!(
        f.stderr.contains("rank 1 failed (killed by signal 9 (SIGKILL)); starting a replacement that joins the 2 running ranks (restart 1 of 1)"),
        "{}",
        f.all()
    );
}

#[test]
fn a_failure_past_max_restarts_or_below_min_ranks_ends_the_job() {
    // Two ranks die and one restart is allowed: the second failure stops the job.
    let f = run(
        oxccl([
            "run",
            "-n",
            "3",
            "--max-restarts",
            "1",
            "--",
            "sh",
            "-c",
            r#"if [ "$RANK" != 0 ] && [ -z "$OXCCL_JOIN" ]; then sleep 0.$RANK; exit 7; fi; sleep 30"#,
        ]),
        LIMIT,
    );
    assert_eq!(f.code(), Some(7), "{}", f.all());
    assert!(f.elapsed < Duration::from_secs(10), "took {:?}", f.elapsed);
    assert!(f.stderr.contains("restart 1 of 1"), "{}", f.all());
    assert!(f.stderr.contains("rank 2 failed first: exit code 7"), "{}", f.all());
    assert!(f.stderr.contains("rank 1: exit code 7, then replaced (--max-restarts)"), "{}", f.all());
    // With 2 ranks and --min-ranks 2, the one left running is too few: no restart.
    let f = run(
        oxccl([
            "run",
            "-n",
            "2",
            "--max-restarts",
            "3",
            "--min-ranks",
            "2",
            "--",
            "sh",
            "-c",
            r#"if [ "$RANK" = 1 ]; then exit 5; fi; sleep 30"#,
        ]),
        LIMIT,
    );
    assert_eq!(f.code(), Some(5), "{}", f.all());
    assert!(!f.stderr.contains("replacement"), "{}", f.all());
}

#[test]
fn a_rank_killed_by_a_signal_is_named() {
    let f =
        run(oxccl(["run", "-n", "2", "--", "sh", "-c", r#"if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 30"#]), LIMIT);
    assert_eq!(f.code(), Some(128 + 9), "{}", f.all());
    assert!(f.elapsed < Duration::from_secs(10), "took {:?}", f.elapsed);
    assert!(f.stderr.contains("rank 1: killed by signal 9 (SIGKILL)"), "{}", f.all());
    assert!(f.stderr.contains("rank 0: terminated by the launcher"), "{}", f.all());
}

/// Starts `oxccl run -n 2` with two ranks that sleep 30 s, and returns once both run: the
/// launcher, its stdout (the ranks' lines read so far are consumed) and the ranks' pids.
fn two_sleeping_ranks() -> (std::process::Child, BufReader<std::process::ChildStdout>, Vec<i32>) {
    let mut child = oxccl(["run", "-n", "2", "--", "sh", "-c", "echo ready $$; exec sleep 30"]).spawn().expect("start");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut pids = Vec::new();
    let mut line = String::new();
    while pids.len() < 2 && out.read_line(&mut line).unwrap_or(0) > 0 {
        if let Some(pid) = line.trim().rsplit(' ').next().and_then(|p| p.parse::<i32>().ok()) {
            pids.push(pid);
        }
        line.clear();
    }
    assert_eq!(pids.len(), 2, "both ranks should report ready");
    (child, out, pids)
}

#[test]
fn the_killed_rank_is_blamed_not_the_ranks_that_exit_when_they_lose_it() {
    // Rank 1 holds a FIFO open to each other rank; they exit with code 1 the moment it
    // closes (EOF), as ranks do on losing a peer, within a millisecond of its SIGKILL. Any
    // rank could be seen dead first; the launcher must blame the killed one, every time.
    let script = r#"if [ "$RANK" = 1 ]; then exec 3>"$FIFOS/0" 4>"$FIFOS/2" 5>"$FIFOS/3"; echo ready $$; exec sleep 30; fi
cat "$FIFOS/$RANK" >/dev/null; exit 1"#;
    let dir = std::env::temp_dir().join(format!("oxccl-run-blame-{}", std::process::id()));
    for trial in 0..8 {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        for r in [0, 2, 3] {
            let made = std::process::Command::new("mkfifo").arg(dir.join(r.to_string())).status().expect("mkfifo");
            assert!(made.success(), "mkfifo failed");
        }
        let mut cmd = oxccl(["run", "-n", "4", "--", "sh", "-c", script]);
        let mut child = cmd.env("FIFOS", &dir).spawn().expect("start");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        let mut victim = None;
        while victim.is_none() && out.read_line(&mut line).unwrap_or(0) > 0 {
            victim = line.trim().strip_prefix("[rank 1] ready ").and_then(|p| p.parse::<i32>().ok());
            line.clear();
        }
        let victim = victim.expect("rank 1 should report ready");
        kill(Pid::from_raw(victim), Signal::SIGKILL).expect("SIGKILL rank 1");
        child.stdout = Some(out.into_inner());
        let f = wait(child, LIMIT);
        let all = format!("trial {trial}:\n{}", f.all());
        assert_eq!(f.code(), Some(128 + 9), "{all}");
        assert!(f.stderr.contains("oxccl run: rank 1 failed first: killed by signal 9 (SIGKILL)"), "{all}");
        assert!(f.stderr.contains("rank 1: killed by signal 9 (SIGKILL), the first to fail"), "{all}");
        for r in [0, 2, 3] {
            // Usually a consequence; on a very busy machine it may still be running when the
            // launcher stops the job.
            let line =
                f.stderr.lines().find(|l| l.trim_start().starts_with(&format!("rank {r}: "))).unwrap_or_default();
            let consequence = line.contains("exit code 1, ") && line.ends_with("rank 1 failed (a consequence)");
            let stopped = line.contains("terminated by the launcher after rank 1 failed");
            assert!(consequence || stopped, "rank {r} is neither a consequence nor stopped; {all}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_to_the_launcher_stops_every_rank() {
    // Wait until both ranks run (each prints its pid), then signal the launcher.
    let (mut child, out, pids) = two_sleeping_ranks();
    let launcher = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    kill(launcher, Signal::SIGTERM).expect("signal the launcher");
    child.stdout = Some(out.into_inner());
    let f = wait(child, LIMIT);
    assert_eq!(f.code(), Some(128 + 15), "{}", f.all());
    assert!(f.elapsed < Duration::from_secs(5), "took {:?}", f.elapsed);
    assert!(f.stderr.contains("received SIGTERM"), "{}", f.all());
    for pid in pids {
        // Reaped by the launcher: the process no longer exists.
        assert!(kill(Pid::from_raw(pid), None).is_err(), "rank process {pid} still exists");
    }
}

#[test]
fn ranks_do_not_outlive_a_killed_launcher() {
    // SIGKILL cannot be forwarded: the ranks die with the launcher (parent-death signal).
    let (mut child, _out, pids) = two_sleeping_ranks();
    child.kill().expect("SIGKILL the launcher");
    let _ = child.wait();
    let start = std::time::Instant::now();
    for pid in pids {
        // Orphans are reparented (to init or a subreaper) and reaped there; a zombie still
        // counts as gone.
        let gone = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.is_empty() || stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'))
        };
        while !gone() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone(), "rank process {pid} outlived the launcher");
    }
}

#[test]
fn the_timeout_stops_the_job() {
    let f = run(oxccl(["run", "-n", "2", "--timeout", "0.3", "--", "sleep", "30"]), LIMIT);
    assert_eq!(f.code(), Some(124), "{}", f.all());
    assert!(f.elapsed < Duration::from_secs(5), "took {:?}", f.elapsed);
    assert!(f.stderr.contains("timeout of 0.3s"), "{}", f.all());
}

#[test]
fn ranks_that_ignore_sigterm_are_killed_after_the_grace_period() {
    // Rank 0 fails once rank 1 has had time to ignore SIGTERM (sleep inherits that).
    let f = run(
        oxccl([
            "run",
            "-n",
            "2",
            "--grace",
            "0.5",
            "--",
            "sh",
            "-c",
            r#"trap "" TERM; [ "$RANK" = 0 ] && sleep 0.5 && exit 1; sleep 30"#,
        ]),
        LIMIT,
    );
    assert_eq!(f.code(), Some(1), "{}", f.all());
    assert!(f.elapsed < Duration::from_secs(5), "took {:?}", f.elapsed);
    assert!(f.stderr.contains("rank 1: terminated by the launcher after rank 0 failed (SIGKILL"), "{}", f.all());
}

#[test]
fn stdin_is_closed() {
    // `cat` would wait forever on an inherited terminal or pipe.
    let f = run(oxccl(["run", "-n", "2", "--", "cat"]), LIMIT);
    assert_eq!(f.code(), Some(0), "{}", f.all());
}

#[test]
fn errors_say_what_to_do() {
    let f = run(oxccl(["run", "-n", "2", "--", "/nonexistent/program"]), LIMIT);
    assert_eq!(f.code(), Some(2), "{}", f.all());
    assert!(f.stderr.contains("could not start") && f.stderr.contains("PATH"), "{}", f.all());

    let f = run(
        oxccl(["run", "-n", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "1", "--", "true"]),
        LIMIT,
    );
    assert_eq!(f.code(), Some(2), "{}", f.all());
    assert!(f.stderr.contains("OXCCL_SECRET"), "{}", f.all());

    let f = run(oxccl(["run", "-n", "2"]), LIMIT);
    assert_eq!(f.code(), Some(2), "{}", f.all());
}

#[test]
fn sigusr1_is_passed_to_every_rank_and_the_job_goes_on() {
    // Each rank reports SIGUSR1 (as oxccl's flight recorders answer it by dumping) and goes on.
    let script =
        r#"trap 'echo usr1 $RANK' USR1; echo ready $RANK; i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done"#;
    let mut child = oxccl(["run", "-n", "2", "--", "sh", "-c", script]).spawn().expect("start");
    let launcher = Pid::from_raw(child.id() as i32);
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let mut ready = 0;
    while ready < 2 && out.read_line(&mut line).unwrap_or(0) > 0 {
        ready += usize::from(line.contains("ready"));
        line.clear();
    }
    assert_eq!(ready, 2, "both ranks should report ready");
    kill(launcher, Signal::SIGUSR1).expect("signal the launcher");
    let mut got = Vec::new();
    while got.len() < 2 && out.read_line(&mut line).unwrap_or(0) > 0 {
        if line.contains("usr1") {
            got.push(line.trim().to_string());
        }
        line.clear();
    }
    assert_eq!(got.len(), 2, "each rank should get SIGUSR1: {got:?}");
    // The job still runs: the launcher stops it only on SIGTERM.
    assert!(child.try_wait().expect("poll the launcher").is_none(), "SIGUSR1 must not stop the job");
    kill(launcher, Signal::SIGTERM).expect("signal the launcher");
    child.stdout = Some(out.into_inner());
    let f = wait(child, LIMIT);
    assert_eq!(f.code(), Some(128 + 15), "{}", f.all());
}

/// The CPUs a rank's line `[rank R] Cpus_allowed_list:\tLIST` names, by rank.
fn cpu_lists(stdout: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = stdout
        .lines()
        .filter_map(|l| {
            let (rank, rest) = l.split_once("] Cpus_allowed_list:")?;
            Some((rank.trim_start_matches("[rank ").to_string(), rest.trim().to_string()))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn bind_to_core_puts_each_rank_on_a_cpu_of_its_own_and_refuses_too_many_ranks() {
    let cpus = oxccl::tuning::allowed_cpus();
    let show = ["--", "grep", "Cpus_allowed_list", "/proc/self/status"];
    // Unbound by default: every rank has the launcher's CPUs.
    let f = run(oxccl(["run", "-n", "2"].into_iter().chain(show)), LIMIT);
    assert_eq!(f.code(), Some(0), "{}", f.all());
    let all = cpu_lists(&f.stdout);
    assert_eq!(all.len(), 2, "{}", f.all());
    assert!(all.iter().all(|(_, l)| l == &all[0].1), "{all:?}");
    if cpus.len() >= 2 {
        let f = run(oxccl(["run", "-n", "2", "--bind-to", "core"].into_iter().chain(show)), LIMIT);
        assert_eq!(f.code(), Some(0), "{}", f.all());
        let want = vec![("0".to_string(), cpus[0].to_string()), ("1".to_string(), cpus[1].to_string())];
        assert_eq!(cpu_lists(&f.stdout), want, "{}", f.all());
    }
    let n = (cpus.len() + 1).to_string();
    let f = run(oxccl(["run", "-n", n.as_str(), "--bind-to", "core", "--", "true"]), LIMIT);
    assert_eq!(f.code(), Some(2), "{}", f.all());
    assert!(f.stderr.contains("needs a CPU per rank") && f.stderr.contains("--bind-to none"), "{}", f.all());
}
