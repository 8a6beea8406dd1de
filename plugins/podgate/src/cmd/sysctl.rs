//! `podgate sysctl get|set|diff`: namespaced `net.*` sysctls inside the
//! selected netns (read and written on a thread that joined it).

use crate::error::{Error, Found, Result};
use crate::output::{self, Table};
use crate::select::{ChangeArgs, Target};
use clap::Subcommand;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_kit::{link, sysctl};
use serde::Serialize;

#[derive(Debug, Clone, Subcommand)]
pub enum SysctlCmd {
    /// Read sysctls inside the netns: `podgate sysctl get --pid 4242 net.ipv4.ip_forward`.
    Get {
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
    /// Write sysctls inside the netns (read first; unchanged values are not rewritten):
    /// `podgate sysctl set --netns /var/run/netns/vpn net.ipv4.ip_forward=1`
    /// (the node's own: `--node`). Only names every network namespace has a
    /// copy of its own.
    Set {
        #[command(flatten)]
        change: ChangeArgs,
        #[arg(required = true, value_name = "NAME=VALUE")]
        pairs: Vec<String>,
    },
    /// The routing-relevant sysctls of the netns next to the node's: forwarding
    /// (ipv4, ipv6 all), rp_filter (all, default, each interface),
    /// src_valid_mark, tcp/udp early demux.
    Diff,
}

/// Refuse anything that is not a namespaced `net.*` name, before touching anything.
fn check_name(name: &str) -> Result<()> {
    sysctl::path_of(name).map(|_| ()).map_err(|e| {
        Error::Refused(format!(
            "{e} (podgate reads and writes only net.* sysctls, which every network namespace has its own copy of; \
             a node-wide setting belongs to the node's own configuration)"
        ))
    })
}

/// Refuse a name that is not per network namespace, before touching
/// anything: `net.*` also holds knobs only the node's namespace has, whose
/// value is the whole machine's (`net.core.bpf_jit_harden`,
/// `net.core.rmem_max`, `net.ipv4.neigh.default.gc_thresh3`, conntrack's
/// table size). The test is the kernel's own: a namespace made for the
/// purpose, on a thread of its own, has a writable copy of every
/// per-namespace knob and of no other (those of the node alone are absent
/// or read-only there). An interface's knobs are looked up on `lo`, which
/// every namespace has.
fn check_per_netns(name: &str) -> Result<()> {
    let path = sysctl::path_of(&on_lo(name))?;
    let refused = |why: &str| {
        Error::Refused(format!(
            "{name} is not per network namespace ({why}): its value is the whole machine's, and podgate \
             sets only sysctls every network namespace has a copy of; a node-wide setting belongs to the \
             node's own configuration"
        ))
    };
    let seen = std::thread::spawn(move || -> std::io::Result<Option<bool>> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
        match std::fs::metadata(&path) {
            Ok(m) => Ok(Some(
                std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o222 != 0,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    })
    .join()
    .map_err(|_| {
        Error::msg(format!(
            "{name}: the check in a new network namespace panicked"
        ))
    })?
    .map_err(|source| Error::SysctlProbe {
        name: name.into(),
        source,
    })?;
    match seen {
        Some(true) => Ok(()),
        Some(false) => Err(refused("a new network namespace has it read-only")),
        None => Err(refused("a new network namespace has no copy of it")),
    }
}

/// `name` with the interface of `net.<family>.conf.<if>.*` or
/// `net.<family>.neigh.<if>.*` replaced by `lo`.
fn on_lo(name: &str) -> String {
    let mut seg: Vec<&str> = name.split('.').collect();
    if let [_net, _family, kind, dev, _knob, ..] = seg.as_mut_slice() {
        if matches!(*kind, "conf" | "neigh") && !matches!(*dev, "all" | "default") {
            *dev = "lo";
        }
    }
    seg.join(".")
}

#[derive(Debug, Serialize)]
struct Value {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Change {
    name: String,
    value: String,
    /// The value before, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    previous: Option<String>,
    changed: bool,
    /// `--dry-run`: `changed` says what a run would change; nothing was.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dry_run: bool,
}

pub fn run(cmd: &SysctlCmd, target: &Target, json: bool) -> Result<Found> {
    match cmd {
        SysctlCmd::Get { names } => get(names, target, json),
        SysctlCmd::Set { change, pairs } => set(pairs, change.dry_run, target, json),
        SysctlCmd::Diff => diff(target, json),
    }
}

fn read_all(ns: &NetNs, names: &[String]) -> Result<Vec<Value>> {
    let owned: Vec<String> = names.to_vec();
    Ok(ns.run(move || {
        owned
            .iter()
            .map(|n| match sysctl::read(n) {
                Ok(v) => Value {
                    name: n.clone(),
                    value: Some(v),
                    error: None,
                },
                Err(e) => Value {
                    name: n.clone(),
                    value: None,
                    error: Some(if e.is_not_found() {
                        "no such sysctl in this netns".to_string()
                    } else {
                        e.to_string()
                    }),
                },
            })
            .collect()
    })?)
}

fn get(names: &[String], target: &Target, json: bool) -> Result<Found> {
    for n in names {
        check_name(n)?;
    }
    let sel = target.select()?;
    let values = read_all(&sel.ns, names)?;
    if json {
        output::json(&values)?;
    } else {
        let mut s = String::new();
        for v in &values {
            match (&v.value, &v.error) {
                (Some(val), _) => s += &format!("{} = {val}\n", v.name),
                (None, Some(e)) => s += &format!("{}: {e}\n", v.name),
                _ => {}
            }
        }
        output::text(s)?;
    }
    match values.iter().find(|v| v.error.is_some()) {
        Some(v) => Err(Error::msg(format!(
            "sysctl {}: {}",
            v.name,
            v.error.as_deref().unwrap_or("")
        ))),
        None => Ok(Found::Ok),
    }
}

fn parse_pair(p: &str) -> Result<(String, String)> {
    let (n, v) = p
        .split_once('=')
        .ok_or_else(|| Error::usage(format!("{p:?}: expected NAME=VALUE")))?;
    let (n, v) = (n.trim(), v.trim());
    if v.is_empty() {
        return Err(Error::usage(format!("{p:?}: empty value")));
    }
    Ok((n.to_string(), v.to_string()))
}

fn set(pairs: &[String], dry_run: bool, target: &Target, json: bool) -> Result<Found> {
    let wanted: Vec<(String, String)> =
        pairs.iter().map(|p| parse_pair(p)).collect::<Result<_>>()?;
    for (n, _) in &wanted {
        check_name(n)?;
    }
    let sel = target.select_to_change("sysctl set")?;
    for (n, _) in &wanted {
        check_per_netns(n)?;
    }
    let w = wanted.clone();
    let (changes, failure) = sel.ns.run(move || {
        let mut done = Vec::new();
        for (name, value) in &w {
            let outcome = if dry_run {
                sysctl::read(name)
                    .map(|now| (sysctl::normalize(&now) != sysctl::normalize(value)).then_some(now))
            } else {
                sysctl::ensure(name, value)
            };
            match outcome {
                Ok(previous) => done.push(Change {
                    name: name.clone(),
                    value: value.clone(),
                    changed: previous.is_some(),
                    previous,
                    dry_run,
                }),
                Err(e) => return (done, Some(e)),
            }
        }
        (done, None)
    })?;
    if json {
        output::json(&changes)?;
    } else {
        let mut s = String::new();
        let would = if dry_run { "would change: " } else { "" };
        for c in &changes {
            match &c.previous {
                Some(p) => {
                    s += &format!(
                        "{would}{}: {p} -> {} ({})\n",
                        c.name,
                        c.value,
                        sel.chosen.label()
                    )
                }
                None => s += &format!("{} = {} (unchanged)\n", c.name, c.value),
            }
        }
        output::text(s)?;
    }
    match failure {
        Some(e) if e.is_not_found() => Err(Error::NoSuchSysctl(e)),
        Some(e) => Err(e.into()),
        None => Ok(Found::Ok),
    }
}

/// The names compared by `diff`, for a netns with these interfaces.
pub fn diff_names(ifaces: &[String]) -> Vec<String> {
    let mut v: Vec<String> = [
        "net.ipv4.ip_forward",
        "net.ipv6.conf.all.forwarding",
        "net.ipv4.conf.all.rp_filter",
        "net.ipv4.conf.default.rp_filter",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for i in ifaces {
        v.push(format!("net.ipv4.conf.{i}.rp_filter"));
    }
    for s in [
        "net.ipv4.conf.all.src_valid_mark",
        "net.ipv4.tcp_early_demux",
        "net.ipv4.udp_early_demux",
    ] {
        v.push(s.to_string());
    }
    v
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DiffRow {
    name: String,
    pod: Option<String>,
    node: Option<String>,
    differs: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Diff {
    netns: crate::select::Chosen,
    node: String,
    rows: Vec<DiffRow>,
}

fn diff(target: &Target, json: bool) -> Result<Found> {
    let sel = target.select()?;
    let (node_ns, node_label) = target.node()?;
    let mut sock = RouteSocket::in_netns(&sel.ns)?;
    let ifaces: Vec<String> = link::list(&mut sock)?
        .into_iter()
        .map(|l| l.name)
        .filter(|n| n != "lo" && sysctl::path_of(&format!("net.ipv4.conf.{n}.rp_filter")).is_ok())
        .collect();
    let names = diff_names(&ifaces);
    let pod = read_all(&sel.ns, &names)?;
    let node = read_all(&node_ns, &names)?;
    let rows: Vec<DiffRow> = pod
        .into_iter()
        .zip(node)
        .map(|(p, n)| DiffRow {
            differs: p.value.is_some() && n.value.is_some() && p.value != n.value,
            name: p.name,
            pod: p.value,
            node: n.value,
        })
        .collect();
    if json {
        output::json(&Diff {
            netns: sel.chosen.clone(),
            node: node_label,
            rows,
        })?;
        return Ok(Found::Ok);
    }
    let mut t = Table::new(&["SYSCTL", "POD", "NODE", ""]);
    for r in &rows {
        t.row([
            r.name.clone(),
            r.pod.clone().unwrap_or_else(|| "-".into()),
            r.node.clone().unwrap_or_else(|| "-".into()),
            if r.differs {
                "<- differs".into()
            } else {
                String::new()
            },
        ]);
    }
    output::text(format!(
        "pod:  {}\nnode: {node_label}\n\n{t}",
        sel.chosen.label()
    ))?;
    Ok(Found::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_wide_names_are_refused() {
        for n in [
            "kernel.pid_max",
            "vm.swappiness",
            "fs.file-max",
            "net/../kernel",
        ] {
            assert!(matches!(check_name(n), Err(Error::Refused(_))), "{n}");
        }
        assert!(check_name("net.ipv4.conf.eth0.rp_filter").is_ok());
    }

    #[test]
    fn a_pair_is_name_equals_value() {
        assert_eq!(
            parse_pair("net.ipv4.ip_forward=1").unwrap(),
            ("net.ipv4.ip_forward".into(), "1".into())
        );
    }

    #[test]
    fn a_pair_without_a_value_is_refused() {
        assert!(parse_pair("net.ipv4.ip_forward").is_err());
        assert!(parse_pair("net.ipv4.ip_forward=").is_err());
    }

    #[test]
    fn diff_names_cover_each_interface() {
        let n = diff_names(&["eth0".into(), "tun0".into()]);
        assert!(n.contains(&"net.ipv4.conf.tun0.rp_filter".to_string()));
        assert_eq!(n.first().map(String::as_str), Some("net.ipv4.ip_forward"));
    }
}
