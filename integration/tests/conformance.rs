//! CNI spec conformance of every plugin binary, driven directly (env + stdin)
//! for every supported version, the way a runtime's libcni calls them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::{
    bin_command, bin_dir, bin_runner, require_root, run_with_stdin, Netns, TempDir,
};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON document ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }

    /// A spec error: non-zero exit, JSON on stdout with cniVersion/code/msg.
    fn assert_error(&self, code: u64, what: &str) -> Value {
        assert_ne!(
            self.code, 0,
            "{what}: expected failure, stdout {:?}",
            self.stdout
        );
        let v = self.json();
        assert_eq!(v["code"].as_u64(), Some(code), "{what}: {v}");
        assert!(
            v["msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
        assert!(v["cniVersion"].is_string(), "{what}: {v}");
        v
    }

    fn assert_ok_empty(&self, what: &str) {
        assert_eq!(
            self.code, 0,
            "{what}: stdout {:?} stderr {:?}",
            self.stdout, self.stderr
        );
        assert!(
            self.stdout.trim().is_empty(),
            "{what}: stdout must be empty, got {:?}",
            self.stdout
        );
    }
}

fn call(plugin: &str, env: &[(&str, &str)], stdin: &[u8]) -> Out {
    let mut cmd = bin_command(&bin_dir().join(plugin));
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().copied())
        .stderr(Stdio::piped());
    // A plugin may stop reading early (e.g. oversized input); that is fine.
    let run = run_with_stdin(&mut cmd, stdin);
    Out {
        code: run.code.unwrap_or(-1),
        stdout: run.stdout,
        stderr: run.stderr,
    }
}

/// A prevResult in the shape of `v` (0.3.x/0.4.0 IPs carry "version").
fn prev_result(v: &str, netns: &Path) -> Value {
    let mut ip = json!({"address": "10.22.0.5/16", "gateway": "10.22.0.1", "interface": 2});
    if v.starts_with("0.") {
        ip["version"] = json!("4");
    }
    json!({
        "cniVersion": v,
        "interfaces": [{"name": "cni0", "mac": "0a:58:0a:16:00:01"},
                       {"name": "veth1234", "mac": "0a:58:0a:16:00:02"},
                       {"name": "eth0", "mac": "0a:58:0a:16:00:05", "sandbox": netns}],
        "ips": [ip],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}],
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]},
        "x-vendor": {"kept": true}
    })
}

fn configs(dir: &Path) -> Vec<(&'static str, Value)> {
    vec![
        (
            "podgate-router",
            json!({"name": "conf", "type": "podgate-router", "stateDir": dir.join("state"),
                   "profiles": {"p": {"sysctls": {"net.ipv4.ip_forward": "1"}}},
                   "assign": [{"namespace": "never-matches", "profile": "p"}]}),
        ),
        (
            "podgate-tunnel-guard",
            json!({"name": "conf", "type": "podgate-tunnel-guard", "required": "never",
                   "agentSocket": dir.join("absent.sock"),
                   "eventFile": dir.join("events.jsonl")}),
        ),
    ]
}

fn with(conf: &Value, v: &str, extra: Value) -> Vec<u8> {
    let mut c = conf.clone();
    c["cniVersion"] = json!(v);
    if let Value::Object(e) = extra {
        for (k, val) in e {
            c[k] = val;
        }
    }
    serde_json::to_vec(&c).unwrap()
}

