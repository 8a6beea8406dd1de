//! Plain data shared by the planners (`plan`, `routing`) and the record:
//! what the node looks like before planning, and the settings a plan holds.
//! A leaf module, so the planners depend on it and not on each other.

use ipnet::IpNet;
use podgate_kit::link::Link;
use podgate_kit::nft::SnatFinding;
use podgate_kit::route::RouteEntry;
use podgate_kit::state::Key;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysctlSetting {
    pub name: String,
    pub value: String,
}

/// What one live attachment holds on to node-wide, from its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub key: Key,
    /// Return-route pools.
    pub pools: Vec<IpNet>,
    /// Its per-pod route table (routing boundary).
    pub table: Option<u32>,
    pub strict: bool,
}

impl Claim {
    /// Does it hold anything another attachment could collide with?
    pub fn holds_any(&self) -> bool {
        !self.pools.is_empty() || self.table.is_some() || self.strict
    }
}

/// What the node looks like, read before planning (no writes).
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    pub routes: Vec<RouteEntry>,
    pub addresses: Vec<IpNet>,
    /// Claims of the live attachments on this node (stale records excluded).
    pub claims: Vec<Claim>,
    pub links: Vec<Link>,
    /// Masquerade/SNAT rules found in the node's nat postrouting chains.
    pub node_snat: Vec<SnatFinding>,
    /// The node has IPv6 (read for strict routing: a strict pod without
    /// an IPv6 address gets IPv6 turned off on its host-side interface).
    pub ipv6: bool,
}

/// Whether two prefixes share any address.
pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}
