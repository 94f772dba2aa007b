//! Joining a launched job as one rank, and the advice given when that fails.
//!
//! Advice to start `oxccl bench` under a launcher fits only one case: the error is about a
//! missing launch environment (no `WORLD_SIZE` to go with a `RANK`, no store, no secret)
//! and no launcher started this process. Under a launcher that advice is wrong (it already
//! runs there): a missing variable is then the launcher's setup to fix, and a failure to
//! meet the other ranks usually means one of them failed first.

use oxccl::bootstrap::auth::SECRET_ENV;
use oxccl::bootstrap::env::{launched_by_mpi, LAUNCHER_ENV};
use oxccl::Error;

/// The variables a launcher sets for each rank (whole names) and the prefixes of the MPI and
/// Slurm ones: a configuration error that names one is about the launch environment.
const LAUNCH_VARIABLES: [&str; 9] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OXCCL_STORE_ADDR",
    "OXCCL_STORE_PORT",
    SECRET_ENV,
];
const LAUNCH_PREFIXES: [&str; 3] = ["OMPI_COMM_WORLD_", "PMI_", "SLURM_"];

/// The launcher that started this process, named for messages, as seen through `env`:
/// `oxccl run` (`OXCCL_LAUNCHER=oxccl`), torchrun (`TORCHELASTIC_RUN_ID`, or another
/// `OXCCL_LAUNCHER` value), mpirun (`OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `PMIX_RANK`) or srun
/// (`SLURM_PROCID` in a job step). `None` when started by hand.
pub fn launcher(env: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
    let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
    if let Some(v) = env(LAUNCHER_ENV).filter(|v| !v.trim().is_empty()) {
        return Some(if v.trim() == "oxccl" { "oxccl run" } else { "torchrun" });
    }
    if set("TORCHELASTIC_RUN_ID") {
        Some("torchrun")
    } else if launched_by_mpi(set) {
        Some("mpirun")
    } else if set("SLURM_PROCID") && (set("SLURM_STEP_ID") || set("SLURM_STEPID")) {
        Some("srun")
    } else {
        None
    }
}

/// Whether `e` is about the launch environment: a configuration error that names one of
/// the variables a launcher sets (oxccl's configuration errors name their variable).
fn about_launch_environment(e: &Error) -> bool {
    let Error::Config(m) = e else { return false };
    let words = m.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
    words
        .filter(|w| !w.is_empty())
        .any(|w| LAUNCH_VARIABLES.contains(&w) || LAUNCH_PREFIXES.iter().any(|p| w.starts_with(p) && w.len() > p.len()))
}

/// What to do about `e`, a failure to join the job, for a process started by `launcher`
/// (from [`launcher`]). `None` when the error's own message says it all.
pub fn advice(e: &Error, launcher: Option<&str>) -> Option<String> {
    match (e, launcher) {
        (e, None) if about_launch_environment(e) => Some(
            "to run N ranks, start oxccl bench with `--ranks N`, or under a launcher: \
             `oxccl run -n N -- oxccl bench ...`, torchrun or mpirun (started alone, without \
             launcher variables, it runs as a world of one)"
                .to_string(),
        ),
        (e, Some(l)) if about_launch_environment(e) => {
            Some(format!("this process runs under {l}: give every rank the variables named above"))
        }
        (Error::BackendUnavailable { .. }, _) => {
            Some("choose another backend with --backend (auto picks one that works here)".to_string())
        }
        (
            Error::Store(_) | Error::Io { .. } | Error::Timeout { .. } | Error::PeerLost { .. } | Error::Aborted { .. },
            Some(l),
        ) => {
            let summary = if l == "oxccl run" { ", and oxccl run's summary," } else { "" };
            Some(format!("another rank may have failed first: its output{summary} may say why"))
        }
        _ => None,
    }
}

