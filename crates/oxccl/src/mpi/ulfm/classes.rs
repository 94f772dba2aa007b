//! ULFM's error classes, whose values differ between MPI families, and which MPIs oxccl can
//! run ULFM on at all. Everything here is pure (strings and numbers in, answers out).
//!
//! | class | Open MPI 5 | MPICH family |
//! |---|---|---|
//! | `MPIX_ERR_PROC_FAILED` | 75 | 101 |
//! | `MPIX_ERR_PROC_FAILED_PENDING` | 76 | 102 |
//! | `MPIX_ERR_REVOKED` | 77 | 103 |
//!
//! Open MPI 5: `mpi-ext.h`'s `mpiext_ftmpi_c.h` defines `MPIX_ERR_*` as `MPI_ERR_PROC_FAILED`,
//! `MPI_ERR_PROC_FAILED_PENDING` and `MPI_ERR_REVOKED`, which its `mpi.h` defines as 75, 76
//! and 77 (checked in the headers of Open MPI 5.0.11). MPICH: `mpi.h` defines them as
//! `MPICH_ERR_FIRST_MPIX` (100) + 1, + 2 and + 3 (checked in MPICH 4.0.2 and 5.0.2); the
//! derivatives that keep MPICH's ABI (Intel MPI, MVAPICH, Cray MPICH) share the values.
//!
//! Which MPI may be used: Open MPI (ULFM is part of Open MPI 5; it is used as exported), and
//! an MPICH-family library whose version text names a `ch3` device (`MPICH Device: ch3:...`). MPICH's `ch4` device (the default since MPICH 4, and
//! what Debian ships: `MPICH Device: ch4:ucx`) exports the `MPIX_Comm_*` functions but
//! implements none of them: `MPID_Comm_failure_ack`, `MPID_Comm_revoke` and
//! `MPID_Comm_get_all_failed_procs` (under agree and shrink) are `MPIR_Assert(0)`, so a call
//! aborts the process (seen with MPICH 4.0.2 and 5.0.2). oxccl refuses them there with an
//! error instead.

/// What a ULFM error class means to oxccl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UlfmClass {
    /// `MPIX_ERR_PROC_FAILED`: a process of the communicator failed.
    ProcFailed,
    /// `MPIX_ERR_PROC_FAILED_PENDING`: a receive from any source could not complete because a
    /// process failed (the request stays pending).
    ProcFailedPending,
    /// `MPIX_ERR_REVOKED`: the communicator was revoked.
    Revoked,
}

/// One MPI family's values of ULFM's error classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Classes {
    /// `MPIX_ERR_PROC_FAILED`.
    pub(crate) proc_failed: i32,
    /// `MPIX_ERR_PROC_FAILED_PENDING`.
    pub(crate) proc_failed_pending: i32,
    /// `MPIX_ERR_REVOKED`.
    pub(crate) revoked: i32,
}

/// Open MPI 5's values (`mpi.h`: `MPI_ERR_PROC_FAILED` 75, `..._PENDING` 76, `MPI_ERR_REVOKED` 77).
pub(crate) const OPEN_MPI: Classes = Classes { proc_failed: 75, proc_failed_pending: 76, revoked: 77 };

/// MPICH's values (`mpi.h`: `MPICH_ERR_FIRST_MPIX` 100, + 1, + 2, + 3).
pub(crate) const MPICH: Classes = Classes { proc_failed: 101, proc_failed_pending: 102, revoked: 103 };

impl Classes {
    /// What `class` (an `MPI_Error_class` result) means, when it is one of ULFM's.
    pub(crate) fn of(&self, class: i32) -> Option<UlfmClass> {
        if class == self.proc_failed {
            Some(UlfmClass::ProcFailed)
        } else if class == self.proc_failed_pending {
            Some(UlfmClass::ProcFailedPending)
        } else if class == self.revoked {
            Some(UlfmClass::Revoked)
        } else {
            None
        }
    }
}

/// The MPI families oxccl knows ULFM's class values of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// Open MPI.
    OpenMpi,
    /// MPICH and the derivatives that keep its ABI.
    Mpich,
}

impl Family {
    /// The family of the MPI whose `MPI_Get_library_version` is `version`; `None` when
    /// unknown.
    pub(crate) fn of(version: &str) -> Option<Family> {
        if version.contains("Open MPI") {
            Some(Family::OpenMpi)
        } else if ["MPICH", "Intel(R) MPI", "MVAPICH", "CRAY MPICH"].iter().any(|n| version.contains(n)) {
            Some(Family::Mpich)
        } else {
            None
        }
    }

    /// The family's class values.
    pub(crate) fn classes(self) -> Classes {
        match self {
            Family::OpenMpi => OPEN_MPI,
            Family::Mpich => MPICH,
        }
    }
}

/// The device an MPICH build names in its version text (`MPICH Device: ch4:ucx`), if any.
fn mpich_device(version: &str) -> Option<&str> {
    version.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("MPICH Device:")?;
        rest.split_whitespace().next()
    })
}

