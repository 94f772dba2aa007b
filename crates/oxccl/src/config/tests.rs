//! Tests of the configuration: every setting resolves, names itself when bad, and loses to
//! the builder.

use super::*;

fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
}

#[test]
fn builder_wins_over_environment() {
    let e = [("OXCCL_BACKEND", "cpu"), ("OXCCL_TIMEOUT", "250ms"), ("OXCCL_ALGO", "bruck")];
    let r = Config::new().resolve_with(env(&e)).unwrap();
    assert_eq!(r.backend, BackendChoice::Named("cpu".into()));
    assert_eq!(r.timeout, Duration::from_millis(250));
    assert_eq!(r.algorithms.for_op(OpKind::AllGather), Algorithm::Bruck);

    let r = Config::new()
        .backend("local")
        .timeout(Duration::from_secs(7))
        .algorithm(Algorithm::Ring)
        .resolve_with(env(&e))
        .unwrap();
    assert_eq!(r.backend, BackendChoice::Named("local".into()));
    assert_eq!(r.timeout, Duration::from_secs(7));
    assert_eq!(r.algorithms.for_op(OpKind::AllGather), Algorithm::Ring);
}

#[test]
fn defaults_without_environment() {
    let r = Config::new().resolve_with(|_| None).unwrap();
    assert_eq!(r.backend, BackendChoice::Auto);
    assert_eq!(r.timeout, DEFAULT_TIMEOUT);
    assert_eq!(r.algorithms.for_op(OpKind::AllReduce), Algorithm::Auto);
}

#[test]
fn bad_values_name_the_variable() {
    let e = Config::new().resolve_with(env(&[("OXCCL_TIMEOUT", "soon")])).unwrap_err();
    assert!(e.to_string().contains("OXCCL_TIMEOUT"), "{e}");
    let e = Config::new().resolve_with(env(&[("OXCCL_ALGO", "all_reduce:pairwise")])).unwrap_err();
    assert!(e.to_string().contains("OXCCL_ALGO"), "{e}");
    assert!(Config::new().resolve_with(env(&[("OXCCL_TIMEOUT", "0")])).is_err());
}

#[test]
fn durations() {
    assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert!(parse_duration("-1").is_err());
    assert!(parse_duration("NaN").is_err());
}

/// One good and one bad value for every setting (a new setting without a case fails here).
fn cases(name: &str) -> (&'static str, &'static str) {
    match name {
        "OXCCL_BACKEND" => ("local", "warp"),
        "OXCCL_TIMEOUT" => ("2.5s", "0"),
        "OXCCL_ALGO" => ("all_reduce:ring,bruck", "all_reduce:pairwise"),
        "OXCCL_TRANSPORT" => ("tcp", "carrier-pigeon"),
        "OXCCL_SOCKET_IFNAME" => ("=eth0", ""),
        "OXCCL_SECRET" => ("s3cret", ""),
        "OXCCL_STORE_ADDR" => ("node0:29501", "node0"),
        "OXCCL_STORE_PORT" => ("29501", "65536"),
        "OXCCL_BOOTSTRAP" => ("pmix", "carrier-pigeon"),
        "OXCCL_PMIX_LIBRARY" => ("/opt/pmix/lib/libpmix.so.2", ""),
        "OXCCL_JOIN" => ("1", "later"),
        "OXCCL_SHM_SLOT_BYTES" => ("512KiB", "2K"),
        "OXCCL_SHM_RING_BYTES" => ("1MiB", "1"),
        "OXCCL_SHM_SINGLE_COPY" => ("0", "sometimes"),
        "OXCCL_MAX_FRAME" => ("1GiB", "1K"),
        "OXCCL_SOCKETS_PER_PEER" => ("4", "9"),
        "OXCCL_HOST_ID" => ("rack1-node7", ""),
        "OXCCL_SPIN_US" => ("0", "-5"),
        "OXCCL_YIELD_US" => ("500", "2ms"),
        "OXCCL_TUNE_FILE" => ("/etc/oxccl/host.tune", ""),
        "OXCCL_LOG" => ("warn,oxccl::cpu::selector=debug", "verbose"),
        "OXCCL_FR_SIZE" => ("500", "lots"),
        "OXCCL_FR_DIR" => ("/var/tmp/oxccl", ""),
        "OXCCL_PROFILE" => ("summary,trace:/tmp/t", "chatty"),
        "OXCCL_LAUNCHER" => ("torchrun", ""),
        "OXCCL_NODE_RANK" => ("1", "first"),
        "OXCCL_MPI_THREAD_LEVEL" => ("MPI_THREAD_SERIALIZED", "many"),
        "OXCCL_MPI_FINGERPRINT" => ("off", "maybe"),
        "OXCCL_MPI_HALF_REDUCE" => ("user-op", "fast"),
        "OXCCL_MPI_CUDA_AWARE" => ("no", "perhaps"),
        "OXCCL_MPI_FORCE_STAGING" => ("1", "2"),
        "OXCCL_CPU_FORCE_STAGING" => ("1", "maybe"),
        "OXCCL_MPI_ENV" => ("OMPI_MCA_btl=self,vader; A=1", "novalue"),
        "OXCCL_NCCL_LIBRARY" => ("/opt/nccl/lib/libnccl.so.2", ""),
        "OXCCL_RCCL_LIBRARY" => ("/opt/rocm/lib", ""),
        "OXCCL_GPU_DEVICE" => ("3", "-1"),
        "OXCCL_GPU_FINGERPRINT" => ("on", "sometimes"),
        "OXCCL_GPU_HOST_BUFFERS" => ("stage", "copy"),
        "OXCCL_PINNED_LIMIT" => ("256MiB", "512K"),
        "OXCCL_CONFORMANCE_FILTER" => ("^p2p/,all_reduce/f32", ""),
        "OXCCL_CONFORMANCE_SKIP" => ("errors/", ""),
        "OXCCL_CONFORMANCE_SEED" => ("18446744073709551615", "-1"),
        "OXCCL_CONFORMANCE_QUICK" => ("yes", "sometimes"),
        "OXCCL_CONFORMANCE_PROGRESS" => ("1", "2"),
        "OXCCL_CONFORMANCE_TIMEOUT" => ("250ms", "0"),
        "OXCCL_CONFORMANCE_DEVICE" => ("cuda:0", ""),
        other => panic!("no test values for {other}: add them here"),
    }
}

