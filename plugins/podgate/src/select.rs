//! Which network namespace a command works in: `--netns PATH`, `--pid PID`,
//! `--container ID` (from podgate's state store), `--k8s-pod NS/NAME` (from
//! the node's CRI runtime), or the current (node) one: by default for the
//! commands that only read, only with `--node` for those that change
//! routes, rules or sysctls ([`Target::select_to_change`]).

use crate::error::{Error, Result};
use clap::Args;
use podgate_cri::{self as cri, PodName};
use podgate_kit::netns::NetNs;
use podgate_kit::state::StateStore;
use podgate_router::config::DEFAULT_STATE_DIR;
use podgate_router::record::Record;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Flags every operator command takes (after the command name, e.g.
/// `podgate sysctl get --netns PATH NAME`). Global within each command
/// group only, so they never clash with `install`/`uninstall`'s own flags.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Print one JSON document instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, Clone, Args)]
pub struct Target {
    /// Work in the namespace podgate runs in (the node's own, on the
    /// node): the default of commands that only read; commands that change
    /// routes, rules or sysctls need it, or another target, named.
    #[arg(long, global = true, conflicts_with_all = ["netns", "pid", "container", "k8s_pod"])]
    pub node: bool,
    /// Work in this network namespace file (/var/run/netns/NAME, /proc/PID/ns/net).
    #[arg(long, global = true, value_name = "PATH", conflicts_with_all = ["pid", "container", "k8s_pod"])]
    pub netns: Option<PathBuf>,
    /// Work in the network namespace of this process.
    #[arg(long, global = true, value_name = "PID", conflicts_with_all = ["container", "k8s_pod"])]
    pub pid: Option<u32>,
    /// Work in the netns of this container (sandbox) ID, as podgate-router
    /// recorded it; a unique prefix is enough.
    #[arg(long, global = true, value_name = "ID", conflicts_with = "k8s_pod")]
    pub container: Option<String>,
    /// Work in the netns of this Kubernetes pod's ready sandbox on this node,
    /// found through the container runtime (CRI); any pod, with or without a
    /// podgate profile.
    #[arg(long, global = true, value_name = "NAMESPACE/NAME")]
    pub k8s_pod: Option<String>,
    /// CRI socket for --k8s-pod [default: crictl's, the first that answers:
    /// unix:///run/containerd/containerd.sock, unix:///run/crio/crio.sock,
    /// unix:///var/run/cri-dockerd.sock].
    #[arg(
        long,
        global = true,
        value_name = "unix:///PATH",
        env = "CONTAINER_RUNTIME_ENDPOINT"
    )]
    pub runtime_endpoint: Option<String>,
    /// podgate-router's state directory (its `stateDir`).
    #[arg(long, global = true, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The node's namespace, for node-side reads (return routes, sysctl diff);
    /// default: the namespace podgate runs in.
    #[arg(long, global = true, value_name = "PATH")]
    pub node_netns: Option<PathBuf>,
}

/// How the namespace was chosen, for headers and JSON.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Chosen {
    /// `node`, `netns`, `pid`, `container` or `k8s-pod`.
    pub by: &'static str,
    pub path: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// `NAMESPACE/NAME`, when chosen by `--k8s-pod`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

impl Chosen {
    pub fn label(&self) -> String {
        match self.by {
            "node" => "node (current netns)".to_string(),
            "container" => format!(
                "container {} (netns {})",
                self.container.as_deref().unwrap_or("?"),
                self.path.display()
            ),
            "k8s-pod" => format!(
                "pod {} (sandbox {}, netns {})",
                self.pod.as_deref().unwrap_or("?"),
                self.container.as_deref().unwrap_or("?"),
                self.path.display()
            ),
            _ => format!("netns {}", self.path.display()),
        }
    }
}

pub struct Selected {
    pub ns: NetNs,
    pub chosen: Chosen,
    /// Records of the container (one per network/ifname), when chosen by ID.
    pub records: Vec<Record>,
    pub pid: Option<u32>,
}

