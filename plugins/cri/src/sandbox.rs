//! A pod's network namespace by Kubernetes name.
//!
//! `ListPodSandbox` (ready sandboxes) picks the pod by its sandbox metadata
//! (namespace + name, what the kubelet sets); `PodSandboxStatus` (verbose)
//! gives the netns path in `info`: `runtimeSpec.linux.namespaces[type=network].path`
//! (containerd and CRI-O both report the OCI spec there), else the sandbox's
//! `pid` (its `/proc/PID/ns/net`).

use super::{block_on, call_err, client, CriError};
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ListPodSandboxRequest, PodSandbox, PodSandboxFilter, PodSandboxState, PodSandboxStateValue,
    PodSandboxStatusRequest,
};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use tonic::transport::Channel;

/// `NAMESPACE/NAME` of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

impl PodName {
    pub fn parse(s: &str) -> Result<PodName, CriError> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(PodName {
                    namespace: ns.into(),
                    name: name.into(),
                })
            }
            _ => Err(CriError::BadPod(s.into())),
        }
    }
}

impl std::fmt::Display for PodName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Where a pod's sandbox is.
#[derive(Debug, Clone)]
pub struct PodNetns {
    pub sandbox_id: String,
    /// The netns file, or `/proc/<pid>/ns/net` when the runtime gave no path.
    pub netns: PathBuf,
    pub pid: Option<u32>,
}

/// Finds the ready sandbox of `pod` through `endpoint`, or through the first
/// default endpoint whose socket exists and answers.
pub fn find_pod(endpoint: Option<&str>, pod: &PodName) -> Result<PodNetns, CriError> {
    block_on(async {
        let (endpoint, mut client) = client(endpoint).await?;
        lookup(&mut client, &endpoint, pod).await
    })
}

/// The runtime's ready sandboxes.
async fn list_ready(
    client: &mut RuntimeServiceClient<Channel>,
    endpoint: &str,
) -> Result<Vec<PodSandbox>, CriError> {
    Ok(client
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                state: Some(PodSandboxStateValue {
                    state: PodSandboxState::SandboxReady as i32,
                }),
                ..Default::default()
            }),
        })
        .await
        .map_err(|s| call_err(endpoint, "ListPodSandbox", s))?
        .into_inner()
        .items)
}

