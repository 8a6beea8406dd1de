//! The kubelet's side of CRI for the tests: a blocking client (`k8s-cri`)
//! that runs, inspects, stops and removes pod sandboxes on a test
//! [`Containerd`], and what a test reads inside a sandbox's netns.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use crate::containerd::Containerd;
use crate::output_text;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, PodSandboxStatusRequest, PortMapping, RemovePodSandboxRequest,
    RunPodSandboxRequest, StopPodSandboxRequest,
};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

const CRI_TIMEOUT: Duration = Duration::from_secs(60);

/// A blocking CRI client (one current-thread tokio runtime per client).
pub struct Cri {
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

/// A pod as the kubelet describes it.
pub struct Pod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub annotations: &'a [(&'a str, &'a str)],
    /// (hostPort, containerPort) UDP mappings.
    pub udp_ports: &'a [(i32, i32)],
    /// hostNetwork: the sandbox shares the node's netns.
    pub host_network: bool,
}

impl<'a> Pod<'a> {
    pub fn new(namespace: &'a str, name: &'a str) -> Pod<'a> {
        Pod {
            namespace,
            name,
            annotations: &[],
            udp_ports: &[],
            host_network: false,
        }
    }
}

impl Cri {
    pub fn connect(c: &Containerd) -> Cri {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let sock = c.socket();
        let channel = rt
            .block_on(
                Endpoint::from_static("http://cri.invalid")
                    .timeout(CRI_TIMEOUT)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let sock = sock.clone();
                        async move {
                            let s = tokio::net::UnixStream::connect(sock).await?;
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                        }
                    })),
            )
            .expect("connecting to containerd's CRI socket");
        Cri {
            rt,
            client: RuntimeServiceClient::new(channel),
        }
    }

    /// RunPodSandbox; the sandbox ID, or the runtime's error message.
    pub fn run(&mut self, c: &Containerd, pod: &Pod) -> Result<String, String> {
        let uid = format!("uid-{}-{}", pod.namespace, pod.name);
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod.name.into(),
                uid,
                namespace: pod.namespace.into(),
                attempt: 0,
            }),
            // The kubelet sets none for hostNetwork (runc refuses one
            // without a UTS namespace of its own).
            hostname: if pod.host_network {
                String::new()
            } else {
                pod.name.into()
            },
            port_mappings: pod
                .udp_ports
                .iter()
                .map(|&(host, container)| PortMapping {
                    protocol: k8s_cri::v1::Protocol::Udp as i32,
                    container_port: container,
                    host_port: host,
                    host_ip: String::new(),
                })
                .collect(),
            labels: HashMap::from([
                ("io.kubernetes.pod.name".into(), pod.name.into()),
                ("io.kubernetes.pod.namespace".into(), pod.namespace.into()),
            ]),
            annotations: pod
                .annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: c.cgroup_parent().into(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: if pod.host_network {
                            k8s_cri::v1::NamespaceMode::Node as i32
                        } else {
                            k8s_cri::v1::NamespaceMode::Pod as i32
                        },
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.rt
            .block_on(self.client.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            }))
            .map(|r| r.into_inner().pod_sandbox_id)
            .map_err(|s| s.message().to_string())
    }

    /// The sandbox's netns path, from PodSandboxStatus(verbose).
    pub fn netns(&mut self, id: &str) -> PathBuf {
        let info = self
            .rt
            .block_on(self.client.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: true,
            }))
            .unwrap()
            .into_inner()
            .info;
        let v: Value = serde_json::from_str(&info["info"]).unwrap();
        let path = v["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["type"] == "network")
            .and_then(|n| n["path"].as_str())
            .unwrap();
        PathBuf::from(path)
    }

    /// Whether the sandbox is ready (PodSandboxStatus).
    pub fn ready(&mut self, id: &str) -> bool {
        self.rt
            .block_on(self.client.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            }))
            .unwrap()
            .into_inner()
            .status
            .is_some_and(|s| s.state == k8s_cri::v1::PodSandboxState::SandboxReady as i32)
    }

    pub fn stop(&mut self, id: &str) {
        self.rt
            .block_on(self.client.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .unwrap_or_else(|s| panic!("StopPodSandbox {id}: {s}"));
    }

    pub fn remove(&mut self, id: &str) {
        self.rt
            .block_on(self.client.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .unwrap_or_else(|s| panic!("RemovePodSandbox {id}: {s}"));
    }

    /// What the kubelet does when a pod is deleted.
    pub fn stop_and_remove(&mut self, id: &str) {
        self.stop(id);
        self.remove(id);
    }
}

pub fn in_netns(netns: &Path, args: &[&str]) -> Output {
    Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

pub fn sysctl_in(netns: &Path, key: &str) -> String {
    let out = in_netns(
        netns,
        &["cat", &format!("/proc/sys/{}", key.replace('.', "/"))],
    );
    assert!(out.status.success(), "{}", output_text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// podgate's nf_tables table in a sandbox, if it is there.
pub fn pod_nft(netns: &Path) -> Option<String> {
    let out = in_netns(netns, &["nft", "list", "table", "inet", "podgate-eth0"]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
