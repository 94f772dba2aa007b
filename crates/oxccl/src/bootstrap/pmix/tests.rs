//! Tests without a PMIx server: detection, the library search and its report, the choice
//! under `OXCCL_BOOTSTRAP`, keys and timeouts, and the ABI against the installed library
//! where there is one. `tests/library/pmix.rs` runs the real thing under `mpirun`.

use super::*;
use crate::config::Config;

fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Whether a PMIx library loads on this machine (the ABI tests need one).
fn system_library() -> Option<LibraryStatus> {
    probe(None).ok()
}

#[test]
fn without_pmix_variables_nothing_is_detected_and_from_env_is_none() {
    assert_eq!(PmixEnv::from_vars(vars(&[("PATH", "/bin"), ("OMPI_COMM_WORLD_RANK", "0")])), None);
    // Empty variables count as unset.
    assert_eq!(PmixEnv::from_vars(vars(&[("PMIX_RANK", " "), ("PMIX_NAMESPACE", "")])), None);
    let e = PmixEnv::from_vars(vars(&[
        ("PMIX_SERVER_URI41", "ns.0;tcp4://127.0.0.1:1"),
        ("PMIX_NAMESPACE", "900988929"),
        ("PMIX_RANK", "3"),
        ("PMIX_SERVER_URI2", "ns.0;tcp4://127.0.0.1:1"),
    ]))
    .unwrap();
    assert_eq!(e.namespace.as_deref(), Some("900988929"));
    assert_eq!(e.server_uris, ["PMIX_SERVER_URI2", "PMIX_SERVER_URI41"]);
    assert_eq!(e.describe(), "PMIX_NAMESPACE=900988929, PMIX_RANK=3, PMIX_SERVER_URI2, PMIX_SERVER_URI41");
    // A server URI alone is enough (a launcher that sets only it).
    assert!(PmixEnv::from_vars(vars(&[("PMIX_SERVER_URI4", "x")])).is_some());
    // This test process was not started under PMIx (unless someone runs it under mpirun).
    if PmixEnv::from_env().is_none() {
        assert!(Pmix::from_env().is_none());
        assert!(Pmix::from_env_with(Some(Path::new("/nonexistent"))).is_none());
    }
}

