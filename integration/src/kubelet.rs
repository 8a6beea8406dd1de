//! The kubelet's part of running a pod from `conf/kubernetes/`, for the
//! test containerd: read the manifests (YAML, every document), and turn a
//! pod template's container into the CRI request the kubelet would send:
//! downward-API env values, `$(VAR)` expansion in args, ConfigMap volumes as
//! files (the kubelet's `..data` layout), hostPath volumes mapped under a
//! throwaway "host" root (and mounted at that mapped path too, where the
//! ConfigMap's node paths point), securityContext (with the kubelet's
//! masked and read-only `/proc` paths) and probes as written.

// Test harness: JSON navigation by index (a missing key is Null).
#![allow(clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use k8s_cri::v1::{
    Capability, ContainerConfig, ContainerMetadata, ImageSpec, Int64Value, KeyValue,
    LinuxContainerConfig, LinuxContainerSecurityContext, Mount, MountPropagation, NamespaceMode,
    NamespaceOption, SecurityProfile,
};
use serde_json::Value;

/// What the kubelet asks the runtime to mask in a container that is not
/// privileged (`procMount: Default`).
const DEFAULT_MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// ... and to mount read-only.
const DEFAULT_READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

fn strings_of(paths: &[&str]) -> Vec<String> {
    paths.iter().map(|p| p.to_string()).collect()
}

/// Every document of every `*.yaml` file given.
pub fn read_manifests(files: &[PathBuf]) -> Vec<Value> {
    let mut docs = Vec::new();
    for f in files {
        let text = fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            if !v.is_null() {
                docs.push(v);
            }
        }
    }
    docs
}

/// The object of `kind` named `name`.
pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the manifests"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The image every container of DaemonSet `ds` runs (one image per
/// DaemonSet, asserted).
pub fn image_of(ds: &Value) -> String {
    let images: Vec<&str> = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("a pod template with containers")
        .iter()
        .map(|c| c["image"].as_str().expect("a container's image"))
        .collect();
    assert!(
        !images.is_empty() && images.windows(2).all(|w| w[0] == w[1]),
        "{images:?}"
    );
    images[0].to_string()
}

