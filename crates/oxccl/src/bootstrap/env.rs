//! Rank and world from the environment variables launchers already set.
//!
//! | launcher | rank | world size | local rank | local world size |
//! |---|---|---|---|---|
//! | `oxccl run`, torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `LOCAL_WORLD_SIZE` |
//! | Open MPI (`mpirun`) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_SIZE` |
//! | MPICH, Intel MPI (PMI) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` | `MPI_LOCALNRANKS` |
//! | Slurm (`srun`) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | see below |
//!
//! `MASTER_ADDR` and `MASTER_PORT` (where rank 0 runs the store) are read whatever the
//! launcher. `oxccl run` also sets `OXCCL_LAUNCHER=oxccl`; torchrun is recognised by the
//! `TORCHELASTIC_RUN_ID` it sets.
//!
//! # Rules
//! - **Precedence**: the torchrun-style variables first (they are the most specific: a
//!   launcher that sets them may itself run under `mpirun` or `srun`), then Open MPI, PMI,
//!   Slurm. Nothing at all: [`Launcher::Standalone`], rank 0 of 1.
//! - **Values**: surrounding whitespace is ignored and an empty variable counts as unset
//!   (so `RANK= prog` hides a stale `RANK`). Anything else must be a non-negative integer.
//! - **Completeness**: each convention needs its rank and world size together; a local
//!   world size needs its local rank. A local rank alone is accepted (older launchers set
//!   only `LOCAL_RANK`).
//! - **Agreement**: when several conventions are present, the others must agree with the
//!   chosen one on rank and world size, which catches variables left over from another
//!   launch (an exported `RANK=0` under `mpirun` would make every process rank 0). A nested
//!   launch is not a disagreement, and these are recognised as one:
//!   - the chosen variables were set by the launcher that started this process
//!     (`OXCCL_LAUNCHER` is set, or torchrun's `TORCHELASTIC_RUN_ID`): e.g. `srun torchrun`;
//!   - an MPI launcher inside a Slurm allocation (Open MPI or PMI chosen, Slurm present);
//!   - the other convention has a smaller world: it is the outer level that started fewer
//!     processes, each of which started several (e.g. `srun` running one launcher per node).
//!
//!   Set `OXCCL_LAUNCHER=torchrun` to declare that `RANK`/`WORLD_SIZE` come from the
//!   launcher that started this process, when no other sign says so.
//! - **Slurm's batch script**: inside `sbatch`'s script itself (`SLURM_JOB_ID` set but
//!   neither `SLURM_STEP_ID` nor `SLURM_STEPID`), the `SLURM_*` task variables describe the
//!   allocation, not this process, and are ignored; tasks started by `srun` have a step id.
//! - **Slurm's local world size** comes from the first usable of: `SLURM_STEP_TASKS_PER_NODE`
//!   when every node runs the same number (`4` or `4(x2)`), `SLURM_NTASKS_PER_NODE` when it
//!   is a plain number, `SLURM_TASKS_PER_NODE` when uniform; otherwise it is unknown.
//! - **Local defaults**: a convention without local values borrows them from another
//!   present convention that agrees with it on rank and world size. If nothing says
//!   otherwise, `local_rank = rank` and `local_world_size = world_size`: every rank is
//!   assumed to be on this host, which is right for single-host runs; when only the local
//!   world size is unknown it is taken as `world_size` (an upper bound). Launch with
//!   `oxccl run`, torchrun or `mpirun` to get exact local values on multi-host runs.

use std::fmt;

use crate::error::{Error, Result};

/// The variable `oxccl run` sets to `oxccl`; `torchrun` declares that `RANK`/`WORLD_SIZE`
/// were set by the launcher that started this process.
pub const LAUNCHER_ENV: &str = crate::config::registry::LAUNCHER.name;

/// Which launcher's conventions the rank and world came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// `oxccl run` (torchrun-style variables plus `OXCCL_LAUNCHER=oxccl`).
    Oxccl,
    /// torchrun or anything else that sets `RANK`/`WORLD_SIZE`.
    Torchrun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// MPICH, Intel MPI or another PMI launcher (`PMI_RANK`/`PMI_SIZE`).
    Pmi,
    /// Slurm's `srun` (`SLURM_PROCID`/`SLURM_NTASKS`).
    Slurm,
    /// No launcher: a single process, rank 0 of 1.
    Standalone,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Oxccl => "oxccl run",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Pmi => "PMI",
            Launcher::Slurm => "Slurm",
            Launcher::Standalone => "standalone",
        })
    }
}

