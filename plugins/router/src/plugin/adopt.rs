//! Adoption: ADD for a sandbox that was already running before the
//! runtime served podgate's chain, on behalf of the node agent.
//!
//! Nothing here decides policy or applies anything itself: the sandbox's
//! metadata and annotations become the request ADD would have had (CNI_ARGS
//! `K8S_POD_NAMESPACE`/`K8S_POD_NAME`, the annotation capability only when
//! podgate-router's entry declares it, as libcni passes it), its interface's
//! addresses, read from its netns, become prevResult, and ADD's own code
//! selects, plans, refuses, writes the record ahead and applies. The record
//! says `adopted`.

use super::{add, io_err, key_of, load, selection, store, Router};
use crate::config::ANNOTATIONS_CAPABILITY;
use crate::record;
use podgate_cni::version::Version;
use podgate_cni::{code, CniError, Command, Env, NetConf, Plugin, Request};
use podgate_kit::link;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A running sandbox, as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    pub namespace: String,
    pub name: String,
    pub annotations: BTreeMap<String, String>,
    pub netns: PathBuf,
}

/// What adoption did with one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adoption {
    /// Policy selects no profile for it: untouched.
    NotSelected,
    /// podgate already has a record of this attachment: untouched.
    Recorded,
    /// The profile is applied and recorded (`adopted`).
    Applied { profile: String, source: String },
}

/// The request ADD would have had for `sb` on `ifname`, with `entry`
/// (podgate-router's entry of the loaded conflist, `name` and `cniVersion`
/// set as the runtime sets them). Reads the interface's addresses in the
/// sandbox's netns: a netns that is gone is CNI code 3 (unknown container).
pub fn request(entry: &Value, ifname: &str, sb: &Sandbox) -> Result<Request, CniError> {
    podgate_cni::env::validate_container_id(&sb.id)?;
    podgate_cni::env::validate_ifname(ifname)?;
    let mut conf = object_of(entry)?;
    let declared = conf
        .get("capabilities")
        .and_then(|c| c.get(ANNOTATIONS_CAPABILITY))
        .and_then(Value::as_bool)
        == Some(true);
    if declared {
        let ann: Map<String, Value> = sb
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        conf.insert(
            "runtimeConfig".into(),
            json!({ ANNOTATIONS_CAPABILITY: ann }),
        );
    }
    let version = conf
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let ips = addresses_of(sb, ifname)?;
    conf.insert(
        "prevResult".into(),
        json!({
            "cniVersion": version,
            "interfaces": [{"name": ifname, "sandbox": sb.netns}],
            "ips": ips.iter().map(|a| json!({"address": a.to_string(), "interface": 0})).collect::<Vec<_>>(),
        }),
    );
    let (conf, version) = parsed(conf)?;
    Ok(Request {
        command: Command::Add,
        env: Env {
            container_id: sb.id.clone(),
            netns: Some(sb.netns.clone()),
            ifname: ifname.to_string(),
            args: vec![
                ("IgnoreUnknown".into(), "1".into()),
                ("K8S_POD_NAMESPACE".into(), sb.namespace.clone()),
                ("K8S_POD_NAME".into(), sb.name.clone()),
                ("K8S_POD_INFRA_CONTAINER_ID".into(), sb.id.clone()),
            ],
            path: Vec::new(),
        },
        conf,
        version,
    })
}

