//! `oxccl tune`: it measures this host with local processes and writes a profile that the
//! cpu backend's cost model reads back whole.

use std::time::Duration;

use crate::common::{oxccl, run};
use oxccl::tuning::Profile;

#[test]
fn tune_writes_a_whole_profile_that_loads() {
    let dir = std::env::temp_dir().join(format!("oxccl-tune-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("profile.txt");
    let mut cmd = oxccl(["tune", "--ranks", "2", "-o"]);
    // Keep any cache of this host out of it: the run must not read or write one.
    cmd.arg(&file).env("XDG_CACHE_HOME", &dir).env("OXCCL_TIMEOUT", "60s");
    let done = run(cmd, Duration::from_secs(180));
    assert_eq!(done.code(), Some(0), "{}", done.all());
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("# written by `oxccl tune`"), "{text}");
    // The host's CPUs, not those of rank 0, which runs bound to one.
    let cpus = oxccl::tuning::allowed_cpus().len();
    if cpus >= 2 {
        let said: usize = text
            .split(" CPUs")
            .next()
            .and_then(|h| h.rsplit('(').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no CPU count in the header:\n{text}"));
        assert!(said >= cpus, "the header says {said} CPUs, this test may use {cpus}:\n{text}");
    }
    // Every value is measured and written, the crowded step among them.
    for key in [
        "shm.alpha_us",
        "tcp.gbps",
        "tcp.oneway_gbps",
        "tcp.oneway_alpha_us",
        "tcp.ack_us",
        "native.crowded_step_us",
        "reduce.gbps",
    ] {
        assert!(text.lines().any(|l| l.starts_with(&format!("{key} = "))), "{key} missing:\n{text}");
    }
    let p = Profile::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let defaults = Profile::default();
    assert_ne!(p.crowded_step, defaults.crowded_step, "measured, not the default:\n{text}");
    assert_ne!(p.native_step, defaults.native_step, "measured, not the default:\n{text}");
    for (name, v) in
        [("crowded step", p.crowded_step), ("step", p.native_step), ("shm alpha", p.shm.alpha), ("tcp ack", p.tcp.ack)]
    {
        assert!(v > 0.0 && v < 0.1, "{name} = {v} s:\n{text}");
    }
    assert!(!dir.join("oxccl").exists(), "-o writes no host cache");
    let _ = std::fs::remove_dir_all(&dir);
}
