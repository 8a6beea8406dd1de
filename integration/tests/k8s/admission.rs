//! The admission policy (`podgate admission render`) on the real API
//! server: it refuses what podgate-router's own intent check refuses, case
//! by case, each refusal with the policy's own message naming the router's
//! rule, none from a CEL error; the shipped render refuses at `kubectl
//! apply`, for pods and every workload kind, on CREATE and on an UPDATE of
//! podgate's annotations.
//!
//! The router's verdict is its binary's ADD, given what containerd gives
//! it (the pod's annotations as `runtimeConfig`, `K8S_POD_*` in CNI_ARGS)
//! and a netns path that does not exist: the intent check comes before the
//! netns is opened, so a refusal is code 100 with the rule, and a pod that
//! passes fails at the netns (code 3) with nothing applied. Only the API
//! server is needed; podgate need not be installed (a pod the cluster can
//! wire is wired when it is).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::PathBuf;

use podgate_integration::k8s::{cluster_sh, Cluster};
use podgate_integration::{bin_command, built_shipped, output_text, run_with_stdin, TempDir};
use serde_json::{json, Map, Value};

use crate::world::World;

/// The parity policy's namespaces: allowed to ask, allowed and pinned by
/// `assign[0]`, not allowed.
const OPEN: &str = "adm-open";
const PINNED: &str = "adm-pinned";
const CLOSED: &str = "adm-closed";
const PROFILE: &str = "podgate.dev/profile";
const MASQ: &str = "podgate.dev/masquerade";
const RETURN: &str = "podgate.dev/return-routes";

/// The parity policy: three profiles, an `assign` rule of every shape
/// (namespace, pod name, prefix without and with a namespace, a prefix
/// longer than a workload's name), IPv4 and IPv6 pools.
fn parity_entry() -> Value {
    json!({
        "type": "podgate-router",
        "capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "profiles": {
            "vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"},
                            "masquerade": [{"source": "10.8.0.0/24"}]},
            "forwarder": {"sysctls": {"net.ipv4.ip_forward": "1"}},
            "relay": {"sysctls": {"net.ipv4.ip_forward": "1"}}
        },
        "assign": [
            {"namespace": PINNED, "profile": "forwarder"},
            {"namespace": OPEN, "podName": "fixed-gw", "profile": "relay"},
            {"podNamePrefix": "edge-", "profile": "vpn-gateway"},
            {"namespace": OPEN, "podNamePrefix": "relay-", "profile": "relay"},
            {"namespace": OPEN, "podNamePrefix": "gw-blue-", "profile": "relay"}
        ],
        "allow": {"annotationNamespaces": [OPEN, PINNED],
                  "pools": ["10.8.0.0/16", "192.168.64.0/20", "fd00:8::/32"]}
    })
}

/// What a pod asks for: its namespace, its name (a workload's name for a
/// template) and annotations; for the table, the rule the router refuses
/// it by (None: admitted).
#[derive(Debug, Clone)]
struct Intent {
    ns: &'static str,
    name: String,
    ann: Vec<(String, String)>,
    expect: Option<Option<&'static str>>,
}

fn intent(
    ns: &'static str,
    name: &str,
    ann: &[(&str, &str)],
    expect: Option<&'static str>,
) -> Intent {
    Intent {
        ns,
        name: name.into(),
        ann: ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        expect: Some(expect),
    }
}

/// `n` distinct IPv4 pools inside allow.pools, comma-separated.
fn pools(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("10.8.{i}.0/24")).collect()
}

