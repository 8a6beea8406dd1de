//! Links and their addresses (read-only: podgate never creates interfaces).

use crate::error::{Error, ParseError, Result};
use crate::netlink::consts::NLM_F_DUMP;
use crate::netlink::msg::attr_string;
use crate::netlink::rtnl::*;
use crate::netlink::RouteSocket;
use ipnet::IpNet;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Link {
    pub index: u32,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Address {
    pub index: u32,
    pub addr: IpNet,
}

pub fn list(sock: &mut RouteSocket) -> Result<Vec<Link>> {
    sock.rows(
        RTM_GETLINK,
        NLM_F_DUMP,
        RTM_NEWLINK,
        "list links",
        |w| IfInfoMsg::default().write(w),
        link_of,
    )
}

/// One row of a link dump; a link without a name (never seen) is skipped.
pub(crate) fn link_of(payload: &[u8]) -> std::result::Result<Option<Link>, ParseError> {
    let (h, attrs) = IfInfoMsg::parse(payload)?;
    Ok(attrs.get(IFLA_IFNAME).map(|n| Link {
        index: h.index,
        name: attr_string(n),
    }))
}

/// Interface index by name, or `NoSuchLink`.
pub fn index_of(sock: &mut RouteSocket, name: &str) -> Result<u32> {
    let found = sock.rows(
        RTM_GETLINK,
        0,
        RTM_NEWLINK,
        &format!("look up link {name}"),
        |w| {
            IfInfoMsg::default().write(w);
            w.attr_str(IFLA_IFNAME, name);
        },
        |payload| IfInfoMsg::parse(payload).map(|(h, _)| Some(h.index)),
    );
    match found {
        Ok(rows) => rows
            .first()
            .copied()
            .ok_or_else(|| Error::NoSuchLink(name.to_string())),
        Err(e) if e.is_not_found() => Err(Error::NoSuchLink(name.to_string())),
        Err(e) => Err(e),
    }
}

pub fn name_of(links: &[Link], index: u32) -> Option<&str> {
    links
        .iter()
        .find(|l| l.index == index)
        .map(|l| l.name.as_str())
}

/// Every address on every interface (both families).
pub fn addresses(sock: &mut RouteSocket) -> Result<Vec<Address>> {
    dump_addresses(sock, IfAddrMsg::default())
}

/// Every address of one family on every interface: the kernel walks only
/// that family's per-interface lists (a node with hundreds of pod
/// interfaces has an IPv6 list on each even when it holds no address).
pub fn addresses_of(sock: &mut RouteSocket, v6: bool) -> Result<Vec<Address>> {
    dump_addresses(
        sock,
        IfAddrMsg {
            family: family_of(v6),
            ..IfAddrMsg::default()
        },
    )
}

fn dump_addresses(sock: &mut RouteSocket, header: IfAddrMsg) -> Result<Vec<Address>> {
    sock.rows(
        RTM_GETADDR,
        NLM_F_DUMP,
        RTM_NEWADDR,
        "list addresses",
        |w| header.write(w),
        address_of,
    )
}

/// One row of an address dump: IFA_LOCAL (the interface's own address on a
/// point-to-point link, where IFA_ADDRESS is the peer), else IFA_ADDRESS.
/// A row with neither, or a prefix length its address cannot have, is
/// skipped.
pub(crate) fn address_of(payload: &[u8]) -> std::result::Result<Option<Address>, ParseError> {
    let (h, attrs) = IfAddrMsg::parse(payload)?;
    let local = opt(&attrs, IFA_LOCAL, |b| any_addr_of(b, "IFA_LOCAL"))?;
    let address = opt(&attrs, IFA_ADDRESS, |b| any_addr_of(b, "IFA_ADDRESS"))?;
    Ok(local.or(address).and_then(|ip| {
        Some(Address {
            index: h.index,
            addr: IpNet::new(ip, h.prefix_len).ok()?,
        })
    }))
}
