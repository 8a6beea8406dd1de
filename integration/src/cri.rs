//! The kubelet's side of CRI for the tests: a blocking client (`k8s-cri`)
//! that runs, inspects, stops and removes pod sandboxes on a test
//! [`Containerd`], and what a test reads inside a sandbox's netns.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use crate::containerd::Containerd;
use crate::output_text;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, CreateContainerRequest, Image, ImageSpec, ImageStatusRequest,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, PortMapping, PullImageRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopPodSandboxRequest,
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
    images: ImageServiceClient<Channel>,
}

/// A pod as the kubelet describes it.
pub struct Pod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub annotations: &'a [(&'a str, &'a str)],
    /// (hostPort, containerPort) UDP mappings.
    pub udp_ports: &'a [(i32, i32)],
    /// `hostNetwork: true`: the node's netns, no CNI call.
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

    /// The sandbox config the kubelet sends (labels, annotations, ports,
    /// namespaces) under `cgroup_parent`.
    pub fn sandbox_config(&self, cgroup_parent: &str) -> PodSandboxConfig {
        let network = match self.host_network {
            true => NamespaceMode::Node,
            false => NamespaceMode::Pod,
        };
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: self.name.into(),
                uid: format!("uid-{}-{}", self.namespace, self.name),
                namespace: self.namespace.into(),
                attempt: 0,
            }),
            // The kubelet sets none for a host-network pod (it shares the
            // node's UTS namespace).
            hostname: match self.host_network {
                true => String::new(),
                false => self.name.into(),
            },
            port_mappings: self
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
                ("io.kubernetes.pod.name".into(), self.name.into()),
                ("io.kubernetes.pod.namespace".into(), self.namespace.into()),
            ]),
            annotations: self
                .annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.into(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: network as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl Cri {
    pub fn connect(c: &Containerd) -> Cri {
        Cri::connect_socket(&c.socket()).expect("connecting to containerd's CRI socket")
    }

    /// A client of the CRI socket at `sock` (any runtime, or a proxy), or
    /// why it cannot connect.
    pub fn connect_socket(sock: &Path) -> Result<Cri, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let sock = sock.to_path_buf();
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
            .map_err(|e| {
                let mut msg = e.to_string();
                let mut cur = std::error::Error::source(&e);
                while let Some(c) = cur {
                    msg = format!("{msg}: {c}");
                    cur = c.source();
                }
                msg
            })?;
        Ok(Cri {
            rt,
            client: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        })
    }

    /// ListPodSandbox: how many sandboxes the runtime lists, or its error.
    pub fn count_sandboxes(&mut self) -> Result<usize, String> {
        self.rt
            .block_on(
                self.client
                    .list_pod_sandbox(k8s_cri::v1::ListPodSandboxRequest { filter: None }),
            )
            .map(|r| r.into_inner().items.len())
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    }

    /// PullImage, as the kubelet asks for a container's image; the image
    /// reference (ID) the runtime returns, or its error message.
    pub fn pull_image(&mut self, image: &str) -> Result<String, String> {
        self.rt
            .block_on(self.images.pull_image(PullImageRequest {
                image: image_spec(image),
                auth: None,
                sandbox_config: None,
            }))
            .map(|r| r.into_inner().image_ref)
            .map_err(|s| s.message().to_string())
    }

    /// ImageStatus: the image the runtime has under `image`, if any.
    pub fn image_status(&mut self, image: &str) -> Option<Image> {
        self.rt
            .block_on(self.images.image_status(ImageStatusRequest {
                image: image_spec(image),
                verbose: false,
            }))
            .unwrap_or_else(|s| panic!("ImageStatus {image}: {s}"))
            .into_inner()
            .image
    }

    /// RunPodSandbox; the sandbox ID, or the runtime's error message.
    pub fn run(&mut self, c: &Containerd, pod: &Pod) -> Result<String, String> {
        self.run_sandbox(&pod.sandbox_config(c.cgroup_parent()))
    }

    /// RunPodSandbox with `config` as given.
    pub fn run_sandbox(&mut self, config: &PodSandboxConfig) -> Result<String, String> {
        self.rt
            .block_on(self.client.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
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
        self.try_stop(id)
            .unwrap_or_else(|s| panic!("StopPodSandbox {id}: {s}"));
    }

    /// StopPodSandbox, or the runtime's (or a proxy's) error message.
    pub fn try_stop(&mut self, id: &str) -> Result<(), String> {
        self.rt
            .block_on(self.client.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .map(|_| ())
            .map_err(|s| s.message().to_string())
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

    /// CreateContainer + StartContainer in `sandbox`; the container ID.
    pub fn start_container(
        &mut self,
        sandbox: &str,
        sandbox_config: &PodSandboxConfig,
        config: ContainerConfig,
    ) -> Result<String, String> {
        let id = self
            .rt
            .block_on(self.client.create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox.into(),
                config: Some(config),
                sandbox_config: Some(sandbox_config.clone()),
            }))
            .map_err(|s| format!("CreateContainer: {}", s.message()))?
            .into_inner()
            .container_id;
        self.rt
            .block_on(self.client.start_container(StartContainerRequest {
                container_id: id.clone(),
            }))
            .map_err(|s| format!("StartContainer: {}", s.message()))?;
        Ok(id)
    }
}

/// An image as CRI requests name it.
fn image_spec(image: &str) -> Option<ImageSpec> {
    Some(ImageSpec {
        image: image.into(),
        ..Default::default()
    })
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
