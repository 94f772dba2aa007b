//! Starting the ranks of this node: the environment each one gets (torchrun's variables plus
//! oxccl's) and the process itself, in its own process group, stdin closed, output piped;
//! and watching for its exit ([`watch_exit`]).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

/// Where this node's ranks sit in the job, and how they find the rendezvous store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Ranks per node (`LOCAL_WORLD_SIZE`).
    pub nproc: usize,
    /// Number of nodes.
    pub nnodes: usize,
    /// This node's index.
    pub node_rank: usize,
    /// The store's host (`MASTER_ADDR`).
    pub master_addr: String,
    /// The store's port (`MASTER_PORT`).
    pub master_port: u16,
}

impl Placement {
    /// `WORLD_SIZE`: ranks on all nodes.
    pub fn world_size(&self) -> usize {
        self.nnodes * self.nproc
    }

    /// The global rank of local rank `local`.
    pub fn rank(&self, local: usize) -> usize {
        self.node_rank * self.nproc + local
    }

    /// `host:port` of the store, with IPv6 hosts in brackets.
    pub fn store_addr(&self) -> String {
        super::rendezvous::join_host_port(&self.master_addr, self.master_port)
    }

    /// The environment of local rank `local`: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `OXCCL_STORE_ADDR`, `OXCCL_SECRET`,
    /// `OXCCL_LAUNCHER=oxccl`, `OXCCL_NODE_RANK`, `GROUP_RANK`, `NODE_RANK`.
    pub fn env(&self, local: usize, secret: &str) -> Vec<(&'static str, String)> {
        vec![
            ("RANK", self.rank(local).to_string()),
            ("WORLD_SIZE", self.world_size().to_string()),
            ("LOCAL_RANK", local.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("NODE_RANK", self.node_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
            ("OXCCL_STORE_ADDR", self.store_addr()),
            (oxccl::bootstrap::auth::SECRET_ENV, secret.to_string()),
            (oxccl::bootstrap::env::LAUNCHER_ENV, "oxccl".to_string()),
            ("OXCCL_NODE_RANK", self.node_rank.to_string()),
        ]
    }
}

/// How a rank's stdout and stderr reach the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Piped to the launcher, which prefixes each line with the rank.
    Prefixed,
    /// The launcher's own stdout and stderr, unchanged (e.g. a terminal, for progress bars).
    Inherited,
}

/// Starts one rank: `program args…` with `env` added to the launcher's environment, stdin
/// from /dev/null, in a new process group (so signals to the group reach whatever it starts,
/// and a Ctrl-C in the terminal reaches only the launcher, which forwards it). On Linux the
/// rank is killed (SIGKILL) when the launcher dies, even by SIGKILL, so no rank outlives it
/// (the kernel's parent-death signal; the launcher spawns from its main thread, which lives
/// as long as the launcher does). With `cpu`, the rank and every thread it starts run on
/// that CPU alone ([`super::bind`]).
///
/// # Errors
/// When the program cannot be started (not found, not executable), or bound to `cpu`.
pub fn spawn(
    program: &OsString,
    args: &[OsString],
    env: &[(impl AsRef<str>, String)],
    output: Output,
    cpu: Option<usize>,
) -> std::io::Result<Child> {
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).process_group(0);
    for (k, v) in env {
        cmd.env(k.as_ref(), v);
    }
    match output {
        Output::Prefixed => cmd.stdout(Stdio::piped()).stderr(Stdio::piped()),
        Output::Inherited => cmd.stdout(Stdio::inherit()).stderr(Stdio::inherit()),
    };
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let launcher = std::process::id();
        // Made here: the child may not allocate between fork and exec.
        let cpus = match cpu {
            Some(c) => Some(super::bind::single_cpu_set(c).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("CPU {c} is beyond what a CPU set holds"))
            })?),
            None => None,
        };
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls (prctl, getppid, _exit, sched_setaffinity on a set
        // made before the fork); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher may have died before the prctl: then no signal would come.
                if libc::getppid() as u32 != launcher {
                    libc::_exit(137);
                }
                if let Some(set) = &cpus {
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
    cmd.spawn()
}

/// Starts a thread that blocks until child `pid` has exited and then calls `exited` with the
/// moment it saw the exit, so the launcher learns of each exit as it happens rather than at
/// its next poll, and can tell which rank died first.
///
/// The thread does not reap the child (`waitid` with `WNOWAIT`): it stays a zombie until the
/// launcher's `Child::try_wait`, so its pid (the id of its process group, which the launcher
/// signals) cannot be reused meanwhile. `exited` is also called when the wait itself fails
/// (the child was already reaped, or an unexpected error): the launcher then looks at the
/// child with `try_wait` and falls back to polling it.
///
/// # Errors
/// When the thread cannot be started; the caller then polls the child instead.
pub fn watch_exit(pid: u32, exited: impl FnOnce(std::time::Instant) + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new().name(format!("oxccl-wait {pid}")).spawn(move || {
        let _ = wait_exited(pid);
        exited(std::time::Instant::now());
    })?;
    Ok(())
}

/// Blocks until child `pid` has exited (or cannot be waited for), leaving it waitable.
fn wait_exited(pid: u32) -> std::io::Result<()> {
    let id = libc::id_t::from(pid);
    let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::zeroed();
    loop {
        // SAFETY: `info` points to a writable siginfo_t that outlives the call, which is all
        // waitid needs; WNOWAIT leaves the child's state untouched (it is not reaped).
        let r = unsafe { libc::waitid(libc::P_PID, id, info.as_mut_ptr(), libc::WEXITED | libc::WNOWAIT) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(node_rank: usize) -> Placement {
        Placement { nproc: 4, nnodes: 2, node_rank, master_addr: "10.1.2.3".into(), master_port: 29500 }
    }

    #[test]
    fn ranks_count_across_nodes() {
        let p = placement(1);
        assert_eq!(p.world_size(), 8);
        assert_eq!(p.rank(0), 4);
        assert_eq!(p.rank(3), 7);
        let env = p.env(2, "s3cret");
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("RANK"), Some("6"));
        assert_eq!(get("WORLD_SIZE"), Some("8"));
        assert_eq!(get("LOCAL_RANK"), Some("2"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("4"));
        assert_eq!(get("MASTER_ADDR"), Some("10.1.2.3"));
        assert_eq!(get("MASTER_PORT"), Some("29500"));
        assert_eq!(get("OXCCL_STORE_ADDR"), Some("10.1.2.3:29500"));
        assert_eq!(get("OXCCL_SECRET"), Some("s3cret"));
        assert_eq!(get("OXCCL_LAUNCHER"), Some("oxccl"));
        assert_eq!(get("OXCCL_NODE_RANK"), Some("1"));
    }

    #[test]
    fn ipv6_store_addresses_get_brackets() {
        let p = Placement { master_addr: "::1".into(), ..placement(0) };
        assert_eq!(p.store_addr(), "[::1]:29500");
    }

    #[test]
    fn an_exit_is_seen_without_reaping_the_child() {
        let mut child =
            spawn(&"sh".into(), &["-c".into(), "exit 7".into()], &[("A", String::new())], Output::Prefixed, None)
                .expect("start sh");
        let (tx, rx) = std::sync::mpsc::channel();
        watch_exit(child.id(), move |at| {
            let _ = tx.send(at);
        })
        .expect("watcher thread");
        let seen = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("exit seen");
        assert!(seen <= std::time::Instant::now());
        // Still waitable: the watcher left the exit status for the launcher.
        let status = child.wait().expect("wait");
        assert_eq!(status.code(), Some(7));
    }

    #[test]
    fn a_missing_program_is_an_error_not_a_panic() {
        let e = spawn(&"/nonexistent/oxccl-test".into(), &[], &[("A", "b".to_string())], Output::Prefixed, None);
        assert!(e.is_err());
    }
}