#[test]
fn a_wrong_library_path_is_named_with_every_candidate() {
    let e = Pmix::init(Some(Path::new("/nonexistent/oxccl/libpmix.so.2"))).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Store(_)), "{e:?}");
    assert!(text.contains("/nonexistent/oxccl/libpmix.so.2 (OXCCL_PMIX_LIBRARY): "), "{text}");
    // A folder: both names in it are tried.
    let dir = std::env::temp_dir().join(format!("oxccl-pmix-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = probe(Some(&dir)).unwrap_err().to_string();
    std::fs::remove_dir_all(&dir).ok();
    for name in ["libpmix.so.2 (OXCCL_PMIX_LIBRARY)", "libpmix.so (OXCCL_PMIX_LIBRARY)"] {
        assert!(text.contains(&format!("{}/{name}", dir.display())), "{name}: {text}");
    }
    // A library that loads but is not PMIx: what it lacks is said.
    let text = probe(Some(Path::new("libc.so.6"))).unwrap_err().to_string();
    assert!(text.contains("libc.so.6 (OXCCL_PMIX_LIBRARY): not a PMIx client library"), "{text}");
    assert!(text.contains("PMIx_Init") && text.contains("PMIx_Fence"), "{text}");
    // The default search names both of its candidates.
    let names: Vec<PathBuf> = library::candidates(None).into_iter().map(|c| c.path).collect();
    assert_eq!(names, [PathBuf::from("libpmix.so.2"), PathBuf::from("libpmix.so")]);
}

#[test]
fn the_setting_parses_and_refuses_junk_naming_the_variable() {
    let env = |v: &'static str| move |k: &str| (k == "OXCCL_BOOTSTRAP").then(|| v.to_string());
    let mode = |v: &'static str| Config::new().resolve_with(env(v)).map(|r| r.cpu.bootstrap);
    assert_eq!(mode("store").unwrap(), BootstrapMode::Store);
    assert_eq!(mode("PMIx").unwrap(), BootstrapMode::Pmix);
    assert_eq!(mode("auto").unwrap(), BootstrapMode::Auto);
    assert_eq!(Config::new().resolve_with(|_| None).unwrap().cpu.bootstrap, BootstrapMode::Auto);
    let e = mode("slurm").unwrap_err().to_string();
    assert!(e.contains("OXCCL_BOOTSTRAP") && e.contains("slurm") && e.contains("pmix"), "{e}");
    let lib = Config::new()
        .set("OXCCL_PMIX_LIBRARY", "/opt/pmix/lib")
        .unwrap()
        .resolve_with(|_| None)
        .unwrap()
        .cpu
        .pmix_library;
    assert_eq!(lib.as_deref(), Some(Path::new("/opt/pmix/lib")));
}

#[test]
fn the_choice_says_why() {
    // Not under PMIx.
    let c = choice_in(BootstrapMode::Auto, None, None);
    assert!(
        matches!(&c, BootstrapChoice::Store { reason, fallback: false } if reason.contains("PMIX_NAMESPACE")),
        "{c:?}"
    );
    let c = choice_in(BootstrapMode::Pmix, None, None);
    assert!(
        matches!(&c, BootstrapChoice::Unusable { reason } if reason.contains("OXCCL_BOOTSTRAP=pmix")
            && reason.contains("not started under PMIx")),
        "{c:?}"
    );
    assert_eq!(choice_in(BootstrapMode::Store, None, None).reason(), "OXCCL_BOOTSTRAP=store");
    // Under PMIx.
    let env = PmixEnv::from_vars(vars(&[("PMIX_NAMESPACE", "job7"), ("PMIX_RANK", "0")]));
    let c = choice_in(BootstrapMode::Store, None, env.clone());
    assert!(!c.is_pmix() && c.reason().contains("PMIX_NAMESPACE=job7, PMIX_RANK=0, unused"), "{c:?}");
    let bad = Path::new("/nonexistent/libpmix.so.2");
    let c = choice_in(BootstrapMode::Auto, Some(bad), env.clone());
    assert!(
        matches!(&c, BootstrapChoice::Store { reason, fallback: true } if reason.contains("/nonexistent/libpmix.so.2")
            && reason.contains("libpmix2")),
        "{c:?}"
    );
    let c = choice_in(BootstrapMode::Pmix, Some(bad), env.clone());
    assert!(matches!(&c, BootstrapChoice::Unusable { reason } if reason.contains("/nonexistent/libpmix.so.2")));
    let e = Pmix::for_mode(BootstrapMode::Store, Some(bad)).unwrap();
    assert!(e.is_none());
    if let Some(lib) = system_library() {
        let c = choice_in(BootstrapMode::Auto, None, env);
        match c {
            BootstrapChoice::Pmix { library, namespace, reason, version } => {
                assert_eq!((library, namespace), (lib.path, "job7".to_string()));
                assert!(reason.contains("its library loads") && version.contains("PMIx"), "{reason} {version}");
            }
            other => panic!("libpmix loads here, yet: {other:?}"),
        }
    }
}

#[test]
fn keys_and_timeouts_fit_pmix() {
    assert!(pmix_key("oxccl/addr/3").is_ok());
    for bad in ["", "pmix.rank", "a\0b"] {
        let e = pmix_key(bad).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{bad:?}: {e}");
    }
    assert!(pmix_key(&"k".repeat(511)).is_ok());
    assert!(pmix_key(&"k".repeat(512)).is_err());
    assert_eq!(whole_seconds(Duration::ZERO), 1);
    assert_eq!(whole_seconds(Duration::from_millis(300)), 1);
    assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
    assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
    assert_eq!(whole_seconds(Duration::from_secs(u64::MAX)), c_int::MAX);
}

#[test]
fn the_installed_library_loads_with_every_function_and_refuses_init_without_a_server() {
    let Some(lib) = system_library() else {
        eprintln!("skipped: no PMIx library on this machine ({})", probe(None).unwrap_err());
        return;
    };
    assert!(lib.path.is_absolute(), "the loader's file: {}", lib.path.display());
    assert!(lib.version.contains("PMIx"), "{}", lib.version);
    let loaded = load(None).unwrap();
    assert!(loaded.lib.describe(library::ERR_TIMEOUT).contains("(-24)"));
    assert!(loaded.lib.describe(library::ERR_NOT_FOUND).contains("(-46)"));
    if PmixEnv::from_env().is_none() {
        // No server to reach: PMIx_Init fails at once (OpenPMIx 4.2: PMIX_ERR_UNREACH), and
        // the error says what was loaded and what failed.
        let e = Pmix::init(None).unwrap_err().to_string();
        assert!(e.contains("PMIx_Init of ") && e.contains(&lib.path.display().to_string()), "{e}");
    }
}

#[test]
fn values_read_as_numbers_whatever_integer_type_pmix_chose() {
    let v = |kind, data| Value { kind, data };
    assert_eq!(v(library::UINT32, library::ValueData { uint32: 4 }).as_u64(), Some(4));
    assert_eq!(v(library::UINT16, library::ValueData { uint16: 3 }).as_u64(), Some(3));
    assert_eq!(v(library::PROC_RANK, library::ValueData { uint32: 9 }).as_u64(), Some(9));
    assert_eq!(v(library::INT, library::ValueData { int32: -1 }).as_u64(), None);
    assert_eq!(v(library::STRING, library::ValueData { string: std::ptr::null_mut() }).as_u64(), None);
    let bytes = b"abc";
    let b = Value::bytes(bytes);
    assert_eq!(b.kind, library::BYTE_OBJECT);
    // SAFETY: `bytes` made the byte object member.
    assert_eq!(unsafe { b.data.bo.size }, 3);
    let i = Info::timeout(7);
    assert_eq!(i.key[..12].iter().map(|&c| c as u8).collect::<Vec<_>>(), b"pmix.timeout");
    assert_eq!((i.key[12], i.value.kind), (0, library::INT));
    let mut p = Proc::undefined();
    for (d, s) in p.nspace.iter_mut().zip(b"ns1") {
        *d = *s as std::ffi::c_char;
    }
    assert_eq!(format!("{:?}", p.with_rank(2)), "ns1:2");
}
