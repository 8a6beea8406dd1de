//! `podgate diagnose`: find the broken hop of a pod that routes (a VPN pod).
//!
//! [`facts`] reads the pod and node namespaces; [`probes`] probes the hops
//! from inside out, stopping at the first broken one; the rest is pure. From the
//! facts and the probe results [`rules`] decides what is wrong, as data
//! ([`finding`]); [`wording`] phrases each finding for the operator;
//! [`verdict`] assembles the table of checks, the hops and the verdict naming
//! the layer to look at next.

pub mod facts;
pub mod finding;
pub mod primary;
pub mod probes;
pub mod rules;
pub mod verdict;
pub mod wording;

use crate::probe::Outcome;
use serde::Serialize;
use std::net::IpAddr;

/// What a target is, probed inside out: the tunnel peer first, DNS last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Peer,
    Pod,
    Service,
    Public,
    Dns,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Peer => "peer",
            Role::Pod => "pod",
            Role::Service => "service",
            Role::Public => "public",
            Role::Dns => "dns",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    pub role: Role,
    /// The address probed (for DNS: the nameserver).
    pub addr: IpAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// For DNS: the name asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Target {
    pub fn addr_text(&self) -> String {
        match (self.port, &self.name) {
            (_, Some(n)) => format!("{n} @{}", self.addr),
            (Some(p), None) if self.addr.is_ipv6() => format!("[{}]:{p}", self.addr),
            (Some(p), None) => format!("{}:{p}", self.addr),
            (None, None) => self.addr.to_string(),
        }
    }

    /// `pod 10.22.0.3`, `service 10.96.0.10:443`, `dns kubernetes.default @10.96.0.10`.
    pub fn label(&self) -> String {
        format!("{} {}", self.role.name(), self.addr_text())
    }

    pub fn method(&self) -> &'static str {
        match (self.role, self.port) {
            (Role::Dns, _) => "dns/udp",
            (_, Some(_)) => "tcp",
            (_, None) => "icmp",
        }
    }

    /// Beyond the VPN pod: reaching it from a tunnel client needs forwarding
    /// and a return path.
    pub fn transit(&self) -> bool {
        self.role != Role::Peer
    }
}

/// The probes made for one target.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeRun {
    pub target: Target,
    /// From the pod's own address (the kernel picks the source).
    pub direct: Outcome,
    /// Bound to `--from` (a tunnel-side address), for transit targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound: Option<(IpAddr, Outcome)>,
}
