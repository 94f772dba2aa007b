//! Which address a rank listens on and publishes: [`select_address`], from the options, the
//! host's IPv4 interfaces and `OXCCL_SOCKET_IFNAME`.

use std::io;
use std::net::{IpAddr, Ipv4Addr};

use super::options::{TcpOptions, IFNAME_ENV};
use crate::error::{Error, Result};

/// An IPv4 interface address, as the selector sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Iface {
    pub(super) name: String,
    pub(super) ip: Ipv4Addr,
    pub(super) up: bool,
}

fn interfaces() -> io::Result<Vec<Iface>> {
    Ok(if_addrs::get_if_addrs()?
        .into_iter()
        .filter_map(|i| {
            let up = i.is_oper_up();
            match i.addr {
                if_addrs::IfAddr::V4(a) => Some(Iface { name: i.name, ip: a.ip, up }),
                if_addrs::IfAddr::V6(_) => None,
            }
        })
        .collect())
}

/// This host's IPv4 interfaces: (name, address, whether it is up), in the order the
/// system lists them (what [`select_address`] chooses from).
///
/// # Errors
/// The system's error when the interfaces cannot be listed.
pub fn ipv4_interfaces() -> io::Result<Vec<(String, Ipv4Addr, bool)>> {
    Ok(interfaces()?.into_iter().map(|i| (i.name, i.ip, i.up)).collect())
}

/// The interfaces the default choice may pick (up, IPv4, not loopback or link-local), by
/// name, in the system's order.
pub fn default_candidates() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for i in interfaces().unwrap_or_default().into_iter().filter(usable) {
        if !names.contains(&i.name) {
            names.push(i.name);
        }
    }
    names
}

/// Whether the default choice may pick `i`.
fn usable(i: &Iface) -> bool {
    i.up && !i.ip.is_loopback() && !i.ip.is_link_local() && !i.ip.is_unspecified()
}

/// The address a rank listens on and publishes: `opts.bind_addr` when set, else the IPv4
/// address of the interface `opts.ifname` names, else that of `opts.prefer` (the NIC
/// nearest the rank's GPU) when it is up, else the first up non-loopback IPv4 interface
/// (not a container bridge), else 127.0.0.1.
///
/// # Errors
/// [`Error::Config`] when `bind_addr` is unspecified (0.0.0.0 cannot be published) or
/// `ifname` matches no interface (the message lists the interfaces found);
/// [`Error::Io`] when the interfaces cannot be listed for `ifname`.
pub fn select_address(opts: &TcpOptions) -> Result<IpAddr> {
    if let Some(ip) = opts.bind_addr {
        if ip.is_unspecified() {
            return Err(Error::Config(format!(
                "the TCP bind address {ip} cannot be published to peers; give an interface's address or set {IFNAME_ENV}"
            )));
        }
        return Ok(ip);
    }
    match opts.ifname.as_deref() {
        Some(spec) => {
            let found =
                interfaces().map_err(|e| Error::io(format!("listing network interfaces for {IFNAME_ENV}"), &e))?;
            pick(Some(spec), &found).map(IpAddr::V4)
        }
        None => Ok(IpAddr::V4(pick_preferring(opts.prefer.as_deref(), &interfaces().unwrap_or_default()))),
    }
}

/// `OXCCL_SOCKET_IFNAME`, parsed.
struct IfSpec {
    exclude: bool,
    /// (name or prefix, exact only)
    items: Vec<(String, bool)>,
}

impl IfSpec {
    fn parse(spec: &str) -> Result<IfSpec> {
        let spec = spec.trim();
        let (exclude, list) = match spec.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let items: Vec<(String, bool)> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s.strip_prefix('=') {
                Some(exact) => (exact.to_string(), true),
                None => (s.to_string(), false),
            })
            .collect();
        if items.is_empty() {
            return Err(Error::Config(format!("{IFNAME_ENV}={spec:?} names no interface")));
        }
        Ok(IfSpec { exclude, items })
    }

    fn matches(&self, name: &str) -> bool {
        self.items.iter().any(|(p, exact)| if *exact { name == p } else { name.starts_with(p.as_str()) })
    }

    fn names_exactly(&self, name: &str) -> bool {
        self.items.iter().any(|(p, _)| name == p)
    }
}

fn describe(found: &[Iface]) -> String {
    if found.is_empty() {
        return "none".into();
    }
    found
        .iter()
        .map(|i| format!("{} {}{}", i.name, i.ip, if i.up { "" } else { " (down)" }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The default choice among `found` (no `OXCCL_SOCKET_IFNAME`): `prefer`'s address when it
/// is a usable interface, else [`pick`]'s.
pub(super) fn pick_preferring(prefer: Option<&str>, found: &[Iface]) -> Ipv4Addr {
    match prefer.and_then(|p| found.iter().find(|i| i.name == p && usable(i))) {
        Some(i) => i.ip,
        None => pick(None, found).unwrap_or(Ipv4Addr::LOCALHOST),
    }
}

/// Picks an address among `found` as [`select_address`] describes.
pub(super) fn pick(spec: Option<&str>, found: &[Iface]) -> Result<Ipv4Addr> {
    let virtual_name = |n: &str| ["docker", "veth", "virbr", "br-"].iter().any(|p| n.starts_with(p));
    let Some(spec) = spec else {
        return Ok(found
            .iter()
            .enumerate()
            .filter(|(_, i)| usable(i))
            .min_by_key(|&(k, i)| (virtual_name(&i.name), k))
            .map_or(Ipv4Addr::LOCALHOST, |(_, i)| i.ip));
    };
    let parsed = IfSpec::parse(spec)?;
    let best = if parsed.exclude {
        found
            .iter()
            .enumerate()
            .filter(|(_, i)| !parsed.matches(&i.name) && !i.ip.is_unspecified())
            .min_by_key(|&(k, i)| (i.ip.is_loopback(), !i.up, k))
    } else {
        found
            .iter()
            .enumerate()
            .filter(|(_, i)| parsed.matches(&i.name) && !i.ip.is_unspecified())
            .min_by_key(|&(k, i)| (!parsed.names_exactly(&i.name), !i.up, k))
    };
    best.map(|(_, i)| i.ip).ok_or_else(|| {
        Error::Config(format!(
            "{IFNAME_ENV}={spec:?} matches no interface with an IPv4 address; interfaces found: {}",
            describe(found)
        ))
    })
}
