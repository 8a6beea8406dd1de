//! The node's primary CNI and its anti-spoofing. With a return route the VPN
//! pod forwards packets that carry client source addresses; Calico, Cilium and
//! Kube-OVN (with port security) drop them unless told to allow the pool, and
//! the symptom is the same silence as with forwarding off, one layer further.

use ipnet::IpNet;
use podgate_install::chain::{self, Kind as FileKind, List};
use podgate_install::fsx;
use podgate_install::json::Json;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PrimaryFact {
    /// `type` of the primary network's first plugin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// The primary's file: the first `.conflist`/`.conf`/`.json` of the conf
    /// dir, as the container runtime loads it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Node interfaces that name a primary (`cali*`, `lxc*`, `ovn0`).
    pub interfaces: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Primaries podgate knows, as far as source filtering goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Primary {
    Calico,
    Cilium,
    KubeOvn,
    /// Plugins that do not filter a pod's source addresses.
    NoFilter(String),
    Unknown(String),
}

/// Plain-Linux plugins (and Flannel, which delegates to bridge): no
/// source-address filter of their own.
const NO_FILTER: &[&str] = &[
    "bridge",
    "ptp",
    "macvlan",
    "ipvlan",
    "host-device",
    "vlan",
    "flannel",
];

/// Interface names each primary creates on the node.
fn interface_hint(name: &str) -> Option<&'static str> {
    if name.starts_with("cali") {
        Some("calico")
    } else if name.starts_with("lxc") || name == "cilium_host" {
        Some("cilium")
    } else if name == "ovn0" || name.starts_with("genev_sys") {
        Some("kube-ovn")
    } else {
        None
    }
}

/// Read the primary from `conf_dir` and the node's interface names.
pub fn read(conf_dir: &Path, node_links: &[String]) -> PrimaryFact {
    let mut f = PrimaryFact {
        interfaces: node_links
            .iter()
            .filter(|n| interface_hint(n).is_some())
            .take(4)
            .cloned()
            .collect(),
        ..PrimaryFact::default()
    };
    let files = match fsx::list_files(conf_dir) {
        Ok(files) => files,
        Err(e) => {
            f.error = Some(e.to_string());
            return f;
        }
    };
    let Some(file) = files.into_iter().find(|n| chain::kind_of(n).is_some()) else {
        f.error = Some(format!("no CNI config in {}", conf_dir.display()));
        return f;
    };
    let parsed = fsx::read(&conf_dir.join(&file))
        .map_err(|e| e.to_string())
        .and_then(|text| {
            match chain::kind_of(&file) {
                Some(FileKind::List) => List::parse(&file, &text),
                _ => List::from_single(&file, &text),
            }
            .map_err(|e| e.to_string())
        });
    match parsed {
        Ok(list) => {
            f.plugin = list.others().first().and_then(|p| match p {
                Json::Object(o) => o.str_field("type").map(str::to_string),
                _ => None,
            });
        }
        Err(e) => f.error = Some(e),
    }
    f.file = Some(file);
    f
}

/// What the facts say: the conflist's type first, the interfaces otherwise.
pub fn classify(f: &PrimaryFact) -> Primary {
    let from_ifaces = f.interfaces.iter().find_map(|n| interface_hint(n));
    let name = f.plugin.as_deref().or(from_ifaces).unwrap_or("");
    match name {
        "calico" => Primary::Calico,
        "cilium-cni" | "cilium" => Primary::Cilium,
        "kube-ovn" => Primary::KubeOvn,
        n if NO_FILTER.contains(&n) => Primary::NoFilter(n.to_string()),
        "" => Primary::Unknown("(none found)".into()),
        n => Primary::Unknown(n.to_string()),
    }
}

fn source(f: &PrimaryFact) -> String {
    match (&f.file, &f.plugin) {
        (Some(file), Some(p)) => format!("primary {p} ({file})"),
        _ if !f.interfaces.is_empty() => {
            format!("primary from node interfaces {}", f.interfaces.join(", "))
        }
        _ => format!(
            "primary not found{}",
            f.error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ),
    }
}

/// The setting that must allow `pool` as a pod source address, or None when
/// the primary does not filter sources.
pub fn recipe(f: &PrimaryFact, pool: &IpNet) -> Option<String> {
    let src = source(f);
    Some(match classify(f) {
        Primary::NoFilter(_) => return None,
        Primary::Calico => format!(
            "{src}: Calico drops packets from the pod whose source is not the pod's own address; allow {pool}: `workloadSourceSpoofing: Any` in the FelixConfiguration named default, and the pod annotation `cni.projectcalico.org/allowedSourcePrefixes: '[\"{pool}\"]'`"
        ),
        Primary::Cilium => format!(
            "{src}: Cilium drops packets from the pod with a source other than its own as \"Invalid source ip\" (`cilium-dbg monitor --type drop`); allow it per endpoint on the pod's node: `cilium-dbg endpoint config <endpoint-id> SourceIPVerification=disable` (again for every new pod), or the agent flag `--disable-sip-verification` node-wide"
        ),
        Primary::KubeOvn => format!(
            "{src}: with port security on (pod annotation `ovn.kubernetes.io/port_security: \"true\"`) OVN drops every source but the pod's own address, and allowed address pairs take no CIDR such as {pool}: set `ovn.kubernetes.io/port_security: \"false\"` on the VPN pod (off is the default)"
        ),
        Primary::Unknown(name) => format!(
            "{src}: podgate does not recognise the primary {name}, so it cannot say whether it drops pod packets with the source {pool} (anti-spoofing) nor how to allow it; check its documentation"
        ),
    })
}

