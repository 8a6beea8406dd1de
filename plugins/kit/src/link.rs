//! Links and their addresses (read-only: podgate never creates interfaces).

use crate::error::{Error, Result};
use crate::netlink::RouteSocket;
use ipnet::IpNet;
use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
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
    let rows = sock.request(
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
        NLM_F_DUMP,
        "list links",
    )?;
    Ok(rows
        .iter()
        .filter_map(|r| match r {
            RouteNetlinkMessage::NewLink(m) => {
                let name = m.attributes.iter().find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n.clone()),
                    _ => None,
                })?;
                Some(Link {
                    index: m.header.index,
                    name,
                })
            }
            _ => None,
        })
        .collect())
}

/// Interface index by name, or `NoSuchLink`.
pub fn index_of(sock: &mut RouteSocket, name: &str) -> Result<u32> {
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(name.to_string()));
    match sock.request(
        RouteNetlinkMessage::GetLink(m),
        0,
        &format!("look up link {name}"),
    ) {
        Ok(rows) => rows
            .iter()
            .find_map(|r| match r {
                RouteNetlinkMessage::NewLink(m) => Some(m.header.index),
                _ => None,
            })
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
    let rows = sock.request(
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        NLM_F_DUMP,
        "list addresses",
    )?;
    Ok(rows
        .iter()
        .filter_map(|r| match r {
            RouteNetlinkMessage::NewAddress(m) => {
                let ip = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Local(ip) => Some(*ip),
                    _ => None,
                });
                let ip = ip.or_else(|| {
                    m.attributes.iter().find_map(|a| match a {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    })
                })?;
                Some(Address {
                    index: m.header.index,
                    addr: IpNet::new(ip, m.header.prefix_len).ok()?,
                })
            }
            _ => None,
        })
        .collect())
}