/// The interface's global addresses in the sandbox's netns (what the
/// primary's result listed).
fn addresses_of(sb: &Sandbox, ifname: &str) -> Result<Vec<ipnet::IpNet>, CniError> {
    let ns = NetNs::open(&sb.netns).map_err(|e| {
        let c = if e.is_not_found() {
            code::UNKNOWN_CONTAINER
        } else {
            code::INVALID_ENV
        };
        CniError::new(c, e.to_string())
    })?;
    let err = |e: podgate_kit::Error| {
        CniError::new(
            code::UNKNOWN_CONTAINER,
            format!("sandbox {} netns {}: {e}", sb.id, sb.netns.display()),
        )
    };
    let mut sock = RouteSocket::in_netns(&ns).map_err(err)?;
    let index = link::index_of(&mut sock, ifname).map_err(err)?;
    let ips: Vec<_> = link::addresses(&mut sock)
        .map_err(err)?
        .into_iter()
        .filter(|a| a.index == index)
        .map(|a| a.addr)
        .filter(|a| match a {
            ipnet::IpNet::V4(_) => true,
            // fe80::/10 is not an address a primary hands out.
            ipnet::IpNet::V6(n) => n.addr().segments()[0] & 0xffc0 != 0xfe80,
        })
        .collect();
    if ips.is_empty() {
        return Err(CniError::new(
            code::UNKNOWN_CONTAINER,
            format!("sandbox {}: {ifname} has no address", sb.id),
        ));
    }
    Ok(ips)
}

/// Policy's verdict on `sb` first (no profile: untouched, nothing read
/// beyond its addresses), then whether a record exists (untouched), then
/// ADD itself. Refusals are ADD's, with its codes.
pub fn adopt(entry: &Value, ifname: &str, sb: &Sandbox) -> Result<Adoption, CniError> {
    let req = request(entry, ifname, sb)?;
    let cfg = load(&req.conf)?;
    let Some(sel) = selection(&cfg, &req)? else {
        return Ok(Adoption::NotSelected);
    };
    let store = store(&cfg)?;
    match record::read(&store, &key_of(&req)) {
        // An adoption killed half-way (the agent died) left its pending
        // record: ADD replaces it, as a repeated ADD does. Any other record
        // is the runtime's or a finished adoption.
        Ok(Some(r)) if r.adopted && r.status == record::Status::Pending => {}
        Ok(Some(_)) => return Ok(Adoption::Recorded),
        Ok(None) => {}
        Err(e) => return Err(io_err(e)),
    }
    add::add_as(&req, true)?;
    Ok(Adoption::Applied {
        profile: sel.profile,
        source: sel.source.to_string(),
    })
}

/// DEL of what [`adopt`] applied to `sb` (the sandbox stopped while it was
/// adopted): the runtime's DEL may have come before the record existed.
pub fn undo(entry: &Value, ifname: &str, sb: &Sandbox) -> Result<(), CniError> {
    let mut conf = object_of(entry)?;
    conf.remove("prevResult");
    let (conf, version) = parsed(conf)?;
    let req = Request {
        command: Command::Del,
        env: Env {
            container_id: sb.id.clone(),
            netns: Some(sb.netns.clone()).filter(|p| p.exists()),
            ifname: ifname.to_string(),
            args: Vec::new(),
            path: Vec::new(),
        },
        conf,
        version,
    };
    Router.del(&req)
}

fn object_of(entry: &Value) -> Result<Map<String, Value>, CniError> {
    entry
        .as_object()
        .cloned()
        .ok_or_else(|| CniError::invalid_config("podgate-router's entry is not an object"))
}

