//! Adoption: ADD for a sandbox that was already running before the
//! runtime served podgate's chain, on behalf of the node agent.
//!
//! Nothing here decides policy or applies anything itself: the sandbox's
//! metadata and annotations become the request ADD would have had (CNI_ARGS
//! `K8S_POD_NAMESPACE`/`K8S_POD_NAME`, the annotation capability only when
//! podgate-router's entry declares it, as libcni passes it), the addresses
//! the runtime reports for it become prevResult (refused unless its
//! interface holds exactly those: the pod's own listing is not trusted),
//! and ADD's own code selects, plans, refuses, writes the record ahead and
//! applies. The record says `adopted`.

use super::{add, load, selection, store, Router};
use crate::config::{ConfigError, ANNOTATIONS_CAPABILITY};
use crate::error::Error;
use crate::record;
use crate::refusal::Refusal;
use podgate_cni::version::{self, Version};
use podgate_cni::{CniError, Command, Env, NetConf, Plugin, Request};
use podgate_kit::link;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

/// A running sandbox, as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    pub namespace: String,
    pub name: String,
    pub annotations: BTreeMap<String, String>,
    pub netns: PathBuf,
    /// Its addresses as the runtime reports them (CRI `PodSandboxStatus`
    /// `network.ip` and `additionalIps`): what finds its pod interface.
    pub ips: Vec<IpAddr>,
}

/// What adoption did with one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adoption {
    /// Policy selects no profile for it: untouched.
    NotSelected,
    /// podgate already has a record of this attachment: untouched.
    Recorded,
    /// The profile is applied and recorded (`adopted`) on the pod's
    /// interface `ifname`.
    Applied {
        profile: String,
        source: String,
        ifname: String,
    },
}

/// The request ADD would have had for `sb` on `ifname`, with `entry`
/// (podgate-router's entry of the loaded conflist, `name` and `cniVersion`
/// set as the runtime sets them). prevResult lists the runtime's addresses
/// for the sandbox, as its interface holds them ([`addresses_of`]): a
/// netns that is gone is CNI code 3 (unknown container).
pub fn request(entry: &Value, ifname: &str, sb: &Sandbox) -> Result<Request, CniError> {
    podgate_cni::env::validate_ifname(ifname)?;
    let mut conf = conf_of(entry, sb)?;
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
        env: env_of(sb, ifname),
        conf,
        version,
    })
}

/// `entry` with the sandbox's annotations as the annotation capability,
/// only when the entry declares it (as libcni passes it).
fn conf_of(entry: &Value, sb: &Sandbox) -> Result<Map<String, Value>, CniError> {
    podgate_cni::env::validate_container_id(&sb.id)?;
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
    Ok(conf)
}

/// The environment ADD would have had: the kubelet's CNI_ARGS.
fn env_of(sb: &Sandbox, ifname: &str) -> Env {
    Env {
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
    }
}

/// The sandbox's netns, open; gone: CNI code 3 (unknown container).
fn netns_of(sb: &Sandbox) -> Result<(NetNs, RouteSocket), CniError> {
    let ns = NetNs::open(&sb.netns).map_err(Error::Netns)?;
    let sock = RouteSocket::in_netns(&ns).map_err(|e| gone(sb, e))?;
    Ok((ns, sock))
}

fn gone(sb: &Sandbox, source: podgate_kit::Error) -> Error {
    Error::SandboxGone {
        id: sb.id.clone(),
        netns: sb.netns.clone(),
        source,
    }
}

/// The sandbox's pod interface: the one interface in its netns holding an
/// address the runtime reports for the sandbox ([`Sandbox::ips`]). None or
/// several: refused (code 4), never guessed.
pub fn interface_of(sb: &Sandbox) -> Result<String, CniError> {
    let (_ns, mut sock) = netns_of(sb)?;
    let links = link::list(&mut sock).map_err(|e| gone(sb, e))?;
    let held: Vec<(String, IpAddr)> = link::addresses(&mut sock)
        .map_err(|e| gone(sb, e))?
        .into_iter()
        .filter_map(|a| Some((link::name_of(&links, a.index)?.to_string(), a.addr.addr())))
        .collect();
    Ok(
        pick_interface(&held, &sb.ips)
            .map_err(|m| Error::Env(format!("sandbox {}: {m}", sb.id)))?,
    )
}