fn open(path: &Path, what: &str) -> Result<NetNs> {
    NetNs::open(path).map_err(|e| {
        if e.is_not_found() {
            Error::msg(format!("{what}: {} does not exist", path.display()))
        } else {
            Error::Netns {
                what: what.into(),
                source: e,
            }
        }
    })
}

/// `--dry-run` of the commands that change something.
#[derive(Debug, Clone, Args)]
pub struct ChangeArgs {
    /// Print what would change; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl Target {
    /// [`Target::select`] for a command that changes routes, rules or
    /// sysctls (`what`): only with a target named on the command line,
    /// `--node` for the namespace podgate runs in. A default there would
    /// make a command meant for a pod, typed without its `--netns`, change
    /// the node.
    pub fn select_to_change(&self, what: &str) -> Result<Selected> {
        let named = self.node
            || self.netns.is_some()
            || self.pid.is_some()
            || self.container.is_some()
            || self.k8s_pod.is_some();
        if !named {
            return Err(Error::usage(format!(
                "{what} changes the network namespace it works in: name it with --netns PATH, --pid PID, \
                 --container ID or --k8s-pod NAMESPACE/NAME, or give --node for the one podgate runs in (the node's own)"
            )));
        }
        self.select()
    }

    pub fn select(&self) -> Result<Selected> {
        if let Some(p) = &self.netns {
            return Ok(Selected {
                ns: open(p, "--netns")?,
                chosen: Chosen {
                    by: "netns",
                    path: p.clone(),
                    container: None,
                    pod: None,
                },
                records: Vec::new(),
                pid: None,
            });
        }
        if let Some(pid) = self.pid {
            let p = PathBuf::from(format!("/proc/{pid}/ns/net"));
            return Ok(Selected {
                ns: open(&p, &format!("--pid {pid}"))?,
                chosen: Chosen {
                    by: "pid",
                    path: p,
                    container: None,
                    pod: None,
                },
                records: Vec::new(),
                pid: Some(pid),
            });
        }
        if let Some(spec) = &self.k8s_pod {
            return self.select_k8s_pod(spec);
        }
        if let Some(id) = &self.container {
            let records = self.records_of(id)?;
            let path = records
                .iter()
                .find_map(|r| r.netns.clone())
                .ok_or_else(|| {
                    Error::msg(format!("container {id}: its podgate record has no netns"))
                })?;
            let ns = NetNs::open(&path).map_err(|e| {
                if e.is_not_found() {
                    Error::msg(format!(
                        "container {id}: netns {} is gone (pod deleted; a record left behind means DEL never ran: see `podgate inspect`)",
                        path.display()
                    ))
                } else {
                    Error::Netns {
                        what: format!("container {id}"),
                        source: e,
                    }
                }
            })?;
            let full = records
                .first()
                .map(|r| r.key.container_id.clone())
                .unwrap_or_else(|| id.clone());
            return Ok(Selected {
                ns,
                chosen: Chosen {
                    by: "container",
                    path,
                    container: Some(full),
                    pod: None,
                },
                records,
                pid: None,
            });
        }
        Ok(Selected {
            ns: NetNs::current()?,
            chosen: Chosen {
                by: "node",
                path: PathBuf::from("/proc/thread-self/ns/net"),
                container: None,
                pod: None,
            },
            records: Vec::new(),
            pid: None,
        })
    }

    /// `--k8s-pod`: the pod's sandbox through CRI, then podgate's records of
    /// that sandbox if it has any (a pod podgate never touched has none).
    fn select_k8s_pod(&self, spec: &str) -> Result<Selected> {
        let name = PodName::parse(spec).map_err(|e| Error::usage(e.to_string()))?;
        let found = cri::find_pod(self.runtime_endpoint.as_deref(), &name)?;
        let ns = open(&found.netns, &format!("pod {name}"))?;
        let records = self.records_of(&found.sandbox_id).unwrap_or_default();
        Ok(Selected {
            ns,
            chosen: Chosen {
                by: "k8s-pod",
                path: found.netns,
                container: Some(found.sandbox_id),
                pod: Some(name.to_string()),
            },
            records,
            pid: found.pid,
        })
    }