#[test]
fn every_verb_every_version() {
    require_root();
    let dir = TempDir::new("conformance");
    let pod = Netns::new("conformance");
    let netns = pod.path().to_str().unwrap().to_string();
    for (plugin, conf) in configs(dir.path()) {
        for v in VERSIONS {
            let what = |verb: &str| format!("{plugin} {v} {verb}");
            let base = |cmd: &'static str| {
                vec![
                    ("CNI_COMMAND", cmd),
                    ("CNI_CONTAINERID", "conformance-1"),
                    ("CNI_NETNS", netns.as_str()),
                    ("CNI_IFNAME", "eth0"),
                    ("CNI_PATH", "/opt/cni/bin"),
                    ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;UNKNOWN_KEY=x"),
                ]
            };

            // VERSION answers exactly what is implemented.
            let out = call(
                plugin,
                &[("CNI_COMMAND", "VERSION")],
                format!(r#"{{"cniVersion":"{v}"}}"#).as_bytes(),
            );
            assert_eq!(out.code, 0, "{}", what("VERSION"));
            let j = out.json();
            assert_eq!(
                j["supportedVersions"],
                json!(VERSIONS),
                "{}",
                what("VERSION")
            );
            assert_eq!(j["cniVersion"], json!(v));

            // ADD with prevResult: a chained plugin that changes nothing hands
            // prevResult back unchanged, in the caller's version.
            let prev = prev_result(v, pod.path());
            let out = call(
                plugin,
                &base("ADD"),
                &with(&conf, v, json!({"prevResult": prev})),
            );
            assert_eq!(
                out.code,
                0,
                "{}: {} {}",
                what("ADD"),
                out.stdout,
                out.stderr
            );
            assert_eq!(out.json(), prev, "{}", what("ADD pass-through"));
            assert_eq!(
                out.stdout.trim().lines().count(),
                1,
                "{}: logs on stdout?",
                what("ADD")
            );

            // ADD without prevResult.
            let out = call(plugin, &base("ADD"), &with(&conf, v, json!({})));
            if plugin == "podgate-router" {
                let e = out.assert_error(7, &what("ADD without prevResult"));
                assert!(e["msg"].as_str().unwrap().contains("chained"), "{e}");
            } else {
                assert_eq!(out.code, 0, "{}", what("ADD without prevResult"));
                assert_eq!(out.json()["cniVersion"], json!(v));
            }

            // CHECK exists from 0.4.0 on.
            let out = call(
                plugin,
                &base("CHECK"),
                &with(&conf, v, json!({"prevResult": prev})),
            );
            if v.starts_with("0.3") {
                out.assert_error(1, &what("CHECK before 0.4.0"));
            } else {
                out.assert_ok_empty(&what("CHECK"));
            }

            // DEL twice, DEL with an empty prevResult, DEL with the netns gone.
            call(
                plugin,
                &base("DEL"),
                &with(&conf, v, json!({"prevResult": prev})),
            )
            .assert_ok_empty(&what("DEL"));
            call(
                plugin,
                &base("DEL"),
                &with(&conf, v, json!({"prevResult": prev})),
            )
            .assert_ok_empty(&what("DEL again"));
            call(
                plugin,
                &base("DEL"),
                &with(&conf, v, json!({"prevResult": {}})),
            )
            .assert_ok_empty(&what("DEL empty prevResult"));
            let mut gone = base("DEL");
            gone.retain(|(k, _)| *k != "CNI_NETNS");
            gone.push(("CNI_NETNS", "/var/run/netns/pg-conformance-does-not-exist"));
            call(plugin, &gone, &with(&conf, v, json!({})))
                .assert_ok_empty(&what("DEL netns gone"));
            let mut no_netns = base("DEL");
            no_netns.retain(|(k, _)| *k != "CNI_NETNS");
            call(plugin, &no_netns, &with(&conf, v, json!({})))
                .assert_ok_empty(&what("DEL without CNI_NETNS"));

            // STATUS and GC exist from 1.1.0 on.
            let status_env = [("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/opt/cni/bin")];
            let gc_env = [("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")];
            let gc_conf = with(
                &conf,
                v,
                json!({"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}]}),
            );
            // The router's GC reads nf_tables and XFRM over netlink, which
            // qemu-user does not translate (tests/image.rs runs the arm64
            // binaries through it): GC is left to the native run there.
            let gc_runs = plugin != "podgate-router" || bin_runner().is_empty();
            if v == "1.1.0" {
                call(plugin, &status_env, &with(&conf, v, json!({})))
                    .assert_ok_empty(&what("STATUS"));
                if gc_runs {
                    call(plugin, &gc_env, &gc_conf).assert_ok_empty(&what("GC"));
                }
            } else {
                call(plugin, &status_env, &with(&conf, v, json!({})))
                    .assert_error(1, &what("STATUS before 1.1.0"));
                call(plugin, &gc_env, &gc_conf).assert_error(1, &what("GC before 1.1.0"));
            }

            // Garbage, missing env, unknown verb.
            call(plugin, &base("ADD"), b"{not json").assert_error(6, &what("garbage"));
            call(plugin, &base("ADD"), b"").assert_error(6, &what("empty stdin"));
            let mut missing = base("ADD");
            missing.retain(|(k, _)| *k != "CNI_CONTAINERID");
            call(
                plugin,
                &missing,
                &with(&conf, v, json!({"prevResult": prev})),
            )
            .assert_error(4, &what("no CNI_CONTAINERID"));
            let mut missing = base("ADD");
            missing.retain(|(k, _)| *k != "CNI_NETNS");
            call(
                plugin,
                &missing,
                &with(&conf, v, json!({"prevResult": prev})),
            )
            .assert_error(4, &what("no CNI_NETNS"));
            let mut missing = base("ADD");
            missing.retain(|(k, _)| *k != "CNI_COMMAND");
            call(plugin, &missing, &with(&conf, v, json!({})))
                .assert_error(4, &what("no CNI_COMMAND"));
            call(plugin, &base("FROB"), &with(&conf, v, json!({})))
                .assert_error(4, &what("unknown CNI_COMMAND"));
        }
        // Versions we do not implement.
        for bad in ["0.1.0", "0.2.0", "1.2.0", "9.9.9"] {
            let out = call(
                plugin,
                &[
                    ("CNI_COMMAND", "ADD"),
                    ("CNI_CONTAINERID", "c"),
                    ("CNI_NETNS", &netns),
                    ("CNI_IFNAME", "eth0"),
                ],
                &with(&conf, bad, json!({})),
            );
            out.assert_error(1, &format!("{plugin} cniVersion {bad}"));
        }
    }
    // Nothing was recorded for a pod without a profile.
    let records = std::fs::read_dir(dir.path().join("state"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(records, 0);
}

/// A chained plugin that changes nothing prints prevResult's own text when
/// it is already in the config's shape (key order, spacing and line breaks
/// kept), and converts only what another version needs otherwise: the
/// 0.3.x/0.4.0 IP `version` field added or removed, `cniVersion` set,
/// unknown keys kept.
#[test]
fn pass_through_echoes_the_text_or_converts_the_shape() {
    require_root();
    let dir = TempDir::new("conformance-shape");
    let pod = Netns::new("conf-shape");
    let netns = pod.path().to_str().unwrap().to_string();
    let env = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "shape-1"),
        ("CNI_NETNS", netns.as_str()),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"),
    ];
    for (plugin, conf) in configs(dir.path()) {
        for (conf_v, prev_v) in [
            ("1.0.0", "1.0.0"),
            ("0.4.0", "0.4.0"),
            ("0.3.1", "1.0.0"),
            ("1.1.0", "0.4.0"),
            ("1.0.0", "1.1.0"),
        ] {
            let what = format!("{plugin}: config {conf_v}, prevResult {prev_v}");
            let prev = prev_result(prev_v, pod.path());
            // Written by hand, as a primary might: its own key order and
            // line breaks, which a re-print would not keep.
            let prev_text = format!(
                "{{ \"x-vendor\": {},\n  \"cniVersion\": \"{prev_v}\", \"interfaces\": {},\n  \"ips\": {}, \"routes\": {}, \"dns\": {} }}",
                prev["x-vendor"], prev["interfaces"], prev["ips"], prev["routes"], prev["dns"]
            );
            let mut c = conf.clone();
            c["cniVersion"] = json!(conf_v);
            let body = serde_json::to_string(&c).unwrap();
            let stdin = format!(
                "{},\"prevResult\":{prev_text}}}",
                body.strip_suffix('}').unwrap()
            );
            let out = call(plugin, &env, stdin.as_bytes());
            assert_eq!(out.code, 0, "{what}: {} {}", out.stdout, out.stderr);
            if conf_v == prev_v {
                assert_eq!(
                    out.stdout,
                    format!("{prev_text}\n"),
                    "{what}: not the same text"
                );
                continue;
            }
            let got = out.json();
            let mut want = prev.clone();
            want["cniVersion"] = json!(conf_v);
            if conf_v.starts_with("0.") {
                want["ips"][0]["version"] = json!("4");
            } else {
                want["ips"][0].as_object_mut().unwrap().remove("version");
            }
            assert_eq!(got, want, "{what}");
        }
    }
}

#[test]
fn hostile_input_gets_a_code_and_changes_nothing() {
    require_root();
    let dir = TempDir::new("hostile");
    let pod = Netns::new("hostile");
    let netns = pod.path().to_str().unwrap().to_string();
    let regular = dir.path().join("not-a-netns");
    std::fs::write(&regular, b"x").unwrap();
    let (plugin, conf) = configs(dir.path()).remove(0);
    let prev = prev_result("1.0.0", pod.path());
    let env = |netns: &str, ifname: &str| {
        vec![
            ("CNI_COMMAND".to_string(), "ADD".to_string()),
            ("CNI_CONTAINERID".into(), "hostile".into()),
            ("CNI_NETNS".into(), netns.to_string()),
            ("CNI_IFNAME".into(), ifname.to_string()),
            (
                "CNI_ARGS".into(),
                "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=x".into(),
            ),
        ]
    };
    let run = |env: Vec<(String, String)>, stdin: Vec<u8>| {
        let e: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        call(plugin, &e, &stdin)
    };
    let mut profile_conf = conf.clone();
    profile_conf["assign"] = json!([{"namespace": "vpn", "profile": "p"}]);

    let huge = vec![b' '; 10 << 20];
    // (what, env, stdin, expected CNI error code)
    type Case = (&'static str, Vec<(String, String)>, Vec<u8>, u64);
    let cases: Vec<Case> = vec![
        (
            "truncated JSON",
            env(&netns, "eth0"),
            br#"{"cniVersion":"1.0.0","name":"#.to_vec(),
            6,
        ),
        (
            "wrong types",
            env(&netns, "eth0"),
            with(&conf, "1.0.0", json!({"profiles": 5})),
            7,
        ),
        ("10 MB stdin", env(&netns, "eth0"), huge, 6),
        (
            "NUL bytes",
            env(&netns, "eth0"),
            b"{\"cniVersion\":\"1.0.0\0\"}".to_vec(),
            6,
        ),
        (
            "unknown cniVersion",
            env(&netns, "eth0"),
            with(&conf, "7.0.0", json!({})),
            1,
        ),
        (
            "16-char IFNAME",
            env(&netns, "eth0123456789abc"),
            with(&conf, "1.0.0", json!({"prevResult": prev})),
            4,
        ),
        (
            "IFNAME with slash",
            env(&netns, "../eth0"),
            with(&conf, "1.0.0", json!({"prevResult": prev})),
            4,
        ),
        (
            "netns is a regular file",
            env(regular.to_str().unwrap(), "eth0"),
            with(&profile_conf, "1.0.0", json!({"prevResult": prev})),
            4,
        ),
        (
            // nsfs too: only the namespace's type tells them apart (also
            // where NS_GET_NSTYPE is missing: qemu-user, kernels < 4.11).
            "netns is a mount namespace",
            env("/proc/self/ns/mnt", "eth0"),
            with(&profile_conf, "1.0.0", json!({"prevResult": prev})),
            4,
        ),
        (
            "netns missing",
            env("/var/run/netns/pg-missing-xyz", "eth0"),
            with(&profile_conf, "1.0.0", json!({"prevResult": prev})),
            3,
        ),
        (
            "sysctl with ..",
            env(&netns, "eth0"),
            with(
                &conf,
                "1.0.0",
                json!({"profiles": {"p": {"sysctls": {"net..ipv4/../kernel": "1"}}}, "prevResult": prev}),
            ),
            7,
        ),
        (
            "node-wide sysctl",
            env(&netns, "eth0"),
            with(
                &conf,
                "1.0.0",
                json!({"profiles": {"p": {"sysctls": {"kernel.panic": "1"}}}, "prevResult": prev}),
            ),
            7,
        ),
        (
            "0.0.0.0/0 in annotation",
            env(&netns, "eth0"),
            with(
                &profile_conf,
                "1.0.0",
                json!({"allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]},
                "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"podgate.dev/masquerade": "0.0.0.0/0"}}, "prevResult": prev}),
            ),
            100,
        ),
        (
            "::/0 in annotation",
            env(&netns, "eth0"),
            with(
                &profile_conf,
                "1.0.0",
                json!({"allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]},
                "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"podgate.dev/return-routes": "::/0"}}, "prevResult": prev}),
            ),
            100,
        ),
    ];
    let before = pod.exec_ok(&[
        "sh",
        "-c",
        "cat /proc/sys/net/ipv4/ip_forward; nft list ruleset; ip route",
    ]);
    for (what, env, stdin, code) in cases {
        let out = run(env, stdin);
        let e = out.assert_error(code, what);
        assert!(
            !e["msg"].as_str().unwrap().contains('\n'),
            "{what}: one-line reason: {e}"
        );
        if what.starts_with("netns is a ") {
            let msg = e["msg"].as_str().unwrap();
            assert!(msg.contains("is not a network namespace"), "{what}: {e}");
        }
    }
    let after = pod.exec_ok(&[
        "sh",
        "-c",
        "cat /proc/sys/net/ipv4/ip_forward; nft list ruleset; ip route",
    ]);
    assert_eq!(before, after, "hostile input changed the pod netns");
    assert!(
        !dir.path().join("state").exists()
            || std::fs::read_dir(dir.path().join("state"))
                .unwrap()
                .flatten()
                .all(|e| !e.file_name().to_string_lossy().ends_with(".json"))
    );
}

/// Without CAP_NET_ADMIN the plugin says which capability is missing and why,
/// instead of a bare EPERM half-way through.
/// A misspelt key is read by neither plugin as its default: ADD fails with
/// code 7 naming it, before anything is applied. Spelt right, the same
/// configs apply the profile and close the gate, which is what the typo
/// would have silently undone (`assgin`: no assignment, the pod passes
/// through; `requried: always`: `auto`, and without IPsec signals the pod
/// passes the guard).
#[test]
fn a_misspelt_key_fails_add_naming_it_and_applies_nothing() {
    require_root();
    let dir = TempDir::new("typo");
    let pod = Netns::new("typo");
    pod.exec_ok(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
    ]);
    pod.exec_ok(&["ip", "addr", "add", "10.22.0.5/16", "dev", "eth0"]);
    pod.sysctl_set("net.ipv4.ip_forward", "0");
    let netns = pod.path().to_str().unwrap().to_string();
    let env = |cmd: &'static str| {
        vec![
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "typo-1"),
            ("CNI_NETNS", netns.as_str()),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"),
        ]
    };
    let prev = json!({"prevResult": prev_result("1.0.0", pod.path())});
    let (_, mut router) = configs(dir.path()).remove(0);
    router["assign"] = json!([{"namespace": "default", "profile": "p"}]);
    let stdin = with(&router, "1.0.0", prev.clone());
    let out = call("podgate-router", &env("ADD"), &stdin);
    assert_eq!(out.code, 0, "spelt right: {} {}", out.stdout, out.stderr);
    assert_eq!(
        pod.sysctl_get("net.ipv4.ip_forward"),
        "1",
        "profile applied"
    );
    call("podgate-router", &env("DEL"), &stdin).assert_ok_empty("DEL");
    assert_eq!(pod.sysctl_get("net.ipv4.ip_forward"), "0");

    let mut typo = router.clone();
    let assign = typo.as_object_mut().unwrap().remove("assign").unwrap();
    typo["assgin"] = assign;
    let mut nested = router.clone();
    nested["profiles"]["p"]["sysctl"] = json!({"net.ipv4.ip_forward": "1"});
    for (conf, key) in [(typo, "\"assgin\""), (nested, "\"profiles.p.sysctl\"")] {
        let out = call(
            "podgate-router",
            &env("ADD"),
            &with(&conf, "1.0.0", prev.clone()),
        );
        let e = out.assert_error(7, key);
        let msg = e["msg"].as_str().unwrap();
        assert!(msg.contains(&format!("unknown key {key}")), "{e}");
        assert_eq!(
            pod.sysctl_get("net.ipv4.ip_forward"),
            "0",
            "{key}: nothing applied"
        );
    }

    // The guard with no IPsec signal on this "node": always is not ready.
    let guard = json!({"name": "conf", "type": "podgate-tunnel-guard", "required": "always",
                       "protectionDir": dir.path().join("no-protection"),
                       "ovsdbSocket": dir.path().join("no-ovsdb.sock"),
                       "eventFile": dir.path().join("events.jsonl")});
    let out = call(
        "podgate-tunnel-guard",
        &env("ADD"),
        &with(&guard, "1.0.0", prev.clone()),
    );
    out.assert_error(11, "required: always without IPsec");
    let mut typo = guard.clone();
    let required = typo.as_object_mut().unwrap().remove("required").unwrap();
    typo["requried"] = required;
    let out = call(
        "podgate-tunnel-guard",
        &env("ADD"),
        &with(&typo, "1.0.0", prev),
    );
    let e = out.assert_error(7, "requried");
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("unknown key \"requried\""),
        "{e}"
    );
}

#[test]
fn missing_capability_is_named() {
    require_root();
    let dir = TempDir::new("caps");
    let pod = Netns::new("caps");
    let (_, mut conf) = configs(dir.path()).remove(0);
    conf["assign"] = json!([{"namespace": "default", "profile": "p"}]);
    let stdin = with(
        &conf,
        "1.0.0",
        json!({"prevResult": prev_result("1.0.0", pod.path())}),
    );
    pod.sysctl_set("net.ipv4.ip_forward", "0");
    let out = run_with_stdin(
        Command::new("setpriv")
            .args(["--bounding-set", "-net_admin", "--inh-caps", "-net_admin"])
            .arg(bin_dir().join("podgate-router"))
            .env_clear()
            .envs([
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "caps-1"),
                ("CNI_NETNS", pod.path().to_str().unwrap()),
                ("CNI_IFNAME", "eth0"),
                ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"),
            ]),
        &stdin,
    );
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["code"], 50, "{v}");
    assert!(v["msg"].as_str().unwrap().contains("CAP_NET_ADMIN"), "{v}");
    assert_eq!(
        pod.sysctl_get("net.ipv4.ip_forward"),
        "0",
        "nothing applied"
    );
}

/// A runtime that closed our stdout must get the plugin's own exit code
/// (std's runtime start ignores SIGPIPE, so the write fails with EPIPE and
/// the answer is not a panic), not a death by signal.
#[test]
fn a_broken_stdout_pipe_is_an_error_not_a_signal() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    let plugins = ["podgate-router", "podgate-tunnel-guard"];
    let bins =
        podgate_integration::built(&plugins, &["-p", plugins[0], "-p", plugins[1], "--bins"]);
    for (plugin, bin) in plugins.iter().zip(bins) {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) writes two fds into the array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both fds were just returned by pipe(2) and are owned here only.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read);
        let status = Command::new(&bin)
            .env_clear()
            .env("CNI_COMMAND", "VERSION")
            .stdin(Stdio::null())
            .stdout(Stdio::from(write))
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert_eq!(
            (status.code(), status.signal()),
            (Some(0), None),
            "{plugin} writing to a closed pipe: {status:?}"
        );
    }
}

/// Without `CNI_COMMAND` (a binary run by hand) the plugin answers with its
/// error at once: it does not wait for the end of an input that never ends.
#[test]
fn without_a_verb_stdin_is_not_waited_for() {
    let plugins = ["podgate-router", "podgate-tunnel-guard"];
    let bins =
        podgate_integration::built(&plugins, &["-p", plugins[0], "-p", plugins[1], "--bins"]);
    for (plugin, bin) in plugins.iter().zip(bins) {
        let mut child = Command::new(&bin)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Keep our end of stdin open: the plugin never sees its end.
        let _stdin = child.stdin.take();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let status =
            status.unwrap_or_else(|| panic!("{plugin} waited for stdin without CNI_COMMAND"));
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
        let o = Out {
            code: status.code().unwrap_or(-1),
            stdout: out,
            stderr: String::new(),
        };
        o.assert_error(4, &format!("{plugin} without CNI_COMMAND"));
    }
}