/// The table: allowed pods, every kind of refusal, and the edges of each.
fn table() -> Vec<Intent> {
    let (fw, vg) = ((PROFILE, "forwarder"), (PROFILE, "vpn-gateway"));
    let sixteen = pools(16).join(",");
    let seventeen = pools(17).join(",");
    let sixteen_and_a_repeat = format!("{sixteen},10.8.3.0/24");
    let sixteen_then_junk = format!("{sixteen},not-a-pool");
    let repeats = format!("{},{}", pools(15).join(","), pools(5).join(", "));
    let junk_third = format!("10.8.0.0/24,10.8.1.0/24,bad,{}", pools(17).join(","));
    let long = format!("relay-{}", "a".repeat(57));
    vec![
        intent(OPEN, "web-1", &[vg], None),
        intent(OPEN, "web-2", &[], None),
        intent(CLOSED, "web-3", &[vg], Some("allow.annotationNamespaces")),
        intent(
            CLOSED,
            "web-4",
            &[(MASQ, "10.8.1.0/24")],
            Some("allow.annotationNamespaces"),
        ),
        intent(
            CLOSED,
            "web-5",
            &[(RETURN, "")],
            Some("allow.annotationNamespaces"),
        ),
        intent(CLOSED, "edge-6", &[], None),
        intent(CLOSED, "edge-7", &[vg], Some("allow.annotationNamespaces")),
        intent(OPEN, "web-8", &[(PROFILE, "nope")], Some("profiles")),
        intent(OPEN, "web-9", &[(PROFILE, "")], Some("profiles")),
        intent(
            OPEN,
            "web-10",
            &[(PROFILE, "VPN-Gateway")],
            Some("profiles"),
        ),
        intent(OPEN, "web-11", &[(PROFILE, " forwarder")], Some("profiles")),
        intent(
            OPEN,
            "web-12",
            &[(PROFILE, "forwarder\n")],
            Some("profiles"),
        ),
        intent(
            OPEN,
            "web-13",
            &[(PROFILE, "f\u{f6}rwarder")],
            Some("profiles"),
        ),
        intent(PINNED, "web-14", &[(PROFILE, "relay")], Some("assign")),
        intent(PINNED, "web-15", &[fw], None),
        intent(PINNED, "web-16", &[(MASQ, "10.8.2.0/24")], None),
        intent(OPEN, "fixed-gw", &[vg], Some("assign")),
        intent(OPEN, "fixed-gw", &[(PROFILE, "relay")], None),
        intent(OPEN, "edge-19", &[fw], Some("assign")),
        intent(OPEN, "relay-20", &[(PROFILE, "relay")], None),
        intent(OPEN, "gw-blue-21", &[fw], Some("assign")),
        intent(OPEN, "web-22", &[(MASQ, "10.8.3.0/24")], Some("no profile")),
        intent(OPEN, "edge-23", &[(MASQ, "10.8.3.0/24")], None),
        intent(OPEN, "web-24", &[fw, (RETURN, "10.8.3.0/24")], None),
        intent(
            OPEN,
            "web-25",
            &[fw, (MASQ, "10.8.0.1/24")],
            Some("host bits masquerade"),
        ),
        intent(
            OPEN,
            "web-26",
            &[fw, (MASQ, "10.9.0.0/24")],
            Some("allow.pools masquerade"),
        ),
        intent(
            OPEN,
            "web-27",
            &[fw, (MASQ, "0.0.0.0/0")],
            Some("allow.pools masquerade"),
        ),
        intent(
            OPEN,
            "web-28",
            &[fw, (MASQ, "10.8.0.0/24,x")],
            Some("not a CIDR masquerade"),
        ),
        intent(
            OPEN,
            "web-29",
            &[fw, (MASQ, "")],
            Some("no pool masquerade"),
        ),
        intent(
            OPEN,
            "web-30",
            &[fw, (MASQ, " , ,")],
            Some("no pool masquerade"),
        ),
        intent(OPEN, "web-31", &[fw, (RETURN, "fd00:8:1::/48")], None),
        intent(OPEN, "web-32", &[fw, (RETURN, "FD00:8:2::/48")], None),
        intent(
            OPEN,
            "web-33",
            &[fw, (RETURN, "fd00:8::1/64")],
            Some("host bits return-routes"),
        ),
        intent(
            OPEN,
            "web-34",
            &[fw, (RETURN, "fd00:9::/32")],
            Some("allow.pools return-routes"),
        ),
        intent(
            OPEN,
            "web-35",
            &[fw, (RETURN, "::ffff:10.8.0.0/120")],
            Some("not a CIDR return-routes"),
        ),
        intent(
            OPEN,
            "web-36",
            &[fw, (MASQ, "010.8.0.0/24")],
            Some("not a CIDR masquerade"),
        ),
        intent(
            OPEN,
            "web-37",
            &[fw, (MASQ, "10.8.0.0/024")],
            Some("not a CIDR masquerade"),
        ),
        intent(
            OPEN,
            "web-38",
            &[fw, (MASQ, "10.8.0.0/33")],
            Some("not a CIDR masquerade"),
        ),
        intent(
            OPEN,
            "web-39",
            &[fw, (RETURN, "fe80::1%eth0/64")],
            Some("not a CIDR return-routes"),
        ),
        intent(OPEN, "web-40", &[fw, (MASQ, &sixteen)], None),
        intent(
            OPEN,
            "web-41",
            &[fw, (MASQ, &seventeen)],
            Some("more than 16 masquerade"),
        ),
        intent(
            OPEN,
            "web-42",
            &[fw, (MASQ, &sixteen_and_a_repeat)],
            Some("more than 16 masquerade"),
        ),
        intent(OPEN, "web-43", &[fw, (MASQ, &repeats)], None),
        intent(
            OPEN,
            "web-44",
            &[fw, (MASQ, &sixteen_then_junk)],
            Some("more than 16 masquerade"),
        ),
        intent(
            OPEN,
            "web-45",
            &[fw, (MASQ, &junk_third)],
            Some("not a CIDR masquerade"),
        ),
        intent(
            OPEN,
            "web-46",
            &[fw, (MASQ, " 10.8.4.0/24 ,\t10.8.5.0/24\n")],
            None,
        ),
        intent(OPEN, "web-47", &[fw, (MASQ, "10.8.4.0/24\u{a0}")], None),
        intent(
            OPEN,
            "web-48",
            &[fw, (MASQ, "10.8.4.0/24\u{200b}")],
            Some("not a CIDR masquerade"),
        ),
        intent(
            OPEN,
            "web-49",
            &[fw, (MASQ, "10.8.6.0/24"), (RETURN, "10.9.0.0/24")],
            Some("allow.pools return-routes"),
        ),
        intent(
            OPEN,
            "web-50",
            &[fw, (MASQ, "10.9.0.0/24"), (RETURN, "x")],
            Some("allow.pools masquerade"),
        ),
        intent(OPEN, "web-51", &[("podgate.dev/Profile", "nope")], None),
        intent(CLOSED, "web-52", &[("podgate.dev/other", "x")], None),
        intent(
            OPEN,
            "web-53",
            &[(PROFILE, "nope"), (MASQ, "10.8.0.0/24")],
            Some("profiles"),
        ),
        intent(
            PINNED,
            "web-54",
            &[(PROFILE, "relay"), (MASQ, "bad")],
            Some("assign"),
        ),
        intent(
            OPEN,
            "web-55",
            &[fw, (MASQ, "192.168.64.0/20,192.168.70.0/24")],
            None,
        ),
        intent(OPEN, "web-56", &[fw, (MASQ, "10.8.0.0/16")], None),
        intent(OPEN, &long, &[vg], Some("assign")),
        intent(OPEN, "fixed", &[(PROFILE, "vpn-gateway")], None),
        intent(OPEN, "gw", &[fw], None),
    ]
}

