//! Interface choice (like `NCCL_SOCKET_IFNAME`), the options' checks and their agreement with
//! the registry.

use super::*;

fn iface(name: &str, ip: [u8; 4], up: bool) -> Iface {
    Iface { name: name.into(), ip: Ipv4Addr::from(ip), up }
}

#[test]
fn interfaces_are_chosen_like_nccl_socket_ifname() {
    let found = vec![
        iface("lo", [127, 0, 0, 1], true),
        iface("docker0", [172, 17, 0, 1], true),
        iface("eth0.100", [10, 1, 0, 2], true),
        iface("eth0", [10, 0, 0, 2], true),
        iface("eth1", [10, 0, 1, 2], false),
        iface("ib0", [10, 9, 0, 2], true),
    ];
    let ip = |spec: Option<&str>| pick(spec, &found).map(|a| a.to_string());
    assert_eq!(ip(Some("eth0")).unwrap(), "10.0.0.2");
    assert_eq!(ip(Some("eth")).unwrap(), "10.1.0.2");
    assert_eq!(ip(Some("=eth1")).unwrap(), "10.0.1.2");
    assert_eq!(ip(Some(" ib , eth ")).unwrap(), "10.1.0.2");
    assert_eq!(ip(Some("^docker,eth,lo")).unwrap(), "10.9.0.2");
    assert_eq!(ip(Some("^eth,ib,docker")).unwrap(), "127.0.0.1");
    assert_eq!(ip(None).unwrap(), "10.1.0.2");
    assert_eq!(pick(None, &found[..2]).unwrap().to_string(), "172.17.0.1");
    assert_eq!(pick(None, &found[..1]).unwrap(), Ipv4Addr::LOCALHOST);
    assert_eq!(pick(None, &[]).unwrap(), Ipv4Addr::LOCALHOST);
    // The NIC nearest the rank's GPU wins the default choice when it is up; a down, loopback
    // or unknown one leaves the default rule.
    let near = |p: &str| pick_preferring(Some(p), &found).to_string();
    assert_eq!(near("ib0"), "10.9.0.2");
    for ignored in ["eth1", "lo", "wlan9"] {
        assert_eq!(near(ignored), "10.1.0.2", "{ignored}");
    }
    assert_eq!(pick_preferring(None, &found).to_string(), "10.1.0.2");
    // OXCCL_SOCKET_IFNAME outranks it.
    let named = TcpOptions { ifname: Some("=lo".into()), prefer: Some("eth0".into()), ..TcpOptions::default() };
    assert_eq!(select_address(&named).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    let e = ip(Some("wlan0")).unwrap_err().to_string();
    assert!(e.contains(IFNAME_ENV) && e.contains("eth1 10.0.1.2 (down)") && e.contains("lo 127.0.0.1"), "{e}");
    assert!(ip(Some("^")).is_err());
    assert!(ip(Some(" , ")).is_err());
    // The real interfaces of this machine: every Linux host has `lo`.
    let real = TcpOptions { ifname: Some("=lo".into()), ..TcpOptions::default() };
    assert_eq!(select_address(&real).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    let e = select_address(&TcpOptions { ifname: Some("no-such-if".into()), ..TcpOptions::default() }).unwrap_err();
    assert!(matches!(&e, Error::Config(m) if m.contains("lo 127.0.0.1")), "{e}");
    let any = TcpOptions { bind_addr: Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), ..TcpOptions::default() };
    assert!(matches!(select_address(&any), Err(Error::Config(_))));
}

#[test]
fn options_are_checked_and_agree_with_the_registry() {
    let small = TcpOptions { max_frame: MAX_NOTICE_LEN - 1, ..TcpOptions::default() };
    assert!(matches!(small.check(), Err(Error::Config(m)) if m.contains(MAX_FRAME_ENV)));
    let never = TcpOptions { connect_timeout: Duration::ZERO, ..TcpOptions::default() };
    assert!(never.check().is_err());
    assert!(TcpOptions::default().check().is_ok());
    // The registry refuses a frame bound below what failure notices need, so a resolved
    // configuration always passes `check`.
    assert!(matches!(registry::MAX_FRAME.kind, Kind::Size { min, .. } if min >= MAX_NOTICE_LEN));
    assert_eq!(registry::MAX_FRAME.default, format_size(super::super::DEFAULT_MAX_FRAME));
}

#[test]
fn establish_checks_its_arguments() {
    let rdv = MemRdv::default();
    let mb = Arc::new(Mailbox::new());
    let o = opts();
    for (rank, world, peers) in [(3, 3, vec![0]), (0, 3, vec![3]), (0, 3, vec![0]), (0, 3, vec![1, 1])] {
        let e = TcpLinks::establish(rank, world, &peers, &rdv, PREFIX, &secret(), &o, Arc::clone(&mb)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
    // A world of one: nothing to connect.
    let l = TcpLinks::establish(0, 1, &[], &rdv, PREFIX, &secret(), &o, mb).unwrap();
    assert!(l.peers().is_empty());
    assert!(format!("{l:?}").contains("TcpLinks"));
}
