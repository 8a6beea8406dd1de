//! What ADD applied, as kept in the state store: DEL, CHECK, GC and
//! `podgate inspect` read this, never a guess from the kernel.

use crate::plan::Plan;
use podgate_kit::route::RouteSpec;
use podgate_kit::state::Key;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub key: Key,
    pub netns: Option<PathBuf>,
    pub created: String,
    pub plan: Plan,
    /// Values the pod netns had before podgate wrote them (only those changed).
    #[serde(default)]
    pub sysctl_previous: BTreeMap<String, String>,
    /// Pod-side routes as applied (oif resolved).
    #[serde(default)]
    pub pod_routes: Vec<RouteSpec>,
    /// Warnings noticed at ADD (e.g. IPVS present), shown by inspect.
    #[serde(default)]
    pub warnings: Vec<String>,
}