/// A small deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// One pool item, right or wrong in every way the router tells apart.
fn pool_item(r: &mut Rng) -> String {
    let n = r.below(24);
    let items = [
        format!("10.8.{n}.0/24"),
        format!("10.8.{n}.0/24"),
        format!("192.168.{}.0/24", 64 + n % 16),
        format!("fd00:8:{n:x}::/48"),
        format!("FD00:8:{n:X}::/48"),
        format!("10.8.{n}.1/24"),
        format!("fd00:8::{n:x}/64"),
        format!("10.9.{n}.0/24"),
        "fd00:9::/32".into(),
        "0.0.0.0/0".into(),
        "::/0".into(),
        "x".into(),
        format!("10.8.{n}.0"),
        format!("10.8.{n}.0/33"),
        format!("010.8.{n}.0/24"),
        format!("10.8.{n}.0/08"),
        format!("::ffff:10.8.{n}.0/120"),
        format!("10.8.{n}.0 /24"),
        " ".into(),
        "\t".into(),
        format!("10.8.{n}.0/24\u{a0}"),
        format!("10.8.{n}.0/24\u{200b}"),
    ];
    r.pick(&items).clone()
}

fn pool_value(r: &mut Rng) -> String {
    let count = match r.below(10) {
        0 => 0,
        1 => 14 + r.below(6),
        _ => 1 + r.below(3),
    };
    let seps = [",", ", ", " ,", ",,"];
    let mut v = String::new();
    for i in 0..count {
        if i > 0 {
            let sep = *r.pick(&seps);
            v.push_str(sep);
        }
        // Long lists mostly of good pools, some repeated: the sixteen rule.
        let item = if count > 10 && r.chance(85) {
            format!("10.8.{}.0/24", r.below(18))
        } else {
            pool_item(r)
        };
        v.push_str(&item);
    }
    v
}

/// `n` intents from a fixed seed.
fn generated(n: usize) -> Vec<Intent> {
    let mut r = Rng(0x00c0_ffee_2026_0037);
    let profiles = [
        "forwarder",
        "relay",
        "vpn-gateway",
        "nope",
        "",
        "Relay",
        " relay",
    ];
    (0..n)
        .map(|i| {
            let ns = *r.pick(&[OPEN, OPEN, PINNED, CLOSED]);
            let name = if r.chance(6) {
                r.pick(&["fixed-gw", "fixed", "gw"]).to_string()
            } else {
                format!(
                    "{}-g{i}",
                    r.pick(&["web", "edge", "relay", "gw-blue", "fixed"])
                )
            };
            let mut ann = Vec::new();
            if r.chance(70) {
                ann.push((PROFILE.to_string(), r.pick(&profiles).to_string()));
            }
            if r.chance(45) {
                ann.push((MASQ.to_string(), pool_value(&mut r)));
            }
            if r.chance(35) {
                ann.push((RETURN.to_string(), pool_value(&mut r)));
            }
            Intent {
                ns,
                name,
                ann,
                expect: None,
            }
        })
        .collect()
}