/// The config as a plugin would have read it from stdin, and its version.
fn parsed(conf: Map<String, Value>) -> Result<(NetConf, Version), CniError> {
    let conf = NetConf::parse(Value::Object(conf).to_string().as_bytes())?;
    let version = Version::parse(&conf.cni_version).ok_or_else(|| {
        CniError::incompatible_version(format!("cniVersion {:?}", conf.cni_version))
    })?;
    Ok((conf, version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn ip(args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("running ip");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A throwaway netns `pg-adopt-<tag>-<pid>` with forwarding off, removed
    /// on drop; for a pod, `eth0` (a veth, its peer in the same netns)
    /// holding 10.77.0.5/24.
    struct PodNs(String);

    impl PodNs {
        fn new(tag: &str, pod: bool) -> PodNs {
            let name = format!("pg-adopt-{tag}-{}", std::process::id());
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
            ip(&["netns", "add", &name]);
            let ns = PodNs(name.clone());
            if pod {
                ip(&[
                    "-n", &name, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
                ]);
                ip(&["-n", &name, "addr", "add", "10.77.0.5/24", "dev", "eth0"]);
            }
            ns.set_forwarding("0");
            ns
        }

        fn path(&self) -> PathBuf {
            PathBuf::from("/run/netns").join(&self.0)
        }

        fn forwarding(&self) -> String {
            let out = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.0,
                    "cat",
                    "/proc/sys/net/ipv4/ip_forward",
                ])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }

        fn set_forwarding(&self, v: &str) {
            let w = format!("net.ipv4.ip_forward={v}");
            ip(&["netns", "exec", &self.0, "sysctl", "-qw", &w]);
        }
    }

    impl Drop for PodNs {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }

    fn sandbox(ns: &str, path: PathBuf) -> Sandbox {
        Sandbox {
            id: "adopt-test-sandbox".into(),
            namespace: ns.into(),
            name: "openvpn-0".into(),
            annotations: BTreeMap::new(),
            netns: path,
        }
    }

    /// Runs `f` on a thread in `node` (ADD's node side must not touch this
    /// machine's netns).
    fn on_node<T: Send>(node: &PodNs, f: impl FnOnce() -> T + Send) -> T {
        NetNs::open(&node.path()).unwrap().run(f).unwrap()
    }

    #[test]
    fn a_selected_sandbox_is_adopted_once_undone_when_stopped_and_refused_once_its_netns_is_gone() {
        let state = std::env::temp_dir().join(format!("podgate-adopt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        let entry = json!({
            "type": "podgate-router", "name": "n", "cniVersion": "1.0.0",
            "stateDir": state,
            "profiles": {"p": {"sysctls": {"net.ipv4.ip_forward": "1"}}},
            "assign": [{"namespace": "vpn", "profile": "p"}]
        });
        let node = PodNs::new("node", false);
        let pod = PodNs::new("pod", true);
        let records = || {
            std::fs::read_dir(&state)
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                        .count()
                })
                .unwrap_or(0)
        };
        on_node(&node, || {
            let sb = sandbox("vpn", pod.path());
            assert_eq!(
                adopt(&entry, "eth0", &sandbox("default", pod.path())).unwrap(),
                Adoption::NotSelected
            );
            assert_eq!(records(), 0);
            assert_eq!(
                adopt(&entry, "eth0", &sb).unwrap(),
                Adoption::Applied {
                    profile: "p".into(),
                    source: "assign[0]".into()
                }
            );
            assert_eq!(pod.forwarding(), "1");
            let key = podgate_kit::state::Key::new("n", &sb.id, "eth0");
            let st = podgate_kit::state::StateStore::open(&state).unwrap();
            let rec = record::read(&st, &key).unwrap().unwrap();
            assert!(rec.adopted && rec.status == record::Status::Applied);
            assert_eq!(rec.pod_ips[0].to_string(), "10.77.0.5/24");
            assert_eq!(adopt(&entry, "eth0", &sb).unwrap(), Adoption::Recorded);
            // An adoption killed half-way left its record pending: the next
            // scan's adoption replaces it and finishes.
            let mut half = rec.clone();
            half.status = record::Status::Pending;
            record::write(&st, &half).unwrap();
            assert!(matches!(
                adopt(&entry, "eth0", &sb).unwrap(),
                Adoption::Applied { .. }
            ));
            let again = record::read(&st, &key).unwrap().unwrap();
            assert_eq!(again.status, record::Status::Applied);
            assert_eq!(pod.forwarding(), "1");
            // Stopped while adopted: undone.
            undo(&entry, "eth0", &sb).unwrap();
            assert_eq!(records(), 0);
            assert_eq!(pod.forwarding(), "0");
        });
        let gone = pod.path();
        drop(pod);
        on_node(&node, || {
            let e = adopt(&entry, "eth0", &sandbox("vpn", gone)).unwrap_err();
            assert_eq!(e.code, code::UNKNOWN_CONTAINER, "{}", e.msg);
            assert_eq!(records(), 0);
        });
        let _ = std::fs::remove_dir_all(&state);
    }
}