/// Who this process is in the job, as its launcher described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// How many ranks the job has.
    pub world_size: usize,
    /// This process's rank among those on its host, `0..local_world_size`.
    pub local_rank: usize,
    /// How many ranks run on this host (see the module docs for the defaults).
    pub local_world_size: usize,
    /// `MASTER_ADDR`: the host that runs the store, if set.
    pub master_addr: Option<String>,
    /// `MASTER_PORT`: the store's port, if set.
    pub master_port: Option<u16>,
    /// Whose conventions these values came from.
    pub launcher: Launcher,
}

/// The world size a launcher asked for, if any: the first world-size variable of the
/// conventions above (`WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `SLURM_NTASKS`) that
/// holds a number, with its name. Used to refuse a single-process backend under a launcher.
pub fn requested_world_size(env: impl Fn(&str) -> Option<String>) -> Option<(&'static str, usize)> {
    [TORCHRUN, OPEN_MPI, PMI, SLURM]
        .iter()
        .find_map(|c| env(c.world).and_then(|v| v.trim().parse().ok()).map(|n| (c.world, n)))
}

/// The store key under which the rank in launcher slot `slot` reports the slot of the first
/// peer it lost, as text (`oxccl run` reads it to tell a failure's cause from the failures
/// it caused: a rank that reports losing a rank that also failed is a consequence).
pub fn lost_peer_key(slot: usize) -> String {
    format!("oxccl/launcher/lost/{slot}")
}

/// Whether an MPI launcher started this process (`OMPI_COMM_WORLD_SIZE`, `PMI_SIZE` or
/// `PMIX_RANK` set), as seen through `has`.
pub fn launched_by_mpi(has: impl Fn(&str) -> bool) -> bool {
    [OPEN_MPI.world, PMI.world, "PMIX_RANK"].into_iter().any(has)
}

/// The launcher's job identity, for launches without `OXCCL_SECRET`: torchrun's run id,
/// Open MPI's / PMIx's job, SLURM's job and step, Hydra's KVS name.
pub fn job_id(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let one = |k: &str| env(k).filter(|v| !v.is_empty()).map(|v| format!("{k}={v}"));
    one("TORCHELASTIC_RUN_ID")
        .or_else(|| one("OMPI_MCA_ess_base_jobid"))
        .or_else(|| one("PMIX_NAMESPACE"))
        .or_else(|| {
            let job = one("SLURM_JOB_ID")?;
            Some(format!("{job},{}", one("SLURM_STEP_ID").or_else(|| one("SLURM_STEPID")).unwrap_or_default()))
        })
        .or_else(|| one("PMI_KVSNAME"))
}

/// [`job_id`] as the process environment gives it (read at each call: a launcher may set it
/// after the process starts, as tests do).
pub fn job_id_from_env() -> Option<String> {
    job_id(|k| std::env::var(k).ok())
}

/// The variable names of one convention.
struct Names {
    launcher: Launcher,
    rank: &'static str,
    world: &'static str,
    local_rank: &'static str,
    local_size: &'static str,
}

const TORCHRUN: Names = Names {
    launcher: Launcher::Torchrun,
    rank: "RANK",
    world: "WORLD_SIZE",
    local_rank: "LOCAL_RANK",
    local_size: "LOCAL_WORLD_SIZE",
};
const OPEN_MPI: Names = Names {
    launcher: Launcher::OpenMpi,
    rank: "OMPI_COMM_WORLD_RANK",
    world: "OMPI_COMM_WORLD_SIZE",
    local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
    local_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
};
const PMI: Names = Names {
    launcher: Launcher::Pmi,
    rank: "PMI_RANK",
    world: "PMI_SIZE",
    local_rank: "MPI_LOCALRANKID",
    local_size: "MPI_LOCALNRANKS",
};
const SLURM: Names = Names {
    launcher: Launcher::Slurm,
    rank: "SLURM_PROCID",
    world: "SLURM_NTASKS",
    local_rank: "SLURM_LOCALID",
    local_size: "SLURM_NTASKS_PER_NODE",
};