/// Whether oxccl can run ULFM on the MPI whose whole `MPI_Get_library_version` text is
/// `version` and which exports every function ULFM needs: its class values, or why not (a
/// sentence that says what to do).
///
/// # Errors
/// The reason, for an MPI whose family is unknown or whose ULFM functions abort (MPICH's
/// `ch4` device).
pub(crate) fn usable(version: &str) -> Result<Classes, String> {
    let first = version.lines().next().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" ");
    let Some(family) = Family::of(version) else {
        return Err(format!(
            "{first} exports ULFM's functions, but oxccl does not know its values of ULFM's error classes \
             (it knows Open MPI's and MPICH's)"
        ));
    };
    if family == Family::Mpich {
        match mpich_device(version) {
            Some(d) if d.starts_with("ch3") => {}
            Some(d) => {
                return Err(format!(
                    "{first} (device {d}) exports ULFM's MPIX_Comm_* functions but its device does not implement \
                     them (they abort the process: MPICH's ch4 device asserts in MPID_Comm_failure_ack, \
                     MPID_Comm_revoke and MPID_Comm_get_all_failed_procs); use an MPICH built with \
                     --with-device=ch3 (run with MPIR_CVAR_ENABLE_FT=1) or Open MPI 5 (mpiexec --with-ft ulfm)"
                ))
            }
            None => {
                return Err(format!(
                    "{first} does not say which device it was built with (no `MPICH Device:` line), and MPICH's ch4 \
                     device (also under its derivatives) aborts in ULFM's functions; use an MPICH built with \
                     --with-device=ch3 or Open MPI 5 (mpiexec --with-ft ulfm)"
                ))
            }
        }
    }
    Ok(family.classes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBIAN_MPICH: &str = "MPICH Version:\t4.0.2\nMPICH Release date:\tThu Apr  7 12:34:45 CDT 2022\n\
                                MPICH ABI:\t14:2:2\nMPICH Device:\tch4:ucx\nMPICH configure:\t--with-device=ch4:ucx";

    #[test]
    fn each_family_maps_its_own_values_and_no_other() {
        assert_eq!(OPEN_MPI.of(75), Some(UlfmClass::ProcFailed));
        assert_eq!(OPEN_MPI.of(76), Some(UlfmClass::ProcFailedPending));
        assert_eq!(OPEN_MPI.of(77), Some(UlfmClass::Revoked));
        assert_eq!(OPEN_MPI.of(101), None);
        assert_eq!(MPICH.of(101), Some(UlfmClass::ProcFailed));
        assert_eq!(MPICH.of(102), Some(UlfmClass::ProcFailedPending));
        assert_eq!(MPICH.of(103), Some(UlfmClass::Revoked));
        assert_eq!(MPICH.of(77), None);
        for c in [0, 1, 16, 54, 74, 78, 100, 104, -1] {
            assert_eq!((OPEN_MPI.of(c), MPICH.of(c)), (None, None), "class {c}");
        }
    }

    #[test]
    fn the_family_comes_from_the_version_text() {
        assert_eq!(Family::of("Open MPI v5.0.11, package: Open MPI"), Some(Family::OpenMpi));
        assert_eq!(Family::of(DEBIAN_MPICH), Some(Family::Mpich));
        assert_eq!(Family::of("Intel(R) MPI Library 2021.10"), Some(Family::Mpich));
        assert_eq!(Family::of("SomeOtherMPI 1.0"), None);
        assert_eq!(Family::OpenMpi.classes(), OPEN_MPI);
        assert_eq!(Family::Mpich.classes(), MPICH);
    }

    #[test]
    fn open_mpi_and_mpich_ch3_are_usable_and_mpich_ch4_is_refused() {
        assert_eq!(usable("Open MPI v5.0.11, package: Open MPI"), Ok(OPEN_MPI));
        assert_eq!(usable("MPICH Version:\t3.4.3\nMPICH Device:\tch3:nemesis\n"), Ok(MPICH));
        let e = usable(DEBIAN_MPICH).unwrap_err();
        assert!(e.starts_with("MPICH Version: 4.0.2 (device ch4:ucx)") && e.contains("abort"), "{e}");
        assert!(e.contains("ch3") && e.contains("--with-ft ulfm"), "{e}");
        let e = usable("MPICH Version: 4.1").unwrap_err();
        assert!(e.contains("MPICH Device"), "{e}");
        assert!(usable("Intel(R) MPI Library 2021.10 for Linux* OS").is_err());
        let e = usable("SomeOtherMPI 1.0\nmore").unwrap_err();
        assert!(e.starts_with("SomeOtherMPI 1.0 exports") && e.contains("error classes"), "{e}");
    }

    #[test]
    fn the_device_is_read_from_its_line() {
        assert_eq!(mpich_device(DEBIAN_MPICH), Some("ch4:ucx"));
        assert_eq!(mpich_device("MPICH Device:      ch4:ucx ofi\n"), Some("ch4:ucx"));
        assert_eq!(mpich_device("MPICH Version: 4"), None);
    }
}
