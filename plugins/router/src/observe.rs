//! What ADD reads from the node before planning, and nothing else: the
//! plan's checks decide which dumps are made (design note "Observe only what
//! the plan checks"). [`Needs`] is plain data computed from the configuration and
//! the selection alone; [`node_view`] makes exactly those reads through a
//! [`Kernel`], so the unit tests see every observation.
//!
//! The reads run under the node-wide lock; on a node with 110 pods the link
//! dump alone is 110+ messages of ~1.4 KiB, and every dump is a netlink
//! round trip (`sendto` and at least two `recvfrom`).

use crate::config::{RoutingMode, TableChoice};
use crate::error::Error;
use crate::intent::Selection;
use crate::kernel::Kernel;
use crate::model::{Claim, NodeView};
use podgate_kit::route::TABLE_MAIN;
use std::net::IpAddr;

/// A sysctl that exists exactly when the node has IPv6 (booted without
/// `ipv6.disable=1`).
const IPV6_KNOB: &str = "net.ipv6.conf.all.disable_ipv6";

/// A set of address families.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Families {
    pub v4: bool,
    pub v6: bool,
}

impl Families {
    pub const BOTH: Families = Families { v4: true, v6: true };

    /// The family of `a`.
    pub fn of(a: IpAddr) -> Families {
        Families {
            v4: a.is_ipv4(),
            v6: a.is_ipv6(),
        }
    }

    pub fn any(self) -> bool {
        self.v4 || self.v6
    }

    fn union(self, o: Families) -> Families {
        Families {
            v4: self.v4 || o.v4,
            v6: self.v6 || o.v6,
        }
    }

    /// `false` (IPv4), then `true` (IPv6), as far as they are in the set:
    /// the `v6` argument of the kernel's listings.
    fn v6_flags(self) -> impl Iterator<Item = bool> {
        [(self.v4, false), (self.v6, true)]
            .into_iter()
            .filter_map(|(on, v6)| on.then_some(v6))
    }
}

/// The parts of the node a plan checks against. Everything else stays
/// unread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// Node routes: return routes (a route overlapping a pool or a gateway
    /// in one, the connected route to the pod) in each pool's family; a routing boundary (the
    /// pod's host route) in its gateway's family, and both when it picks a
    /// free table (a table is taken if either family has a route in it).
    pub routes: Families,
    /// The routes of every table, not the main table's alone: a routing
    /// boundary checks and picks tables. Return routes look at the main
    /// table only (where they go), so without a boundary the kernel walks
    /// only that table, not the local one (a route for every node address,
    /// thousands with kube-proxy in IPVS mode) or others.
    pub all_tables: bool,
    /// Node addresses: a return-route pool must not contain one or
    /// overlap its subnet (each pool's family).
    pub addresses: Families,
    /// Other pods' records (pool owners, tables, strict slots).
    pub claims: bool,
    /// A routing boundary resolves its uplink and the pod's host-side
    /// interface.
    pub links: bool,
    /// Strict routing refuses a node whose nat chains would SNAT the pod.
    pub snat: bool,
    /// Strict routing turns IPv6 off on the host-side interface of a pod
    /// without IPv6 addresses, if the node has IPv6.
    pub ipv6: bool,
}

impl Needs {
    pub fn of(sel: &Selection) -> Needs {
        let mut n = Needs::default();
        for pool in &sel.return_routes {
            let f = Families::of(pool.addr());
            n.routes = n.routes.union(f);
            n.addresses = n.addresses.union(f);
            n.claims = true;
        }
        if let Some(r) = &sel.profile.routing {
            let strict = r.mode == RoutingMode::Strict;
            // A strict pod's every address is bounded, of either family.
            let f = match r.table {
                _ if strict => Families::BOTH,
                TableChoice::Auto => Families::BOTH,
                TableChoice::Id(_) => Families::of(r.gateway),
            };
            n.routes = n.routes.union(f);
            n.all_tables = true;
            n.claims = true;
            n.links = true;
            n.snat = strict;
            n.ipv6 = strict;
        }
        n
    }

    /// Does the plan read the node's kernel state at all (then a node
    /// socket is needed before planning)?
    pub fn reads_node(&self) -> bool {
        self.routes.any() || self.addresses.any() || self.links || self.snat || self.ipv6
    }
}

/// Read what `needs` names through `k` (the node's namespace); `claims`
/// gives the other live attachments' claims, called only when needed.
pub fn node_view(
    k: &mut impl Kernel,
    needs: &Needs,
    claims: impl FnOnce() -> Vec<Claim>,
) -> Result<NodeView, Error> {
    let mut view = NodeView::default();
    for v6 in needs.routes.v6_flags() {
        let routes = if needs.all_tables {
            k.route_list(v6)
        } else {
            k.route_list_table(v6, TABLE_MAIN)
        };
        view.routes
            .extend(routes.map_err(Error::kernel("reading node routes"))?);
    }
    for v6 in needs.addresses.v6_flags() {
        view.addresses.extend(
            k.address_list(v6)
                .map_err(Error::kernel("reading node addresses"))?,
        );
    }
    if needs.claims {
        view.claims = claims();
    }
    if needs.links {
        view.links = k.link_list().map_err(Error::kernel("reading node links"))?;
    }
    if needs.ipv6 {
        view.ipv6 = match k.sysctl_read(IPV6_KNOB) {
            Ok(_) => true,
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(Error::kernel("reading whether the node has IPv6")(e)),
        };
    }
    // Reading nf_tables only when a strict profile needs it keeps the
    // common path short.
    if needs.snat {
        view.node_snat = k
            .nft_find_snat()
            .map_err(Error::kernel("reading node nf_tables"))?;
    }
    Ok(view)
}

#[cfg(test)]
mod tests;