/// Why a sandbox's pod interface is not known (never guessed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterfaceUnknown {
    #[error("the runtime reports no address for it: its pod interface is not known")]
    NoAddress,
    #[error("no interface in its netns holds {}", joined(.0))]
    NoneHolds(Vec<IpAddr>),
    #[error(
        "several interfaces in its netns hold {}: {}; not guessing which is the pod's",
        joined(.ips),
        .names.join(", ")
    )]
    Several {
        ips: Vec<IpAddr>,
        names: Vec<String>,
    },
}

/// Of the (interface, address) pairs of a netns, the one interface holding
/// any of `ips`; Err saying why not when none or several do.
pub fn pick_interface(
    held: &[(String, IpAddr)],
    ips: &[IpAddr],
) -> Result<String, InterfaceUnknown> {
    if ips.is_empty() {
        return Err(InterfaceUnknown::NoAddress);
    }
    let names: std::collections::BTreeSet<&str> = held
        .iter()
        .filter(|(_, a)| ips.contains(a))
        .map(|(n, _)| n.as_str())
        .collect();
    match names.len() {
        1 => Ok(names.into_iter().collect::<String>()),
        0 => Err(InterfaceUnknown::NoneHolds(ips.to_vec())),
        _ => Err(InterfaceUnknown::Several {
            ips: ips.to_vec(),
            names: names.into_iter().map(str::to_string).collect(),
        }),
    }
}

/// The pod's addresses for prevResult: the runtime's for the sandbox
/// ([`Sandbox::ips`]), in the runtime's order, each with the prefix length
/// `ifname` holds it with in the sandbox's netns. Refused when the
/// interface holds another address (IPv6 link-local aside: the kernel
/// gives every interface one) or lacks one of them: the pod's own listing
/// is not trusted (with NET_ADMIN it can add another pod's address before
/// its own, and a routing boundary or return route would be bound to it).
fn addresses_of(sb: &Sandbox, ifname: &str) -> Result<Vec<ipnet::IpNet>, CniError> {
    let (_ns, mut sock) = netns_of(sb)?;
    let index = link::index_of(&mut sock, ifname).map_err(|e| gone(sb, e))?;
    let held: Vec<ipnet::IpNet> = link::addresses(&mut sock)
        .map_err(|e| gone(sb, e))?
        .into_iter()
        .filter(|a| a.index == index)
        .map(|a| a.addr)
        .collect();
    reported_addresses(&held, &sb.ips).map_err(|why| {
        Refusal::AddressesChanged {
            sandbox: sb.id.clone(),
            ifname: ifname.to_string(),
            why,
        }
        .into()
    })
}

/// Of `held` (an interface's addresses, as listed), those in `reported`
/// (the runtime's, in its order); Err saying what differs when the
/// interface holds an address not reported (IPv6 link-local aside) or
/// lacks a reported one.
fn reported_addresses(
    held: &[ipnet::IpNet],
    reported: &[IpAddr],
) -> Result<Vec<ipnet::IpNet>, String> {
    let link_local =
        |a: &IpAddr| matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
    let foreign: Vec<IpAddr> = held
        .iter()
        .map(ipnet::IpNet::addr)
        .filter(|a| !link_local(a) && !reported.contains(a))
        .collect();
    if !foreign.is_empty() {
        return Err(format!(
            "holds {}, which the runtime does not report for the sandbox (it reports {})",
            joined(&foreign),
            joined(reported)
        ));
    }
    reported
        .iter()
        .map(|r| {
            held.iter()
                .find(|h| h.addr() == *r)
                .copied()
                .ok_or_else(|| {
                    format!("does not hold {r}, which the runtime reports for the sandbox")
                })
        })
        .collect()
}

