//! `podgate diagnose`: checks, then probes from the inside out, stopping at
//! the first broken hop (see `diagnose::verdict` for the reasoning).

use crate::diagnose;
use crate::diagnose::facts::{self, Facts};
use crate::diagnose::verdict::{self, Diagnosis};
use crate::diagnose::{ProbeRun, Role, Target as Hop};
use crate::error::{Error, Found, Result};
use crate::output::{self, Table};
use crate::probe::dns;
use crate::progress::Progress;
use crate::select::{Chosen, Target};
use clap::Args;
use ipnet::IpNet;
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub struct DiagnoseArgs {
    /// The tunnel's far end (first hop; e.g. the client's tunnel address 10.8.0.2).
    #[arg(long, value_name = "IP")]
    pub peer: Option<IpAddr>,
    /// Another pod's address (second hop).
    #[arg(long, value_name = "IP[:PORT]")]
    pub pod: Option<String>,
    /// A Service VIP; with :PORT a TCP connect (ClusterIPs often ignore ping).
    #[arg(long, value_name = "IP[:PORT]")]
    pub service: Option<String>,
    /// A public address (last hop).
    #[arg(long, value_name = "IP[:PORT]")]
    pub public: Option<String>,
    /// Resolve this name (A record) over UDP, after the IP hops.
    #[arg(long, value_name = "NAME")]
    pub dns: Option<String>,
    /// Nameserver for --dns (default: the pod's resolv.conf with --pid, else the node's).
    #[arg(long, value_name = "IP")]
    pub dns_server: Option<IpAddr>,
    /// VPN client pool the pod forwards for (repeatable); with --container also
    /// taken from podgate's record (masquerade and return-route pools).
    #[arg(long = "pool", value_name = "CIDR")]
    pub pools: Vec<IpNet>,
    /// Also probe transit hops from this source address (e.g. the pod's tunnel
    /// address 10.8.0.1): replies must then find their way back like a client's.
    #[arg(long, value_name = "IP")]
    pub from: Option<IpAddr>,
    /// The node's CNI config dir: its first config names the primary, whose
    /// anti-spoofing is checked for pools routed back to the pod.
    #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// Per-probe timeout.
    #[arg(long, value_name = "MS", default_value_t = 1500, value_parser = clap::value_parser!(u64).range(100..=10000))]
    pub timeout_ms: u64,
}

/// `IP`, `IP:PORT` or `[IPv6]:PORT`.
pub fn parse_endpoint(s: &str) -> Result<(IpAddr, Option<u16>)> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok((sa.ip(), Some(sa.port())));
    }
    s.parse::<IpAddr>()
        .map(|ip| (ip, None))
        .map_err(|_| Error::usage(format!("{s:?}: expected IP, IP:PORT or [IPv6]:PORT")))
}

fn hop(role: Role, s: &str) -> Result<Hop> {
    let (addr, port) = parse_endpoint(s)?;
    Ok(Hop {
        role,
        addr,
        port,
        name: None,
    })
}

/// Where the DNS server came from, for the header.
fn dns_server(a: &DiagnoseArgs, pid: Option<u32>) -> Result<(IpAddr, String)> {
    if let Some(s) = a.dns_server {
        return Ok((s, "--dns-server".into()));
    }
    let mut candidates = Vec::new();
    if let Some(p) = pid {
        candidates.push(PathBuf::from(format!("/proc/{p}/root/etc/resolv.conf")));
    }
    candidates.push(PathBuf::from("/etc/resolv.conf"));
    for c in candidates {
        let pods = pid.is_some() && c.starts_with("/proc");
        // The pod's file is the pod's: a link there is not followed.
        let found = dns::nameserver_in(&c, !pods).map_err(|e| {
            Error::usage(format!("--dns: {}: {e}; pass --dns-server IP", c.display()))
        })?;
        if let Some(ip) = found {
            let note = if pods {
                format!("{} (the pod's)", c.display())
            } else {
                format!(
                    "{} (the node's: pass --dns-server or --pid for the pod's)",
                    c.display()
                )
            };
            return Ok((ip, note));
        }
    }
    Err(Error::usage(
        "--dns: no nameserver found; pass --dns-server IP",
    ))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report<'a> {
    netns: &'a Chosen,
    node: &'a str,
    pools: &'a [IpNet],
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dns_server: Option<&'a str>,
    facts: &'a Facts,
    #[serde(flatten)]
    diagnosis: &'a Diagnosis,
    probes: &'a [ProbeRun],
}

