//! What the diagnosis found, as data: one value per check and per hop, with
//! the facts that decided it. `rules` produces them from the facts
//! and the probes; `wording` turns them into the operator's text.

use super::facts::{MasqFact, RouteFact};
use super::Target;
use crate::probe::Outcome;
use ipnet::IpNet;
use serde::Serialize;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Fail,
    Warn,
    Skip,
}

impl Status {
    pub fn text(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Fail => "FAIL",
            Status::Warn => "warn",
            Status::Skip => "skip",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HopState {
    /// Answers, and nothing on the client path is missing.
    Ok,
    /// No answer (or unreachable) from inside the pod.
    Silent,
    /// Answers the pod itself, but tunnel clients cannot get there and back.
    Blocked,
    /// Answered with an error (DNS NXDOMAIN, nothing on port 53).
    Failed,
    /// Not probed: an earlier hop is broken.
    NotProbed,
}

impl HopState {
    pub fn text(self) -> &'static str {
        match self {
            HopState::Ok => "ok",
            HopState::Silent => "SILENT",
            HopState::Blocked => "BLOCKED",
            HopState::Failed => "FAILED",
            HopState::NotProbed => "-",
        }
    }
}

/// How replies to a client pool find their way back into the tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReturnPath {
    /// podgate-shaped masquerade in the pod covers the pool.
    Masquerade(MasqFact),
    /// The node routes the pool back via this pod.
    Route(RouteFact),
    /// Some other source NAT exists in the pod (as the scan listed it); its
    /// match is not decoded.
    Unverified(String),
    /// Neither; `elsewhere` is a node route covering the pool via someone else.
    Missing { elsewhere: Option<RouteFact> },
}

/// Where a target is served, as the node routes to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locality {
    /// One of the node's own addresses, or a route into a local pod
    /// network (a bridge, a pod's veth).
    ThisNode,
    /// Through a gateway or the node's uplink: another node (or beyond).
    Elsewhere(RouteFact),
    /// No node-side view (no node netns, unreadable, no route).
    Unknown,
}

/// A return route for a pool exists on this node only, and the target's
/// replies to the pool leave from another node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffNode {
    pub pool: IpNet,
    /// The return route on this node (via the VPN pod).
    pub return_route: RouteFact,
    /// The node's route to the target.
    pub node_route: RouteFact,
    /// This node's address the other nodes would route the pool to.
    pub node_addr: Option<IpAddr>,
    /// The primary's own way of routing the pool cluster-wide, if recognised.
    pub primary_way: Option<String>,
}

/// The pod's forwarding sysctl of one family, judged for its use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarding {
    /// No IPv6 in this netns (the sysctl does not exist).
    Disabled,
    Unreadable,
    On,
    /// Off, and tunnel clients of this family are probed for.
    OffForClients,
    /// Off; the family is used, but only by the pod's own traffic.
    OffUsed,
    /// Off; nothing of this family is asked about.
    OffUnused,
}

/// One row of the checks table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckFinding {
    Forwarding {
        v6: bool,
        state: Forwarding,
    },
    DefaultRoute {
        v6: bool,
        route: Option<RouteFact>,
    },
    ReturnPath {
        pool: IpNet,
        path: ReturnPath,
        /// Why a part of the return path could not be read.
        nft_error: Option<String>,
        node_error: Option<String>,
    },
    /// A routed pool keeps the client's source: the primary must allow it.
    AntiSpoofing {
        pool: IpNet,
        recipe: String,
    },
    /// Client context without pools: return paths not checked.
    PoolsUnknown,
    RpFilter {
        values: Vec<(String, String)>,
        /// Interfaces where the effective value is strict.
        strict: Vec<String>,
    },
}

/// What one target's probes mean.
#[derive(Debug, Clone, PartialEq)]
pub enum HopFinding {
    Ok,
    /// The tunnel peer does not answer.
    TunnelDown {
        target: Target,
        outcome: Outcome,
    },
    /// The nameserver answers, with an error about the name.
    DnsBadAnswer {
        target: Target,
        detail: String,
    },
    /// Nothing serves DNS at the address.
    DnsRefused {
        target: Target,
        detail: String,
    },
    /// The pod's own address does not answer.
    OwnAddressSilent {
        target: Target,
        outcome: Outcome,
    },
    /// The pod has no route to the target.
    NoRoute {
        target: Target,
    },
    /// Silent even from the pod itself, which has a route.
    SilentPastPod {
        target: Target,
        outcome: Outcome,
        route: RouteFact,
    },
    /// The pod reaches it; forwarding is off for the target's family.
    ForwardingOff {
        target: Target,
        outcome: Outcome,
        /// Pools of that family without a return path either.
        unreturned: Vec<IpNet>,
    },
    /// Forwarding is on; these pools have no return path.
    NoReturnPath {
        target: Target,
        missing: Vec<(IpNet, Option<RouteFact>)>,
    },
    /// A probe from a tunnel-side address gets no answer.
    ClientRepliesLost {
        target: Target,
        src: IpAddr,
        outcome: Outcome,
        masqueraded: bool,
        /// The primary's recipe for accepting the pool, if it filters.
        recipe: Option<String>,
        /// The pool is routed back on this node only, and the target is not
        /// served by this node.
        off_node: Option<OffNode>,
    },
}

impl HopFinding {
    pub fn state(&self) -> HopState {
        match self {
            HopFinding::Ok => HopState::Ok,
            HopFinding::TunnelDown { .. }
            | HopFinding::OwnAddressSilent { .. }
            | HopFinding::NoRoute { .. }
            | HopFinding::SilentPastPod { .. } => HopState::Silent,
            HopFinding::DnsBadAnswer { .. } | HopFinding::DnsRefused { .. } => HopState::Failed,
            HopFinding::ForwardingOff { .. }
            | HopFinding::NoReturnPath { .. }
            | HopFinding::ClientRepliesLost { .. } => HopState::Blocked,
        }
    }
}

/// The caveat on how to read the probes from `--from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeNote {
    /// The source pool is masqueraded: probes show the masqueraded path.
    Masqueraded(IpAddr),
    /// Replies must be routed back to the tunnel address.
    ClientAddressed(IpAddr),
}
