//! `podgate install` / `uninstall` against copies of real-world primary
//! configs (integration/fixtures/primaries/) in temp dirs: podgate's own
//! conflist (`00-podgate.conflist`) rendered from the primary, `--watch`
//! while a primary rewrites or removes its file, and a pod wired through the
//! chain by the real libcni. Never touches the machine's /etc/cni or /opt/cni.
//! The reboot case (installer down while the primary rewrites its file) runs
//! under containerd in `tests/containerd.rs`.
//!
//! Needs the binaries built first (`cargo build --bins`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::{
    bin_dir, podgate_command, require_root, workspace_root, TempDir, TestNode, Verb,
};
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const PRIMARIES: [&str; 7] = [
    "01-kube-ovn.conflist",
    "05-cilium.conflist",
    "10-calico.conflist",
    "10-flannel.conflist",
    "11-crio-ipv4-bridge.conflist",
    "10-mynet.conf",
    "10-calico.conf",
];

fn fixture(name: &str) -> Vec<u8> {
    let p = workspace_root()
        .join("integration/fixtures/primaries")
        .join(name);
    fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn router_entry(state_dir: &Path) -> Value {
    json!({
        "type": "podgate-router",
        "capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "stateDir": state_dir,
        "profiles": {"vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}, "masquerade": [{"source": "10.8.0.0/24"}]}},
        "assign": [{"namespace": "vpn", "podNamePrefix": "openvpn-gw", "profile": "vpn-gateway"}],
        "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]}
    })
}

fn guard_entry() -> Value {
    json!({"type": "podgate-tunnel-guard", "required": "never"})
}

/// A node's dirs in a temp dir: `net.d/`, `bin/`, `src/` (small stand-in
/// plugin binaries), `state/`, and `plugins.json`.
struct Dirs {
    tmp: TempDir,
}

impl Dirs {
    fn new(tag: &str) -> Dirs {
        let d = Dirs {
            tmp: TempDir::new(&format!("install-{tag}")),
        };
        for sub in ["net.d", "bin", "src"] {
            fs::create_dir_all(d.root().join(sub)).unwrap();
        }
        d.set_binaries("v1");
        d.set_plugins(&json!([
            guard_entry(),
            router_entry(&d.root().join("router"))
        ]));
        d
    }
    fn root(&self) -> &Path {
        self.tmp.path()
    }
    fn conf(&self) -> PathBuf {
        self.root().join("net.d")
    }
    fn bin(&self) -> PathBuf {
        self.root().join("bin")
    }
    fn plugins(&self) -> PathBuf {
        self.root().join("plugins.json")
    }
    fn ready(&self) -> PathBuf {
        self.root().join("run/ready")
    }
    fn set_binaries(&self, version: &str) {
        for name in ["podgate-router", "podgate-tunnel-guard"] {
            let p = self.root().join("src").join(name);
            fs::write(&p, format!("#!/bin/sh\n# {name} {version}\nexit 0\n")).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    fn set_plugins(&self, entries: &Value) {
        fs::write(self.plugins(), serde_json::to_vec_pretty(entries).unwrap()).unwrap();
    }
    fn put(&self, name: &str, bytes: &[u8]) {
        fs::write(self.conf().join(name), bytes).unwrap();
    }
    fn read(&self, name: &str) -> Vec<u8> {
        fs::read(self.conf().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }
    fn json(&self, name: &str) -> Value {
        serde_json::from_slice(&self.read(name)).unwrap()
    }
    fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.conf())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
    /// The files a runtime would consider, in the order it would.
    fn loaded(&self) -> Vec<String> {
        self.files()
            .into_iter()
            .filter(|n| n.ends_with(".conflist") || n.ends_with(".conf") || n.ends_with(".json"))
            .collect()
    }
    fn common(&self, cmd: &mut Command) {
        cmd.arg("--cni-conf-dir")
            .arg(self.conf())
            .arg("--cni-bin-dir")
            .arg(self.bin())
            .arg("--state-dir")
            .arg(self.root().join("state"));
    }
    fn install_cmd(&self, extra: &[&str]) -> Command {
        let mut cmd = podgate_command();
        cmd.arg("install");
        self.common(&mut cmd);
        cmd.arg("--source-dir")
            .arg(self.root().join("src"))
            .arg("--plugins")
            .arg(self.plugins())
            .arg("--plugin-path-root")
            .arg(self.root())
            .args(extra)
            .stdin(Stdio::null());
        // No runtime here: readiness is the file check (tests/containerd.rs
        // and tests/runtime_truth.rs ask a real containerd).
        if !extra.contains(&"--runtime-endpoint") {
            cmd.args(["--runtime-endpoint", "none"]);
        }
        cmd
    }
    fn install(&self, extra: &[&str]) -> Output {
        self.install_cmd(extra).output().unwrap()
    }
    fn install_ok(&self) {
        let out = self.install(&[]);
        assert!(out.status.success(), "install failed:\n{}", text(&out));
    }
    fn check(&self) -> bool {
        self.install(&["--check"]).status.success()
    }
    fn uninstall(&self, extra: &[&str]) -> Output {
        let mut cmd = podgate_command();
        cmd.arg("uninstall");
        self.common(&mut cmd);
        cmd.args(extra).stdin(Stdio::null()).output().unwrap()
    }
    fn uninstall_ok(&self) {
        let out = self.uninstall(&[]);
        assert!(out.status.success(), "uninstall failed:\n{}", text(&out));
    }
}

fn text(out: &Output) -> String {
    podgate_integration::output_text(out)
}

fn types(conflist: &Value) -> Vec<String> {
    conflist["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect()
}

fn top_keys(bytes: &[u8]) -> Vec<String> {
    // Top-level keys in file order (serde_json's Map sorts, so scan instead).
    let v: Value = serde_json::from_slice(bytes).unwrap();
    let s = String::from_utf8_lossy(bytes);
    let mut keys: Vec<(usize, String)> = v
        .as_object()
        .unwrap()
        .keys()
        .map(|k| (s.find(&format!("\"{k}\"")).unwrap(), k.clone()))
        .collect();
    keys.sort();
    keys.into_iter().map(|(_, k)| k).collect()
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// Write like a primary's installer: temp file + rename.
fn replace_atomically(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp-primary");
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, path).unwrap();
}

/// podgate's own conflist.
const OWN: &str = "00-podgate.conflist";

/// The chain a runtime gets from podgate's file: the primary's plugins
/// (a `.conf` as a one-plugin list), then podgate's two entries.
fn assert_rendered_from(d: &Dirs, primary: &[u8], what: &str) {
    let own = d.json(OWN);
    let orig: Value = serde_json::from_slice(primary).unwrap();
    let mut want_types = match orig.get("plugins") {
        Some(_) => types(&orig),
        None => vec![orig["type"].as_str().unwrap().to_string()],
    };
    want_types.extend(["podgate-tunnel-guard".into(), "podgate-router".into()]);
    assert_eq!(
        types(&own),
        want_types,
        "{what}: the primary's plugins, then podgate's"
    );
    assert_eq!(own["cniVersion"], orig["cniVersion"], "{what}: cniVersion");
    assert_eq!(own["name"], orig["name"], "{what}: same network name");
    for p in own["plugins"].as_array().unwrap() {
        if p["type"].as_str().unwrap().starts_with("podgate-") {
            assert!(
                p.get("cniVersion").is_none(),
                "{what}: entries inherit cniVersion"
            );
        }
    }
    if let Some(plugins) = orig.get("plugins") {
        // The primary's own plugins, and the top-level key order, as it wrote them.
        let n = plugins.as_array().unwrap().len();
        assert_eq!(
            &own["plugins"].as_array().unwrap()[..n],
            plugins.as_array().unwrap()
        );
        assert_eq!(top_keys(&d.read(OWN)), top_keys(primary), "{what}");
    } else {
        let mut plugin = orig.clone();
        plugin.as_object_mut().unwrap().remove("cniVersion");
        plugin.as_object_mut().unwrap().remove("name");
        assert_eq!(own["plugins"][0], plugin, "{what}: .conf as a list");
    }
}

/// With the chain in place on disk but no runtime answering on the
/// endpoint, `--check` says so instead of trusting the conf dir; `none`
/// trusts the conf dir.
#[test]
fn check_without_a_runtime_answering_says_so_and_none_falls_back_to_the_files() {
    let d = Dirs::new("no-runtime");
    d.put("10-calico.conflist", &fixture("10-calico.conflist"));
    d.install_ok();
    let sock = d.root().join("no-such-runtime.sock");
    let endpoint = format!("unix://{}", sock.display());
    let out = d.install(&["--check", "--runtime-endpoint", &endpoint]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot tell what the runtime loaded")
            && err.contains(&sock.display().to_string()),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(d.check(), "--runtime-endpoint none: the file check");
}

#[test]
fn install_renders_its_own_conflist_from_each_real_world_primary() {
    for name in PRIMARIES {
        let d = Dirs::new("each");
        let original = fixture(name);
        d.put(name, &original);
        d.put("calico-kubeconfig", b"# not a CNI config\n");
        assert!(!d.check(), "{name}: --check before install");

        d.install_ok();
        // What a runtime loads first now: podgate's file; the primary's file
        // is exactly as its owner wrote it.
        assert_eq!(
            d.loaded(),
            vec![OWN.to_string(), name.to_string()],
            "{name}"
        );
        assert_eq!(d.read(name), original, "{name}: primary untouched");
        assert_rendered_from(&d, &original, name);
        for bin in ["podgate-router", "podgate-tunnel-guard"] {
            let p = d.bin().join(bin);
            assert_eq!(
                fs::read(&p).unwrap(),
                fs::read(d.root().join("src").join(bin)).unwrap()
            );
            assert_eq!(
                fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o755
            );
        }
        assert!(d.check(), "{name}: --check after install");

        // Install twice = install once.
        let once = d.read(OWN);
        let files = d.files();
        d.install_ok();
        assert_eq!(d.read(OWN), once, "{name}: second install changed the file");
        assert_eq!(d.files(), files, "{name}");

        d.uninstall_ok();
        assert_eq!(d.read(name), original, "{name}: primary untouched");
        assert_eq!(d.loaded(), vec![name.to_string()], "{name}");
        assert!(
            !d.files().iter().any(|f| f.contains("podgate")),
            "{name}: {:?}",
            d.files()
        );
        assert!(!d.check(), "{name}: --check after uninstall");
        // The binaries stay (pods on the node still need them for DEL) ...
        assert!(d.bin().join("podgate-router").exists());
        // ... unless asked.
        let out = d.uninstall(&["--remove-binaries"]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(!d.bin().join("podgate-router").exists());
        assert!(!d.bin().join("podgate-tunnel-guard").exists());
        assert_eq!(
            d.read(name),
            original,
            "{name}: second uninstall is a no-op"
        );
    }
}

#[test]
fn the_first_file_in_lexical_order_is_the_primary() {
    let d = Dirs::new("order");
    d.put("10-calico.conflist", &fixture("10-calico.conflist"));
    let lo = br#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#;
    d.put("99-loopback.conf", lo);
    d.put("00-disabled.conflist.bak", b"{not json");
    d.put("calico-kubeconfig", b"apiVersion: v1\n");
    d.install_ok();
    assert_rendered_from(&d, &fixture("10-calico.conflist"), "10-calico");
    assert_eq!(
        d.loaded(),
        vec![OWN, "10-calico.conflist", "99-loopback.conf"]
    );
    assert_eq!(d.read("00-disabled.conflist.bak"), b"{not json");

    // --primary picks another file.
    let out = d.install(&["--primary", "99-loopback.conf"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(types(&d.json(OWN))[0], "loopback");
    let check = d.install(&["--check", "--primary", "99-loopback.conf"]);
    assert!(check.status.success(), "{}", text(&check));
    assert!(!d.check(), "without --primary the chain is not current");
    let out = d.install(&["--primary", OWN]);
    assert!(!out.status.success(), "podgate's own file is no primary");
    d.uninstall_ok();
    assert_eq!(d.read("99-loopback.conf"), lo);
    assert_eq!(d.read("10-calico.conflist"), fixture("10-calico.conflist"));
    assert_eq!(d.loaded(), vec!["10-calico.conflist", "99-loopback.conf"]);
}

#[test]
fn corrupt_or_empty_primaries_are_refused_untouched() {
    let cases: [(&str, &[u8], &str); 5] = [
        (
            "10-broken.conflist",
            b"{\"name\": \"k8s-pod-network\", \"plugins\": [",
            "not valid JSON",
        ),
        (
            "10-noplugins.conflist",
            br#"{"cniVersion":"0.3.1","name":"x"}"#,
            "has no plugins",
        ),
        (
            "10-empty.conflist",
            br#"{"cniVersion":"0.3.1","name":"x","plugins":[]}"#,
            "has no plugins",
        ),
        ("10-array.conflist", b"[]", "not a JSON object"),
        (
            "10-old.conflist",
            br#"{"cniVersion":"0.2.0","name":"x","plugins":[{"type":"bridge"}]}"#,
            "0.3.0",
        ),
    ];
    for (name, bytes, msg) in cases {
        let d = Dirs::new("corrupt");
        d.put(name, bytes);
        let out = d.install(&[]);
        assert!(!out.status.success(), "{name}: install must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(msg) && err.contains(name), "{name}: {err}");
        assert_eq!(d.read(name), bytes, "{name} touched");
        assert_eq!(d.files(), vec![name.to_string()]);
    }
    // No config at all.
    let d = Dirs::new("none");
    let out = d.install(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no CNI config"));

    // podgate's name taken by a file podgate did not write.
    let d = Dirs::new("taken");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    d.put(OWN, &fixture("05-cilium.conflist"));
    let out = d.install(&[]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("was not written by podgate"),
        "{}",
        text(&out)
    );
    assert_eq!(d.read(OWN), fixture("05-cilium.conflist"));
    d.uninstall_ok();
    assert_eq!(d.read(OWN), fixture("05-cilium.conflist"), "not podgate's");

    // A primary that sorts before podgate's file: refused (the runtime would
    // never load podgate's chain), until a name that sorts earlier is given.
    let d = Dirs::new("sorts");
    d.put("00-aaa.conflist", &fixture("10-flannel.conflist"));
    let out = d.install(&[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("sorts before it"), "{}", text(&out));
    assert_eq!(d.files(), vec!["00-aaa.conflist"]);
    let out = d.install(&["--conflist-name", "0-podgate.conflist"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(d.loaded(), vec!["0-podgate.conflist", "00-aaa.conflist"]);
    let out = d.uninstall(&["--conflist-name", "0-podgate.conflist"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(d.files(), vec!["00-aaa.conflist"]);
    // A meta-plugin's file first (Multus): render from the real primary.
    let d = Dirs::new("multus");
    let multus = br#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus","kubeconfig":"/etc/cni/net.d/multus.d/multus.kubeconfig"}"#;
    d.put("00-multus.conf", multus);
    d.put("10-calico.conflist", &fixture("10-calico.conflist"));
    let out = d.install(&[]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("00-multus.conf sorts before it"),
        "{}",
        text(&out)
    );
    let out = d.install(&["--primary", "10-calico.conflist"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        d.loaded(),
        vec!["00-multus.conf", OWN, "10-calico.conflist"]
    );
    assert_rendered_from(&d, &fixture("10-calico.conflist"), "behind multus");
    assert_eq!(d.read("00-multus.conf"), multus);
    d.uninstall_ok();
    assert_eq!(d.loaded(), vec!["00-multus.conf", "10-calico.conflist"]);
    for bad in [
        "x.conf",
        ".00-podgate.conflist",
        "a/b.conflist",
        ".conflist",
    ] {
        let out = d.install(&["--conflist-name", bad]);
        assert!(!out.status.success(), "{bad}");
        assert!(
            text(&out).contains("--conflist-name"),
            "{bad}: {}",
            text(&out)
        );
    }
}

#[test]
fn bad_plugins_file_is_refused_before_touching_anything() {
    let d = Dirs::new("badplugins");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    for (entries, msg) in [
        (json!([{"type": "portmap"}]), "only podgate-* plugins"),
        (
            json!([{"type": "podgate-router", "assign": [{"profile": "nope"}]}]),
            "not in profiles",
        ),
        (
            json!([{"type": "podgate-tunnel-guard", "timeoutMs": 0}]),
            "timeoutMs",
        ),
        (json!([]), "no plugin"),
    ] {
        d.set_plugins(&entries);
        let out = d.install(&[]);
        assert!(!out.status.success(), "{entries}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(msg),
            "{entries}: {}",
            text(&out)
        );
        assert_eq!(d.files(), vec!["10-flannel.conflist"]);
        assert_eq!(
            d.read("10-flannel.conflist"),
            fixture("10-flannel.conflist")
        );
        assert!(!d.bin().join("podgate-router").exists());
    }
}

/// An earlier podgate chained into the primary's file in place (and kept
/// its original bytes in the state dir); a primary may also hold podgate
/// entries nobody recorded. Install moves the chain into podgate's file
/// and gives the primary back.
#[test]
fn in_place_chains_of_earlier_installs_are_given_back() {
    let d = Dirs::new("migrate");
    let original = fixture("10-calico.conflist");
    let mut old: Value = serde_json::from_slice(&original).unwrap();
    let plugins = old["plugins"].as_array_mut().unwrap();
    plugins.insert(
        1,
        json!({"type": "podgate-router", "profiles": {}, "generation": "old"}),
    );
    plugins.push(json!({"type": "podgate-tunnel-guard", "generation": "old"}));
    let written = serde_json::to_string_pretty(&old).unwrap();
    d.put("10-calico.conflist", written.as_bytes());
    // The record an in-place install left.
    let state = d.root().join("state");
    fs::create_dir_all(&state).unwrap();
    fs::write(
        state.join("10-calico.conflist.podgate-backup"),
        serde_json::to_vec(&json!({
            "file": "10-calico.conflist",
            "written": written,
            "original": String::from_utf8(original.clone()).unwrap(),
        }))
        .unwrap(),
    )
    .unwrap();
    d.install_ok();
    assert_eq!(
        d.read("10-calico.conflist"),
        original,
        "the primary's own bytes are back"
    );
    assert_rendered_from(&d, &original, "migrated");
    assert!(!d.json(OWN).to_string().contains("\"old\""));
    assert!(d.check());

    // New entries from an updated plugins file replace the current ones.
    d.set_plugins(&json!([router_entry(&d.root().join("router2"))]));
    assert!(!d.check(), "--check must notice the plugins file changed");
    d.install_ok();
    assert_eq!(
        types(&d.json(OWN)),
        ["calico", "portmap", "bandwidth", "podgate-router"]
    );
    assert!(d.json(OWN).to_string().contains("router2"));
    d.uninstall_ok();
    assert_eq!(d.files(), vec!["10-calico.conflist"]);

    // Unrecorded podgate entries in a primary (state dir lost): podgate's
    // file never carries them twice, and uninstall takes them out.
    d.put("10-calico.conflist", written.as_bytes());
    d.install_ok();
    assert_eq!(
        types(&d.json(OWN)),
        ["calico", "portmap", "bandwidth", "podgate-router"]
    );
    d.uninstall_ok();
    assert_eq!(
        d.json("10-calico.conflist"),
        serde_json::from_slice::<Value>(&original).unwrap()
    );
}

/// An earlier podgate converted a single-plugin `.conf` into a conflist and
/// renamed the `.conf` away: install gives the `.conf` back and renders from
/// it.
#[test]
fn conversions_of_earlier_installs_are_given_back() {
    let d = Dirs::new("migrateconf");
    let conf = fixture("10-mynet.conf");
    let mut converted: Value = serde_json::from_slice(&conf).unwrap();
    let plugin = {
        let mut p = converted.clone();
        p.as_object_mut().unwrap().remove("cniVersion");
        p.as_object_mut().unwrap().remove("name");
        p
    };
    converted = json!({
        "cniVersion": converted["cniVersion"],
        "name": converted["name"],
        "plugins": [plugin, {"type": "podgate-router", "generation": "old"}],
    });
    let written = serde_json::to_string_pretty(&converted).unwrap();
    d.put("10-mynet.conflist", written.as_bytes());
    d.put("10-mynet.conf.podgate-orig", &conf);
    let state = d.root().join("state");
    fs::create_dir_all(&state).unwrap();
    fs::write(
        state.join("10-mynet.conflist.podgate-backup"),
        serde_json::to_vec(&json!({
            "file": "10-mynet.conflist",
            "written": written,
            "original": String::from_utf8(conf.clone()).unwrap(),
            "convertedFrom": "10-mynet.conf",
        }))
        .unwrap(),
    )
    .unwrap();
    d.install_ok();
    assert_eq!(d.files(), vec![OWN, "10-mynet.conf"]);
    assert_eq!(d.read("10-mynet.conf"), conf);
    assert_rendered_from(&d, &conf, "migrated .conf");
    assert!(d.check());
    d.uninstall_ok();
    assert_eq!(d.files(), vec!["10-mynet.conf"]);
    assert_eq!(d.read("10-mynet.conf"), conf);
}

/// A record of `file` as an earlier in-place install left it in `dir`.
fn put_record(dir: &Path, key: &str, record: &Value) {
    fs::create_dir_all(dir).unwrap();
    fs::write(
        dir.join(format!("{key}.podgate-backup")),
        serde_json::to_vec(record).unwrap(),
    )
    .unwrap();
}

/// The files of `dir` with their bytes, by name.
fn dir_contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// 10-calico.conflist with podgate entries chained in place: (its
/// original bytes, what the in-place install wrote).
fn chained_in_place() -> (Vec<u8>, String) {
    let original = fixture("10-calico.conflist");
    let mut old: Value = serde_json::from_slice(&original).unwrap();
    old["plugins"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "podgate-router", "generation": "old"}));
    (original, serde_json::to_string_pretty(&old).unwrap())
}

/// Records whose names leave the conf dir (a `../` conversion source
/// reaching the bin dir, an absolute file) are refused: the install fails
/// naming the record and the rule, and writes nothing they name.
#[test]
fn records_naming_files_outside_the_conf_dir_are_refused() {
    let d = Dirs::new("recordnames");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    let state = d.root().join("state");
    put_record(
        &state,
        "10-x.conflist",
        &json!({"file": "10-x.conflist", "written": "", "original": "#!/bin/sh\n",
                "convertedFrom": "../bin/pg-forged.conf"}),
    );
    let out = d.install(&[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("10-x.conflist.podgate-backup")
            && text(&out).contains("convertedFrom")
            && text(&out).contains("refusing it"),
        "{}",
        text(&out)
    );
    assert!(!d.bin().join("pg-forged.conf").exists());
    fs::remove_file(state.join("10-x.conflist.podgate-backup")).unwrap();
    put_record(
        &state,
        "10-y.conflist",
        &json!({"file": "/etc/cni/net.d/10-y.conflist", "written": "", "original": "{}"}),
    );
    let out = d.install(&[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("is not the one its name says"),
        "{}",
        text(&out)
    );
}

/// `--migrate-state-from` takes an earlier release's record of an in-place
/// chain (its original is the file without podgate's entries) and nothing
/// else that dir holds: not a conversion record with forged bytes, not a
/// record whose original is another chain, not podgate's own file's record,
/// not the runtime's history. The old dir is left as it was.
#[test]
fn earlier_records_are_taken_only_as_far_as_the_conf_dir_confirms_them() {
    let d = Dirs::new("migratefrom");
    let (original, written) = chained_in_place();
    d.put("10-calico.conflist", written.as_bytes());
    let mut other: Value = serde_json::from_slice(&fixture("10-flannel.conflist")).unwrap();
    other["plugins"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "podgate-router"}));
    let other_written = serde_json::to_string_pretty(&other).unwrap();
    d.put("20-flannel.conflist", other_written.as_bytes());
    let evil = r#"{"cniVersion": "1.0.0", "name": "evil", "type": "bridge"}"#;
    let old = d.root().join("router/installer");
    put_record(
        &old,
        "10-calico.conflist",
        &json!({"file": "10-calico.conflist", "written": written,
                "original": String::from_utf8(original.clone()).unwrap()}),
    );
    put_record(
        &old,
        "00-evil.conflist",
        &json!({"file": "00-evil.conflist", "written": "", "original": evil,
                "convertedFrom": "00-evil.conf"}),
    );
    put_record(
        &old,
        "20-flannel.conflist",
        &json!({"file": "20-flannel.conflist", "written": other_written,
                "original": r#"{"cniVersion": "1.0.0", "name": "evil", "plugins": [{"type": "bridge"}]}"#}),
    );
    put_record(
        &old,
        OWN,
        &json!({"file": OWN, "written": "", "renderedFrom": "10-calico.conflist"}),
    );
    fs::write(old.join("runtime-chain.json"), br#"{"version": 1}"#).unwrap();
    let before = dir_contents(&old);

    let out = d.install(&["--migrate-state-from", old.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let log = text(&out);
    assert!(
        log.contains("took the record of 10-calico.conflist"),
        "{log}"
    );
    for refused in ["00-evil.conflist", "20-flannel.conflist", OWN] {
        assert!(
            log.contains(&format!("not taking the record of {refused}")),
            "{log}"
        );
    }
    assert!(
        log.contains("not taking") && log.contains("runtime-chain.json"),
        "{log}"
    );
    assert_eq!(d.read("10-calico.conflist"), original, "{log}");
    assert_eq!(
        d.read("20-flannel.conflist"),
        other_written.as_bytes(),
        "{log}"
    );
    assert_eq!(
        d.files(),
        [OWN, "10-calico.conflist", "20-flannel.conflist"],
        "{log}"
    );
    assert!(!d.root().join("state/runtime-chain.json").exists());
    let after = dir_contents(&old);
    assert!(before == after, "the old dir changed");
}

#[test]
fn binaries_are_replaced_only_when_their_content_changes() {
    let d = Dirs::new("bins");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    d.install_ok();
    let router = d.bin().join("podgate-router");
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    let first = ino(&router);
    d.install_ok();
    assert_eq!(ino(&router), first, "unchanged binary rewritten");
    d.set_binaries("v2");
    assert!(!d.check(), "--check must notice an outdated binary");
    d.install_ok();
    assert_ne!(ino(&router), first);
    assert!(String::from_utf8_lossy(&fs::read(&router).unwrap()).contains("v2"));
    assert!(d.check());
    // No temp files left behind in either dir.
    let bins: Vec<_> = fs::read_dir(d.bin())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(bins.len(), 2, "{bins:?}");
    assert!(
        !d.files().iter().any(|f| f.contains("tmp")),
        "{:?}",
        d.files()
    );
}

/// `podgate install --watch` as a child; SIGKILLed on drop if still running.
struct Watcher {
    child: Child,
    log: PathBuf,
}

impl Watcher {
    fn start(d: &Dirs, extra: &[&str]) -> Watcher {
        let log = d.root().join("watch.log");
        let mut cmd = d.install_cmd(&["--watch", "--debounce-ms", "50"]);
        cmd.arg("--ready-file")
            .arg(d.ready())
            .args(extra)
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        Watcher {
            child: cmd.spawn().unwrap(),
            log,
        }
    }
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: signalling our own child by pid.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }
    /// SIGTERM and wait; returns the exit status.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        self.signal(libc::SIGTERM);
        let status = self.wait(Duration::from_secs(10));
        (status, self.log())
    }
    fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                start.elapsed() < timeout,
                "watcher did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// podgate's file holds a chain of `first_type` ... then podgate's two entries.
fn chained(d: &Dirs, first_type: &str) -> bool {
    fs::read(d.conf().join(OWN))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|v| {
            let t = types(&v);
            t.first().map(String::as_str) == Some(first_type)
                && t.last().map(String::as_str) == Some("podgate-router")
                && t.iter().filter(|x| x.starts_with("podgate-")).count() == 2
        })
}

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn watch_rerenders_when_the_primary_rewrites_its_file() {
    let d = Dirs::new("watch");
    d.put("10-calico.conflist", &fixture("10-calico.conflist"));
    let w = Watcher::start(&d, &[]);
    wait_for("first chain", WAIT, || {
        chained(&d, "calico") && d.ready().exists()
    });
    assert!(d.check());

    // Calico's install-cni rewrites its file (temp + rename) with a new MTU.
    let v2 = String::from_utf8(fixture("10-calico.conflist"))
        .unwrap()
        .replace("\"mtu\": 0", "\"mtu\": 1440");
    replace_atomically(&d.conf().join("10-calico.conflist"), v2.as_bytes());
    wait_for("re-render after rename", WAIT, || {
        d.json(OWN)["plugins"][0]["mtu"] == 1440
    });
    assert_eq!(
        d.read("10-calico.conflist"),
        v2.as_bytes(),
        "primary untouched"
    );

    // A writer that truncates and writes in place, in two steps: the
    // half-written file is waited out (podgate's last good chain stays, the
    // installer reports unready), the complete one rendered.
    let v3 = v2.replace("\"mtu\": 1440", "\"mtu\": 1400");
    let (head, tail) = v3.split_at(v3.len() / 2);
    let mut f = fs::File::create(d.conf().join("10-calico.conflist")).unwrap();
    f.write_all(head.as_bytes()).unwrap();
    wait_for("unready while the file is half-written", WAIT, || {
        !d.ready().exists()
    });
    assert!(chained(&d, "calico"), "the last good chain stays in place");
    f.write_all(tail.as_bytes()).unwrap();
    drop(f);
    wait_for("re-render after in-place write", WAIT, || {
        d.ready().exists() && d.json(OWN)["plugins"][0]["mtu"] == 1400
    });
    assert_eq!(d.read("10-calico.conflist"), v3.as_bytes());

    // Someone deletes podgate's file: it comes back.
    fs::remove_file(d.conf().join(OWN)).unwrap();
    wait_for("podgate's file back", WAIT, || chained(&d, "calico"));

    // A deleted plugin binary comes back.
    fs::remove_file(d.bin().join("podgate-router")).unwrap();
    wait_for("binary restored", WAIT, || {
        d.bin().join("podgate-router").exists()
    });

    let (status, log) = w.stop();
    assert!(status.success(), "watcher exit {status}:\n{log}");
    assert!(!d.ready().exists(), "ready file left after exit");
    // Default: the chain stays in place when the installer stops.
    assert!(chained(&d, "calico"));
    d.uninstall_ok();
    assert_eq!(d.files(), vec!["10-calico.conflist"]);
    assert_eq!(d.read("10-calico.conflist"), v3.as_bytes());
}

#[test]
fn watch_follows_a_rewritten_conf_and_a_new_first_file() {
    let d = Dirs::new("watchconf");
    d.put("10-mynet.conf", &fixture("10-mynet.conf"));
    let w = Watcher::start(&d, &[]);
    wait_for("chain", WAIT, || chained(&d, "bridge"));
    assert_eq!(d.loaded(), vec![OWN, "10-mynet.conf"]);

    // The primary's installer writes its .conf anew.
    let v2 = String::from_utf8(fixture("10-mynet.conf"))
        .unwrap()
        .replace("10.22.0.0/16", "10.23.0.0/16");
    replace_atomically(&d.conf().join("10-mynet.conf"), v2.as_bytes());
    wait_for("re-render", WAIT, || {
        d.json(OWN).to_string().contains("10.23.0.0/16")
    });
    assert_eq!(d.read("10-mynet.conf"), v2.as_bytes());

    // A new primary sorts first (Cilium installed): podgate's file follows.
    d.put("05-cilium.conflist", &fixture("05-cilium.conflist"));
    wait_for("chain moved", WAIT, || chained(&d, "cilium-cni"));
    assert_eq!(d.loaded(), vec![OWN, "05-cilium.conflist", "10-mynet.conf"]);

    let (status, log) = w.stop();
    assert!(status.success(), "{log}");
    d.uninstall_ok();
    assert_eq!(d.read("05-cilium.conflist"), fixture("05-cilium.conflist"));
    assert_eq!(d.loaded(), vec!["05-cilium.conflist", "10-mynet.conf"]);
}

#[test]
fn watch_withdraws_its_copy_when_the_primary_disappears() {
    let d = Dirs::new("withdraw");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    let w = Watcher::start(&d, &[]);
    wait_for("chain", WAIT, || {
        chained(&d, "flannel") && d.ready().exists()
    });
    // The primary CNI is uninstalled: a copy of its chain must not outlive it.
    fs::remove_file(d.conf().join("10-flannel.conflist")).unwrap();
    wait_for("podgate's copy removed", WAIT, || {
        d.files().is_empty() && !d.ready().exists()
    });
    // It comes back.
    replace_atomically(
        &d.conf().join("10-flannel.conflist"),
        &fixture("10-flannel.conflist"),
    );
    wait_for("chain again", WAIT, || {
        chained(&d, "flannel") && d.ready().exists()
    });
    let (status, log) = w.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("removed 00-podgate.conflist"), "{log}");
}

#[test]
fn watch_waits_for_the_primary_and_reports_readiness() {
    let d = Dirs::new("waitprimary");
    let w = Watcher::start(&d, &[]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!d.ready().exists(), "ready without a primary");
    assert!(!d.check());
    // The primary's DaemonSet comes up later.
    replace_atomically(
        &d.conf().join("01-kube-ovn.conflist"),
        &fixture("01-kube-ovn.conflist"),
    );
    wait_for("chain", WAIT, || {
        chained(&d, "kube-ovn") && d.ready().exists()
    });
    assert!(d.check());
    assert_eq!(
        fs::read_to_string(d.ready()).unwrap(),
        format!("chained {OWN}\n")
    );

    // A ConfigMap update (kubelet swaps the ..data symlink) re-renders.
    d.set_plugins(&json!([router_entry(&d.root().join("router-v2"))]));
    wait_for("new entries", WAIT, || {
        d.json(OWN).to_string().contains("router-v2")
    });
    // An invalid update keeps the chain but is unready until fixed.
    d.set_plugins(&json!([{"type": "podgate-router", "assign": [{"profile": "missing"}]}]));
    wait_for("unready on a bad plugins file", WAIT, || {
        !d.ready().exists()
    });
    assert!(d.json(OWN).to_string().contains("router-v2"));
    d.set_plugins(&json!([
        guard_entry(),
        router_entry(&d.root().join("router"))
    ]));
    wait_for("ready again", WAIT, || {
        chained(&d, "kube-ovn") && d.ready().exists()
    });

    let (status, log) = w.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("not chained, waiting"), "{log}");
    assert_eq!(
        d.read("01-kube-ovn.conflist"),
        fixture("01-kube-ovn.conflist")
    );
}

/// The podgate-plugins ConfigMap is edited by someone who may not be root
/// on the node, and what the installer renders from it runs as root: a
/// misspelt key (which the plugins would read as its default) and a host
/// path outside podgate's directories are refused by the installer, which
/// keeps the last good chain, stays unready and says which key, until the
/// ConfigMap is fixed. A one-shot install refuses the same way.
#[test]
fn a_misspelt_key_or_a_node_root_path_in_the_configmap_is_not_installed() {
    let d = Dirs::new("configmap-refusals");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    let w = Watcher::start(&d, &[]);
    wait_for("first chain", WAIT, || {
        chained(&d, "flannel") && d.ready().exists()
    });
    let good = d.read(OWN);
    let mut router = router_entry(&d.root().join("router"));
    let cases = [
        (
            json!([{"type": "podgate-tunnel-guard", "requried": "always"}, router.clone()]),
            "plugins[0] (podgate-tunnel-guard): podgate-tunnel-guard config: unknown key \"requried\"",
        ),
        (
            json!([guard_entry(), {"type": "podgate-router", "stateDir": d.root().join("router"),
                   "profiles": {"vpn-gateway": {}},
                   "assgin": [{"namespace": "vpn", "profile": "vpn-gateway"}]}]),
            "plugins[1] (podgate-router): unknown key \"assgin\"",
        ),
        (
            json!([guard_entry(), {"type": "podgate-router", "stateDir": "/etc"}]),
            "plugins[1] (podgate-router): stateDir /etc is outside /var/lib/cni/podgate, /var/lib/podgate",
        ),
        (
            {
                router["logFile"] = json!("/etc/cron.d/podgate");
                json!([guard_entry(), router.clone()])
            },
            "plugins[1] (podgate-router): logFile /etc/cron.d/podgate is outside /var/log/podgate",
        ),
        (
            json!([{"type": "podgate-tunnel-guard", "required": "always",
                    "ovsdbSocket": "/run/containerd/containerd.sock"},
                   router_entry(&d.root().join("router"))]),
            "plugins[0] (podgate-tunnel-guard): ovsdbSocket /run/containerd/containerd.sock is outside /run/openvswitch",
        ),
    ];
    for (entries, want) in cases {
        d.set_plugins(&entries);
        wait_for(want, WAIT, || w.log().contains(want) && !d.ready().exists());
        assert_eq!(d.read(OWN), good, "{want}: the last good chain stays");
        let once = d.install(&[]);
        assert!(!once.status.success(), "{want}: {}", text(&once));
        assert!(text(&once).contains(want), "{}", text(&once));
        assert_eq!(
            d.read(OWN),
            good,
            "{want}: a one-shot install wrote nothing"
        );
    }
    assert!(!Path::new("/etc/cron.d/podgate").exists());

    d.set_plugins(&json!([
        guard_entry(),
        router_entry(&d.root().join("router"))
    ]));
    wait_for("ready again once the ConfigMap is fixed", WAIT, || {
        chained(&d, "flannel") && d.ready().exists()
    });
    let (status, log) = w.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn watch_uninstall_on_exit_removes_its_file() {
    let d = Dirs::new("onexit");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    let w = Watcher::start(&d, &["--uninstall-on-exit"]);
    wait_for("chain", WAIT, || {
        chained(&d, "flannel") && d.ready().exists()
    });
    let (status, log) = w.stop();
    assert!(status.success(), "{log}");
    assert_eq!(d.files(), vec!["10-flannel.conflist"]);
    assert_eq!(
        d.read("10-flannel.conflist"),
        fixture("10-flannel.conflist")
    );
    assert!(!d.ready().exists());
}

#[test]
fn watch_exits_nonzero_when_the_conf_dir_goes_away() {
    let d = Dirs::new("gone");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    let mut w = Watcher::start(&d, &[]);
    wait_for("chain", WAIT, || d.ready().exists());
    fs::rename(d.conf(), d.root().join("net.d.moved")).unwrap();
    let status = w.wait(WAIT);
    assert!(
        !status.success(),
        "watcher must fail so the DaemonSet restarts it"
    );
    assert!(w.log().contains("went away"), "{}", w.log());
    assert!(!d.ready().exists());
}

fn pod_args(ns: &str, name: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=x"
    )
}

/// The installer's chain, run by the real libcni: the bridge primary wires
/// the pod, podgate-router (from podgate's own conflist) makes the assigned
/// pod a router; DEL undoes it; the primary's file is never touched.
fn wire_pod_through_installed_chain(single_conf: bool) {
    require_root();
    let node = TestNode::new(if single_conf {
        "inst-conf"
    } else {
        "inst-list"
    });
    let net = if single_conf { "instconf" } else { "instlist" };
    let list = node.bridge_conflist(net, "1.0.0", "10.23.0.0/16", vec![]);
    let file = if single_conf {
        let mut conf = list["plugins"][0].clone();
        conf["cniVersion"] = json!("1.0.0");
        conf["name"] = json!(net);
        let path = node.conf_dir().join(format!("10-{net}.conf"));
        fs::write(&path, serde_json::to_vec_pretty(&conf).unwrap()).unwrap();
        path
    } else {
        node.write_conflist(&format!("10-{net}"), &list)
    };
    let original = fs::read(&file).unwrap();
    let plugins = node.root().join("plugins.json");
    fs::write(
        &plugins,
        serde_json::to_vec(&json!([guard_entry(), router_entry(&node.state_dir())])).unwrap(),
    )
    .unwrap();
    let run = |verb: &str, extra: &[&OsStr]| {
        let mut cmd = podgate_command();
        cmd.arg(verb)
            .arg("--cni-conf-dir")
            .arg(node.conf_dir())
            .arg("--cni-bin-dir")
            .arg(node.cni_bin_dir())
            .arg("--state-dir")
            .arg(node.root().join("installer"))
            .args(extra);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "podgate {verb}:\n{}", text(&out));
    };
    run(
        "install",
        &[
            OsStr::new("--source-dir"),
            bin_dir().as_os_str(),
            OsStr::new("--plugins"),
            plugins.as_os_str(),
            OsStr::new("--plugin-path-root"),
            node.root().as_os_str(),
        ],
    );
    assert_eq!(fs::read(&file).unwrap(), original, "primary untouched");

    let gw = node.pod("openvpn-gw-0");
    gw.set_forwarding(false);
    let plain = node.pod("plain");
    plain.set_forwarding(false);
    let add = |pod: &podgate_integration::Netns, name: &str| {
        node.cni(
            Verb::Add,
            net,
            pod,
            "eth0",
            Some(&pod_args("vpn", name)),
            None,
        )
    };
    add(&gw, "openvpn-gw-0").assert_ok();
    add(&plain, "plain").assert_ok();
    assert_eq!(
        gw.sysctl_get("net.ipv4.ip_forward"),
        "1",
        "assigned pod is a router"
    );
    assert_eq!(
        plain.sysctl_get("net.ipv4.ip_forward"),
        "0",
        "other pods untouched"
    );
    assert!(
        !node.state_files().is_empty(),
        "podgate-router recorded its work"
    );

    for (pod, name) in [(&gw, "openvpn-gw-0"), (&plain, "plain")] {
        node.cni(
            Verb::Del,
            net,
            pod,
            "eth0",
            Some(&pod_args("vpn", name)),
            None,
        )
        .assert_ok();
    }
    assert_eq!(
        node.state_files(),
        Vec::<String>::new(),
        "DEL left router state"
    );
    run("uninstall", &[]);
    assert!(!node.conf_dir().join(OWN).exists());
    assert_eq!(fs::read(&file).unwrap(), original, "primary untouched");
}

#[test]
fn libcni_wires_a_pod_through_the_installed_chain() {
    wire_pod_through_installed_chain(false);
}

#[test]
fn libcni_wires_a_pod_through_a_single_plugin_conf() {
    wire_pod_through_installed_chain(true);
}

#[test]
fn watch_warns_when_a_writer_keeps_removing_podgates_file() {
    let d = Dirs::new("fight");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    let w = Watcher::start(&d, &[]);
    // A component that removes every CNI config it does not own.
    for round in 0..6 {
        wait_for(&format!("chain, round {round}"), WAIT, || {
            chained(&d, "flannel")
        });
        fs::remove_file(d.conf().join(OWN)).unwrap();
    }
    wait_for("last chain", WAIT, || chained(&d, "flannel"));
    let (status, log) = w.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("keeps removing"), "{log}");
    assert_eq!(
        log.matches("keeps removing").count(),
        1,
        "warned once a minute"
    );
}

/// conf/10-bridge-vpn.conflist as shipped (only its host paths moved into
/// the test node), run by libcni: the assigned pod and a pod that asks by
/// annotation become routers, any other pod is left alone.
#[test]
fn example_bridge_conflist_works_through_libcni() {
    require_root();
    let node = TestNode::new("example");
    let path = workspace_root().join("conf/10-bridge-vpn.conflist");
    let mut list: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let net = list["name"].as_str().unwrap().to_string();
    list["plugins"][0]["ipam"]["dataDir"] = json!(node.ipam_dir());
    let router = list["plugins"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["type"] == "podgate-router")
        .unwrap();
    router["stateDir"] = json!(node.state_dir());
    router["logFile"] = json!(node.root().join("router.log"));
    node.write_conflist("10-bridge-vpn", &list);

    let cases = [
        ("openvpn-gw-0", json!({}), "1"),
        ("wg-0", json!({"podgate.dev/profile": "vpn-gateway"}), "1"),
        ("web-0", json!({}), "0"),
    ];
    for (name, ann, forwarding) in &cases {
        let pod = node.pod(name);
        pod.set_forwarding(false);
        let caps = json!({"io.kubernetes.cri.pod-annotations": ann});
        node.cni(
            Verb::Add,
            &net,
            &pod,
            "eth0",
            Some(&pod_args("vpn", name)),
            Some(caps.clone()),
        )
        .assert_ok();
        assert_eq!(pod.sysctl_get("net.ipv4.ip_forward"), *forwarding, "{name}");
        node.cni(
            Verb::Del,
            &net,
            &pod,
            "eth0",
            Some(&pod_args("vpn", name)),
            Some(caps),
        )
        .assert_ok();
    }
    assert_eq!(node.state_files(), Vec::<String>::new());
}

/// The kubelet's ConfigMap volume: `..<ts>/plugins.json`, `..data` -> it,
/// `plugins.json` -> `..data/plugins.json` (created in that order).
fn kubelet_configmap_update(dir: &Path, entries: &Value) {
    let ts = dir.join("..2026_12_01_00_00_00.1");
    fs::create_dir_all(&ts).unwrap();
    fs::write(ts.join("plugins.json"), entries.to_string()).unwrap();
    std::os::unix::fs::symlink(ts.file_name().unwrap(), dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/plugins.json", dir.join("plugins.json")).unwrap();
}

#[test]
fn watch_stays_unready_saying_which_configmap_to_apply_until_the_plugins_file_appears() {
    let d = Dirs::new("optionalcm");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    // An optional ConfigMap volume that does not exist yet: no plugins file
    // in its dir.
    fs::remove_file(d.plugins()).unwrap();
    let plugins = d.plugins();
    let w = Watcher::start(&d, &[]);
    wait_for("the watcher's first pass", WAIT, || {
        w.log().contains("not chained, waiting")
    });
    assert!(!d.ready().exists());
    assert_eq!(d.files(), vec!["10-flannel.conflist"], "{}", w.log());
    let check = d.install(&["--check"]);
    assert!(!check.status.success(), "{}", text(&check));
    let want = format!(
        "plugins file {} missing: apply podgate-config.yaml",
        plugins.display()
    );
    assert!(
        String::from_utf8_lossy(&check.stderr).contains(&want),
        "{}",
        text(&check)
    );
    assert!(w.log().contains(&want), "{}", w.log());

    kubelet_configmap_update(
        d.root(),
        &json!([guard_entry(), router_entry(&d.root().join("router"))]),
    );
    wait_for("chain once the ConfigMap exists", WAIT, || {
        chained(&d, "flannel") && d.ready().exists()
    });
    let (status, log) = w.stop();
    assert!(status.success(), "{log}");
}

/// `podgate uninstall --wait --purge-state-dir <router_state>` as a child.
fn uninstall_waiting(d: &Dirs, extra: &[&str], router_state: &Path) -> Watcher {
    let log = d.root().join("uninstall.log");
    let mut cmd = podgate_command();
    cmd.arg("uninstall");
    d.common(&mut cmd);
    let child = cmd
        .args(extra)
        .args(["--wait", "--purge-state-dir"])
        .arg(router_state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Watcher { child, log }
}

#[test]
fn uninstall_wait_removes_podgate_then_stays_up_until_sigterm_and_check_says_what_is_left() {
    let d = Dirs::new("uninstallwait");
    d.put("10-flannel.conflist", &fixture("10-flannel.conflist"));
    d.install_ok();
    let check = d.uninstall(&["--check", "--remove-binaries"]);
    assert!(!check.status.success(), "{}", text(&check));
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(
        err.contains("not uninstalled") && err.contains(OWN),
        "{err}"
    );
    assert!(err.contains("podgate-router"), "{err}");

    // podgate-router's state dir: the lock, events, the installer's subdir.
    let router_state = d.root().join("router");
    fs::create_dir_all(router_state.join("installer")).unwrap();
    fs::write(router_state.join(".lock"), b"").unwrap();
    fs::write(router_state.join("events.jsonl"), b"{}\n").unwrap();
    fs::write(router_state.join("installer/x.json"), b"{}").unwrap();
    let mut w = uninstall_waiting(&d, &["--remove-binaries"], &router_state);
    wait_for("uninstalled", WAIT, || {
        d.uninstall(&["--check", "--remove-binaries"])
            .status
            .success()
    });
    assert_eq!(d.files(), vec!["10-flannel.conflist"]);
    assert!(!d.bin().join("podgate-router").exists());
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        w.child.try_wait().unwrap().is_none(),
        "exited:\n{}",
        w.log()
    );
    let (status, log) = w.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("waiting for SIGTERM"), "{log}");
    // No attachment record left: emptied on SIGTERM.
    assert!(router_state.is_dir());
    assert_eq!(fs::read_dir(&router_state).unwrap().count(), 0, "{log}");
}

/// The purge runs under podgate-router's node-wide lock. An ADD from the
/// old chain still running at SIGTERM (here the test, holding the lock as
/// that ADD would while it writes `node/strict.json` and its record) makes
/// the purge wait; it then finds the record and keeps everything. Without
/// the lock it emptied the dir under the ADD.
#[test]
fn uninstall_purge_waits_for_the_routers_lock_and_keeps_what_an_add_wrote_meanwhile() {
    let d = Dirs::new("uninstallrace");
    let router_state = d.root().join("router");
    fs::create_dir_all(&router_state).unwrap();
    let mut w = uninstall_waiting(&d, &[], &router_state);
    wait_for("waiting", WAIT, || w.log().contains("waiting for SIGTERM"));
    let lock = fs::File::create(router_state.join(".lock")).unwrap();
    lock.lock().unwrap();
    fs::create_dir_all(router_state.join("node")).unwrap();
    let strict = router_state.join("node/strict.json");
    fs::write(&strict, b"{}").unwrap();
    w.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        strict.exists(),
        "emptied while the router's lock was held:\n{}",
        w.log()
    );
    let record = router_state.join("podnet+abc+eth0.json");
    fs::write(&record, b"{}").unwrap();
    drop(lock);
    let status = w.wait(Duration::from_secs(10));
    let log = w.log();
    assert!(status.success(), "{log}");
    assert!(record.exists() && strict.exists(), "{log}");
    assert!(log.contains("1 attachment record(s) left"), "{log}");
}

/// The purge removes what podgate made in the router's state dir and
/// nothing else: another network's `stateDir` placed under it (with its
/// records) and an operator's file stay, and the log names them.
#[test]
fn uninstall_purge_removes_only_what_podgate_made() {
    let d = Dirs::new("uninstallforeign");
    let router_state = d.root().join("router");
    for dir in [
        "node",
        "claims.v1",
        "quarantine",
        "events.jsonl.inflight",
        "agent",
        "net2",
    ] {
        fs::create_dir_all(router_state.join(dir)).unwrap();
    }
    for (file, text) in [
        (".lock", ""),
        ("claims.v2", "podgate claims v2\n"),
        ("node/strict.json", "{}"),
        ("quarantine/podnet+old+eth0.json", ""),
        ("events.jsonl", "{}\n"),
        ("agent/metrics.json", "{}"),
        (".tmp-1-podnet+a+eth0.json", "{"),
        // Another router network's stateDir: its record is not this one's.
        ("net2/net2+c9+eth0.json", "{\"version\": 1}"),
        ("OPERATOR-NOTES", "mine"),
    ] {
        fs::write(router_state.join(file), text).unwrap();
    }
    let w = uninstall_waiting(&d, &[], &router_state);
    wait_for("waiting", WAIT, || w.log().contains("waiting for SIGTERM"));
    let (status, log) = w.stop();
    assert!(status.success(), "{log}");
    let mut left: Vec<String> = fs::read_dir(&router_state)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["OPERATOR-NOTES", "net2"], "{log}");
    assert_eq!(
        fs::read_to_string(router_state.join("net2/net2+c9+eth0.json")).unwrap(),
        "{\"version\": 1}"
    );
    assert!(
        log.contains("OPERATOR-NOTES, net2 (not podgate's)"),
        "{log}"
    );
}

#[test]
fn uninstall_keeps_the_state_dir_while_an_attachment_record_is_left() {
    let d = Dirs::new("uninstallkeep");
    let router_state = d.root().join("router");
    fs::create_dir_all(&router_state).unwrap();
    let record = router_state.join("podnet+abc+eth0.json");
    fs::write(&record, b"{}").unwrap();
    let w = uninstall_waiting(&d, &[], &router_state);
    wait_for("waiting", WAIT, || w.log().contains("waiting for SIGTERM"));
    let (status, log) = w.stop();
    assert!(status.success(), "{log}");
    assert!(record.exists(), "{log}");
    assert!(log.contains("1 attachment record(s) left"), "{log}");
}