fn joined(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Policy's verdict on `sb` first (its metadata and annotations: no profile,
/// untouched, nothing read in its netns), then its pod interface
/// ([`interface_of`]), then whether a record exists (untouched), then ADD
/// itself. Refusals are ADD's, with its codes.
pub fn adopt(entry: &Value, sb: &Sandbox) -> Result<Adoption, CniError> {
    let (conf, version) = parsed(conf_of(entry, sb)?)?;
    // Policy reads CNI_ARGS and the capability only, not the interface.
    let policy = Request {
        command: Command::Add,
        env: env_of(sb, ""),
        conf,
        version,
    };
    let cfg = load(&policy.conf)?;
    let Some(sel) = selection(&cfg, &policy)? else {
        return Ok(Adoption::NotSelected);
    };
    let ifname = interface_of(sb)?;
    let store = store(&cfg)?;
    let key = podgate_kit::state::Key::new(&policy.conf.name, &sb.id, &ifname);
    match record::read(&store, &key) {
        // An adoption killed half-way (the agent died) left its pending
        // record: ADD replaces it, as a repeated ADD does. Any other record
        // is the runtime's or a finished adoption.
        Ok(Some(r)) if r.adopted && r.status == record::Status::Pending => {}
        Ok(Some(_)) => return Ok(Adoption::Recorded),
        Ok(None) => {}
        Err(e) => return Err(Error::Record(e).into()),
    }
    // Only now the pod's addresses: a recorded sandbox is left alone
    // whatever it holds since.
    let req = request(entry, &ifname, sb)?;
    add::add_as(&req, true)?;
    Ok(Adoption::Applied {
        profile: sel.name.to_string(),
        source: sel.source.to_string(),
        ifname,
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
        .ok_or_else(|| ConfigError::from("podgate-router's entry is not an object").into())
}

/// The config as a plugin would have read it from stdin, and its version
/// (checked as the CNI protocol checks it for a runtime's call).
fn parsed(conf: Map<String, Value>) -> Result<(NetConf, Version), CniError> {
    let conf = NetConf::parse(Value::Object(conf).to_string().as_bytes())?;
    let version = version::require_supported(&conf.cni_version)?;
    Ok((conf, version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use podgate_cni::code;
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
            ips: vec!["10.77.0.5".parse().unwrap()],
        }
    }

    /// Runs `f` on a thread in `node` (ADD's node side must not touch this
    /// machine's netns).
    fn on_node<T: Send>(node: &PodNs, f: impl FnOnce() -> T + Send) -> T {
        NetNs::open(&node.path()).unwrap().run(f).unwrap()
    }

    /// A fresh state dir and podgate-router's entry keeping its records
    /// there: profile `p` (forwarding) for namespace `vpn`.
    /// The state dir is removed with the returned guard.
    fn fixture(tag: &str) -> (tempfile::TempDir, PathBuf, Value) {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("podgate-{tag}-"))
            .tempdir()
            .unwrap();
        let state = tmp.path().join("state");
        let entry = json!({
            "type": "podgate-router", "name": "n", "cniVersion": "1.0.0",
            "stateDir": state,
            "profiles": {"p": {"sysctls": {"net.ipv4.ip_forward": "1"}}},
            "assign": [{"namespace": "vpn", "profile": "p"}]
        });
        (tmp, state, entry)
    }

    /// The CNI error's details of a kit error: errno and object (JSON).
    fn details(e: &CniError) -> Value {
        assert!(!e.details.is_empty(), "no details in {e}");
        serde_json::from_str(&e.details).unwrap()
    }

    /// A sandbox whose netns is not there is an unknown container (code 3)
    /// whose details carry the failing open's errno and the path it opened.
    #[test]
    fn a_missing_netns_is_unknown_and_its_details_name_the_errno_and_the_path() {
        let path = PathBuf::from(format!("/run/netns/pg-adopt-none-{}", std::process::id()));
        let e = interface_of(&sandbox("vpn", path.clone())).unwrap_err();
        assert_eq!(e.code, code::UNKNOWN_CONTAINER, "{e}");
        let d = details(&e);
        assert_eq!(d["errnoName"], "ENOENT", "{e}");
        assert_eq!(d["errno"], 2, "{e}");
        assert_eq!(d["object"], path.display().to_string(), "{e}");
    }

    /// An entry of a cniVersion the plugin does not speak is refused as a
    /// runtime's call would be (code 1), not adopted under it.
    #[test]
    fn an_entry_of_an_unsupported_version_is_refused_as_the_protocol_refuses_it() {
        let (_tmp, _state, mut entry) = fixture("version");
        for v in ["0.2.0", "2.0.0"] {
            entry["cniVersion"] = json!(v);
            let e = parsed(object_of(&entry).unwrap()).unwrap_err();
            assert_eq!(e.code, code::INCOMPATIBLE_VERSION, "{v}: {e}");
        }
    }

    /// STATUS on a state dir that is a file: code 50, the same message, and
    /// details naming the failing call's errno and the path.
    #[test]
    fn status_on_an_unusable_state_dir_names_the_errno_and_the_path() {
        let (_tmp, state, mut entry) = fixture("status");
        std::fs::write(&state, b"not a directory").unwrap();
        entry["stateDir"] = json!(state);
        let (conf, _) = parsed(object_of(&entry).unwrap()).unwrap();
        let e = Router.status(&conf).unwrap_err();
        assert_eq!(e.code, code::NOT_AVAILABLE, "{e}");
        assert!(e.msg.starts_with("state dir unusable: "), "{e}");
        let d = details(&e);
        assert!(d["errno"].is_u64(), "{e}");
        assert_eq!(d["object"], state.display().to_string(), "{e}");
    }

    #[test]
    fn a_selected_sandbox_is_adopted_once_undone_when_stopped_and_refused_once_its_netns_is_gone() {
        let (_tmp, state, entry) = fixture("adopt");
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
                adopt(&entry, &sandbox("default", pod.path())).unwrap(),
                Adoption::NotSelected
            );
            assert_eq!(records(), 0);
            assert_eq!(
                adopt(&entry, &sb).unwrap(),
                Adoption::Applied {
                    profile: "p".into(),
                    source: "assign[0]".into(),
                    ifname: "eth0".into()
                }
            );
            assert_eq!(pod.forwarding(), "1");
            let key = podgate_kit::state::Key::new("n", &sb.id, "eth0");
            let st = podgate_kit::state::StateStore::open(&state).unwrap();
            let rec = record::read(&st, &key).unwrap().unwrap();
            assert!(rec.adopted && rec.status == record::Status::Applied);
            assert_eq!(rec.pod_ips[0].to_string(), "10.77.0.5/24");
            assert_eq!(adopt(&entry, &sb).unwrap(), Adoption::Recorded);
            // An adoption killed half-way left its record pending: the next
            // scan's adoption replaces it and finishes.
            let mut half = rec.clone();
            half.status = record::Status::Pending;
            record::write(&st, &half).unwrap();
            assert!(matches!(
                adopt(&entry, &sb).unwrap(),
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
            let e = adopt(&entry, &sandbox("vpn", gone)).unwrap_err();
            assert_eq!(e.code, code::UNKNOWN_CONTAINER, "{}", e.msg);
            assert_eq!(records(), 0);
        });
        let _ = std::fs::remove_dir_all(&state);
    }

    #[test]
    fn the_pod_interface_is_the_one_holding_the_runtimes_address_and_never_a_guess() {
        let held = |v: &[(&str, &str)]| -> Vec<(String, IpAddr)> {
            v.iter()
                .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
                .collect()
        };
        let ips = |v: &[&str]| -> Vec<IpAddr> { v.iter().map(|a| a.parse().unwrap()).collect() };
        let netns = held(&[
            ("lo", "127.0.0.1"),
            ("net1", "10.77.0.5"),
            ("net1", "fd00::5"),
            ("eth9", "192.168.9.2"),
        ]);
        assert_eq!(
            pick_interface(&netns, &ips(&["10.77.0.5"])).unwrap(),
            "net1"
        );
        assert_eq!(
            pick_interface(&netns, &ips(&["10.77.0.5", "fd00::5"])).unwrap(),
            "net1",
            "additional IPs on the same interface"
        );
        let none = pick_interface(&netns, &ips(&["10.1.1.1"]))
            .unwrap_err()
            .to_string();
        assert!(
            none.contains("no interface") && none.contains("10.1.1.1"),
            "{none}"
        );
        let several = pick_interface(&netns, &ips(&["10.77.0.5", "192.168.9.2"]))
            .unwrap_err()
            .to_string();
        assert!(several.contains("eth9, net1"), "{several}");
        let twice = held(&[("eth0", "10.77.0.5"), ("net1", "10.77.0.5")]);
        assert!(pick_interface(&twice, &ips(&["10.77.0.5"])).is_err());
        assert!(pick_interface(&netns, &[])
            .unwrap_err()
            .to_string()
            .contains("no address"));
    }

    #[test]
    fn prev_result_lists_the_runtimes_addresses_and_an_interface_holding_others_is_refused() {
        let nets =
            |v: &[&str]| -> Vec<ipnet::IpNet> { v.iter().map(|a| a.parse().unwrap()).collect() };
        let ips = |v: &[&str]| -> Vec<IpAddr> { v.iter().map(|a| a.parse().unwrap()).collect() };
        // The runtime's order, the interface's prefixes; IPv6 link-local
        // (every interface has one) is not an address of the pod.
        assert_eq!(
            reported_addresses(
                &nets(&["fd00::5/64", "fe80::1/64", "10.77.0.5/24"]),
                &ips(&["10.77.0.5", "fd00::5"])
            )
            .unwrap(),
            nets(&["10.77.0.5/24", "fd00::5/64"])
        );
        // Another pod's address listed first, an IPv4 link-local one, an
        // IPv6 one: refused, each named.
        for extra in ["10.77.0.9/24", "169.254.1.1/16", "fd00::9/64"] {
            let held = nets(&[extra, "10.77.0.5/24", "fd00::5/64"]);
            let e = reported_addresses(&held, &ips(&["10.77.0.5", "fd00::5"])).unwrap_err();
            let a = extra.split('/').next().unwrap();
            assert!(
                e.contains(&format!("holds {a}, which the runtime does not report")),
                "{e}"
            );
        }
        // A reported address the interface lacks.
        let e = reported_addresses(&nets(&["10.77.0.5/24"]), &ips(&["10.77.0.5", "fd00::5"]))
            .unwrap_err();
        assert!(e.contains("does not hold fd00::5"), "{e}");
    }

    #[test]
    fn a_sandbox_holding_an_address_the_runtime_does_not_report_is_refused_and_nothing_applied() {
        let (_tmp, state, entry) = fixture("adopt-foreign");
        let node = PodNs::new("fnode", false);
        let pod = PodNs::new("fpod", true);
        // As a pod with NET_ADMIN would: another pod's address before its own.
        ip(&["-n", &pod.0, "addr", "flush", "dev", "eth0"]);
        ip(&["-n", &pod.0, "addr", "add", "10.77.0.9/24", "dev", "eth0"]);
        ip(&["-n", &pod.0, "addr", "add", "10.77.0.5/24", "dev", "eth0"]);
        on_node(&node, || {
            let sb = sandbox("vpn", pod.path());
            let e = adopt(&entry, &sb).unwrap_err();
            assert_eq!(e.code, code::POLICY_REFUSED, "{}", e.msg);
            assert!(
                e.msg.starts_with("refused by adoption: ") && e.msg.contains("holds 10.77.0.9"),
                "{}",
                e.msg
            );
            let key = podgate_kit::state::Key::new("n", &sb.id, "eth0");
            let st = podgate_kit::state::StateStore::open(&state).unwrap();
            assert!(record::read(&st, &key).unwrap().is_none());
            assert_eq!(pod.forwarding(), "0");
        });
        let _ = std::fs::remove_dir_all(&state);
    }

    #[test]
    fn a_sandbox_whose_pod_interface_is_not_eth0_is_adopted_on_it_and_an_ambiguous_one_refused() {
        let (_tmp, state, entry) = fixture("adopt-if");
        let node = PodNs::new("ifnode", false);
        let pod = PodNs::new("ifpod", false);
        ip(&[
            "-n", &pod.0, "link", "add", "net1", "type", "veth", "peer", "name", "peer1",
        ]);
        ip(&["-n", &pod.0, "addr", "add", "10.77.0.5/24", "dev", "net1"]);
        ip(&[
            "-n", &pod.0, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
        ]);
        ip(&["-n", &pod.0, "addr", "add", "10.66.0.5/24", "dev", "eth0"]);
        on_node(&node, || {
            let sb = sandbox("vpn", pod.path());
            assert_eq!(interface_of(&sb).unwrap(), "net1");
            assert!(matches!(
                adopt(&entry, &sb).unwrap(),
                Adoption::Applied { ifname, .. } if ifname == "net1"
            ));
            let key = podgate_kit::state::Key::new("n", &sb.id, "net1");
            let st = podgate_kit::state::StateStore::open(&state).unwrap();
            let rec = record::read(&st, &key).unwrap().unwrap();
            assert_eq!(rec.pod_ips[0].to_string(), "10.77.0.5/24");
            assert_eq!(pod.forwarding(), "1");
            undo(&entry, "net1", &sb).unwrap();
            assert_eq!(pod.forwarding(), "0");
            // The runtime's address on two interfaces: refused, nothing applied.
            ip(&["-n", &pod.0, "addr", "add", "10.77.0.5/24", "dev", "eth0"]);
            let e = adopt(&entry, &sb).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV, "{}", e.msg);
            assert!(e.msg.contains("eth0, net1"), "{}", e.msg);
            assert!(record::read(&st, &key).unwrap().is_none());
            assert_eq!(pod.forwarding(), "0");
        });
        let _ = std::fs::remove_dir_all(&state);
    }
}
