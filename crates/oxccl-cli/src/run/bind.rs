//! Binding each rank of this node to a CPU of its own (`--bind-to`), as `mpirun` does by
//! default: local rank `i` runs on the `i`-th CPU of the launcher's affinity mask, it and
//! every thread it starts.
//!
//! Why: ranks that the scheduler may move share a CPU's run queue now and then, and then
//! neither runs while the other waits for it (measurements: docs/performance.md).
//!
//! Why not always: a bound rank's threads (data loaders, a framework's compute pool) share
//! its one CPU. So `oxccl run` binds only when asked (as torchrun, which never binds), and
//! `oxccl bench`, whose ranks run nothing else, binds where every rank gets a CPU.

use clap::ValueEnum;

/// Where the ranks of this node run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BindTo {
    /// Wherever the scheduler puts them (the launcher's own affinity mask).
    None,
    /// Each on a CPU of its own; an error where the ranks outnumber the CPUs.
    Core,
    /// As `core` where every rank gets a CPU of its own, else as `none`.
    Auto,
}

/// The CPU of each local rank (`None`: not bound) for `nproc` ranks, `allowed` the
/// launcher's CPUs.
///
/// # Errors
/// `Core` with more ranks than CPUs.
pub fn cpus_for(bind: BindTo, nproc: usize, allowed: &[usize]) -> Result<Option<Vec<usize>>, String> {
    let fits = nproc <= allowed.len();
    match bind {
        BindTo::None => Ok(None),
        BindTo::Auto if !fits => Ok(None),
        BindTo::Core if !fits => Err(format!(
            "--bind-to core needs a CPU per rank: {nproc} ranks, {} CPUs in the launcher's affinity mask; \
             start fewer ranks or use --bind-to none",
            allowed.len()
        )),
        BindTo::Core | BindTo::Auto => Ok(Some(allowed[..nproc].to_vec())),
    }
}

/// The CPU set holding `cpu` alone, for `sched_setaffinity` in the child; `None` where `cpu`
/// is beyond what a set can hold.
pub fn single_cpu_set(cpu: usize) -> Option<libc::cpu_set_t> {
    cpu_set([cpu])
}

/// The CPU set holding `cpus`, for `sched_setaffinity`; `None` where one of them is beyond
/// what a set can hold.
pub fn cpu_set(cpus: impl IntoIterator<Item = usize>) -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return None;
        }
        // SAFETY: `cpu` is below CPU_SETSIZE, so CPU_SET writes within `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    Some(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_the_launchers_cpus_in_order_while_they_last() {
        let cpus = [2, 3, 6, 7];
        assert_eq!(cpus_for(BindTo::Core, 3, &cpus), Ok(Some(vec![2, 3, 6])));
        assert_eq!(cpus_for(BindTo::Auto, 4, &cpus), Ok(Some(vec![2, 3, 6, 7])));
        assert_eq!(cpus_for(BindTo::Auto, 5, &cpus), Ok(None), "oversubscribed: left to the scheduler");
        assert_eq!(cpus_for(BindTo::None, 2, &cpus), Ok(None));
        let e = cpus_for(BindTo::Core, 5, &cpus).unwrap_err();
        assert!(e.contains("5 ranks, 4 CPUs") && e.contains("--bind-to none"), "{e}");
        assert!(single_cpu_set(libc::CPU_SETSIZE as usize).is_none());
        let set = single_cpu_set(3).unwrap();
        // SAFETY: 3 and 2 are below CPU_SETSIZE.
        assert!(unsafe { libc::CPU_ISSET(3, &set) && !libc::CPU_ISSET(2, &set) });
    }
}
