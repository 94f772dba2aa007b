use super::*;

fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn variables_are_checked_against_the_registry_and_secrets_hidden() {
    let v = check_environment(vars(&[
        ("PATH", "/bin"),
        ("OXCCL_TIMEOUT", "5s"),
        ("OXCCL_TIMEUOT", "5s"),
        ("OXCCL_SHM_SLOT_BYTES", "lots"),
        ("NCCL_DEBUG", "INFO"),
        ("OXCCL_SECRET", "hunter22"),
        ("OXCCL_WHATEVER_THIS_IS", "1"),
    ]));
    let names: Vec<&str> = v.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "NCCL_DEBUG",
            "OXCCL_SECRET",
            "OXCCL_SHM_SLOT_BYTES",
            "OXCCL_TIMEOUT",
            "OXCCL_TIMEUOT",
            "OXCCL_WHATEVER_THIS_IS"
        ]
    );
    assert!(v[0].status.starts_with("ok (read by the NCCL"));
    assert_eq!((v[1].value.as_str(), v[1].status.as_str()), ("(8 characters, hidden)", "ok"));
    assert!(v[2].status.contains("OXCCL_SHM_SLOT_BYTES"), "a bad value names its variable: {}", v[2].status);
    assert_eq!(v[3].status, "ok");
    assert!(v[4].status.contains("did you mean OXCCL_TIMEOUT?"), "{}", v[4].status);
    assert_eq!(v[5].status, "not an oxccl setting; it is ignored");
    assert_eq!(edit_distance("kitten", "sitting"), 3);
}

#[test]
fn the_conformance_suites_variables_are_checked_too() {
    let v = check_environment(vars(&[
        ("OXCCL_CONFORMANCE_QUICK", "1"),
        ("OXCCL_CONFORMANCE_SEED", "x"),
        ("OXCCL_CONFORMANCE_FILTR", "^p2p/"),
    ]));
    let status = |n: &str| v.iter().find(|x| x.name == n).map(|x| x.status.clone()).unwrap();
    assert_eq!(status("OXCCL_CONFORMANCE_QUICK"), "ok (read by the conformance suite)");
    let seed = status("OXCCL_CONFORMANCE_SEED");
    assert!(seed.starts_with("OXCCL_CONFORMANCE_SEED=\"x\": ") && seed.ends_with("; the suite ignores it"), "{seed}");
    let filtr = status("OXCCL_CONFORMANCE_FILTR");
    assert!(filtr.contains("did you mean OXCCL_CONFORMANCE_FILTER?"), "{filtr}");
}

#[test]
fn this_machine_without_gpu_or_mpi_is_described() {
    let r = Report::gather();
    let state = |n: &str| r.backends.iter().find(|b| b.name == n).map(|b| (b.available, b.detail.clone()));
    assert_eq!(state("cpu").map(|s| s.0), Some(true));
    assert_eq!(state("local").map(|s| s.0), Some(true));
    // No GPU here (CI machines have none): the GPU backends say why.
    if r.topology.gpus.is_empty() && !std::path::Path::new("/dev/nvidia0").exists() {
        let (ok, why) = state("nccl").unwrap();
        assert!(!ok && !why.is_empty(), "{why}");
        let nccl = r.gpu_stacks.iter().find(|g| g.backend == "nccl").unwrap();
        assert!(nccl.runtime.is_err() || nccl.devices.unwrap_or(0) == 0, "{nccl:?}");
    }
    assert_eq!(r.mpi.built_in, cfg!(feature = "mpi"));
    assert!(r.interfaces.iter().any(|i| i.name == "lo" && i.address == "127.0.0.1"), "{:?}", r.interfaces);
    assert!(r.tcp_address.is_ok(), "{:?}", r.tcp_address);
    if std::path::Path::new("/dev/shm").is_dir() {
        assert!(r.topology.host.dev_shm.is_some());
    }
    let text = r.to_string();
    for part in [
        "Backends",
        "GPU runtimes and libraries",
        "MPI",
        "GPUs on the PCI bus",
        "GPUDirect RDMA:",
        "Network",
        "Host",
        "/dev/shm",
        "locked-memory limit",
        "Environment",
        "Problems",
    ] {
        assert!(text.contains(part), "{part} missing:\n{text}");
    }
    if r.topology.gpus.is_empty() {
        assert!(text.contains("GPUs on the PCI bus\n  none"), "{text}");
        assert!(text.contains("GPUDirect RDMA: no (no NVIDIA or AMD GPU"), "{text}");
    }
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["backends"].is_array() && json["topology"]["host"]["cpus"].as_u64() >= Some(1));
}

