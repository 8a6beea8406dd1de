//! `podgate report` in a test node netns: a bridge chain with both podgate
//! plugins, pods wired through the real libcni, secrets planted where an
//! operator might leave them (a conflist, a log, the installer's state).
//! The archive must hold every listed part and none of the secrets.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::{bin_dir, cnitool_container_id, require_root, Netns, TestNode, Verb};
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const NET: &str = "reportnet";
/// A private key body no redaction could guess: found anywhere = leaked.
const KEY_BODY: &str = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCplantedSecretKeyBody0xDEAD";
/// An ESP SA key as `ip xfrm state` prints it.
const SA_KEY: &str = "0x6d4f1c0a9e2b7d3358aa0172c4e9b1f06d4f1c0a";

fn pem() -> String {
    format!("-----BEGIN PRIVATE KEY-----\n{KEY_BODY}\nAAAA\n-----END PRIVATE KEY-----\n")
}

fn pod_args(ns: &str, name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}")
}

fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// A node with both plugins chained, two VPN pods wired through libcni
/// (one masqueraded, one with a return-route pool), and secrets planted
/// where operators leave them: another network's conflist, the installer's
/// state, the router's log. Fields drop in order: the pods, then the node.
struct Planted {
    gw: Netns,
    rt: Netns,
    gw_id: String,
    rt_id: String,
    installer: PathBuf,
    plugins_file: PathBuf,
    agent_state: PathBuf,
    agent_log: PathBuf,
    node: TestNode,
}