#[test]
fn every_setting_accepts_good_values_and_names_itself_on_bad_ones() {
    for s in registry::ALL {
        let (good, bad) = cases(s.name);
        assert!(s.check(good).is_ok(), "{}={good}: {:?}", s.name, s.check(good));
        Config::new().resolve_with(env(&[(s.name, good)])).unwrap_or_else(|e| panic!("{}={good}: {e}", s.name));
        let c = Config::new().set(s.name, good).unwrap_or_else(|e| panic!("set {}={good}: {e}", s.name));
        c.resolve_with(|_| None).unwrap_or_else(|e| panic!("{}={good} via set: {e}", s.name));
        if s.kind == registry::Kind::Text {
            continue; // free text: anything goes (an empty variable counts as unset)
        }
        let e = Config::new().resolve_with(env(&[(s.name, bad)])).unwrap_err().to_string();
        assert!(e.contains(s.name) && e.contains(bad), "{}={bad}: {e}", s.name);
        let e = Config::new().set(s.name, bad).unwrap_err().to_string();
        assert!(e.contains(s.name) && e.contains("Config"), "set {}={bad}: {e}", s.name);
        // Every default is a good value of its own kind.
        if !s.default.is_empty() {
            assert!(s.check(s.default).is_ok(), "default of {}", s.name);
        }
    }
}

/// The conformance suite's variables are declared (one name each, checked by `oxccl info`)
/// but are not the library's: `Config` neither accepts nor reads them.
#[test]
fn the_conformance_suites_settings_are_declared_apart() {
    assert_eq!(registry::CONFORMANCE.len(), 7);
    for s in registry::CONFORMANCE {
        assert!(s.name.starts_with("OXCCL_CONFORMANCE_"), "{}", s.name);
        assert!(registry::find(s.name).is_none(), "{} is not a setting of the library", s.name);
        assert_eq!(registry::find_declared(&s.name.to_lowercase()), Some(s));
        let (good, bad) = cases(s.name);
        assert!(s.check(good).is_ok(), "{}={good}: {:?}", s.name, s.check(good));
        if s.kind != registry::Kind::Text {
            assert!(s.check(bad).is_err(), "{}={bad}", s.name);
        }
        if !s.default.is_empty() {
            assert!(s.check(s.default).is_ok(), "default of {}", s.name);
        }
        let e = Config::new().set(s.name, good).unwrap_err().to_string();
        assert!(e.contains("there is no setting"), "{e}");
        assert!(Config::new().resolve_with(env(&[(s.name, bad)])).is_ok(), "{}={bad} is not the library's", s.name);
    }
    for s in registry::ALL {
        assert_eq!(registry::find_declared(s.name), Some(s));
    }
}