/// The primary's own way of making `pool` reach the VPN pod (at `pod_ip`, on
/// the node at `node_ip`) from every node, or None when podgate does not
/// recognise the primary.
pub fn cluster_route(
    f: &PrimaryFact,
    pool: &IpNet,
    pod_ip: Option<std::net::IpAddr>,
    node_ip: Option<std::net::IpAddr>,
) -> Option<String> {
    let text = |ip: Option<std::net::IpAddr>, what: &str| {
        ip.map_or_else(|| format!("<{what}>"), |a| a.to_string())
    };
    let (pod, node) = (text(pod_ip, "VPN pod IP"), text(node_ip, "this node's IP"));
    Some(match classify(f) {
        Primary::KubeOvn => format!(
            "Kube-OVN: a static route on the VPC's router reaches every node: `staticRoutes: [{{cidr: {pool}, nextHopIP: {pod}, policy: policyDst}}]` in the Vpc, with the VPN pod's IP pinned (annotation ovn.kubernetes.io/ip_address)"
        ),
        Primary::Calico => format!(
            "Calico: announce {pool} by BGP from the VPN pod (a BGP speaker in the pod peering with its node, where your Calico version allows peering with workloads); Calico then carries the route to every node"
        ),
        Primary::Cilium => format!(
            "Cilium treats {pool} as outside the cluster: masquerade it, or route it to this node on every node and add it to the agent's non-masquerade CIDRs"
        ),
        Primary::NoFilter(name) => format!(
            "{name} routes only each node's pod CIDR: `ip route add {pool} via {node}` on every other node (or once on the fabric), moved by hand when the pod moves"
        ),
        Primary::Unknown(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(plugin: Option<&str>, ifaces: &[&str]) -> PrimaryFact {
        PrimaryFact {
            plugin: plugin.map(str::to_string),
            file: plugin.map(|_| "10-x.conflist".to_string()),
            interfaces: ifaces.iter().map(|s| s.to_string()).collect(),
            error: None,
        }
    }

    #[test]
    fn recipes_per_primary() {
        let pool: IpNet = "10.8.0.0/24".parse().unwrap();
        let r = recipe(&fact(Some("calico"), &[]), &pool).unwrap();
        assert!(r.contains("workloadSourceSpoofing: Any"), "{r}");
        assert!(
            r.contains("cni.projectcalico.org/allowedSourcePrefixes: '[\"10.8.0.0/24\"]'"),
            "{r}"
        );
        let r = recipe(&fact(Some("cilium-cni"), &[]), &pool).unwrap();
        assert!(r.contains("SourceIPVerification=disable"), "{r}");
        let r = recipe(&fact(Some("kube-ovn"), &[]), &pool).unwrap();
        assert!(r.contains("ovn.kubernetes.io/port_security"), "{r}");
        assert_eq!(recipe(&fact(Some("bridge"), &[]), &pool), None);
        assert_eq!(recipe(&fact(Some("flannel"), &[]), &pool), None);
        let r = recipe(&fact(Some("weave-net"), &[]), &pool).unwrap();
        assert!(
            r.contains("does not recognise the primary weave-net"),
            "{r}"
        );
        // Interfaces stand in when there is no readable conflist.
        let r = recipe(&fact(None, &["cali1234abcd"]), &pool).unwrap();
        assert!(
            r.contains("node interfaces cali1234abcd") && r.contains("Calico"),
            "{r}"
        );
        let r = recipe(&fact(None, &[]), &pool).unwrap();
        assert!(r.contains("primary not found"), "{r}");
    }

    #[test]
    fn each_recognised_primary_has_its_own_way_to_route_a_pool_cluster_wide() {
        let pool: IpNet = "10.8.0.0/24".parse().unwrap();
        let pod = Some("10.16.0.9".parse().unwrap());
        let node = Some("192.168.100.1".parse().unwrap());
        let way = |plugin: &str| cluster_route(&fact(Some(plugin), &[]), &pool, pod, node);
        let r = way("kube-ovn").unwrap();
        assert!(
            r.contains(
                "staticRoutes: [{cidr: 10.8.0.0/24, nextHopIP: 10.16.0.9, policy: policyDst}]"
            ),
            "{r}"
        );
        assert!(way("calico").unwrap().contains("by BGP"));
        assert!(way("cilium-cni").unwrap().contains("masquerade it"));
        let r = way("flannel").unwrap();
        assert!(
            r.starts_with("flannel routes only each node's pod CIDR: `ip route add 10.8.0.0/24 via 192.168.100.1`"),
            "{r}"
        );
        assert_eq!(way("weave-net"), None);
        let r = cluster_route(&fact(Some("bridge"), &[]), &pool, None, None).unwrap();
        assert!(r.contains("via <this node's IP>"), "{r}");
    }
}