/// The verbose status of sandbox `id`: whether it is ready, its netns, and
/// its addresses (`network.ip`, then `additionalIps`; unparsable ones
/// skipped).
async fn status_of(
    client: &mut RuntimeServiceClient<Channel>,
    endpoint: &str,
    id: &str,
) -> Result<(bool, Netns, Vec<IpAddr>), CriError> {
    let resp = client
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: true,
        })
        .await
        .map_err(|s| call_err(endpoint, "PodSandboxStatus", s))?
        .into_inner();
    let status = resp.status.as_ref();
    let ready = status.is_some_and(|s| s.state == PodSandboxState::SandboxReady as i32);
    // The CRI's own word on the network namespace mode (NODE: hostNetwork).
    let node_mode = status
        .and_then(|s| s.linux.as_ref())
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .is_some_and(|o| o.network == k8s_cri::v1::NamespaceMode::Node as i32);
    let netns = if node_mode {
        Netns::Host
    } else {
        netns_from_info(&resp.info)
    };
    let ips = status
        .and_then(|s| s.network.as_ref())
        .map(|n| {
            std::iter::once(n.ip.as_str())
                .chain(n.additional_ips.iter().map(|a| a.ip.as_str()))
                .filter_map(|a| a.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Ok((ready, netns, ips))
}

/// Where a ready sandbox's network is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxNetns {
    /// Its own netns (the file, or `/proc/<pid>/ns/net`).
    Path(PathBuf),
    /// The node's (hostNetwork).
    Host,
    /// The runtime reports neither a path nor a pid.
    Unknown,
}

/// A ready sandbox: what the node agent's adoption scan looks at.
#[derive(Debug, Clone)]
pub struct ReadySandbox {
    pub id: String,
    pub namespace: String,
    pub name: String,
    /// CRI `createdAt`, Unix nanoseconds.
    pub created_at: i64,
    pub annotations: std::collections::BTreeMap<String, String>,
    pub netns: SandboxNetns,
    /// Its addresses as the runtime reports them (`network.ip`,
    /// `additionalIps`).
    pub ips: Vec<IpAddr>,
}

/// The ready sandboxes of the runtime at `endpoint` (or the first default
/// one that answers) whose `createdAt` passes `keep`, each with its netns
/// from the verbose status (asked only for those); the endpoint used.
pub fn ready_sandboxes(
    endpoint: Option<&str>,
    keep: impl Fn(i64) -> bool,
) -> Result<(String, Vec<ReadySandbox>), CriError> {
    block_on(async {
        let (endpoint, mut client) = client(endpoint).await?;
        let mut out = Vec::new();
        for sb in list_ready(&mut client, &endpoint).await? {
            let Some(meta) = sb.metadata.filter(|_| keep(sb.created_at)) else {
                continue;
            };
            // Gone between the list and the status: not ready any more.
            let Ok((true, netns, ips)) = status_of(&mut client, &endpoint, &sb.id).await else {
                continue;
            };
            out.push(ReadySandbox {
                id: sb.id,
                namespace: meta.namespace,
                name: meta.name,
                created_at: sb.created_at,
                annotations: sb.annotations.into_iter().collect(),
                netns: match netns {
                    Netns::Path(p, _) => SandboxNetns::Path(p),
                    Netns::Pid(pid) => {
                        SandboxNetns::Path(PathBuf::from(format!("/proc/{pid}/ns/net")))
                    }
                    Netns::Host => SandboxNetns::Host,
                    Netns::Unknown => SandboxNetns::Unknown,
                },
                ips,
            });
        }
        Ok((endpoint, out))
    })
}

/// StopPodSandbox `id`: the kubelet then recreates the pod's sandbox
/// (through the chain the runtime serves now), as after a sandbox crash.
pub fn stop_sandbox(endpoint: &str, id: &str) -> Result<(), CriError> {
    block_on(async {
        let (endpoint, mut client) = client(Some(endpoint)).await?;
        client
            .stop_pod_sandbox(k8s_cri::v1::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
            .map_err(|s| call_err(&endpoint, "StopPodSandbox", s))?;
        Ok(())
    })
}

/// Whether sandbox `id` is still ready (false once stopped or removed).
pub fn is_ready(endpoint: &str, id: &str) -> Result<bool, CriError> {
    block_on(async {
        let (endpoint, mut client) = client(Some(endpoint)).await?;
        match status_of(&mut client, &endpoint, id).await {
            Ok((ready, _, _)) => Ok(ready),
            Err(CriError::Call { msg, .. }) if msg.contains("not found") => Ok(false),
            Err(e) => Err(e),
        }
    })
}

async fn lookup(
    client: &mut RuntimeServiceClient<Channel>,
    endpoint: &str,
    pod: &PodName,
) -> Result<PodNetns, CriError> {
    let items = list_ready(client, endpoint).await?;
    let Some(sandbox) = pick_sandbox(&items, pod) else {
        let others = items
            .iter()
            .filter_map(|s| s.metadata.as_ref())
            .filter(|m| m.namespace == pod.namespace)
            .count();
        let hint = if others > 0 {
            format!(
                "; {others} other ready pod(s) in namespace {}",
                pod.namespace
            )
        } else {
            "; is it scheduled on this node? (kubectl get pod -o wide)".to_string()
        };
        return Err(CriError::NotFound {
            pod: pod.to_string(),
            endpoint: endpoint.into(),
            hint,
        });
    };
    let id = sandbox.id.clone();
    let (_, netns, _) = status_of(client, endpoint, &id).await?;
    match netns {
        Netns::Path(p, pid) => Ok(PodNetns {
            sandbox_id: id,
            netns: p,
            pid,
        }),
        Netns::Pid(pid) => Ok(PodNetns {
            sandbox_id: id,
            netns: PathBuf::from(format!("/proc/{pid}/ns/net")),
            pid: Some(pid),
        }),
        Netns::Host => Err(CriError::HostNetwork {
            pod: pod.to_string(),
            id,
        }),
        Netns::Unknown => Err(CriError::NoNetns {
            pod: pod.to_string(),
            id,
        }),
    }
}

/// The newest ready sandbox whose metadata names `pod` (a pod restarting
/// briefly has two).
fn pick_sandbox<'a>(items: &'a [PodSandbox], pod: &PodName) -> Option<&'a PodSandbox> {
    items
        .iter()
        .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
        .filter(|s| {
            s.metadata
                .as_ref()
                .is_some_and(|m| m.namespace == pod.namespace && m.name == pod.name)
        })
        .max_by_key(|s| s.created_at)
}