#[test]
fn the_builder_wins_for_every_setting() {
    for s in registry::ALL {
        let (good, bad) = cases(s.name);
        if s.kind == registry::Kind::Text {
            continue;
        }
        // A bad environment value does not matter when the builder sets the setting.
        let r = Config::new().set(s.name, good).unwrap().resolve_with(env(&[(s.name, bad)]));
        assert!(r.is_ok(), "{}: builder {good} vs env {bad}: {r:?}", s.name);
    }
    let e = [
        ("OXCCL_SHM_SLOT_BYTES", "64K"),
        ("OXCCL_SPIN_US", "7"),
        ("OXCCL_YIELD_US", "30"),
        ("OXCCL_TRANSPORT", "tcp"),
        ("OXCCL_SOCKET_IFNAME", "eth9"),
        ("OXCCL_MPI_FINGERPRINT", "0"),
        ("OXCCL_SECRET", "from-env"),
    ];
    let from_env = Config::new().resolve_with(env(&e)).unwrap();
    assert_eq!(from_env.cpu.shm_slot_bytes, 64 << 10);
    assert_eq!(from_env.cpu.spin, Some(Duration::from_micros(7)));
    assert_eq!(from_env.cpu.yield_for, Some(Duration::from_micros(30)));
    let defaults = Config::new().resolve_with(|_| None).unwrap().cpu;
    assert_eq!((defaults.spin, defaults.yield_for), (None, None), "both phases are automatic");
    assert_eq!(from_env.cpu.transport, TransportChoice::Tcp);
    assert_eq!(from_env.cpu.socket_ifname.as_deref(), Some("eth9"));
    assert!(!from_env.mpi.fingerprint);
    let gpu = Config::new()
        .resolve_with(env(&[
            ("OXCCL_NCCL_LIBRARY", "/x/libnccl.so.2"),
            ("OXCCL_GPU_DEVICE", "2"),
            ("OXCCL_GPU_FINGERPRINT", "1"),
            ("OXCCL_GPU_HOST_BUFFERS", "cpu"),
        ]))
        .unwrap()
        .gpu;
    assert_eq!(gpu.nccl_library.as_deref(), Some(std::path::Path::new("/x/libnccl.so.2")));
    assert_eq!((gpu.device, gpu.fingerprint, gpu.host_buffers), (Some(2), true, Some(crate::config::HostBuffers::Cpu)));
    assert_eq!(Config::new().resolve_with(|_| None).unwrap().gpu, crate::config::GpuSettings::default());
    assert_eq!(from_env.cpu.secret, Some(SecretText("from-env".into())));
    let built = Config::new()
        .set("oxccl_shm_slot_bytes", "2M")
        .and_then(|c| c.set("OXCCL_SPIN_US", "0"))
        .and_then(|c| c.set("OXCCL_SOCKET_IFNAME", "lo"))
        .and_then(|c| c.set("OXCCL_SECRET", "from-builder"))
        .unwrap()
        .transport(TransportChoice::Shm)
        .mpi(MpiConfig::new().fingerprint(true))
        .resolve_with(env(&e))
        .unwrap();
    assert_eq!(built.cpu.shm_slot_bytes, 2 << 20);
    assert_eq!(built.cpu.spin, Some(Duration::ZERO));
    assert_eq!(built.cpu.transport, TransportChoice::Shm);
    assert_eq!(built.cpu.socket_ifname.as_deref(), Some("lo"));
    assert!(built.mpi.fingerprint, "the typed MpiConfig wins over OXCCL_MPI_FINGERPRINT");
    assert_eq!(built.cpu.secret, Some(SecretText("from-builder".into())));
    assert!(!format!("{built:?}").contains("from-builder"), "the secret stays out of Debug");
    // A setting given by name wins over the typed MpiConfig too.
    let r = Config::new().mpi(MpiConfig::new()).set("OXCCL_MPI_FINGERPRINT", "0").unwrap().resolve_with(|_| None);
    assert!(!r.unwrap().mpi.fingerprint);
}

