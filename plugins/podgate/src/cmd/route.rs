//! `podgate route list|add|del` inside the selected netns, `ip route` style.

use crate::error::{Error, Found, Result};
use crate::ipargs::{self, RouteArgs, Selector, Spec};
use crate::output;
use crate::routes::{row_of, RouteRow};
use crate::select::{ChangeArgs, Target};
use clap::Subcommand;
use podgate_kit::link;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::route::{self, RouteEntry, RouteProtocol, RouteSpec, TABLE_MAIN};

#[derive(Debug, Clone, Subcommand)]
pub enum RouteCmd {
    /// List routes (default: table main, both families):
    /// `podgate route list --netns /var/run/netns/vpn [table all|main|local|N] [dev IF] [proto P] [PREFIX]`.
    #[command(visible_aliases = ["show", "ls"])]
    List(Selector),
    /// Add a route: `podgate route add --netns ... 10.8.0.0/24 via 10.22.0.5 [dev eth0] [table T] [metric N] [proto P] [onlink]`
    /// (the node's own routes: `--node`).
    Add {
        /// Replace a route with the same key instead of failing (`ip route replace`).
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        change: ChangeArgs,
        #[command(flatten)]
        route: Spec,
    },
    /// Delete a route: `podgate route del --netns ... 10.8.0.0/24 [via GW] [dev IF] [table T]`
    /// (the node's own routes: `--node`).
    #[command(visible_alias = "delete")]
    Del {
        #[command(flatten)]
        change: ChangeArgs,
        #[command(flatten)]
        route: Spec,
    },
}

pub fn run(cmd: &RouteCmd, target: &Target, json: bool) -> Result<Found> {
    match cmd {
        RouteCmd::List(Selector { family, args }) => {
            let a = ipargs::parse_route(args, true).map_err(Error::Usage)?;
            let sel = target.select()?;
            let mut sock = RouteSocket::in_netns(&sel.ns)?;
            list(&mut sock, a.family.or(family.flag()), &a, json)
        }
        RouteCmd::Add {
            replace,
            change,
            route: Spec { family, args },
        } => {
            let a = ipargs::parse_route(args, false).map_err(Error::Usage)?;
            let sel = target.select_to_change("route add")?;
            let mut sock = RouteSocket::in_netns(&sel.ns)?;
            let spec = spec_of(&mut sock, &a, family.flag(), true)?;
            if change.dry_run {
                return report("would add", &mut sock, &spec, &sel.chosen.label(), json);
            }
            route::add(&mut sock, &spec, *replace)?;
            report("added", &mut sock, &spec, &sel.chosen.label(), json)
        }
        RouteCmd::Del {
            change,
            route: Spec { family, args },
        } => {
            let a = ipargs::parse_route(args, false).map_err(Error::Usage)?;
            let sel = target.select_to_change("route del")?;
            let mut sock = RouteSocket::in_netns(&sel.ns)?;
            let spec = spec_of(&mut sock, &a, family.flag(), false)?;
            let missing = || {
                Error::msg(format!(
                    "no route {} in {}",
                    spec.describe(),
                    sel.chosen.label()
                ))
            };
            if change.dry_run {
                let listed = route::list(&mut sock, spec.dst.addr().is_ipv6())?;
                let found = RouteSpec::from(&first_deleted(listed, &spec).ok_or_else(missing)?);
                return report("would delete", &mut sock, &found, &sel.chosen.label(), json);
            }
            if !route::del(&mut sock, &spec)? {
                return Err(missing());
            }
            report("deleted", &mut sock, &spec, &sel.chosen.label(), json)
        }
    }
}

/// The route a delete of `spec` takes, as the kernel picks it: the first
/// with its prefix and table and, where given, its gateway, interface,
/// metric and protocol.
fn first_deleted(mut listed: Vec<RouteEntry>, spec: &RouteSpec) -> Option<RouteEntry> {
    listed.retain(|e| {
        spec.metric.is_none_or(|m| e.metric == Some(m))
            && (spec.protocol == RouteProtocol::UNSPEC.0 || e.protocol == spec.protocol)
    });
    route::find(&listed, spec).cloned()
}

fn spec_of(
    sock: &mut RouteSocket,
    a: &RouteArgs,
    flag: Option<bool>,
    add: bool,
) -> Result<RouteSpec> {
    let v6 = a.v6(flag).map_err(Error::Usage)?;
    let dst = a
        .dst
        .map(|d| d.resolve(v6))
        .ok_or_else(|| Error::usage("which prefix?"))?;
    if add && a.via.is_none() && a.dev.is_none() {
        return Err(Error::usage(format!(
            "route {dst}: give `via GATEWAY` and/or `dev IFNAME`"
        )));
    }
    let mut spec = RouteSpec::new(dst);
    spec.gateway = a.via;
    spec.oif = match &a.dev {
        Some(d) => Some(link::index_of(sock, d)?),
        None => None,
    };
    spec.table = a.table.unwrap_or(TABLE_MAIN);
    spec.metric = a.metric;
    spec.onlink = a.onlink;
    spec.link_scope = a.scope_link || (a.via.is_none() && a.dev.is_some());
    // Add tags like `ip route add` (boot) unless told; delete matches any proto.
    spec.protocol = a.proto.unwrap_or(if add {
        RouteProtocol::BOOT.0
    } else {
        RouteProtocol::UNSPEC.0
    });
    Ok(spec)
}

fn report(
    what: &str,
    sock: &mut RouteSocket,
    spec: &RouteSpec,
    ns: &str,
    json: bool,
) -> Result<Found> {
    let links = link::list(sock)?;
    let row = row_of(&RouteEntry::from(spec), &links);
    if json {
        output::json(&serde_json::json!({ "action": what, "route": row }))?;
    } else {
        output::text(format!("{what}: {} ({ns})\n", row.line()))?;
    }
    Ok(Found::Ok)
}

fn list(sock: &mut RouteSocket, flag: Option<bool>, a: &RouteArgs, json: bool) -> Result<Found> {
    let links = link::list(sock)?;
    let mut entries = Vec::new();
    if flag != Some(true) {
        entries.extend(route::list(sock, false)?);
    }
    if flag != Some(false) {
        entries.extend(route::list(sock, true)?);
    }
    let table = a.table.unwrap_or(TABLE_MAIN);
    let oif = match &a.dev {
        Some(d) => Some(link::index_of(sock, d)?),
        None => None,
    };
    let v6 = a.dst.and_then(|d| d.v6()).or(flag);
    let dst = a.dst.map(|d| d.resolve(v6.unwrap_or(false)));
    let rows: Vec<RouteRow> = entries
        .iter()
        .filter(|e| table == 0 || e.table == table)
        .filter(|e| oif.is_none() || e.oif == oif)
        .filter(|e| a.proto.is_none_or(|p| e.protocol == p))
        .filter(|e| a.via.is_none() || e.gateway == a.via)
        .filter(|e| dst.is_none_or(|d| e.dst == d.trunc()))
        .map(|e| row_of(e, &links))
        .collect();
    if json {
        output::json(&rows)?;
    } else {
        let mut s = String::new();
        for r in &rows {
            s += &r.line();
            s.push('\n');
        }
        output::text(s)?;
    }
    Ok(Found::Ok)
}