pub fn run(a: &DiagnoseArgs, target: &Target, json: bool) -> Result<Found> {
    let sel = target.select()?;
    let (node_ns, node_label) = target.node()?;
    let mut pools: Vec<IpNet> = a.pools.iter().map(IpNet::trunc).collect();
    for r in &sel.records {
        let from_rec = r
            .masquerade
            .iter()
            .map(|m| m.source)
            .chain(r.node_routes.iter().map(|n| n.dst));
        pools.extend(from_rec.map(|p| p.trunc()));
    }
    pools.sort();
    pools.dedup();

    let mut targets = Vec::new();
    if let Some(p) = a.peer {
        targets.push(Hop {
            role: Role::Peer,
            addr: p,
            port: None,
            name: None,
        });
    }
    for (role, v) in [
        (Role::Pod, &a.pod),
        (Role::Service, &a.service),
        (Role::Public, &a.public),
    ] {
        if let Some(s) = v {
            targets.push(hop(role, s)?);
        }
    }
    let mut dns_note = None;
    if let Some(name) = &a.dns {
        let (server, note) = dns_server(a, sel.pid)?;
        dns::query(0, name, dns::TYPE_A).map_err(Error::Usage)?;
        dns_note = Some(format!("{server} from {note}"));
        targets.push(Hop {
            role: Role::Dns,
            addr: server,
            port: Some(53),
            name: Some(name.clone()),
        });
    }

    let mut progress = Progress::new();
    progress.step(&format!("reading {} ...", sel.chosen.label()));
    let pod_targets: Vec<IpAddr> = targets
        .iter()
        .filter(|t| t.role == Role::Pod)
        .map(|t| t.addr)
        .collect();
    let facts = facts::gather(
        &sel.ns,
        &node_ns,
        &pools,
        a.from,
        &pod_targets,
        &a.cni_conf_dir,
    )?;
    if let Some(f) = a.from {
        if !facts.pod_addrs.iter().any(|n| n.addr() == f) {
            let have: Vec<String> = facts
                .pod_addrs
                .iter()
                .map(|n| n.addr().to_string())
                .collect();
            return Err(Error::usage(format!(
                "--from {f} is not an address of {} (it has {})",
                sel.chosen.label(),
                have.join(", ")
            )));
        }
    }

    let timeout = Duration::from_millis(a.timeout_ms);
    let runs = diagnose::probes::probe_hops(&sel.ns, &facts, &targets, a.from, timeout, &mut |m| {
        progress.step(m)
    });
    progress.done();
    let d = verdict::judge(&facts, &targets, &runs);
    if json {
        output::json(&Report {
            netns: &sel.chosen,
            node: &node_label,
            pools: &pools,
            from: a.from,
            dns_server: dns_note.as_deref(),
            facts: &facts,
            diagnosis: &d,
            probes: &runs,
        })?;
    } else {
        output::text(render(
            &sel.chosen.label(),
            &node_label,
            &pools,
            a.from,
            dns_note.as_deref(),
            &d,
        ))?;
    }
    Ok(Found::problem_if(!d.verdict.ok))
}

pub fn render(
    ns: &str,
    node: &str,
    pools: &[IpNet],
    from: Option<IpAddr>,
    dns_note: Option<&str>,
    d: &Diagnosis,
) -> String {
    let mut s = format!("podgate diagnose: {ns}\n");
    s += &format!("node:  {node}\n");
    let pools_text = if pools.is_empty() {
        "none".to_string()
    } else {
        pools
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    s += &format!("pools: {pools_text}\n");
    if let Some(f) = from {
        s += &format!("from:  {f}\n");
    }
    if let Some(n) = dns_note {
        s += &format!("dns:   {n}\n");
    }
    let mut t = Table::new(&["CHECK", "STATUS", "DETAIL"]);
    for c in &d.checks {
        t.row([
            c.name.clone(),
            c.status.text().to_string(),
            c.detail.clone(),
        ]);
    }
    s += &format!("\n{t}");
    if !d.hops.is_empty() {
        let mut h = Table::new(&["HOP", "TARGET", "PROBE", "STATE", "RESULT"]);
        for hop in &d.hops {
            h.row([
                hop.role.name().to_string(),
                hop.target.clone(),
                hop.method.to_string(),
                hop.state.text().to_string(),
                hop.result.clone(),
            ]);
        }
        s += &format!("\n{h}");
    }
    for n in &d.notes {
        s += &format!("\nnote: {n}\n");
    }
    s += &format!("\nverdict: {}\n", d.verdict.message);
    if let Some(n) = &d.verdict.next {
        s += &format!("next:    {n}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("10.96.0.10:80").unwrap(),
            ("10.96.0.10".parse().unwrap(), Some(80))
        );
        assert_eq!(
            parse_endpoint("10.96.0.10").unwrap(),
            ("10.96.0.10".parse().unwrap(), None)
        );
        assert_eq!(
            parse_endpoint("[fd00::1]:443").unwrap(),
            ("fd00::1".parse().unwrap(), Some(443))
        );
        assert_eq!(parse_endpoint("fd00::1").unwrap().1, None);
        assert!(parse_endpoint("kube-dns").is_err());
    }
}