/// The rule a refusal names, the router's and the policy's messages alike
/// (both start with it); None for a message of neither (a CEL error).
fn rule(msg: &str) -> Option<String> {
    let starts = [
        (
            "refused by allow.annotationNamespaces:",
            "allow.annotationNamespaces",
        ),
        ("refused by assign[", "assign"),
        (
            "pool annotations given but no podgate profile is selected",
            "no profile",
        ),
        ("refused by profiles:", "profiles"),
    ];
    if let Some((_, r)) = starts.iter().find(|(s, _)| msg.starts_with(s)) {
        return Some(r.to_string());
    }
    let ann = |rest: &str| {
        [MASQ, RETURN]
            .into_iter()
            .find(|a| rest.starts_with(a))
            .map(|a| a.trim_start_matches("podgate.dev/"))
    };
    if let Some(rest) = msg.strip_prefix("refused by allow.pools: ") {
        let a = rest.split(" from annotation ").nth(1).and_then(ann)?;
        return Some(format!("allow.pools {a}"));
    }
    let rest = msg.strip_prefix("annotation ")?;
    let a = ann(rest)?;
    let rest = rest.get(format!("podgate.dev/{a}").len()..)?;
    let kind = if rest.starts_with(" names no pool") {
        "no pool"
    } else if rest.starts_with(": more than 16 pools") {
        "more than 16"
    } else if rest.starts_with(": \"") || rest.starts_with(": a value of ") {
        "not a CIDR"
    } else if rest.contains(" has host bits set") {
        "host bits"
    } else {
        return None;
    };
    Some(format!("{kind} {a}"))
}

/// podgate-router's ADD, run as containerd runs it for a pod, without a
/// netns: its verdict on the pod's intent.
struct Router {
    bin: PathBuf,
    dir: TempDir,
    entry: Value,
    calls: Cell<u32>,
}

impl Router {
    fn new(bin: PathBuf, entry: &Value) -> Router {
        Router {
            bin,
            dir: TempDir::new("k8s-admission"),
            entry: entry.clone(),
            calls: Cell::new(0),
        }
    }

    /// Ok, or the refusal's message.
    fn verdict(&self, ns: &str, pod: &str, ann: &[(String, String)]) -> Result<(), String> {
        let n = self.calls.get() + 1;
        self.calls.set(n);
        let dir = self.dir.path();
        let netns = dir.join("no-netns");
        let annotations: Map<String, Value> =
            ann.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        let mut conf = self.entry.clone();
        let extra = json!({
            "cniVersion": "1.0.0", "name": "podgate-parity",
            "stateDir": dir.join("state"), "logFile": dir.join("router.log"),
            "runtimeConfig": {"io.kubernetes.cri.pod-annotations": annotations},
            "prevResult": {"cniVersion": "1.0.0",
                           "interfaces": [{"name": "eth0", "sandbox": netns}],
                           "ips": [{"address": "10.244.1.5/24", "interface": 0}]}
        });
        conf.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let id = format!("parity{n:06}");
        let mut cmd = bin_command(&self.bin);
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", &id)
            .env("CNI_NETNS", &netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", dir)
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={id}"),
            );
        let run = run_with_stdin(&mut cmd, conf.to_string().as_bytes());
        if run.code == Some(0) {
            return Ok(());
        }
        let err: Value = serde_json::from_str(run.stdout.trim())
            .unwrap_or_else(|e| panic!("not a CNI error ({e}): {run:?}"));
        let msg = err["msg"].as_str().unwrap_or_default().to_string();
        match err["code"].as_u64() {
            Some(100) => Err(msg),
            // Past the intent check: the netns is the first thing it opens.
            Some(3) if msg.starts_with(&format!("netns {}", netns.display())) => Ok(()),
            _ => panic!("neither a refusal nor the missing netns: {run:?}"),
        }
    }
}

/// The object of `kind` (`Pod` or `Deployment`) for `i`.
fn object(kind: &str, i: &Intent) -> Value {
    let ann: Map<String, Value> = i.ann.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    let spec = json!({
        "automountServiceAccountToken": false,
        "containers": [{"name": "c", "image": "localhost/podgate/none:1", "imagePullPolicy": "Never"}]
    });
    match kind {
        "Pod" => json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": i.name, "namespace": i.ns, "annotations": ann},
            "spec": spec
        }),
        _ => json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": i.name, "namespace": i.ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "parity"}},
                     "template": {"metadata": {"labels": {"app": "parity"}, "annotations": ann},
                                  "spec": spec}}
        }),
    }
}

