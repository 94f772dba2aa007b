//! Flight recorders of real `cpu` jobs (processes, see `support`; each rank runs
//! `src/bin/oxccl-failure-probe.rs`): when a rank calls another collective, skips one, hangs
//! in user code (and gets SIGUSR1) or is killed, the dumps appear in `OXCCL_FR_DIR` and
//! their analysis names the rank and the collective.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{World, WorldSpec};
use oxccl::perf::analyze::{analyze, Analysis, Finding};
use oxccl::perf::OpState;

const PROBE: &str = env!("CARGO_BIN_EXE_oxccl-failure-probe");

fn dump_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("oxccl-fr-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spec(scenario: &str, n: usize, dir: &std::path::Path) -> WorldSpec {
    WorldSpec::new(PROBE, n)
        .label(format!("{scenario} on {n} ranks"))
        .args([scenario])
        .env("OXCCL_FR_DIR", dir.to_str().unwrap())
        .oxccl_timeout("20s")
        .deadline(Duration::from_secs(60))
}

/// The dumps' analysis, with the job's output in every failure message.
fn analysis(dir: &std::path::Path, job: &str) -> Analysis {
    let a = analyze(dir).unwrap_or_else(|e| panic!("{e}\n{job}"));
    let text: Vec<String> = a.findings.iter().map(|f| f.to_string()).collect();
    println!("{}", text.join("\n"));
    assert!(a.has_problems(), "no problem found\n{job}");
    a
}

#[test]
fn a_mismatch_is_traced_to_the_diverging_collective() {
    let dir = dump_dir("mismatch");
    let out = World::run(&spec("mismatch", 2, &dir));
    let a = analysis(&dir, &out.describe());
    assert_eq!(a.dumps, 2);
    let Some(Finding::Diverged { collective: 0, calls, .. }) =
        a.findings.iter().find(|f| matches!(f, Finding::Diverged { .. }))
    else {
        panic!("no divergence at collective 0: {:?}", a.findings)
    };
    let by_rank: Vec<(usize, &str)> =
        calls.iter().flat_map(|(c, who)| who.iter().map(move |w| (w.0, c.split('(').next().unwrap()))).collect();
    assert!(by_rank.contains(&(0, "all_reduce")) && by_rank.contains(&(1, "all_gather")), "{calls:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_rank_that_skips_a_collective_is_named() {
    let dir = dump_dir("skip");
    let out = World::run(&spec("skip", 3, &dir));
    let a = analysis(&dir, &out.describe());
    let Some(Finding::Diverged { collective: 2, calls, .. }) =
        a.findings.iter().find(|f| matches!(f, Finding::Diverged { .. }))
    else {
        panic!("no divergence at collective 2: {:?}", a.findings)
    };
    let lone = calls.iter().find(|(_, who)| who.len() == 1).expect("one rank alone");
    assert_eq!((lone.1[0], lone.0.starts_with("barrier")), ((1, 2), true), "{calls:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_rank_that_hangs_in_user_code_is_named_from_its_sigusr1_dump() {
    let dir = dump_dir("hang");
    // Rank 1 sleeps past the others' timeout; once they have failed, it is killed (as a
    // launcher stops the rest of a failed job), so its dump is the one SIGUSR1 wrote.
    let s = spec("hang", 3, &dir).oxccl_timeout("2s").env("PROBE_SECONDS", "50");
    let mut world = World::spawn(&s);
    world.wait_for_line(0, "PROBE-ERROR");
    world.wait_for_line(2, "PROBE-ERROR");
    world.kill(1);
    let out = world.wait();
    let a = analysis(&dir, &out.describe());
    assert_eq!(a.dumps, 3, "rank 1's dump comes from its SIGUSR1\n{}", out.describe());
    let Some(Finding::NeverEntered { collective: 2, inside, absent, .. }) =
        a.findings.iter().find(|f| matches!(f, Finding::NeverEntered { .. }))
    else {
        panic!("no rank named as never entering collective 2: {:?}", a.findings)
    };
    assert_eq!(inside, &[0, 2]);
    assert_eq!(absent.len(), 1);
    assert_eq!(absent[0].0, 1);
    assert!(
        absent[0].1.as_deref().is_some_and(|l| l.starts_with("seq 1 all_reduce") && l.contains("completed")),
        "{absent:?}"
    );
    // The ranks that timed out (the others were aborted by them) name rank 1 as the one
    // they waited on.
    let waited: Vec<Option<usize>> = a
        .findings
        .iter()
        .filter_map(|f| match f {
            Finding::Unfinished { state: OpState::Failed, waiting_on, error, .. }
                if error.as_deref().is_some_and(|e| e.starts_with("timeout")) =>
            {
                Some(*waiting_on)
            }
            _ => None,
        })
        .collect();
    assert!(!waited.is_empty() && waited.iter().all(|w| *w == Some(1)), "{:?}", a.findings);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_killed_rank_is_named_by_its_missing_dump() {
    let dir = dump_dir("kill");
    let s = spec("loop", 3, &dir).env("PROBE_BYTES", "65536");
    let mut world = World::spawn(&s);
    world.wait_for_line(1, "PROBE-READY");
    world.kill(1);
    let out = world.wait();
    let a = analysis(&dir, &out.describe());
    assert!(a.findings.contains(&Finding::MissingDump { comm: 0, rank: 1 }), "{:?}", a.findings);
    for survivor in [0, 2] {
        assert!(
            a.findings
                .iter()
                .any(|f| matches!(f, Finding::Unfinished { rank, state: OpState::Failed, .. } if *rank == survivor)),
            "rank {survivor}'s failure is missing: {:?}",
            a.findings
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