#[derive(Debug, PartialEq)]
enum Netns {
    Path(PathBuf, Option<u32>),
    Pid(u32),
    Host,
    Unknown,
}

/// The verbose `info["info"]` JSON: `runtimeSpec.linux.namespaces`, `pid`.
fn netns_from_info(info: &HashMap<String, String>) -> Netns {
    let Some(v) = info
        .get("info")
        .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
    else {
        return Netns::Unknown;
    };
    let pid = v
        .get("pid")
        .and_then(serde_json::Value::as_u64)
        .and_then(|p| u32::try_from(p).ok())
        .filter(|&p| p > 0);
    let namespaces = v
        .pointer("/runtimeSpec/linux/namespaces")
        .and_then(serde_json::Value::as_array);
    if let Some(nss) = namespaces {
        let net = nss
            .iter()
            .find(|n| n.get("type").and_then(serde_json::Value::as_str) == Some("network"));
        match net {
            // An OCI spec without a network namespace entry shares the node's.
            None => return Netns::Host,
            Some(n) => {
                if let Some(p) = n
                    .get("path")
                    .and_then(serde_json::Value::as_str)
                    .filter(|p| !p.is_empty())
                {
                    return Netns::Path(PathBuf::from(p), pid);
                }
            }
        }
    }
    match pid {
        Some(p) => Netns::Pid(p),
        None => Netns::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_cri::v1::PodSandboxMetadata;

    fn sb(id: &str, ns: &str, name: &str, created: i64, ready: bool) -> PodSandbox {
        PodSandbox {
            id: id.into(),
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                namespace: ns.into(),
                uid: format!("uid-{id}"),
                attempt: 0,
            }),
            state: if ready {
                PodSandboxState::SandboxReady as i32
            } else {
                PodSandboxState::SandboxNotready as i32
            },
            created_at: created,
            ..Default::default()
        }
    }

    #[test]
    fn pod_names() {
        assert_eq!(
            PodName::parse("vpn/openvpn-0").unwrap(),
            PodName {
                namespace: "vpn".into(),
                name: "openvpn-0".into()
            }
        );
        for bad in ["vpn", "/x", "vpn/", "a/b/c", ""] {
            assert!(PodName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn newest_ready_sandbox_of_that_pod() {
        let items = vec![
            sb("old", "vpn", "openvpn-0", 1, true),
            sb("new", "vpn", "openvpn-0", 5, true),
            sb("dead", "vpn", "openvpn-0", 9, false),
            sb("other-ns", "default", "openvpn-0", 10, true),
        ];
        let pod = PodName::parse("vpn/openvpn-0").unwrap();
        assert_eq!(pick_sandbox(&items, &pod).unwrap().id, "new");
        assert!(pick_sandbox(&items, &PodName::parse("vpn/x").unwrap()).is_none());
    }

    fn info(v: serde_json::Value) -> HashMap<String, String> {
        HashMap::from([("info".to_string(), v.to_string())])
    }

    #[test]
    fn netns_from_verbose_info() {
        let containerd = info(serde_json::json!({
            "pid": 4242,
            "runtimeSpec": {"linux": {"namespaces": [
                {"type": "pid"},
                {"type": "network", "path": "/var/run/netns/cni-1234"}
            ]}}
        }));
        assert_eq!(
            netns_from_info(&containerd),
            Netns::Path(PathBuf::from("/var/run/netns/cni-1234"), Some(4242))
        );
        let host = info(serde_json::json!({
            "pid": 7, "runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}]}}
        }));
        assert_eq!(netns_from_info(&host), Netns::Host);
        let no_path = info(serde_json::json!({
            "pid": 7, "runtimeSpec": {"linux": {"namespaces": [{"type": "network"}]}}
        }));
        assert_eq!(netns_from_info(&no_path), Netns::Pid(7));
        assert_eq!(netns_from_info(&HashMap::new()), Netns::Unknown);
        assert_eq!(
            netns_from_info(&HashMap::from([("info".into(), "not json".into())])),
            Netns::Unknown
        );
    }
}
