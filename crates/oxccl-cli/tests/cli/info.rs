//! `oxccl info`: it runs on a machine without GPU or MPI, says what it finds and what is
//! missing, checks the environment, and gives the same facts as JSON.

use std::process::Command;

const OXCCL: &str = env!("CARGO_BIN_EXE_oxccl");

#[test]
fn the_doctor_describes_this_machine_and_flags_a_misspelt_setting() {
    let out = Command::new(OXCCL)
        .arg("info")
        .env("OXCCL_TIMEUOT", "5s")
        .env("OXCCL_SECRET", "do-not-print-me")
        .env_remove("OXCCL_SOCKET_IFNAME")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for part in ["oxccl 0.", "Backends", "  cpu    available", "GPUs on the PCI bus", "Network", "/dev/shm", "Problems"]
    {
        assert!(text.contains(part), "{part} missing:\n{text}");
    }
    assert!(text.contains("OXCCL_TIMEUOT=5s  not an oxccl setting (did you mean OXCCL_TIMEOUT?)"), "{text}");
    assert!(text.contains("  - OXCCL_TIMEUOT: not an oxccl setting"), "listed as a problem:\n{text}");
    assert!(!text.contains("do-not-print-me") && text.contains("OXCCL_SECRET=(15 characters, hidden)"), "{text}");
    assert!(text.contains("the cpu backend's TCP transport listens on"), "{text}");
}

#[test]
fn the_json_report_has_every_section() {
    let out = Command::new(OXCCL).args(["info", "--json"]).env("OXCCL_SOCKET_IFNAME", "=lo").output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    for key in
        ["version", "backends", "gpu_stacks", "mpi", "topology", "interfaces", "tcp_address", "environment", "problems"]
    {
        assert!(!v[key].is_null(), "{key} missing from {v}");
    }
    assert_eq!(v["tcp_address"]["Ok"], "127.0.0.1", "OXCCL_SOCKET_IFNAME=lo picks lo: {}", v["tcp_address"]);
    let cpu = v["backends"].as_array().unwrap().iter().find(|b| b["name"] == "cpu").unwrap();
    assert_eq!(cpu["available"], true);
    assert!(v["topology"]["host"]["cpus"].as_u64() >= Some(1));
}
