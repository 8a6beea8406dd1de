//! Routes as the helper shows them (`podgate route list`, `inspect`, the
//! report, diagnosis facts): one row type, one `ip route`-style line.

use crate::names;
use ipnet::IpNet;
use podgate_kit::link::{self, Link};
use podgate_kit::route::{RouteEntry, TABLE_MAIN};
use serde::Serialize;
use std::net::IpAddr;

/// A route for display and JSON.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRow {
    pub family: &'static str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub dst: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    pub table: u32,
    pub table_name: String,
    pub protocol: u8,
    pub protocol_name: String,
    pub scope: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefsrc: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
}

pub fn dev_name(links: &[Link], oif: Option<u32>) -> Option<String> {
    oif.map(|i| {
        link::name_of(links, i)
            .map(str::to_string)
            .unwrap_or_else(|| format!("if{i}"))
    })
}

fn dst_text(dst: &IpNet) -> String {
    if dst.prefix_len() == 0 {
        "default".into()
    } else if dst.prefix_len() == dst.max_prefix_len() {
        dst.addr().to_string()
    } else {
        dst.to_string()
    }
}

pub fn row_of(e: &RouteEntry, links: &[Link]) -> RouteRow {
    RouteRow {
        family: if e.dst.addr().is_ipv4() {
            "ipv4"
        } else {
            "ipv6"
        },
        kind: names::type_name(e.kind),
        dst: dst_text(&e.dst),
        gateway: e.gateway,
        dev: dev_name(links, e.oif),
        table: e.table,
        table_name: names::table_name(e.table),
        protocol: e.protocol,
        protocol_name: names::proto_name(e.protocol),
        scope: names::scope_name(e.scope),
        prefsrc: e.prefsrc,
        metric: e.metric,
    }
}

impl RouteRow {
    /// One line as `ip route` prints it (table and proto always named).
    pub fn line(&self) -> String {
        let mut s = String::new();
        if self.kind != "unicast" {
            s += self.kind;
            s += " ";
        }
        s += &self.dst;
        if let Some(g) = self.gateway {
            s += &format!(" via {g}");
        }
        if let Some(d) = &self.dev {
            s += &format!(" dev {d}");
        }
        if self.table != TABLE_MAIN {
            s += &format!(" table {}", self.table_name);
        }
        if self.protocol != 0 {
            s += &format!(" proto {}", self.protocol_name);
        }
        if self.scope != "global" {
            s += &format!(" scope {}", self.scope);
        }
        if let Some(p) = self.prefsrc {
            s += &format!(" src {p}");
        }
        if let Some(m) = self.metric {
            s += &format!(" metric {m}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_like_ip() {
        let links = vec![Link {
            index: 2,
            name: "eth0".into(),
        }];
        let e = RouteEntry {
            dst: "0.0.0.0/0".parse().unwrap(),
            gateway: Some("10.22.0.1".parse().unwrap()),
            oif: Some(2),
            table: 254,
            protocol: 4,
            metric: None,
            scope: 0,
            kind: 1,
            prefsrc: None,
        };
        assert_eq!(
            row_of(&e, &links).line(),
            "default via 10.22.0.1 dev eth0 proto static"
        );
        let l = RouteEntry {
            dst: "10.22.0.5/32".parse().unwrap(),
            gateway: None,
            oif: Some(2),
            table: 255,
            protocol: 2,
            metric: None,
            scope: 254,
            kind: 2,
            prefsrc: Some("10.22.0.5".parse().unwrap()),
        };
        assert_eq!(
            row_of(&l, &links).line(),
            "local 10.22.0.5 dev eth0 table local proto kernel scope host src 10.22.0.5"
        );
        let p = RouteEntry {
            dst: "10.8.0.0/24".parse().unwrap(),
            protocol: 94,
            oif: Some(9),
            ..l.clone()
        };
        let r = row_of(&p, &links);
        assert!(r.line().contains("dev if9"), "{}", r.line());
        assert_eq!(r.protocol_name, "podgate");
    }
}