#[test]
fn problems_say_what_to_do() {
    let mut r = Report::gather();
    r.topology.host.dev_shm = Some(crate::topology::host::Space { total_bytes: 64 << 20, free_bytes: 60 << 20 });
    r.environment = check_environment(vars(&[("OXCCL_TIMEOUT", "soon")]));
    r.tcp_address = Err("no interface matches".into());
    let p = r.find_problems();
    assert!(p.iter().any(|x| x.contains("/dev/shm is only 64 MiB") && x.contains("--shm-size")), "{p:?}");
    assert!(p.iter().any(|x| x.starts_with("OXCCL_TIMEOUT:")), "{p:?}");
    assert!(p.iter().any(|x| x.contains("cannot pick an address")), "{p:?}");
    r.topology.host.dev_shm = None;
    assert!(r.find_problems().iter().any(|x| x.contains("/dev/shm is not mounted")));
}

#[test]
fn runtime_devices_and_peer_access_are_shown() {
    let mut r = Report::gather();
    r.gpu_stacks = vec![GpuStack {
        backend: "nccl".into(),
        runtime: Ok("the CUDA driver 13.0 (/fake)".into()),
        devices: Some(2),
        library: Err("no usable NCCL library".into()),
        device_details: vec![
            Ok(RuntimeDevice {
                name: Some("NVIDIA H100 80GB HBM3".into()),
                memory_bytes: Some(80 << 30),
                pci_bus_id: Some("0000:3b:00.0".into()),
                dma_buf: Some(true),
            }),
            Err("cuDeviceGet failed".into()),
        ],
        peer_access: vec![(0, 1, true), (1, 0, false)],
    }];
    let text = r.to_string();
    assert!(text.contains("    device 0: NVIDIA H100 80GB HBM3, 80.0 GiB, PCI 0000:3b:00.0, dma-buf yes"), "{text}");
    assert!(text.contains("    device 1: cuDeviceGet failed"), "{text}");
    assert!(text.contains("    peer access: 0->1; not: 1->0"), "{text}");
    assert_eq!(gpu_stacks_dma_buf(&r.gpu_stacks), [true]);
}

#[test]
fn the_bootstrap_is_named_with_its_reason() {
    use crate::bootstrap::pmix::BootstrapChoice;
    let mut r = Report::gather();
    // This machine's choice, whatever it is, is shown with its reason.
    let text = r.to_string();
    assert!(text.contains("\nBootstrap\n") && text.contains(r.bootstrap.reason()), "{text}");
    if crate::bootstrap::pmix::PmixEnv::from_env().is_none() && std::env::var_os("OXCCL_BOOTSTRAP").is_none() {
        assert!(matches!(&r.bootstrap, BootstrapChoice::Store { fallback: false, .. }), "{:?}", r.bootstrap);
        assert!(text.contains("  oxccl's TCP store\n  why: the launcher runs no PMIx"), "{text}");
    }
    r.bootstrap = BootstrapChoice::Pmix {
        library: "/usr/lib/x86_64-linux-gnu/libpmix.so.2".into(),
        version: "OpenPMIx 4.2.2".into(),
        namespace: "900988929".into(),
        reason: "OXCCL_BOOTSTRAP=auto: the launcher runs PMIx (PMIX_NAMESPACE=900988929) and its library loads".into(),
    };
    let text = r.to_string();
    assert!(
        text.contains(
            "  the launcher's PMIx, namespace 900988929: /usr/lib/x86_64-linux-gnu/libpmix.so.2 (OpenPMIx 4.2.2)\n  \
             why: OXCCL_BOOTSTRAP=auto: the launcher runs PMIx"
        ),
        "{text}"
    );
    assert!(!r.find_problems().iter().any(|p| p.contains("bootstrap")));
    assert_eq!(serde_json::to_value(&r).unwrap()["bootstrap"]["via"], "pmix");
    r.bootstrap = BootstrapChoice::Store {
        reason: "OXCCL_BOOTSTRAP=auto: the launcher runs PMIx (PMIX_RANK=0) but the PMIx client library does not load"
            .into(),
        fallback: true,
    };
    let p = r.find_problems();
    assert!(
        p.iter().any(|x| x.starts_with("the bootstrap falls back to oxccl's store: OXCCL_BOOTSTRAP=auto")),
        "{p:?}"
    );
    r.bootstrap = BootstrapChoice::Unusable { reason: "OXCCL_BOOTSTRAP=pmix but this process was not started".into() };
    assert!(r.to_string().contains("Bootstrap\n  none can run: OXCCL_BOOTSTRAP=pmix but"));
    assert!(r.find_problems().iter().any(|x| x.starts_with("no bootstrap can run: OXCCL_BOOTSTRAP=pmix")));
}