    /// The sandbox ID of `--k8s-pod`, if given (for record lookups).
    pub fn k8s_sandbox_id(&self) -> Result<Option<String>> {
        let Some(spec) = &self.k8s_pod else {
            return Ok(None);
        };
        let name = PodName::parse(spec).map_err(|e| Error::usage(e.to_string()))?;
        let found = cri::find_pod(self.runtime_endpoint.as_deref(), &name)?;
        Ok(Some(found.sandbox_id))
    }

    /// The node's namespace: `--node-netns`, else the current one.
    pub fn node(&self) -> Result<(NetNs, String)> {
        match &self.node_netns {
            Some(p) => Ok((open(p, "--node-netns")?, p.display().to_string())),
            None => Ok((NetNs::current()?, "current netns".to_string())),
        }
    }

    pub fn store(&self) -> Result<StateStore> {
        StateStore::existing(&self.state_dir)?.ok_or_else(|| {
            Error::msg(format!(
                "no podgate state at {} (podgate-router never ran here, or pass --state-dir)",
                self.state_dir.display()
            ))
        })
    }

    /// Every record, and the ones that did not parse as errors.
    pub fn all_records(&self) -> Result<(Vec<Record>, Vec<String>)> {
        let l = podgate_router::record::list(&self.store()?)?;
        let bad = l
            .newer
            .iter()
            .chain(&l.unreadable)
            .map(|(_, e)| e.to_string());
        Ok((l.records, bad.collect()))
    }

    /// Records of one container: exact ID, else a unique prefix.
    pub fn records_of(&self, id: &str) -> Result<Vec<Record>> {
        let (all, _) = self.all_records()?;
        pick_container(all, id).map_err(Error::Msg)
    }
}

/// Records whose container ID is `id`, or starts with `id` when exactly one
/// container matches that way.
pub fn pick_container(all: Vec<Record>, id: &str) -> Result<Vec<Record>, String> {
    if id.is_empty() {
        return Err("--container: empty ID".into());
    }
    let exact: Vec<Record> = all
        .iter()
        .filter(|r| r.key.container_id == id)
        .cloned()
        .collect();
    if !exact.is_empty() {
        return Ok(exact);
    }
    let by_prefix: Vec<Record> = all
        .into_iter()
        .filter(|r| r.key.container_id.starts_with(id))
        .collect();
    let mut ids: Vec<&str> = by_prefix
        .iter()
        .map(|r| r.key.container_id.as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    match ids.len() {
        0 => Err(format!(
            "container {id}: no podgate record (the pod has no podgate profile, or another --state-dir)"
        )),
        1 => Ok(by_prefix),
        _ => Err(format!(
            "container {id}: ambiguous prefix, matches {}",
            ids.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podgate_kit::state::Key;
    use podgate_router::plan::Plan;

    fn rec(cid: &str, ifname: &str) -> Record {
        let plan = Plan {
            profile: "p".into(),
            source: "assign[0]".into(),
            ifname: ifname.into(),
            pod_ips: vec![],
            sysctls: vec![],
            nft_table: None,
            masquerade: vec![],
            mss_clamp: vec![],
            pod_routes: vec![],
            node_routes: vec![],
            routing: None,
        };
        let origin = podgate_router::record::Origin {
            netns: Some(PathBuf::from("/var/run/netns/x")),
            ..Default::default()
        };
        Record::pending(&Key::new("net", cid, ifname), &plan, origin)
    }

    #[test]
    fn container_by_id_or_unique_prefix() {
        let all = vec![
            rec("abc123", "eth0"),
            rec("abc123", "net1"),
            rec("abd999", "eth0"),
        ];
        assert_eq!(pick_container(all.clone(), "abc123").unwrap().len(), 2);
        assert_eq!(pick_container(all.clone(), "abc").unwrap().len(), 2);
        assert!(pick_container(all.clone(), "ab")
            .unwrap_err()
            .contains("ambiguous"));
        assert!(pick_container(all, "zzz")
            .unwrap_err()
            .contains("no podgate record"));
    }
}
