//! Which address a rank is reached at, and which addresses it may listen on:
//! [`own_ip`] picks `COLLECTIX_ADDR`, else the address of the interface named by
//! `COLLECTIX_SOCKET_IFNAME` (Gloo's `GLOO_SOCKET_IFNAME`), else the local end of the route to
//! the store's host. Whether an address may be listened on without a secret is the
//! security policy's call ([`Security::check_bind`](crate::Security::check_bind)).

use collectix_runtime::{Error, Result};
use std::net::{IpAddr, ToSocketAddrs, UdpSocket};

/// The address this process is reached at by its peers, in order of preference:
/// `COLLECTIX_ADDR` (an address or a name, as given), the first address of the interface
/// named by `COLLECTIX_SOCKET_IFNAME` (IPv4 before IPv6), the local end of the route to the
/// store's host (no packet is sent), loopback.
pub(crate) fn own_ip(store_host: Option<&str>) -> Result<String> {
    own_ip_from(store_host, &|k| std::env::var(k).ok())
}

/// [`own_ip`] over any source of variables.
pub(crate) fn own_ip_from(
    store_host: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String> {
    if let Some(a) = env("COLLECTIX_ADDR").filter(|a| !a.trim().is_empty()) {
        return Ok(a.trim().to_string());
    }
    if let Some(name) = env("COLLECTIX_SOCKET_IFNAME").filter(|a| !a.trim().is_empty()) {
        return interface_ip(name.trim()).map(|ip| ip.to_string());
    }
    let route = store_host.and_then(|h| {
        let target = (h, 9).to_socket_addrs().ok()?.next()?;
        let bind = if target.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        };
        let s = UdpSocket::bind(bind).ok()?;
        s.connect(target).ok()?;
        s.local_addr().ok().map(|a| a.ip().to_string())
    });
    Ok(route.unwrap_or_else(|| "127.0.0.1".into()))
}

/// The address of the interface `name` (an IPv4 one if it has one; an IPv6 one that is not
/// link-local otherwise); an address given in its place is taken as it is.
pub(crate) fn interface_ip(name: &str) -> Result<IpAddr> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(ip);
    }
    let found = interface_addrs(name)?;
    let pick = found
        .iter()
        .find(|ip| ip.is_ipv4())
        .or_else(|| {
            found
                .iter()
                .find(|ip| matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) != 0xfe80))
        })
        .copied();
    pick.ok_or_else(|| {
        Error::invalid(format!(
            "interface {name:?} (COLLECTIX_SOCKET_IFNAME, or the builder's `interface`): no such interface with an address on this host{}",
            interface_names()
                .map(|n| format!(" (it has {})", n.join(", ")))
                .unwrap_or_default()
        ))
    })
}

#[cfg(unix)]
fn interface_addrs(name: &str) -> Result<Vec<IpAddr>> {
    let all = nix::ifaddrs::getifaddrs()
        .map_err(|e| Error::Resource(format!("cannot list the network interfaces: {e}")))?;
    Ok(all
        .filter(|i| i.interface_name == name)
        .filter_map(|i| {
            let a = i.address?;
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect())
}

#[cfg(unix)]
fn interface_names() -> Option<Vec<String>> {
    let mut names: Vec<String> = nix::ifaddrs::getifaddrs()
        .ok()?
        .map(|i| i.interface_name)
        .collect();
    names.sort();
    names.dedup();
    Some(names)
}

#[cfg(not(unix))]
fn interface_addrs(name: &str) -> Result<Vec<IpAddr>> {
    Err(Error::invalid(format!(
        "interface {name:?} (COLLECTIX_SOCKET_IFNAME, or the builder's `interface`): interface names are read on Unix only; give an address (COLLECTIX_ADDR)"
    )))
}

#[cfg(not(unix))]
fn interface_names() -> Option<Vec<String>> {
    None
}

/// The IP address of `host` (a name or an address), the first it resolves to.
pub(crate) fn resolve_ip(host: &str) -> Option<IpAddr> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = h.parse::<IpAddr>() {
        return Some(ip);
    }
    (h, 0).to_socket_addrs().ok()?.next().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::env;

    #[test]
    fn the_address_comes_from_collectix_addr_then_the_interface_then_the_route() {
        let e = env(&[
            ("COLLECTIX_ADDR", "node07"),
            ("COLLECTIX_SOCKET_IFNAME", "lo"),
        ]);
        assert_eq!(
            own_ip_from(Some("127.0.0.1"), &e).ok().as_deref(),
            Some("node07")
        );
        let e = env(&[("COLLECTIX_SOCKET_IFNAME", "lo")]);
        assert_eq!(
            own_ip_from(Some("192.0.2.1"), &e).ok().as_deref(),
            Some("127.0.0.1")
        );
        let e = env(&[("COLLECTIX_SOCKET_IFNAME", "192.0.2.9")]);
        assert_eq!(own_ip_from(None, &e).ok().as_deref(), Some("192.0.2.9"));
        let e = env(&[("COLLECTIX_SOCKET_IFNAME", "no-such-if0")]);
        let r = own_ip_from(None, &e);
        assert!(
            matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("no-such-if0") && m.contains("lo")),
            "{r:?}"
        );
        assert_eq!(
            own_ip_from(Some("127.0.0.1"), &env(&[])).ok().as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(
            own_ip_from(None, &env(&[])).ok().as_deref(),
            Some("127.0.0.1")
        );
    }
}