#[test]
fn unknown_settings_and_zero_timeouts_are_refused() {
    let e = Config::new().set("OXCCL_WARP_FACTOR", "9").unwrap_err().to_string();
    assert!(e.contains("OXCCL_WARP_FACTOR") && e.contains("OXCCL_TIMEOUT"), "{e}");
    let e = Config::new().timeout(Duration::ZERO).resolve_with(|_| None).unwrap_err().to_string();
    assert!(e.contains("Config::timeout"), "{e}");
    let e = Config::new().resolve_with(env(&[("OXCCL_TIMEOUT", "0")])).unwrap_err().to_string();
    assert!(e.contains("OXCCL_TIMEOUT=\"0\"") && e.contains("greater than zero"), "{e}");
    let e = Config::new().backend("warp").resolve_with(|_| None).unwrap_err().to_string();
    assert!(e.contains("OXCCL_BACKEND") && e.contains("warp") && e.contains("local"), "{e}");
    let e = Config::new().resolve_with(env(&[("OXCCL_SPIN_US", "99999999999999999999")])).unwrap_err();
    assert!(e.to_string().contains("OXCCL_SPIN_US"), "{e}");
    let e = Config::new().resolve_with(env(&[("OXCCL_SHM_SLOT_BYTES", "2T")])).unwrap_err().to_string();
    assert!(e.contains("OXCCL_SHM_SLOT_BYTES") && e.contains("1T"), "{e}");
    // An empty variable counts as unset.
    assert_eq!(Config::new().resolve_with(env(&[("OXCCL_TIMEOUT", " ")])).unwrap().timeout, DEFAULT_TIMEOUT);
}

#[test]
fn sizes_share_one_grammar() {
    for (text, bytes) in [
        ("262144", 262_144usize),
        ("64K", 64 << 10),
        ("64k", 64 << 10),
        ("64KiB", 64 << 10),
        ("64 KB", 64 << 10),
        ("1M", 1 << 20),
        ("1MiB", 1 << 20),
        ("1G", 1 << 30),
        ("1GiB", 1 << 30),
        ("512B", 512),
    ] {
        assert_eq!(parse::size(text), Ok(bytes), "{text}");
        assert_eq!(parse::size(&parse::format_size(bytes)), Ok(bytes));
    }
    for bad in ["", "K", "1.5M", "-1", "1X", "99999999999999999999", "18446744073709551615G"] {
        assert!(parse::size(bad).is_err(), "{bad}");
    }
    // The same grammar for every size setting (the old parsers disagreed on `1MiB`).
    for s in registry::ALL.iter().filter(|s| matches!(s.kind, registry::Kind::Size { .. })) {
        let r = Config::new().resolve_with(env(&[(s.name, "1MiB")])).unwrap();
        let got = match s.name {
            "OXCCL_SHM_SLOT_BYTES" => r.cpu.shm_slot_bytes,
            "OXCCL_SHM_RING_BYTES" => r.cpu.shm_ring_bytes,
            "OXCCL_MAX_FRAME" => r.cpu.max_frame,
            // Process-wide, read by the pinned pool itself (through the same parser).
            "OXCCL_PINNED_LIMIT" => crate::pinned::limit_with(env(&[(s.name, "1MiB")])).unwrap(),
            other => panic!("size setting {other} is not checked here"),
        };
        assert_eq!(got, 1 << 20, "{}", s.name);
    }
}

#[test]
fn the_docs_list_every_setting_as_the_registry_declares_it() {
    let table = registry::markdown_table();
    let settings_md = include_str!("SETTINGS.md");
    assert_eq!(settings_md, table, "config/SETTINGS.md differs from the registry; write it as:\n{table}");
    // The README names the common settings and links the full table.
    let readme = include_str!("../../../../README.md");
    assert!(readme.contains("(crates/oxccl/src/config/SETTINGS.md)"), "the README links config/SETTINGS.md");
    // Every `OXCCL_*` name the README mentions is a setting (test harness variables aside).
    let mut rest = readme;
    while let Some(i) = rest.find("OXCCL_") {
        rest = &rest[i..];
        let name: String =
            rest.chars().take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit()).collect();
        rest = &rest[name.len()..];
        let harness = name.starts_with("OXCCL_MPI_NP4") || name == "OXCCL_MPI_BENCH_MAX";
        if name.ends_with('_') || harness {
            continue;
        }
        assert!(
            registry::find_declared(&name).is_some(),
            "the README names {name}, which the registry does not declare"
        );
    }
}
