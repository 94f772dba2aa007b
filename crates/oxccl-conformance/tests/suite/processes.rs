//! The conformance suite on the `cpu` backend with real processes: worlds of 2 to 8 ranks,
//! one process per rank (started the way `oxccl run` starts them, see `support`), over
//! shared memory (`OXCCL_TRANSPORT=shm`) and over TCP forced on one host
//! (`OXCCL_TRANSPORT=tcp`).
//!
//! Worlds of 2 and 3 run the whole suite; larger worlds run the quick matrix (every
//! operation, reduce op and algorithm, fewer dtypes and counts) so that the file stays
//! within a few minutes on a small machine. Set `OXCCL_CONFORMANCE_FULL=1` to run the whole
//! suite on every world size. One test per transport and world size, so a failure names both.
//! The error cases also run on their own over shared memory with 2 and 4 ranks, where
//! failure notices race with the frames of the operations before them.

use std::time::Duration;

use crate::support::{Launch, World, WorldSpec};

const BIN: &str = env!("CARGO_BIN_EXE_oxccl-conformance");

/// Worlds up to this size run the whole suite, larger ones the quick matrix.
const FULL_UP_TO: usize = 3;

fn conformance(transport: &str, n: usize) {
    let full = n <= FULL_UP_TO || std::env::var("OXCCL_CONFORMANCE_FULL").is_ok_and(|v| v.trim() == "1");
    run(Launch::Oxccl, transport, n, full, None);
}

/// Runs the conformance binary on `n` ranks over `transport` and checks that the world passed.
fn run(launch: Launch, transport: &str, n: usize, full: bool, only: Option<&str>) {
    let mut label = format!("oxccl-conformance, {n} ranks over {transport}{}", if full { "" } else { ", quick" });
    if launch == Launch::Torchrun {
        label.push_str(", torchrun-style environment");
    }
    if let Some(f) = only {
        label.push_str(&format!(", only {f}"));
    }
    let mut spec = WorldSpec::new(BIN, n)
        .label(label.clone())
        .launch(launch)
        .env("OXCCL_TRANSPORT", transport)
        .oxccl_timeout("60s")
        .deadline(Duration::from_secs(240));
    if !full {
        spec = spec.env("OXCCL_CONFORMANCE_QUICK", "1");
    }
    if let Some(f) = only {
        spec = spec.env("OXCCL_CONFORMANCE_FILTER", f);
    }
    let out = World::run(&spec);
    println!("{label}: {:.2}s", out.elapsed.as_secs_f64());
    out.assert_all_succeeded();
    let rank0 = &out.ranks[0].stdout;
    let last = rank0.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
    println!("    rank 0: {last}");
    let passed = last
        .strip_prefix("conformance: ")
        .and_then(|rest| rest.split_once(" passed, 0 failed"))
        .and_then(|(n, tail)| (tail.is_empty() || tail.starts_with(", ")).then_some(n))
        .and_then(|n| n.parse::<u64>().ok());
    match passed {
        Some(p) if p > 0 => {}
        _ => panic!(
            "rank 0's last line should be `conformance: N passed, 0 failed` with N > 0, got {last:?}\n{}",
            out.describe()
        ),
    }
    for r in &out.ranks[1..] {
        assert!(
            !r.stdout.contains("conformance: "),
            "only rank 0 prints the world's totals, rank {} did too\n{}",
            r.rank,
            out.describe()
        );
    }
}

/// Started the way torchrun starts ranks: `MASTER_ADDR`/`MASTER_PORT`, no store address
/// (rank 0 hosts the store), `OXCCL_SECRET` exported by the user. Quick matrix, auto transport.
#[test]
fn torchrun_style_environment() {
    run(Launch::Torchrun, "auto", 3, false, None);
}

macro_rules! worlds {
    ($($shm:ident, $tcp:ident = $n:expr;)*) => {$(
        #[test]
        fn $shm() {
            conformance("shm", $n);
        }

        #[test]
        fn $tcp() {
            conformance("tcp", $n);
        }
    )*};
}

worlds! {
    shm_world_2, tcp_world_2 = 2;
    shm_world_3, tcp_world_3 = 3;
    shm_world_4, tcp_world_4 = 4;
    shm_world_5, tcp_world_5 = 5;
    shm_world_6, tcp_world_6 = 6;
    shm_world_7, tcp_world_7 = 7;
    shm_world_8, tcp_world_8 = 8;
}

/// The error cases over shared memory.
#[test]
fn shm_error_cases_world_2() {
    run(Launch::Oxccl, "shm", 2, true, Some("^errors/"));
}

/// As [`shm_error_cases_world_2`], with more ranks: a failure notice of one rank races the
/// frames other ranks sent before it (a notice used to end a wait at an earlier stage; see
/// `Stage` in the transport).
#[test]
fn shm_error_cases_world_4() {
    run(Launch::Oxccl, "shm", 4, true, Some("^errors/"));
}
