//! Every policy refusal of the router (CNI code 100,
//! `code::POLICY_REFUSED`), each naming the rule
//! or the fact that refuses the pod. Built where the decision is made
//! (intent, plan, routing, MSS clamp, adoption) and turned into the CNI
//! error by the router's one conversion (`error::Error::Refused`).

use ipnet::IpNet;
use podgate_kit::nft::SnatFinding;
use std::net::IpAddr;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    // What the pod asks for (intent.rs).
    #[error(
        "refused by allow.annotationNamespaces: pod namespace {} may not choose podgate profiles or pools",
        .0.as_ref().map(|n| format!("{n:?}")).unwrap_or_else(|| "(unknown, no K8S_POD_NAMESPACE)".into())
    )]
    AnnotationNamespace(Option<String>),
    #[error("annotation {ann}={annotation:?} and args.cni.profile={args:?} disagree")]
    ProfilesDisagree {
        ann: &'static str,
        annotation: String,
        args: String,
    },
    #[error("refused by assign[{index}]: the operator assigns profile {assigned:?} to this pod; {asked_by} asks for {asked:?}")]
    Assigned {
        index: usize,
        assigned: String,
        /// Where the other profile came from (`annotation …`, `args.cni.profile`).
        asked_by: String,
        asked: String,
    },
    #[error("pool annotations given but no podgate profile is selected for this pod")]
    PoolsWithoutProfile,
    #[error("refused by profiles: {asked_by} names profile {profile:?}, which the operator did not define")]
    UnknownProfile { asked_by: String, profile: String },
    #[error("annotation {ann}: more than {max} pools")]
    TooManyPools { ann: &'static str, max: usize },
    #[error("annotation {ann}: {text:?} is not a CIDR")]
    NotCidr { ann: &'static str, text: String },
    #[error("annotation {ann}: {net} has host bits set; write {}", .net.trunc())]
    HostBits { ann: &'static str, net: IpNet },
    #[error(
        "refused by allow.pools: {net} from annotation {ann} is not inside [{}]",
        .allowed.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    PoolNotAllowed {
        ann: &'static str,
        net: IpNet,
        allowed: Vec<IpNet>,
    },
    #[error("annotation {0} names no pool")]
    NoPool(&'static str),

    // Return routes (plan.rs).
    #[error("return route {pool} refused: {why}")]
    ReturnRouteConflict { pool: IpNet, why: String },
    #[error(
        "return route {pool} refused: the pod has no {} address on {ifname}",
        if .pool.addr().is_ipv4() { "IPv4" } else { "IPv6" }
    )]
    ReturnRouteFamily { pool: IpNet, ifname: String },

    // MSS clamp (mss.rs).
    #[error("refused by mssClamp: no client pool to clamp (the profile has no masquerade or returnRoutes and the pod named none)")]
    MssNoPool,

    // Strict and standard routing (routing.rs).
    #[error("strict routing refused: the profile (or an annotation) asks for masquerade, and a strict pod's egress must never be SNATed")]
    StrictMasquerade,
    #[error("routing: uplink {0} does not exist on the node")]
    NoUplink(String),
    #[error("strict routing refused: return route {0} has no gateway of its family on the uplink")]
    ReturnRouteNoGateway(IpNet),
    #[error("routing: the pod has no address of the gateway's family ({0})")]
    NoGatewayFamily(IpAddr),
    #[error("refused by routing.gateway6: the pod's address {0} is IPv6 and the profile names no IPv6 next hop on the uplink; every address of a strict pod crosses the boundary")]
    NoGateway6(IpAddr),
    #[error("routing: the node has no route to the pod {0}")]
    NoHostRoute(IpAddr),
    #[error("routing refused: {ip} is reached through the shared subnet {subnet}; strict/standard routing needs a routed primary with one host route per pod (e.g. ptp)")]
    SharedSubnet { ip: IpAddr, subnet: IpNet },
    #[error("routing: the pod's host route has no interface")]
    HostRouteNoInterface,
    #[error("routing refused: the pod's address {0} is routed through another interface than its first address")]
    SplitHostInterfaces(IpAddr),
    #[error("routing: the pod has no address")]
    NoPodAddress,
    #[error("routing: interface index {0} vanished")]
    InterfaceVanished(u32),
    #[error("strict routing refused: the pod's host-side interface {0:?} has a '.' in its name")]
    DottedHostInterface(String),
    #[error("refused by maxStrictPods: this node already has {pods} strict pods (limit {limit})")]
    MaxStrictPods { pods: usize, limit: usize },
    #[error("refused by routing.exempt: {exempt} overlaps the pod's own subnet {subnet} (its gateway included)")]
    ExemptOverlaps { exempt: IpNet, subnet: IpNet },
    #[error("strict routing refused: node SNAT would rewrite the pod's egress: {0}")]
    NodeSnat(SnatFinding),
    #[error("routing: table {table} is already used by pod {pod}")]
    TableTaken { table: u32, pod: String },
    #[error("routing: no free route table in 20000-29999")]
    NoFreeTable,

    // Adoption of a running sandbox (plugin/adopt.rs).
    #[error("refused by adoption: sandbox {sandbox}: {ifname} {why}; not adopted (the pod may have changed its addresses)")]
    AddressesChanged {
        sandbox: String,
        ifname: String,
        why: String,
    },
}