fn planted() -> Planted {
    let node = TestNode::new("report");
    let router_log = node.root().join("router.log");
    let entries = json!([
        {"type": "podgate-tunnel-guard", "required": "always", "mode": "audit",
         "agentSocket": node.root().join("no-agent/status.sock"),
         "logFile": node.root().join("guard.log"), "eventFile": node.event_file()},
        {"type": "podgate-router", "stateDir": node.state_dir(), "logFile": router_log,
         "capabilities": {"io.kubernetes.cri.pod-annotations": true},
         "profiles": {
            "vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}, "masquerade": [{"source": "10.8.0.0/24"}]},
            "vpn-routed": {"sysctls": {"net.ipv4.ip_forward": "1"}, "returnRoutes": [{"dst": "10.8.3.0/24"}]}},
         "assign": [{"namespace": "vpn", "podNamePrefix": "openvpn-gw", "profile": "vpn-gateway"},
                    {"namespace": "vpn", "podNamePrefix": "openvpn-rt", "profile": "vpn-routed"}],
         "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]}}
    ]);
    let plugins: Vec<Value> = entries.as_array().unwrap().clone();
    node.write_conflist(
        &format!("10-{NET}"),
        &node.bridge_conflist(NET, "1.0.0", "10.25.0.0/16", plugins),
    );
    // Secrets where operators leave them: another network's conflist...
    node.write_conflist(
        "20-secret",
        &json!({"cniVersion": "1.0.0", "name": "secret", "plugins": [
            {"type": "bridge", "bridge": "nouse0",
             "tls": {"clientKey": pem(), "saKey": SA_KEY},
             "note": format!("pasted {} and {SA_KEY}", pem())}]}),
    );
    let plugins_file = node.root().join("plugins.json");
    fs::write(&plugins_file, serde_json::to_vec(&entries).unwrap()).unwrap();
    let installer = node.root().join("installer");
    fs::create_dir_all(&installer).unwrap();
    fs::write(
        installer.join("backup-20-secret.json"),
        format!("{{\"bytes\": {:?}}}", pem()),
    )
    .unwrap();

    let gw = node.pod("openvpn-gw-0");
    let rt = node.pod("openvpn-rt-0");
    for (pod, name) in [(&gw, "openvpn-gw-0"), (&rt, "openvpn-rt-0")] {
        node.cni(
            Verb::Add,
            NET,
            pod,
            "eth0",
            Some(&pod_args("vpn", name)),
            None,
        )
        .assert_ok();
    }
    let (gw_id, rt_id) = (
        cnitool_container_id(gw.path()),
        cnitool_container_id(rt.path()),
    );
    // ...and a log (a JSON line, a plain line).
    let mut log = fs::read_to_string(&router_log).unwrap();
    log += &format!(
        "{}\nip xfrm state: proto esp spi 0x1000 enc cbc(aes) {SA_KEY} {}\n",
        json!({"msg": "debugging", "pem": pem(), "dump": format!("auth {SA_KEY}")}),
        pem().replace('\n', " ")
    );
    fs::write(&router_log, log).unwrap();
    let agent_state = node.root().join("agent");
    fs::create_dir_all(&agent_state).unwrap();
    fs::write(agent_state.join("metrics.json"), "{\"v\":1}").unwrap();
    let agent_log = node.root().join("agent.log");
    fs::write(
        &agent_log,
        "2026-12-01T00:00:00.000Z podgate installer: chained podgate\n",
    )
    .unwrap();
    Planted {
        gw,
        rt,
        gw_id,
        rt_id,
        installer,
        plugins_file,
        agent_state,
        agent_log,
        node,
    }
}

/// `podgate report --output <node>/report.tar` in the node netns, over
/// everything planted: it succeeds, prints the archive's name, and draws
/// no progress without a terminal.
fn report(p: &Planted) -> PathBuf {
    let Planted {
        node,
        installer,
        plugins_file,
        agent_state,
        agent_log,
        ..
    } = p;
    let archive = node.root().join("report.tar");
    let out = node
        .ns
        .command(bin_dir().join("podgate").to_str().unwrap())
        .arg("report")
        .arg("--output")
        .arg(&archive)
        .arg("--cni-conf-dir")
        .arg(node.conf_dir())
        .arg("--cni-bin-dir")
        .arg(node.cni_bin_dir())
        .arg("--state-dir")
        .arg(node.state_dir())
        .arg("--installer-state-dir")
        .arg(installer)
        .arg("--plugins")
        .arg(plugins_file)
        .arg("--agent-state-dir")
        .arg(agent_state)
        .arg("--log")
        .arg(agent_log)
        .args(["--lines", "200"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = podgate_integration::output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains('\x1b'),
        "no progress without a terminal: {text}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("report.tar"),
        "{text}"
    );
    archive
}

/// The archive unpacked under the node's dir: its `podgate-report/`.
fn untar(node: &TestNode, archive: &Path) -> PathBuf {
    let x = node.root().join("x");
    fs::create_dir_all(&x).unwrap();
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&x)
        .output()
        .unwrap();
    assert!(
        untar.status.success(),
        "{}",
        podgate_integration::output_text(&untar)
    );
    x.join("podgate-report")
}

/// `podgate-report/<p>`, which must be there.
fn read(r: &Path, p: &str) -> String {
    fs::read_to_string(r.join(p)).unwrap_or_else(|e| panic!("{p} missing from the report: {e}"))
}

/// Whether any file of `podgate-report/logs/` holds `needle`.
fn logs_hold(r: &Path, needle: &str) -> bool {
    fs::read_dir(r.join("logs"))
        .unwrap()
        .flatten()
        .any(|e| fs::read_to_string(e.path()).unwrap().contains(needle))
}

/// Every listed part: versions, configs, the installer's and the agent's
/// state, both records with the claims index, IPsec status, the node's
/// routes, rules and nf_tables, the logs, the README.
fn assert_every_part(p: &Planted, r: &Path) {
    let (gw_id, rt_id) = (&p.gw_id, &p.rt_id);
    let read = |f: &str| read(r, f);
    let logs = |needle: &str| logs_hold(r, needle);
    let release =
        String::from_utf8(Command::new("uname").arg("-r").output().unwrap().stdout).unwrap();
    let v = read("version.txt");
    assert!(
        v.contains(env!("CARGO_PKG_VERSION")) && v.contains(release.trim()),
        "{v}"
    );
    assert!(read(&format!("cni/10-{NET}.conflist")).contains("podgate-router"));
    assert!(read("installer/plugins.json").contains("podgate-tunnel-guard"));
    assert!(read("installer/check.txt").contains("podgate install --check"));
    let counters: Value = serde_json::from_str(&read("agent/state/metrics.json")).unwrap();
    assert_eq!(counters["v"], 1, "the agent's counters");
    let inspect: Value = serde_json::from_str(&read("records/inspect.json")).unwrap();
    let mut ids: Vec<&str> = inspect["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["key"]["containerID"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    let mut want = vec![gw_id.as_str(), rt_id.as_str()];
    want.sort_unstable();
    assert_eq!(ids, want, "{inspect}");
    assert!(inspect["attachments"][0]["state"] == "holds", "{inspect}");
    assert!(read("records/inspect.txt").contains("status:      holds"));
    // The claims index, as `podgate inspect` shows it.
    assert_eq!(
        inspect["claims"],
        json!([{"pool": "10.8.3.0/24", "owner": {"network": NET, "containerID": rt_id, "ifname": "eth0"}, "trusted": true}]),
        "{inspect}"
    );
    assert!(
        read("records/inspect.txt")
            .contains(&format!("claim: pool 10.8.3.0/24 -> {NET}/{rt_id}/eth0\n")),
        "{}",
        read("records/inspect.txt")
    );
    assert!(read("ipsec/status.txt").contains("NOT READY"));
    assert!(read("ipsec/status.json").contains("\"verdict\""));
    assert!(
        read("node/routes.txt").contains("10.8.3.0/24"),
        "{}",
        read("node/routes.txt")
    );
    read("node/rules.txt");
    let nft = read("node/nftables.txt");
    assert!(
        nft.contains(&format!(
            "pod reportnet/{gw_id}/eth0 table inet podgate-eth0"
        )) && nft.contains("10.8.0.0/24"),
        "{nft}"
    );
    assert!(logs("\"msg\":\"applied\""), "router log lines included");
    assert!(logs("chained podgate"), "the agent's --log included");
    assert!(read("README.txt").contains("records/inspect.json"));
}

/// The secrets: nowhere in the archive, nor in any file in it; the planted
/// places were copied (redacted), not skipped.
fn assert_no_key_material(archive: &Path, r: &Path) {
    let read = |f: &str| read(r, f);
    let logs = |needle: &str| logs_hold(r, needle);
    let raw = fs::read(archive).unwrap();
    let raw = String::from_utf8_lossy(&raw);
    let sa_digits = SA_KEY.trim_start_matches("0x");
    for secret in [KEY_BODY, "BEGIN PRIVATE KEY", sa_digits] {
        assert!(!raw.contains(secret), "{secret:?} leaked into the archive");
    }
    let mut all = Vec::new();
    files_under(r, &mut all);
    assert!(all.len() >= 14, "{all:?}");
    for f in all {
        let t = fs::read_to_string(&f).unwrap();
        for secret in [KEY_BODY, "BEGIN PRIVATE KEY", sa_digits] {
            assert!(
                !t.contains(secret),
                "{secret:?} leaked into {}",
                f.display()
            );
        }
    }
    // The planted places were copied (redacted), not skipped.
    assert!(read("cni/20-secret.conflist").contains("[redacted"));
    assert!(logs("[redacted key]") && logs("[redacted PEM PRIVATE KEY]"));
}

#[test]
fn report_has_every_part_and_no_key_material() {
    require_root();
    podgate_integration::built_shipped();
    let p = planted();
    let archive = report(&p);
    let r = untar(&p.node, &archive);
    assert_every_part(&p, &r);
    assert_no_key_material(&archive, &r);
    let Planted { node, gw, rt, .. } = &p;
    for (pod, name) in [(&gw, "openvpn-gw-0"), (&rt, "openvpn-rt-0")] {
        node.cni(
            Verb::Del,
            NET,
            pod,
            "eth0",
            Some(&pod_args("vpn", name)),
            None,
        )
        .assert_ok();
    }
}
