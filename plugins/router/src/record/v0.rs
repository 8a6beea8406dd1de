//! Records written before the format was versioned: the planner's `Plan`
//! stored whole. Frozen here as it was, read only to be upgraded.

use super::*;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    key: Key,
    #[serde(default)]
    netns: Option<PathBuf>,
    #[serde(default)]
    created: String,
    plan: Plan,
    #[serde(default)]
    sysctl_previous: BTreeMap<String, String>,
    #[serde(default)]
    pod_routes: Vec<Route>,
    #[serde(default)]
    warnings: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Plan {
    profile: String,
    source: String,
    #[serde(default)]
    pod_ips: Vec<IpNet>,
    #[serde(default)]
    sysctls: Vec<NodeSysctl>,
    #[serde(default)]
    nft_table: Option<String>,
    #[serde(default)]
    masquerade: Vec<Masquerade>,
    #[serde(default)]
    node_routes: Vec<Route>,
    #[serde(default)]
    routing: Option<Routing>,
}

impl Record {
    pub fn upgrade(self) -> super::Record {
        let previous = self.sysctl_previous;
        super::Record {
            version: VERSION_1,
            status: Status::Applied,
            key: self.key,
            created: self.created,
            boot_id: None,
            netns: self.netns,
            netns_id: None,
            node_netns_id: None,
            profile: self.plan.profile,
            source: self.plan.source,
            pod_ips: self.plan.pod_ips,
            sysctls: self
                .plan
                .sysctls
                .into_iter()
                .map(|s| Sysctl {
                    previous: previous.get(&s.name).cloned(),
                    name: s.name,
                    value: s.value,
                })
                .collect(),
            nft_table: self.plan.nft_table,
            masquerade: self.plan.masquerade,
            mss_clamp: Vec::new(),
            pod_routes: self.pod_routes,
            node_routes: self.plan.node_routes,
            routing: self.plan.routing,
            warnings: self.warnings,
            adopted: false,
        }
    }
}