/// Server-side dry-run creation of each object (all of one kind): Ok, or
/// the message of the podgate policy that refused it. Objects go in
/// batches of distinct names (one `kubectl create` each, a List); any
/// other output fails the test.
fn dry_run(objects: &[Value]) -> Vec<Result<(), String>> {
    let mut batches: Vec<Vec<usize>> = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        let name = &o["metadata"]["name"];
        match batches
            .iter_mut()
            .find(|b| b.iter().all(|j| &objects[*j]["metadata"]["name"] != name))
        {
            Some(b) => b.push(i),
            None => batches.push(vec![i]),
        }
    }
    let mut out: Vec<Option<Result<(), String>>> = vec![None; objects.len()];
    for batch in batches {
        let list = json!({"apiVersion": "v1", "kind": "List",
                          "items": batch.iter().map(|i| objects[*i].clone()).collect::<Vec<_>>()});
        let run = kubectl_stdin(
            &["create", "--dry-run=server", "-f", "-"],
            &list.to_string(),
        );
        let mut verdicts: BTreeMap<String, Result<(), String>> = BTreeMap::new();
        for line in run.stdout.lines() {
            let name = line
                .strip_suffix(" created (server dry run)")
                .and_then(|l| l.split_once('/'))
                .map(|(_, n)| n.to_string())
                .unwrap_or_else(|| panic!("unexpected kubectl output {line:?}:\n{run:?}"));
            verdicts.insert(name, Ok(()));
        }
        for line in run.stderr.lines() {
            let (name, msg) =
                refusal(line).unwrap_or_else(|| panic!("not a podgate refusal: {line:?}"));
            verdicts.insert(name, Err(msg));
        }
        for i in batch {
            let name = objects[i]["metadata"]["name"].as_str().unwrap();
            out[i] = Some(
                verdicts
                    .remove(name)
                    .unwrap_or_else(|| panic!("no verdict for {name}:\n{run:?}")),
            );
        }
    }
    out.into_iter().map(Option::unwrap).collect()
}

/// `Error from server (Forbidden): error when creating "STDIN": <kind>
/// "<name>" is forbidden: ValidatingAdmissionPolicy 'podgate-…' with
/// binding 'podgate-…' denied request: <message>`: the name and message.
fn refusal(line: &str) -> Option<(String, String)> {
    let rest =
        line.strip_prefix("Error from server (Forbidden): error when creating \"STDIN\": ")?;
    let (what, rest) = rest.split_once("\" is forbidden: ")?;
    let name = what.split_once(" \"")?.1;
    let rest = rest.strip_prefix("ValidatingAdmissionPolicy 'podgate-")?;
    let msg = rest.split_once("' denied request: ")?.1;
    Some((name.to_string(), msg.to_string()))
}

/// The pod names a Deployment named `name` can make that tell the parity
/// policy's `assign` rules apart: a generated one, and one per rule whose
/// name or prefix goes on after `<name>-`.
fn template_pod_names(name: &str, entry: &Value) -> Vec<String> {
    let base = format!("{name}-");
    let known = if base.len() > 58 { &name[..58] } else { &base };
    let mut out = vec![format!("{known}7d4b9c8f6d-x2k9p")];
    for rule in entry["assign"].as_array().unwrap() {
        if let Some(p) = rule["podNamePrefix"].as_str() {
            if p.starts_with(known) && p.len() > known.len() {
                out.push(format!("{p}x2k9p"));
            }
        }
        if let Some(n) = rule["podName"].as_str() {
            if n.starts_with(known) {
                out.push(n.to_string());
            }
        }
    }
    out
}

/// `podgate admission render` (the built binary) of a plugins file holding
/// `entry`, with `args`.
fn render(entry: &Value, args: &[&str]) -> String {
    let dir = TempDir::new("k8s-render");
    let file = dir.path().join("plugins.json");
    std::fs::write(
        &file,
        serde_json::to_string_pretty(&json!([entry])).unwrap(),
    )
    .unwrap();
    let podgate = built_shipped().into_iter().next().unwrap();
    let out = bin_command(&podgate)
        .args(["admission", "render", "--plugins"])
        .arg(&file)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// Applies a render and checks it ([`type_checked`]).
fn apply_policy(c: &Cluster, yaml: &str) {
    c.apply(yaml);
    type_checked(c);
}

/// The API server type-checked every expression of the policies against
/// their kinds' schemas without a warning.
fn type_checked(c: &Cluster) {
    for name in [
        "podgate-pods",
        "podgate-pod-templates",
        "podgate-cronjob-templates",
    ] {
        let status = c.wait("the policy type-checked", 60, || {
            let p = c.kubectl_json(&["get", "validatingadmissionpolicy", name]);
            (p["status"]["observedGeneration"] == p["metadata"]["generation"])
                .then_some(p["status"].clone())
        });
        assert!(
            status["typeChecking"]["expressionWarnings"].is_null(),
            "{name}: {status:#}"
        );
    }
}

/// Removes the policies and the namespaces a case made, also when it fails.
struct Cleanup<'a> {
    c: &'a Cluster,
    namespaces: &'a [&'a str],
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        self.c.kubectl(&[
            "delete",
            "validatingadmissionpolicybindings,validatingadmissionpolicies",
            "-l",
            "app.kubernetes.io/name=podgate",
            "--ignore-not-found",
        ]);
        for ns in self.namespaces {
            self.c.kubectl(&[
                "delete",
                "namespace",
                ns,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=120s",
            ]);
        }
    }
}