/// One convention found in the environment, checked on its own.
struct Found {
    names: &'static Names,
    launcher: Launcher,
    /// Set by the launcher that started this process (see the module docs).
    direct: bool,
    rank: usize,
    world: usize,
    local_rank: Option<usize>,
    /// The local world size and the variable it came from.
    local_size: Option<(usize, &'static str)>,
}

impl Found {
    fn describe(&self) -> String {
        format!("{}={}, {}={} ({})", self.names.rank, self.rank, self.names.world, self.world, self.launcher)
    }
}

/// The environment, with values trimmed and empty ones treated as unset.
struct Env<F> {
    lookup: F,
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    fn get(&self, name: &str) -> Option<String> {
        (self.lookup)(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
    }

    fn number(&self, name: &str) -> Result<Option<usize>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.parse::<usize>().map(Some).map_err(|_| {
                Error::Config(format!(
                    "{name}={v:?} is not a non-negative integer; set {name} to a number (e.g. {name}=0) or unset it"
                ))
            }),
        }
    }

    /// Reads one convention: `None` when none of its variables is set.
    fn convention(&self, names: &'static Names, direct: bool) -> Result<Option<Found>> {
        let rank = self.number(names.rank)?;
        let world = self.number(names.world)?;
        let local_rank = self.number(names.local_rank)?;
        let local_size = if names.launcher == Launcher::Slurm {
            self.slurm_local_size()
        } else {
            self.number(names.local_size)?.map(|n| (n, names.local_size))
        };
        let (rank, world) = match (rank, world) {
            (Some(r), Some(w)) => (r, w),
            (None, None) if local_rank.is_none() && (local_size.is_none() || names.launcher == Launcher::Slurm) => {
                return Ok(None)
            }
            (Some(r), None) => {
                return Err(Error::Config(format!(
                    "{}={r} is set but {} is not ({}); set {} to the number of ranks, or unset {}",
                    names.rank, names.world, names.launcher, names.world, names.rank
                )))
            }
            (None, Some(w)) => {
                return Err(Error::Config(format!(
                    "{}={w} is set but {} is not ({}); set {} to this process's rank, or unset {}",
                    names.world, names.rank, names.launcher, names.rank, names.world
                )))
            }
            (None, None) => {
                let set = if local_rank.is_some() { names.local_rank } else { names.local_size };
                return Err(Error::Config(format!(
                    "{set} is set but {} and {} are not ({}); set them too, or unset {set}",
                    names.rank, names.world, names.launcher
                )));
            }
        };
        if world == 0 {
            return Err(Error::Config(format!(
                "{}=0: a job needs at least one rank; set {} to the number of ranks",
                names.world, names.world
            )));
        }
        if rank >= world {
            return Err(Error::Config(format!(
                "{}={rank} is not below {}={world}: ranks are numbered 0..{}; fix {} or {}",
                names.rank,
                names.world,
                world - 1,
                names.rank,
                names.world
            )));
        }
        let mut local_size = local_size;
        if local_size.is_some() && local_rank.is_none() {
            if names.launcher == Launcher::Slurm {
                // Slurm's per-node counts are job-wide variables, not a partner of SLURM_LOCALID.
                local_size = None;
            } else {
                return Err(Error::Config(format!(
                    "{} is set but {} is not ({}); set {} to this process's rank on its host, or unset {}",
                    names.local_size, names.local_rank, names.launcher, names.local_rank, names.local_size
                )));
            }
        }
        Ok(Some(Found { names, launcher: names.launcher, direct, rank, world, local_rank, local_size }))
    }

    /// Slurm's tasks on this node, from the first usable variable (see the module docs).
    fn slurm_local_size(&self) -> Option<(usize, &'static str)> {
        let uniform = |name: &'static str| self.get(name).and_then(|v| uniform_tasks_per_node(&v)).map(|n| (n, name));
        uniform("SLURM_STEP_TASKS_PER_NODE")
            .or_else(|| {
                self.get("SLURM_NTASKS_PER_NODE")
                    .and_then(|v| v.parse::<usize>().ok())
                    .filter(|&n| n > 0)
                    .map(|n| (n, "SLURM_NTASKS_PER_NODE"))
            })
            .or_else(|| uniform("SLURM_TASKS_PER_NODE"))
    }

    /// Whether the `SLURM_*` task variables describe this process (see the module docs).
    fn slurm_applies(&self) -> bool {
        self.get("SLURM_JOB_ID").is_none() || self.get("SLURM_STEP_ID").is_some() || self.get("SLURM_STEPID").is_some()
    }
}