/// The message of a failure to join the job: `e` and, where one fits, [`advice`].
pub fn join_error(e: &Error, launcher: Option<&str>) -> String {
    let text = format!("could not join the job: {e}");
    match advice(e, launcher) {
        None => text,
        Some(a) => {
            let sep = if text.ends_with(['.', '?', '!']) { " " } else { ". " };
            let mut a = a;
            if let Some(first) = a.get(..1) {
                a = first.to_ascii_uppercase() + &a[1..];
            }
            format!("{text}{sep}{a}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn launchers_are_recognised() {
        assert_eq!(launcher(env(&[])), None);
        assert_eq!(launcher(env(&[("RANK", "0"), ("WORLD_SIZE", "2")])), None, "variables by hand");
        assert_eq!(launcher(env(&[("OXCCL_LAUNCHER", "oxccl")])), Some("oxccl run"));
        assert_eq!(launcher(env(&[("OXCCL_LAUNCHER", "torchrun")])), Some("torchrun"));
        assert_eq!(launcher(env(&[("OXCCL_LAUNCHER", " ")])), None);
        assert_eq!(launcher(env(&[("TORCHELASTIC_RUN_ID", "abc")])), Some("torchrun"));
        assert_eq!(launcher(env(&[("OMPI_COMM_WORLD_SIZE", "4")])), Some("mpirun"));
        assert_eq!(launcher(env(&[("PMI_SIZE", "4")])), Some("mpirun"));
        assert_eq!(launcher(env(&[("SLURM_PROCID", "1"), ("SLURM_STEP_ID", "0")])), Some("srun"));
        assert_eq!(launcher(env(&[("SLURM_PROCID", "1"), ("SLURM_JOB_ID", "7")])), None, "sbatch script");
    }

    #[test]
    fn launcher_advice_only_for_a_missing_environment_outside_a_launcher() {
        let missing = Error::Config("RANK=1 is set but WORLD_SIZE is not (torchrun); set WORLD_SIZE".into());
        let no_store = Error::Config("no rendezvous store: set OXCCL_STORE_ADDR (host:port), or MASTER_ADDR".into());
        let no_secret = Error::Config("OXCCL_SECRET is not set: every rank must know the job's secret".into());
        for e in [&missing, &no_store, &no_secret] {
            assert!(advice(e, None).is_some_and(|a| a.contains("--ranks N") && a.contains("oxccl run -n N")), "{e}");
            for l in ["oxccl run", "torchrun", "mpirun"] {
                let a = advice(e, Some(l)).unwrap_or_default();
                assert!(!a.contains("--ranks") && !a.contains("oxccl run -n"), "{l}: {a}");
                assert!(a.contains(l), "{l}: {a}");
            }
        }
        // Not about the launch environment: no launcher advice, whoever started us.
        let bad_value = Error::Config("OXCCL_TIMEOUT=\"soon\" is not a duration; use e.g. 30s".into());
        let lowercase = Error::Config("the ranks are on several hosts; set world_size".into());
        for e in [&bad_value, &lowercase] {
            assert_eq!(advice(e, None), None, "{e}");
            assert_eq!(advice(e, Some("oxccl run")), None, "{e}");
        }
        let store = Error::Store("connecting to 127.0.0.1:1 failed: connection refused".into());
        assert_eq!(advice(&store, None), None);
        let a = advice(&store, Some("oxccl run")).unwrap_or_default();
        assert!(a.contains("failed first") && a.contains("summary") && !a.contains("--ranks"), "{a}");
        let a = advice(&store, Some("mpirun")).unwrap_or_default();
        assert!(a.contains("failed first") && !a.contains("summary"), "{a}");
        let gone = Error::BackendUnavailable { backend: "nccl".into(), why: "no libnccl".into() };
        assert!(advice(&gone, Some("oxccl run")).is_some_and(|a| a.contains("--backend")));
    }

    #[test]
    fn the_message_reads_as_sentences() {
        let e = Error::Config("RANK=1 is set but WORLD_SIZE is not".into());
        let m = join_error(&e, None);
        assert!(m.starts_with("could not join the job: configuration: RANK=1"), "{m}");
        assert!(m.contains("WORLD_SIZE is not. To run N ranks"), "{m}");
        let e = Error::Store("is the store (rank 0) up?".into());
        assert_eq!(join_error(&e, None), "could not join the job: store: is the store (rank 0) up?");
        assert!(join_error(&e, Some("torchrun")).contains("up? Another rank may have failed first"));
    }
}