fn namespaces(c: &Cluster, names: &[&str]) {
    for ns in names {
        c.apply(&crate::policy::namespace_yaml(ns));
        // Pods need the namespace's default service account to be admitted.
        c.wait("the default service account", 60, || {
            c.kubectl(&["-n", ns, "get", "serviceaccount", "default"])
                .status
                .success()
                .then_some(())
        });
    }
}

pub fn the_policy_refuses_what_the_router_refuses(world: &mut World) {
    let entry = parity_entry();
    let router_bin = built_shipped()
        .into_iter()
        .find(|p| p.ends_with("podgate-router"))
        .unwrap();
    let yaml = render(&entry, &[]);
    let c = world.cluster();
    let _cleanup = Cleanup {
        c,
        namespaces: &[OPEN, PINNED, CLOSED],
    };
    namespaces(c, &[OPEN, PINNED, CLOSED]);
    apply_policy(c, &yaml);

    let mut intents = table();
    let table_size = intents.len();
    intents.extend(generated(300));
    let router = Router::new(router_bin, &entry);
    let pods = dry_run(&intents.iter().map(|i| object("Pod", i)).collect::<Vec<_>>());
    let deployments = dry_run(
        &intents
            .iter()
            .map(|i| object("Deployment", i))
            .collect::<Vec<_>>(),
    );

    let mut failures = Vec::new();
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for (n, i) in intents.iter().enumerate() {
        let case = format!("#{n} {}/{} {:?}", i.ns, i.name, i.ann);
        let named = |v: &Result<(), String>, who: &str| -> Option<String> {
            match v {
                Ok(()) => None,
                Err(m) => Some(
                    rule(m).unwrap_or_else(|| panic!("{case}: {who}'s refusal names no rule: {m}")),
                ),
            }
        };
        // The pod: the same verdict, the same rule.
        let by_router = named(&router.verdict(i.ns, &i.name, &i.ann), "the router");
        let by_policy = named(&pods[n], "the policy");
        *tally
            .entry(by_router.clone().unwrap_or_else(|| "admitted".into()))
            .or_default() += 1;
        if by_router != by_policy {
            failures.push(format!(
                "{case}: pod: router {by_router:?}, API server {by_policy:?} ({:?})",
                pods[n]
            ));
        }
        if let Some(expect) = i.expect {
            if by_router.as_deref() != expect {
                failures.push(format!(
                    "{case}: the table expects {expect:?}, the router says {by_router:?}"
                ));
            }
        }
        if let Err(m) = &pods[n] {
            // The policy's own message: rule and fix, no CEL error.
            if !m.contains("; fix: ") {
                failures.push(format!("{case}: not the policy's own message: {m}"));
            }
        }
        // The Deployment: refused iff every pod it can make would be,
        // by one of the rules the router names for them.
        let samples: Vec<Option<String>> = template_pod_names(&i.name, &entry)
            .iter()
            .map(|pod| named(&router.verdict(i.ns, pod, &i.ann), "the router"))
            .collect();
        let by_policy = named(&deployments[n], "the policy");
        let agree = match &by_policy {
            None => samples.iter().any(Option::is_none),
            Some(r) => samples.iter().all(Option::is_some) && samples.contains(&Some(r.clone())),
        };
        if !agree {
            failures.push(format!(
                "{case}: deployment: router on its pods {samples:?}, API server {by_policy:?}"
            ));
        }
    }
    println!(
        "parity: {} intents ({table_size} in the table, {} generated), each as a pod and a Deployment; \
         {} router calls; the router's verdicts on the pods: {tally:?}",
        intents.len(),
        intents.len() - table_size,
        router.calls.get()
    );
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The table covers every kind of refusal.
    for r in [
        "admitted",
        "allow.annotationNamespaces",
        "assign",
        "no profile",
        "profiles",
        "not a CIDR masquerade",
        "host bits masquerade",
        "allow.pools masquerade",
        "more than 16 masquerade",
        "no pool masquerade",
        "not a CIDR return-routes",
        "host bits return-routes",
        "allow.pools return-routes",
    ] {
        assert!(
            tally.get(r).is_some_and(|n| *n > 0),
            "no case of {r}: {tally:?}"
        );
    }
}

/// A namespace the shipped policy does not let choose (the shipped policy
/// allows `vpn`).
const APPLY_NS: &str = "adm-apply";

/// `kubectl ARGS` with `yaml` on stdin: its output.
fn kubectl_stdin(args: &[&str], yaml: &str) -> podgate_integration::Run {
    let mut full = vec!["run", "kubectl"];
    full.extend_from_slice(args);
    let mut cmd = cluster_sh(&full);
    cmd.stderr(std::process::Stdio::piped());
    run_with_stdin(&mut cmd, yaml.as_bytes())
}