/// The tasks per node of a Slurm list such as `4`, `4(x3)` or `4(x2),4`, when every node has
/// the same number; `None` for mixed counts or anything unparsable.
fn uniform_tasks_per_node(v: &str) -> Option<usize> {
    let mut common = None;
    for part in v.split(',') {
        let count = match part.split_once('(') {
            Some((n, rest)) => {
                let reps = rest.strip_prefix('x')?.strip_suffix(')')?;
                reps.parse::<usize>().ok().filter(|&r| r > 0)?;
                n
            }
            None => part,
        };
        let n = count.trim().parse::<usize>().ok().filter(|&n| n > 0)?;
        match common {
            None => common = Some(n),
            Some(c) if c == n => {}
            Some(_) => return None,
        }
    }
    common
}

impl LaunchInfo {
    /// Reads this process's rank and world from the environment (see the module docs).
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable(s) to fix: a rank without its world size (or
    /// the reverse), a value that is not a number, a rank not below the world size, a world
    /// size of 0, a local rank not below the local world size, two conventions that disagree
    /// on rank or world size, or a bad `MASTER_PORT` or `OXCCL_LAUNCHER`.
    pub fn from_env() -> Result<LaunchInfo> {
        LaunchInfo::from_lookup(|k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()))
    }

    /// [`from_env`](Self::from_env) over any variable lookup (tests pass a map).
    ///
    /// # Errors
    /// As for [`from_env`](Self::from_env).
    pub fn from_lookup(f: impl Fn(&str) -> Option<String>) -> Result<LaunchInfo> {
        let env = Env { lookup: f };
        let master_addr = env.get("MASTER_ADDR");
        let master_port = match env.get("MASTER_PORT") {
            None => None,
            Some(v) => match v.parse::<u16>() {
                Ok(p) if p > 0 => Some(p),
                _ => {
                    return Err(Error::Config(format!(
                        "MASTER_PORT={v:?} is not a port number; set MASTER_PORT to the store's port (1-65535, \
                         e.g. 29500) or unset it"
                    )))
                }
            },
        };

        let (torch_launcher, direct) = match env.get(LAUNCHER_ENV).map(|v| v.to_ascii_lowercase()).as_deref() {
            None => (Launcher::Torchrun, env.get("TORCHELASTIC_RUN_ID").is_some()),
            Some("oxccl") => (Launcher::Oxccl, true),
            Some("torchrun") => (Launcher::Torchrun, true),
            Some(other) => {
                return Err(Error::Config(format!(
                    "{LAUNCHER_ENV}={other:?} is not a known launcher; use {LAUNCHER_ENV}=oxccl (set by `oxccl run`) \
                     or {LAUNCHER_ENV}=torchrun, or unset it"
                )))
            }
        };
        let mut found = Vec::new();
        match env.convention(&TORCHRUN, direct)? {
            Some(mut f) => {
                f.launcher = torch_launcher;
                found.push(f);
            }
            None if env.get(LAUNCHER_ENV).is_some() => {
                return Err(Error::Config(format!(
                    "{LAUNCHER_ENV} is set but RANK and WORLD_SIZE are not; set them too (`oxccl run` sets all \
                     three), or unset {LAUNCHER_ENV}"
                )))
            }
            None => {}
        }
        found.extend(env.convention(&OPEN_MPI, false)?);
        found.extend(env.convention(&PMI, false)?);
        if env.slurm_applies() {
            found.extend(env.convention(&SLURM, false)?);
        }

        let Some((chosen, others)) = found.split_first() else {
            return Ok(LaunchInfo {
                rank: 0,
                world_size: 1,
                local_rank: 0,
                local_world_size: 1,
                master_addr,
                master_port,
                launcher: Launcher::Standalone,
            });
        };

        let mut agreeing = Vec::new();
        for other in others {
            let nested = chosen.direct
                || (matches!(chosen.launcher, Launcher::OpenMpi | Launcher::Pmi) && other.launcher == Launcher::Slurm)
                || other.world < chosen.world;
            if nested {
                continue;
            }
            if other.rank != chosen.rank || other.world != chosen.world {
                let mut hint = format!(
                    "one of them is stale (left over from another launch or exported by hand): unset it \
                     (`unset {} {}` or `unset {} {}`)",
                    chosen.names.rank, chosen.names.world, other.names.rank, other.names.world
                );
                if chosen.names.rank == TORCHRUN.rank {
                    hint.push_str(&format!(
                        "; if the launcher that set RANK and WORLD_SIZE started this process inside {}, set \
                         {LAUNCHER_ENV}=torchrun",
                        other.launcher
                    ));
                }
                return Err(Error::Config(format!(
                    "the launch environment disagrees on this process's rank: {} but {}; {hint}",
                    chosen.describe(),
                    other.describe()
                )));
            }
            agreeing.push(other);
        }

        let (rank, world_size) = (chosen.rank, chosen.world);
        let local_rank = chosen
            .local_rank
            .map(|r| (r, chosen.names.local_rank))
            .or_else(|| agreeing.iter().find_map(|o| o.local_rank.map(|r| (r, o.names.local_rank))));
        let local_size = chosen.local_size.or_else(|| agreeing.iter().find_map(|o| o.local_size));
        let (local_rank, local_world_size) = match (local_rank, local_size) {
            (Some((lr, lr_var)), Some((ls, ls_var))) => {
                if ls == 0 {
                    return Err(Error::Config(format!(
                        "{ls_var}=0: a host runs at least one rank; set {ls_var} to the number of ranks on this host"
                    )));
                }
                if ls > world_size {
                    return Err(Error::Config(format!(
                        "{ls_var}={ls} is larger than {}={world_size}; fix {ls_var}",
                        chosen.names.world
                    )));
                }
                if lr >= ls {
                    return Err(Error::Config(format!(
                        "{lr_var}={lr} is not below {ls_var}={ls}: local ranks are numbered 0..{}; fix {lr_var} or \
                         {ls_var}",
                        ls - 1
                    )));
                }
                (lr, ls)
            }
            (Some((lr, lr_var)), None) => {
                if lr >= world_size {
                    return Err(Error::Config(format!(
                        "{lr_var}={lr} is not below {}={world_size}; fix {lr_var}",
                        chosen.names.world
                    )));
                }
                (lr, world_size)
            }
            _ => (rank, world_size),
        };
        Ok(LaunchInfo {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher: chosen.launcher,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn info(vars: &[(&str, &str)]) -> Result<LaunchInfo> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LaunchInfo::from_lookup(|k| map.get(k).cloned())
    }

    /// The error's message; fails unless it is `Error::Config` naming every variable given.
    fn config_error(vars: &[(&str, &str)], named: &[&str]) -> String {
        match info(vars) {
            Err(Error::Config(m)) => {
                for n in named {
                    assert!(m.contains(n), "message does not name {n}: {m}");
                }
                m
            }
            other => panic!("expected a configuration error for {vars:?}, got {other:?}"),
        }
    }

    fn ranks(i: &LaunchInfo) -> (usize, usize, usize, usize, Launcher) {
        (i.rank, i.world_size, i.local_rank, i.local_world_size, i.launcher)
    }

    #[test]
    fn nothing_set_is_standalone() {
        let i = info(&[]).unwrap();
        assert_eq!(ranks(&i), (0, 1, 0, 1, Launcher::Standalone));
        assert_eq!((i.master_addr, i.master_port), (None, None));
        let i = info(&[("MASTER_ADDR", "node0"), ("MASTER_PORT", "29500"), ("PATH", "/bin")]).unwrap();
        assert_eq!(i.launcher, Launcher::Standalone);
        assert_eq!((i.master_addr.as_deref(), i.master_port), (Some("node0"), Some(29500)));
    }

    #[test]
    fn torchrun_and_oxccl_run() {
        let torch = [
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let i = info(&torch).unwrap();
        assert_eq!(ranks(&i), (5, 8, 1, 4, Launcher::Torchrun));
        assert_eq!((i.master_addr.as_deref(), i.master_port), (Some("10.0.0.1"), Some(29500)));
        let mut ox = torch.to_vec();
        ox.push(("OXCCL_LAUNCHER", "oxccl"));
        assert_eq!(ranks(&info(&ox).unwrap()), (5, 8, 1, 4, Launcher::Oxccl));
    }

    #[test]
    fn local_values_default_to_the_global_ones() {
        assert_eq!(ranks(&info(&[("RANK", "2"), ("WORLD_SIZE", "3")]).unwrap()), (2, 3, 2, 3, Launcher::Torchrun));
        // A local rank alone (older launchers): the local world size is the world size.
        let i = info(&[("RANK", "6"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "2")]).unwrap();
        assert_eq!(ranks(&i), (6, 8, 2, 8, Launcher::Torchrun));
    }

    #[test]
    fn values_are_trimmed_and_empty_means_unset() {
        let i = info(&[("RANK", " 1 "), ("WORLD_SIZE", "2\n"), ("LOCAL_RANK", ""), ("MASTER_ADDR", "")]).unwrap();
        assert_eq!(ranks(&i), (1, 2, 1, 2, Launcher::Torchrun));
        assert_eq!(i.master_addr, None);
        // An empty RANK hides the torchrun convention entirely.
        let i = info(&[("RANK", ""), ("WORLD_SIZE", ""), ("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")])
            .unwrap();
        assert_eq!(i.launcher, Launcher::OpenMpi);
    }

    #[test]
    fn open_mpi() {
        let i = info(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap();
        assert_eq!(ranks(&i), (3, 4, 1, 2, Launcher::OpenMpi));
    }

    #[test]
    fn pmi_with_and_without_local_values() {
        let i =
            info(&[("PMI_RANK", "2"), ("PMI_SIZE", "6"), ("MPI_LOCALRANKID", "0"), ("MPI_LOCALNRANKS", "3")]).unwrap();
        assert_eq!(ranks(&i), (2, 6, 0, 3, Launcher::Pmi));
        assert_eq!(ranks(&info(&[("PMI_RANK", "2"), ("PMI_SIZE", "6")]).unwrap()), (2, 6, 2, 6, Launcher::Pmi));
    }

    #[test]
    fn slurm_local_size_sources() {
        let base = [("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "1")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            ranks(&info(&v).unwrap())
        };
        assert_eq!(with(&[("SLURM_NTASKS_PER_NODE", "4")]), (5, 8, 1, 4, Launcher::Slurm));
        // Not a plain number and nothing else: unknown, falls back to the world size.
        assert_eq!(with(&[("SLURM_NTASKS_PER_NODE", "2(x4)x")]), (5, 8, 1, 8, Launcher::Slurm));
        assert_eq!(with(&[]), (5, 8, 1, 8, Launcher::Slurm));
        assert_eq!(with(&[("SLURM_TASKS_PER_NODE", "4(x2)")]), (5, 8, 1, 4, Launcher::Slurm));
        assert_eq!(with(&[("SLURM_TASKS_PER_NODE", "5,3")]), (5, 8, 1, 8, Launcher::Slurm), "mixed: unknown");
        // The step's own layout wins over the job's.
        let step = [("SLURM_NTASKS_PER_NODE", "8"), ("SLURM_STEP_TASKS_PER_NODE", "2(x4)")];
        assert_eq!(with(&step), (5, 8, 1, 2, Launcher::Slurm));
        // Inside an srun step the job id and step id are both set.
        assert_eq!(with(&[("SLURM_JOB_ID", "77"), ("SLURM_STEP_ID", "0")]).4, Launcher::Slurm);
    }

    #[test]
    fn uniform_tasks_per_node_parses_slurm_lists() {
        assert_eq!(uniform_tasks_per_node("4"), Some(4));
        assert_eq!(uniform_tasks_per_node("4(x3)"), Some(4));
        assert_eq!(uniform_tasks_per_node("4(x2),4"), Some(4));
        assert_eq!(uniform_tasks_per_node("2(x3),1"), None);
        for bad in ["", "x", "4(3)", "4(x)", "4(x0)", "0", "4(x2", "-1", "4,,4"] {
            assert_eq!(uniform_tasks_per_node(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn slurm_batch_script_variables_are_ignored() {
        // sbatch's script: rank variables describe the allocation, not this single process.
        let batch = [("SLURM_JOB_ID", "77"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), ("SLURM_LOCALID", "0")];
        assert_eq!(ranks(&info(&batch).unwrap()), (0, 1, 0, 1, Launcher::Standalone));
        // ... even with SLURM_NTASKS missing (sbatch without --ntasks).
        assert_eq!(info(&[("SLURM_JOB_ID", "77"), ("SLURM_PROCID", "0")]).unwrap().launcher, Launcher::Standalone);
        // torchrun started from the batch script with as many processes as tasks.
        let mut v = batch.to_vec();
        v.extend_from_slice(&[("RANK", "3"), ("WORLD_SIZE", "4")]);
        assert_eq!(ranks(&info(&v).unwrap()), (3, 4, 3, 4, Launcher::Torchrun));
    }

    #[test]
    fn precedence_and_borrowed_local_values() {
        // torchrun-style variables win over agreeing MPI ones and borrow their local values.
        let v = [
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
        ];
        assert_eq!(ranks(&info(&v).unwrap()), (3, 4, 1, 2, Launcher::Torchrun));
        // Open MPI before PMI before Slurm.
        let v = [("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")];
        assert_eq!(info(&v).unwrap().launcher, Launcher::Pmi);
        let v = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"), ("PMI_RANK", "1"), ("PMI_SIZE", "2")];
        assert_eq!(info(&v).unwrap().launcher, Launcher::OpenMpi);
    }

    #[test]
    fn nested_launches_are_not_disagreements() {
        // srun starting torchrun: torchrun's TORCHELASTIC_RUN_ID marks its variables as direct.
        let v = [
            ("RANK", "6"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("TORCHELASTIC_RUN_ID", "job"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_JOB_ID", "9"),
            ("SLURM_STEP_ID", "0"),
        ];
        assert_eq!(ranks(&info(&v).unwrap()), (6, 8, 2, 4, Launcher::Torchrun));
        // The same with a same-sized outer world (the direct mark is what allows it).
        let v = [("RANK", "3"), ("WORLD_SIZE", "4"), ("OXCCL_LAUNCHER", "oxccl"), ("PMI_RANK", "0"), ("PMI_SIZE", "4")];
        assert_eq!(ranks(&info(&v).unwrap()), (3, 4, 3, 4, Launcher::Oxccl));
        let v =
            [("RANK", "3"), ("WORLD_SIZE", "4"), ("OXCCL_LAUNCHER", "torchrun"), ("PMI_RANK", "0"), ("PMI_SIZE", "4")];
        assert_eq!(info(&v).unwrap().launcher, Launcher::Torchrun);
        // An unmarked launcher under an outer one that started fewer processes.
        let v = [("RANK", "5"), ("WORLD_SIZE", "8"), ("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")];
        assert_eq!(ranks(&info(&v).unwrap()), (5, 8, 5, 8, Launcher::Torchrun));
        // mpirun inside a Slurm allocation.
        let v = [
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
        ];
        assert_eq!(info(&v).unwrap().launcher, Launcher::OpenMpi);
    }

    #[test]
    fn disagreeing_conventions_are_errors_naming_both() {
        // A stale exported RANK=0 WORLD_SIZE=1 under mpirun -np 4.
        let m = config_error(
            &[("RANK", "0"), ("WORLD_SIZE", "1"), ("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "4")],
            &["RANK=0", "WORLD_SIZE=1", "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4", "unset", "OXCCL_LAUNCHER"],
        );
        assert!(m.contains("Open MPI"), "{m}");
        // Same world, different rank (`export RANK=$SLURM_PROCID` in the batch script).
        config_error(
            &[("RANK", "0"), ("WORLD_SIZE", "4"), ("SLURM_PROCID", "2"), ("SLURM_NTASKS", "4")],
            &["RANK=0", "SLURM_PROCID=2"],
        );
        // Two MPI conventions.
        config_error(
            &[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"), ("PMI_RANK", "0"), ("PMI_SIZE", "2")],
            &["OMPI_COMM_WORLD_RANK=1", "PMI_RANK=0"],
        );
    }

    #[test]
    fn missing_partner_variables() {
        config_error(&[("RANK", "1")], &["RANK", "WORLD_SIZE"]);
        config_error(&[("WORLD_SIZE", "4")], &["WORLD_SIZE", "RANK"]);
        config_error(&[("LOCAL_RANK", "0")], &["LOCAL_RANK", "RANK", "WORLD_SIZE"]);
        config_error(
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")],
            &["LOCAL_WORLD_SIZE", "LOCAL_RANK"],
        );
        config_error(&[("OMPI_COMM_WORLD_RANK", "0")], &["OMPI_COMM_WORLD_SIZE"]);
        config_error(&[("OMPI_COMM_WORLD_SIZE", "2")], &["OMPI_COMM_WORLD_RANK"]);
        config_error(&[("PMI_RANK", "0")], &["PMI_SIZE"]);
        config_error(&[("PMI_SIZE", "2")], &["PMI_RANK"]);
        config_error(&[("MPI_LOCALNRANKS", "2"), ("PMI_RANK", "0"), ("PMI_SIZE", "2")], &["MPI_LOCALRANKID"]);
        config_error(&[("SLURM_PROCID", "0")], &["SLURM_NTASKS"]);
        config_error(&[("SLURM_NTASKS", "2")], &["SLURM_PROCID"]);
        config_error(&[("OXCCL_LAUNCHER", "oxccl")], &["OXCCL_LAUNCHER", "RANK", "WORLD_SIZE"]);
    }

    #[test]
    fn bad_numbers() {
        config_error(&[("RANK", "one"), ("WORLD_SIZE", "2")], &["RANK", "\"one\""]);
        config_error(&[("RANK", "-1"), ("WORLD_SIZE", "2")], &["RANK"]);
        config_error(&[("RANK", "0"), ("WORLD_SIZE", "2.0")], &["WORLD_SIZE"]);
        config_error(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "x")], &["LOCAL_RANK"]);
        config_error(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "z")], &["OMPI_COMM_WORLD_SIZE"]);
        config_error(&[("PMI_RANK", "0"), ("PMI_SIZE", "1"), ("MPI_LOCALRANKID", "?")], &["MPI_LOCALRANKID"]);
        config_error(&[("SLURM_PROCID", "a"), ("SLURM_NTASKS", "1")], &["SLURM_PROCID"]);
        config_error(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1"), ("SLURM_LOCALID", "b")], &["SLURM_LOCALID"]);
        for port in ["http", "0", "70000", "-1"] {
            config_error(&[("MASTER_PORT", port)], &["MASTER_PORT"]);
        }
        config_error(&[("OXCCL_LAUNCHER", "mpirun"), ("RANK", "0"), ("WORLD_SIZE", "1")], &["OXCCL_LAUNCHER"]);
    }

    #[test]
    fn out_of_range_values() {
        config_error(&[("RANK", "4"), ("WORLD_SIZE", "4")], &["RANK=4", "WORLD_SIZE=4"]);
        config_error(&[("RANK", "0"), ("WORLD_SIZE", "0")], &["WORLD_SIZE=0"]);
        config_error(&[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "2")], &["OMPI_COMM_WORLD_RANK"]);
        config_error(&[("PMI_RANK", "0"), ("PMI_SIZE", "0")], &["PMI_SIZE=0"]);
        config_error(&[("SLURM_PROCID", "9"), ("SLURM_NTASKS", "3")], &["SLURM_PROCID=9", "SLURM_NTASKS=3"]);
        let torch = [("RANK", "0"), ("WORLD_SIZE", "4")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = torch.to_vec();
            v.extend_from_slice(extra);
            v
        };
        config_error(&with(&[("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")]), &["LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"]);
        config_error(&with(&[("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "0")]), &["LOCAL_WORLD_SIZE=0"]);
        config_error(&with(&[("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "8")]), &["LOCAL_WORLD_SIZE=8", "WORLD_SIZE=4"]);
        config_error(&with(&[("LOCAL_RANK", "4")]), &["LOCAL_RANK=4", "WORLD_SIZE=4"]);
        config_error(
            &[
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ],
            &["OMPI_COMM_WORLD_LOCAL_RANK=3", "OMPI_COMM_WORLD_LOCAL_SIZE=2"],
        );
        config_error(
            &[("PMI_RANK", "0"), ("PMI_SIZE", "4"), ("MPI_LOCALRANKID", "2"), ("MPI_LOCALNRANKS", "2")],
            &["MPI_LOCALRANKID=2", "MPI_LOCALNRANKS=2"],
        );
        config_error(
            &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "4"), ("SLURM_NTASKS_PER_NODE", "4")],
            &["SLURM_LOCALID=4", "SLURM_NTASKS_PER_NODE=4"],
        );
    }

    #[test]
    fn from_env_reads_the_process_environment() {
        // Whatever this test runs under, reading it must not panic; an error must be Config.
        match LaunchInfo::from_env() {
            Ok(i) => assert!(i.rank < i.world_size && i.local_rank < i.local_world_size),
            Err(e) => assert!(matches!(e, Error::Config(_)), "{e}"),
        }
    }

    #[test]
    fn requested_world_sizes_and_mpi_launches() {
        let e = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(requested_world_size(e(&[("PMI_SIZE", " 3")])), Some(("PMI_SIZE", 3)));
        assert_eq!(requested_world_size(e(&[("WORLD_SIZE", "x"), ("SLURM_NTASKS", "2")])), Some(("SLURM_NTASKS", 2)));
        assert_eq!(requested_world_size(e(&[("RANK", "1")])), None);
        assert!(launched_by_mpi(|k| k == "OMPI_COMM_WORLD_SIZE"));
        assert!(launched_by_mpi(|k| k == "PMI_SIZE"));
        assert!(launched_by_mpi(|k| k == "PMIX_RANK"));
        assert!(!launched_by_mpi(|k| k == "WORLD_SIZE"));
    }
}
