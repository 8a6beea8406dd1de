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
        kind: e.route_type().name(),
        dst: dst_text(&e.dst),
        gateway: e.gateway,
        dev: dev_name(links, e.oif),
        table: e.table,
        table_name: names::table_name(e.table),
        protocol: e.protocol,
        protocol_name: e.route_protocol().to_string(),
        scope: e.route_scope().to_string(),
        prefsrc: e.prefsrc,
        metric: e.metric,
    }
}

impl RouteRow {
    /// One line as `ip route` prints it (table and proto always named).
    pub fn line(&self) -> String {
        RouteText {
            kind: (self.kind != "unicast").then_some(self.kind),
            dst: self.dst.clone(),
            gateway: self.gateway,
            dev: self.dev.as_deref(),
            table: (self.table != TABLE_MAIN).then(|| self.table_name.clone()),
            proto: (self.protocol != 0).then(|| self.protocol_name.clone()),
            scope: (self.scope != "global").then_some(self.scope.as_str()),
            src: self.prefsrc,
            metric: self.metric,
            ..RouteText::default()
        }
        .to_string()
    }
}

/// The parts of an `ip route`-style line; each present part is printed in
/// `ip`'s order (`[type] DST via GW dev DEV onlink table T proto P scope S
/// src A metric M`). Every route the helper prints goes through it.
#[derive(Debug, Default)]
pub struct RouteText<'a> {
    pub kind: Option<&'a str>,
    pub dst: String,
    pub gateway: Option<IpAddr>,
    pub dev: Option<&'a str>,
    pub onlink: bool,
    pub table: Option<String>,
    pub proto: Option<String>,
    pub scope: Option<&'a str>,
    pub src: Option<IpAddr>,
    pub metric: Option<u32>,
}

impl std::fmt::Display for RouteText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(k) = self.kind {
            write!(f, "{k} ")?;
        }
        f.write_str(&self.dst)?;
        if let Some(g) = self.gateway {
            write!(f, " via {g}")?;
        }
        if let Some(d) = self.dev {
            write!(f, " dev {d}")?;
        }
        if self.onlink {
            f.write_str(" onlink")?;
        }
        if let Some(t) = &self.table {
            write!(f, " table {t}")?;
        }
        if let Some(p) = &self.proto {
            write!(f, " proto {p}")?;
        }
        if let Some(s) = self.scope {
            write!(f, " scope {s}")?;
        }
        if let Some(p) = self.src {
            write!(f, " src {p}")?;
        }
        if let Some(m) = self.metric {
            write!(f, " metric {m}")?;
        }
        Ok(())
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
            multipath: Vec::new(),
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
            multipath: Vec::new(),
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

    #[test]
    fn route_text_keeps_ips_order_and_prints_only_what_is_there() {
        let t = RouteText {
            dst: "10.8.0.0/24".into(),
            gateway: Some("10.22.0.5".parse().unwrap()),
            dev: Some("eth0"),
            onlink: true,
            proto: Some("podgate".into()),
            ..RouteText::default()
        };
        assert_eq!(
            t.to_string(),
            "10.8.0.0/24 via 10.22.0.5 dev eth0 onlink proto podgate"
        );
        let bare = RouteText {
            dst: "default".into(),
            ..RouteText::default()
        };
        assert_eq!(bare.to_string(), "default");
    }
}