/// A workload of `kind` in `ns` whose pods ask for `profile`.
fn workload(kind: &str, ns: &str, name: &str, profile: &str) -> Value {
    let template = json!({
        "metadata": {"labels": {"app": name}, "annotations": {PROFILE: profile}},
        "spec": {"automountServiceAccountToken": false, "restartPolicy": if kind.ends_with("Job") { "Never" } else { "Always" },
                 "containers": [{"name": "c", "image": "localhost/podgate/none:1", "imagePullPolicy": "Never"}]}
    });
    let selector = json!({"matchLabels": {"app": name}});
    let (api, spec) = match kind {
        "Deployment" | "ReplicaSet" | "DaemonSet" => (
            "apps/v1",
            json!({"selector": selector, "template": template}),
        ),
        "StatefulSet" => (
            "apps/v1",
            json!({"selector": selector, "serviceName": name, "template": template}),
        ),
        "Job" => ("batch/v1", json!({"template": template})),
        _ => (
            "batch/v1",
            json!({"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"template": template}}}),
        ),
    };
    json!({"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

pub fn the_shipped_policy_refuses_at_kubectl_apply(world: &mut World) {
    let installed = world.installed;
    let world_policy_edited = world.policy_edited;
    let podgate = built_shipped().into_iter().next().unwrap();
    let c = world.cluster();
    let vpn_existed = c.kubectl(&["get", "namespace", "vpn"]).status.success();
    let mut made: Vec<&str> = vec![APPLY_NS];
    if !vpn_existed {
        made.push("vpn");
    }
    let _cleanup = Cleanup {
        c,
        namespaces: &made,
    };
    namespaces(c, &[APPLY_NS, "vpn"]);
    // A pod made before the policy, asking for what it will refuse; kept
    // off every node (no sandbox, no refusal at ADD).
    let mut early = object(
        "Pod",
        &intent(APPLY_NS, "before-policy", &[(PROFILE, "vpn-gateway")], None),
    );
    early["spec"]["nodeSelector"] = json!({"podgate-k8s/none": "none"});
    c.apply(&early.to_string());

    // The README's command, verbatim: the shipped render.
    let block = crate::world::sh_block(
        "conf/kubernetes/README.md",
        "Refusal at admission",
        "podgate-admission.yaml",
    );
    c.sh_ok(&block);
    type_checked(c);
    let shipped = std::fs::read_to_string(
        podgate_integration::workspace_root().join("conf/kubernetes/podgate-admission.yaml"),
    )
    .unwrap();
    // Both carry the digest of the policy they were rendered from.
    let digest = bin_command(&podgate)
        .args(["admission", "digest", "--plugins"])
        .arg(podgate_integration::workspace_root().join("conf/plugins.json"))
        .output()
        .unwrap();
    let digest = String::from_utf8_lossy(&digest.stdout).trim().to_string();
    assert!(digest.starts_with("sha256:"), "{digest}");
    for kind in [
        "validatingadmissionpolicy",
        "validatingadmissionpolicybinding",
    ] {
        let got = c.kubectl_ok(&[
            "get",
            kind,
            "podgate-pods",
            "-o",
            "jsonpath={.metadata.annotations.podgate\\.dev/policy-digest}",
        ]);
        assert_eq!(got.trim(), digest, "{kind}");
    }

    // Refused at kubectl apply, the rule named: a pod and a Deployment.
    for (what, policy, obj) in [
        (
            "pod",
            "podgate-pods",
            object(
                "Pod",
                &intent(APPLY_NS, "refused", &[(PROFILE, "vpn-gateway")], None),
            ),
        ),
        (
            "deployment",
            "podgate-pod-templates",
            workload("Deployment", APPLY_NS, "refused", "vpn-gateway"),
        ),
    ] {
        let run = kubectl_stdin(&["apply", "-f", "-"], &obj.to_string());
        assert_ne!(run.code, Some(0), "{what} admitted: {run:?}");
        assert!(
            run.stderr
                .contains(&format!("ValidatingAdmissionPolicy '{policy}'"))
                && run
                    .stderr
                    .contains("refused by allow.annotationNamespaces: namespace adm-apply"),
            "{what}: {run:?}"
        );
        assert!(
            c.kubectl(&["-n", APPLY_NS, "get", what, "refused"])
                .status
                .code()
                != Some(0),
            "{what} exists"
        );
    }
    // Every workload kind's template, refused where the pods may not ask
    // and admitted where they may.
    for kind in [
        "Deployment",
        "StatefulSet",
        "DaemonSet",
        "ReplicaSet",
        "Job",
        "CronJob",
    ] {
        let name = kind.to_lowercase();
        let refused = kubectl_stdin(
            &["create", "--dry-run=server", "-f", "-"],
            &workload(kind, APPLY_NS, &name, "vpn-gateway").to_string(),
        );
        let policy = if kind == "CronJob" {
            "podgate-cronjob-templates"
        } else {
            "podgate-pod-templates"
        };
        assert!(
            refused.code != Some(0)
                && refused
                    .stderr
                    .contains(&format!("ValidatingAdmissionPolicy '{policy}'"))
                && refused
                    .stderr
                    .contains("refused by allow.annotationNamespaces"),
            "{kind}: {refused:?}"
        );
        let admitted = kubectl_stdin(
            &["create", "--dry-run=server", "-f", "-"],
            &workload(kind, "vpn", &name, "vpn-gateway").to_string(),
        );
        assert_eq!(admitted.code, Some(0), "{kind}: {admitted:?}");
        let undefined = kubectl_stdin(
            &["create", "--dry-run=server", "-f", "-"],
            &workload(kind, "vpn", &name, "nope").to_string(),
        );
        assert!(
            undefined.stderr.contains("refused by profiles"),
            "{kind}: {undefined:?}"
        );
    }
    // A pod named by generateName: the name is known at admission.
    let mut generated = object("Pod", &intent("vpn", "", &[(PROFILE, "nope")], None));
    generated["metadata"] =
        json!({"generateName": "gen-", "namespace": "vpn", "annotations": {PROFILE: "nope"}});
    let run = kubectl_stdin(
        &["create", "--dry-run=server", "-f", "-"],
        &generated.to_string(),
    );
    assert!(
        run.stderr.contains("pods \"gen-") && run.stderr.contains("refused by profiles"),
        "{run:?}"
    );

    // UPDATE: a change of podgate's annotations is checked, anything else
    // of a pod admitted before the policy goes on (labels, finalizers).
    c.kubectl_ok(&[
        "-n",
        APPLY_NS,
        "label",
        "pod",
        "before-policy",
        "touched=yes",
    ]);
    let annotate = c.kubectl(&[
        "-n",
        APPLY_NS,
        "annotate",
        "pod",
        "before-policy",
        "podgate.dev/masquerade=10.8.0.0/24",
    ]);
    let text = output_text(&annotate);
    assert!(
        !annotate.status.success() && text.contains("refused by allow.annotationNamespaces"),
        "{text}"
    );
    c.kubectl_ok(&[
        "-n",
        APPLY_NS,
        "annotate",
        "pod",
        "before-policy",
        "podgate.dev/profile-",
    ]);

    // validationActions is a value: Warn admits with the policy's message
    // as a warning.
    let entry = {
        let plugins: Value = serde_json::from_str(
            &std::fs::read_to_string(
                podgate_integration::workspace_root().join("conf/plugins.json"),
            )
            .unwrap(),
        )
        .unwrap();
        plugins
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "podgate-router")
            .unwrap()
            .clone()
    };
    apply_policy(c, &render(&entry, &["--validation-actions", "Warn"]));
    let warned = kubectl_stdin(
        &["create", "--dry-run=server", "-f", "-"],
        &object(
            "Pod",
            &intent(APPLY_NS, "warned", &[(PROFILE, "vpn-gateway")], None),
        )
        .to_string(),
    );
    assert_eq!(warned.code, Some(0), "{warned:?}");
    assert!(
        warned
            .stderr
            .contains("Warning: Validation failed for ValidatingAdmissionPolicy 'podgate-pods'")
            && warned
                .stderr
                .contains("refused by allow.annotationNamespaces"),
        "{warned:?}"
    );
    apply_policy(c, &shipped);

    if installed {
        // The README's digest check: the admission policy's digest against
        // the one of the policy the nodes have mounted; then the README's
        // render from that policy makes them agree.
        let compare = || {
            let block = crate::world::sh_block(
                "conf/kubernetes/README.md",
                "Refusal at admission",
                "policy-digest",
            );
            let out = c.sh_ok(&block);
            let lines: Vec<String> = out.lines().map(|l| l.trim().to_string()).collect();
            assert!(
                lines.len() == 2 && lines.iter().all(|l| l.starts_with("sha256:")),
                "{out}"
            );
            lines
        };
        let before = compare();
        assert_eq!(before[0], digest, "the shipped render's digest");
        // The policy case edited the ConfigMap (no render): they disagree.
        assert_eq!(before[0] != before[1], world_policy_edited, "{before:?}");
        let block = crate::world::sh_block(
            "conf/kubernetes/README.md",
            "Refusal at admission",
            "admission render --plugins /etc/podgate/plugins.json",
        );
        c.sh_ok(&block);
        type_checked(c);
        let after = compare();
        assert_eq!(after[0], after[1], "{after:?}");
        assert_eq!(after[1], before[1], "{after:?}");
    }

    // An allowed pod is admitted, and wired where podgate runs.
    c.apply(&crate::policy::pod_yaml(
        "vpn",
        "adm-allowed",
        &[(PROFILE, "vpn-gateway")],
        false,
    ));
    if installed {
        c.wait_pod_ready("vpn", "adm-allowed");
        assert_eq!(crate::nodes::ip_forward(c, "vpn", "adm-allowed"), "1");
    } else {
        println!(
            "podgate is not installed on this cluster: the admitted pod is not checked for wiring"
        );
    }
    c.kubectl_ok(&["-n", "vpn", "delete", "pod", "adm-allowed", "--wait=true"]);
}