/// `$(NAME)` replaced by the env value; `$$` escapes; unknown names stay
/// as written (the kubelet's rules).
pub fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.get(name) {
                        Some(v) => out.push_str(v),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str(&rest[i..]);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A node as the kubelet sees it.
pub struct Kubelet {
    /// Host paths are mapped to `<host_root>/<path>`.
    pub host_root: PathBuf,
    /// Host paths used as they are (the runtime's own dirs on this machine).
    pub shared: Vec<PathBuf>,
    /// `status.hostIP`.
    pub host_ip: String,
    /// Where this pod's volumes (ConfigMaps, emptyDirs) live.
    pub pod_dir: PathBuf,
    /// ConfigMaps that exist: name -> data.
    pub configmaps: BTreeMap<String, BTreeMap<String, String>>,
}

/// One container of a pod template, with its CRI request.
pub struct Container {
    pub name: String,
    pub spec: Value,
    pub config: ContainerConfig,
}

impl Container {
    /// The readiness probe's exec command, if any.
    pub fn readiness_exec(&self) -> Option<Vec<String>> {
        let c = strings(&self.spec["readinessProbe"]["exec"]["command"]);
        (!c.is_empty()).then_some(c)
    }

    /// Whether the container adds any capability.
    pub fn adds_capabilities(&self) -> bool {
        !strings(&self.spec["securityContext"]["capabilities"]["add"]).is_empty()
    }
}

impl Kubelet {
    /// `path` of the node, as seen from this machine.
    pub fn host_path(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        if self.shared.iter().any(|s| p.starts_with(s)) {
            // Symlinks resolved (/var/run -> /run): containerd 1.6 checks a
            // HostToContainer source's propagation on the path as given.
            return p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        }
        self.host_root.join(path.trim_start_matches('/'))
    }

    /// A JSON value with every absolute path (a string starting with `/`)
    /// mapped by [`Kubelet::host_path`]: the operator's plugin config names
    /// the node's paths.
    pub fn map_paths(&self, v: &Value) -> Value {
        match v {
            Value::String(s) if s.starts_with('/') => {
                Value::String(self.host_path(s).display().to_string())
            }
            Value::Array(a) => Value::Array(a.iter().map(|x| self.map_paths(x)).collect()),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, x)| (k.clone(), self.map_paths(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    fn env(&self, c: &Value) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for e in c["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap().to_string();
            let value = if let Some(v) = e["value"].as_str() {
                expand(v, &env)
            } else {
                match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    Some("status.hostIP") => self.host_ip.clone(),
                    other => panic!("env {name}: fieldRef {other:?} not done by this kubelet"),
                }
            };
            env.insert(name, value);
        }
        env
    }

    /// The volume `name` of `pod` as a host path (made as the kubelet makes
    /// it).
    fn volume(&self, pod: &Value, name: &str) -> PathBuf {
        let v = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("volume {name} not in the pod template"));
        if let Some(path) = v["hostPath"]["path"].as_str() {
            let p = self.host_path(path);
            match v["hostPath"]["type"].as_str() {
                Some("DirectoryOrCreate") => fs::create_dir_all(&p).unwrap(),
                Some("Directory") => assert!(p.is_dir(), "{}: not a dir", p.display()),
                other => panic!("hostPath type {other:?} not done by this kubelet"),
            }
            return p;
        }
        let dir = self.pod_dir.join("volumes").join(name);
        fs::create_dir_all(&dir).unwrap();
        if v.get("emptyDir").is_some() {
            return dir;
        }
        let cm = &v["configMap"];
        let cm_name = cm["name"]
            .as_str()
            .expect("a hostPath, emptyDir or configMap volume");
        match self.configmaps.get(cm_name) {
            None => assert!(
                cm["optional"] == true,
                "ConfigMap {cm_name} missing and not optional"
            ),
            Some(data) => {
                // The kubelet's atomic writer: files in a timestamped dir,
                // `..data` pointing at it, each key a symlink through it.
                let ts = dir.join("..2026_01_01_00_00_00.000000001");
                if ts.exists() {
                    return dir;
                }
                fs::create_dir_all(&ts).unwrap();
                let items: Vec<(String, String)> = match cm["items"].as_array() {
                    Some(items) => items
                        .iter()
                        .map(|i| {
                            let k = i["key"].as_str().unwrap().to_string();
                            (k, i["path"].as_str().unwrap().to_string())
                        })
                        .collect(),
                    None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
                };
                for (key, path) in items {
                    let text = data
                        .get(&key)
                        .unwrap_or_else(|| panic!("ConfigMap {cm_name} has no key {key}"));
                    fs::write(ts.join(&path), text).unwrap();
                    std::os::unix::fs::symlink(format!("..data/{path}"), dir.join(&path)).unwrap();
                }
                std::os::unix::fs::symlink(ts.file_name().unwrap(), dir.join("..data")).unwrap();
            }
        }
        dir
    }

    /// Whether volume `name` is a hostPath mapped under [`Kubelet::host_root`].
    fn is_mapped_host_path(&self, pod: &Value, name: &str) -> bool {
        pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == name)
            .and_then(|v| v["hostPath"]["path"].as_str())
            .is_some_and(|p| self.host_path(p).starts_with(&self.host_root))
    }

    /// (Re)writes the ConfigMap volumes of `template` from
    /// [`Kubelet::configmaps`], as the kubelet does when a ConfigMap appears
    /// or changes.
    pub fn sync_configmap_volumes(&self, template: &Value) {
        let pod = &template["spec"];
        for v in pod["volumes"].as_array().into_iter().flatten() {
            if v.get("configMap").is_some() {
                self.volume(pod, v["name"].as_str().unwrap());
            }
        }
    }

    /// The pod template's container `name` as the CRI request the kubelet
    /// sends for it.
    pub fn container(&self, template: &Value, name: &str) -> Container {
        let pod = &template["spec"];
        let c = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("container {name} not in the pod template"));
        let env = self.env(c);
        let sc = &c["securityContext"];
        let id = |v: &Value| v.as_i64().map(|value| Int64Value { value });
        let profile = |v: &Value| match v["type"].as_str() {
            Some("RuntimeDefault") => Some(SecurityProfile {
                profile_type: k8s_cri::v1::security_profile::ProfileType::RuntimeDefault as i32,
                localhost_ref: String::new(),
            }),
            None => None,
            other => panic!("seccompProfile {other:?} not done by this kubelet"),
        };
        let seccomp = profile(&sc["seccompProfile"])
            .or_else(|| profile(&pod["securityContext"]["seccompProfile"]));
        let mounts = c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|m| {
                let propagation = match m["mountPropagation"].as_str() {
                    None | Some("None") => MountPropagation::PropagationPrivate,
                    Some("HostToContainer") => MountPropagation::PropagationHostToContainer,
                    Some("Bidirectional") => MountPropagation::PropagationBidirectional,
                    Some(other) => panic!("mountPropagation {other}"),
                };
                let name = m["name"].as_str().unwrap();
                let host = self.volume(pod, name);
                let mount = |container_path: String| Mount {
                    container_path,
                    host_path: host.display().to_string(),
                    readonly: m["readOnly"] == true,
                    propagation: propagation as i32,
                    ..Default::default()
                };
                let mut out = vec![mount(m["mountPath"].as_str().unwrap().into())];
                // A hostPath mapped under the host root is also where the
                // ConfigMap's (mapped) node paths say it is, as on a node,
                // where the two are one path: same dir, same mode.
                if self.is_mapped_host_path(pod, name) {
                    out.push(mount(host.display().to_string()));
                }
                out
            })
            .collect();
        let network = match pod["hostNetwork"] == true {
            true => NamespaceMode::Node,
            false => NamespaceMode::Pod,
        };
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: c["image"].as_str().unwrap().into(),
                ..Default::default()
            }),
            command: strings(&c["command"])
                .iter()
                .map(|a| expand(a, &env))
                .collect(),
            args: strings(&c["args"])
                .iter()
                .map(|a| expand(a, &env))
                .collect(),
            envs: env
                .iter()
                .map(|(key, value)| KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            mounts,
            log_path: format!("{name}.log"),
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    capabilities: Some(Capability {
                        add_capabilities: strings(&sc["capabilities"]["add"]),
                        drop_capabilities: strings(&sc["capabilities"]["drop"]),
                        ..Default::default()
                    }),
                    privileged: sc["privileged"] == true,
                    // The kubelet's defaults for `procMount: Default`
                    // (pkg/securitycontext): a container's /proc/sys is
                    // read-only.
                    masked_paths: match sc["privileged"] == true {
                        true => Vec::new(),
                        false => strings_of(&DEFAULT_MASKED_PATHS),
                    },
                    readonly_paths: match sc["privileged"] == true {
                        true => Vec::new(),
                        false => strings_of(&DEFAULT_READONLY_PATHS),
                    },
                    namespace_options: Some(NamespaceOption {
                        network: network as i32,
                        ..Default::default()
                    }),
                    run_as_user: id(&sc["runAsUser"]),
                    run_as_group: id(&sc["runAsGroup"]),
                    readonly_rootfs: sc["readOnlyRootFilesystem"] == true,
                    no_new_privs: sc["allowPrivilegeEscalation"] == false,
                    seccomp,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        Container {
            name: name.into(),
            spec: c.clone(),
            config,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_follows_the_kubelets_rules() {
        let env = BTreeMap::from([("HOST_IP".to_string(), "10.0.0.5".to_string())]);
        assert_eq!(expand("--a=$(HOST_IP):9750", &env), "--a=10.0.0.5:9750");
        assert_eq!(expand("$$(HOST_IP)", &env), "$(HOST_IP)");
        assert_eq!(expand("$(NOPE)x", &env), "$(NOPE)x");
        assert_eq!(expand("a$b$(", &env), "a$b$(");
    }
}
