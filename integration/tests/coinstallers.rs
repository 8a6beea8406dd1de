//! Readiness from what the runtime loaded, beside other products'
//! installers: a real containerd (CRI `Status{verbose}`), podgate's installer,
//! and small stand-ins (integration/fixtures/coinstallers/, each naming the
//! upstream code it follows) doing to the conf dir what Multus thick, Cilium,
//! Istio and Calico do. Each test asserts the outcome the co-installer table
//! in conf/kubernetes/README.md states: the runtime loads a chain with
//! podgate in it and `install --check` passes, or the check fails naming the
//! file the runtime loaded and why.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::containerd::Containerd;
use podgate_integration::cri::{sysctl_in, Cri, Pod};
use podgate_integration::{
    cnirunner, output_text, podgate_command, require_root, workspace_root, TestNode,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const NET: &str = "podnet";
const OWN: &str = "00-podgate.conflist";
/// How long containerd gets to reload its CNI config after a change.
const RELOAD: Duration = Duration::from_secs(15);

fn fixture(name: &str) -> PathBuf {
    workspace_root()
        .join("integration/fixtures/coinstallers")
        .join(name)
}

fn router_entry(node: &TestNode) -> Value {
    json!({
        "type": "podgate-router",
        "stateDir": node.state_dir(),
        "capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "profiles": {"vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}}},
        // By name: Multus does not pass the pod-annotations capability on.
        "assign": [{"namespace": "vpn", "podNamePrefix": "openvpn-", "profile": "vpn-gateway"}]
    })
}

/// The primary's conflist (no podgate in it) on `subnet`.
fn primary(node: &TestNode, subnet: &str) -> Value {
    node.bridge_conflist(
        NET,
        "1.0.0",
        subnet,
        vec![json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true})],
    )
}

/// A node whose conf dir holds `10-podnet.conflist` (unless `with_primary`
/// is false), podgate's plugins file, and containerd running.
fn start(prefix: &str, with_primary: bool) -> Containerd {
    require_root();
    podgate_integration::built_shipped();
    let node = TestNode::new(prefix);
    node.refresh_cni_bin();
    if with_primary {
        node.write_conflist("10-podnet", &primary(&node, "10.23.0.0/16"));
    }
    std::fs::write(
        node.root().join("plugins.json"),
        json!([
            {"type": "podgate-tunnel-guard", "required": "never", "eventFile": node.event_file()},
            router_entry(&node)
        ])
        .to_string(),
    )
    .unwrap();
    Containerd::start(node)
}

/// The operator changes podgate's entries (a profile added).
fn change_entries(node: &TestNode) {
    let plugins = node.root().join("plugins.json");
    let mut entries: Value = serde_json::from_slice(&std::fs::read(&plugins).unwrap()).unwrap();
    entries[1]["profiles"]["pool-router"] = json!({"sysctls": {"net.ipv4.ip_forward": "1"}});
    std::fs::write(&plugins, entries.to_string()).unwrap();
}

/// `podgate install ARGS` against this node, asking this containerd.
fn install(c: &Containerd, args: &[&str]) -> Output {
    let node = c.node();
    let mut cmd = podgate_command();
    podgate_integration::agent::install(&mut cmd, node, &node.root().join("plugins.json"))
        .arg("--runtime-endpoint")
        .arg(c.endpoint())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn install_ok(c: &Containerd, args: &[&str]) {
    let out = install(c, args);
    assert!(out.status.success(), "install:\n{}", output_text(&out));
}

/// `install --check ARGS` until it exits `want_ok` (the runtime reloads a
/// moment after the conf dir changes) or [`RELOAD`] passes; the last run.
fn check_until(c: &Containerd, args: &[&str], want_ok: bool) -> Output {
    let deadline = Instant::now() + RELOAD;
    loop {
        let mut a = vec!["--check"];
        a.extend_from_slice(args);
        let out = install(c, &a);
        if out.status.success() == want_ok || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The check passes and says which file.
fn assert_ready(c: &Containerd, args: &[&str], file: &str) {
    let out = check_until(c, args, true);
    assert!(
        out.status.success(),
        "not ready:\n{}\n{}",
        output_text(&out),
        c.log()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("chained: {file}\n")
    );
}

/// The check fails with exactly one line holding every part of `why`.
fn assert_not_ready(c: &Containerd, args: &[&str], why: &[&str]) -> String {
    let out = check_until(c, args, false);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    for part in why {
        assert!(err.contains(part), "{part:?} not in: {err}");
    }
    err
}

fn python(script: &str, args: &[&OsArg]) -> Output {
    let out = Command::new("python3")
        .arg(fixture(script))
        .args(args.iter().map(|a| a.as_os()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}:\n{}", output_text(&out));
    out
}

/// A path or a plain string argument.
enum OsArg {
    Path(PathBuf),
    Str(&'static str),
}

impl OsArg {
    fn as_os(&self) -> &std::ffi::OsStr {
        match self {
            OsArg::Path(p) => p.as_os_str(),
            OsArg::Str(s) => std::ffi::OsStr::new(s),
        }
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

fn plugin_types(path: &Path) -> Vec<String> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect()
}

// ------------------------------------------------------------------- tests

/// Another network's file sorting before podgate's: the runtime loads it, and
/// the check names it; without it the runtime loads podgate's chain and the
/// check passes; the one-shot install's ready file follows the same answer.
#[test]
fn another_file_sorting_first_fails_the_check_naming_it_and_podgates_loaded_chain_passes() {
    let c = start("co-first", true);
    let ready = c.node().root().join("installer.ready");
    let ready_arg = ready.to_str().unwrap().to_string();
    install_ok(&c, &["--ready-file", &ready_arg]);
    assert_eq!(
        std::fs::read_to_string(&ready).unwrap(),
        format!("chained {OWN}\n")
    );
    assert_ready(&c, &[], OWN);

    c.node()
        .write_conflist("00-aaa", &primary(c.node(), "10.30.0.0/16"));
    assert_not_ready(
        &c,
        &[],
        &["loaded 00-aaa.conflist: no podgate plugin in its chain [bridge, portmap]"],
    );
    install(&c, &["--ready-file", &ready_arg]);
    assert!(
        !ready.exists(),
        "no ready file while the runtime loads 00-aaa"
    );

    std::fs::remove_file(c.node().conf_dir().join("00-aaa.conflist")).unwrap();
    assert_ready(&c, &[], OWN);
}

/// Cilium with `cni.exclusive: true` renames podgate's file away on its next
/// pass: the runtime loads 05-cilium.conflist and the check says so and why.
/// With `cni.exclusive: false` Cilium's file is podgate's primary and the
/// runtime loads podgate's chain.
#[test]
fn cilium_exclusive_renames_podgates_file_and_the_check_says_so_and_not_exclusive_is_ready() {
    let c = start("co-cilium", true);
    let conf = c.node().conf_dir();
    let cilium_conf = c.node().root().join("cilium-cni.conflist");
    std::fs::write(
        &cilium_conf,
        serde_json::to_vec_pretty(&primary(c.node(), "10.23.0.0/16")).unwrap(),
    )
    .unwrap();
    let cilium = |exclusive: &'static str| {
        python(
            "cilium_cni_config.py",
            &[
                &OsArg::Path(conf.clone()),
                &OsArg::Str(exclusive),
                &OsArg::Path(cilium_conf.clone()),
            ],
        )
    };
    // The agent becomes ready: its file, the old primary renamed away.
    cilium("true");
    assert_eq!(
        files(&conf),
        ["05-cilium.conflist", "10-podnet.conflist.cilium_bak"]
    );
    install_ok(&c, &[]);
    assert_eq!(plugin_types(&conf.join(OWN))[..2], ["bridge", "portmap"]);
    assert_ready(&c, &[], OWN);
    // podgate's write is an event in the conf dir: Cilium's next pass.
    cilium("true");
    assert!(conf.join(format!("{OWN}.cilium_bak")).exists());
    assert_not_ready(
        &c,
        &[],
        &[
            "loaded 05-cilium.conflist: no podgate plugin in its chain [bridge, portmap]",
            "00-podgate.conflist was renamed to 00-podgate.conflist.cilium_bak (Cilium's cni.exclusive)",
        ],
    );

    // cni.exclusive: false.
    std::fs::remove_file(conf.join(format!("{OWN}.cilium_bak"))).unwrap();
    install_ok(&c, &[]);
    cilium("false");
    assert!(conf.join(OWN).exists(), "not renamed");
    assert_ready(&c, &[], OWN);
}

/// Istio's owned config (1.27+). With podgate's defaults each takes the
/// other's file for the primary: the runtime loads podgate's file holding
/// the primary, istio-cni and podgate (ready), while Istio keeps finding its
/// own file not first. With podgate's file named to sort after Istio's and
/// the primary named, Istio copies podgate's chain into its file, the
/// runtime loads Istio's file with podgate in it, and both are ready.
#[test]
fn istio_owned_config_loads_a_chain_with_podgate_in_both_layouts() {
    let c = start("co-istio", true);
    let conf = c.node().conf_dir();
    let state = c.node().root().join("istio-primary");
    let istio = || {
        let out = python(
            "istio_cni_install.py",
            &[&OsArg::Path(conf.clone()), &OsArg::Path(state.clone())],
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };

    // Defaults: passes of both installers (each write is the other's event)
    // until neither changes anything.
    install_ok(&c, &[]);
    for _ in 0..3 {
        istio();
        install_ok(&c, &[]);
    }
    assert_eq!(
        istio(),
        "istio owned CNI config does not exist or is not the highest priority. Got 00-podgate.conflist instead"
    );
    let own = plugin_types(&conf.join(OWN));
    assert_eq!(
        own,
        [
            "bridge",
            "portmap",
            "istio-cni",
            "podgate-tunnel-guard",
            "podgate-router"
        ]
    );
    assert_ready(&c, &[], OWN);

    // Istio's file first, podgate's second, the primary named.
    let out = podgate_command()
        .arg("uninstall")
        .arg("--cni-conf-dir")
        .arg(&conf)
        .arg("--cni-bin-dir")
        .arg(c.node().cni_bin_dir())
        .arg("--state-dir")
        .arg(c.node().root().join("installer"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    std::fs::remove_file(conf.join("02-istio-cni.conflist")).unwrap();
    std::fs::remove_file(&state).unwrap();
    let layout = [
        "--conflist-name",
        "03-podgate.conflist",
        "--primary",
        "10-podnet.conflist",
    ];
    install_ok(&c, &layout);
    assert_eq!(istio(), "istio owned CNI config does not exist or is not the highest priority. Got 03-podgate.conflist instead");
    assert_eq!(istio(), "valid");
    assert_eq!(
        plugin_types(&conf.join("02-istio-cni.conflist")),
        [
            "bridge",
            "portmap",
            "podgate-tunnel-guard",
            "podgate-router",
            "istio-cni"
        ]
    );
    assert_ready(&c, &layout, "03-podgate.conflist");
    // The plugins file changes: podgate re-renders its file; Istio compares
    // plugin types only and keeps its copy, so the runtime's chain is not
    // what the plugins file says (the table: restart Istio's agent).
    change_entries(c.node());
    install_ok(&c, &layout);
    assert_not_ready(
        &c,
        &layout,
        &["loaded 02-istio-cni.conflist: its podgate plugins differ from the plugins file"],
    );
    assert_eq!(
        istio(),
        "valid",
        "Istio checks plugin types only, so it does not copy the new entries"
    );
}

/// The Multus thick daemon (stand-in), started with a conf dir.
struct Multus {
    child: Child,
    log: PathBuf,
}

impl Multus {
    fn start(c: &Containerd) -> Multus {
        let node = c.node();
        let run = node.root().join("multus-run");
        let cfg = node.root().join("daemon-config.json");
        std::fs::write(
            &cfg,
            json!({
                "cniVersion": "1.0.0",
                "cniConfigDir": node.conf_dir(),
                "multusAutoconfigDir": node.conf_dir(),
                "multusConfigFile": "auto",
                "socketDir": run,
                "daemonSocketDir": run,
            })
            .to_string(),
        )
        .unwrap();
        let log = node.root().join("multus.log");
        let multus_conf = node.conf_dir().join("00-multus.conf");
        let _ = std::fs::remove_file(&multus_conf);
        let cache = node.root().join("multus-cache");
        let child = Command::new("nsenter")
            .arg(format!("--net={}", node.ns.path().display()))
            .arg("python3")
            .arg(fixture("multus_daemon.py"))
            .arg(&cfg)
            .arg(cnirunner())
            .arg(node.cni_bin_dir())
            .arg(&cache)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let m = Multus { child, log };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(multus_conf.exists() && run.join("multus.sock").exists()) {
            assert!(
                Instant::now() < deadline,
                "Multus stand-in not up:\n{}",
                m.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as the kubelet stops it: it removes its `00-multus.conf`.
    fn stop(mut self) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}\n{}", self.log());
    }
}

/// SIGKILL: a crashed daemon, its `00-multus.conf` left behind.
impl Drop for Multus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Multus thick (the shim in the runtime's chain, the daemon delegating to
/// its clusterNetwork): started before podgate's file existed it delegates to
/// the primary, pods miss podgate and the check says so; restarted, it
/// delegates to podgate's file, pods get podgate and the check passes; with
/// the daemon crashed, a re-rendered podgate file is not ready; stopped
/// cleanly, its file goes and the runtime loads podgate's own.
#[test]
fn multus_thick_is_ready_only_once_its_daemon_delegates_to_podgates_file() {
    // Multus's own file sorts first: podgate is told which file is the
    // primary (the co-installer table's operator setting).
    const PRIMARY: [&str; 2] = ["--primary", "10-podnet.conflist"];
    let c = start("co-multus", true);
    let node = c.node();
    let shim = node.cni_bin_dir().join("multus-shim");
    std::fs::copy(fixture("multus-shim"), &shim).unwrap();
    let baseline = fresh_forwarding();
    let mut cri = Cri::connect(&c);

    let multus = Multus::start(&c);
    install_ok(&c, &PRIMARY);
    let primary_path = node.conf_dir().join("10-podnet.conflist");
    assert_not_ready(
        &c,
        &PRIMARY,
        &[
            "loaded 00-multus.conf: Multus delegates to",
            &format!("{}, not 00-podgate.conflist", primary_path.display()),
        ],
    );
    let before = cri
        .run(&c, &Pod::new("vpn", "openvpn-0"))
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", multus.log(), c.log()));
    assert_eq!(
        sysctl_in(&cri.netns(&before), "net.ipv4.ip_forward"),
        baseline,
        "the pod went through the primary alone, as the check said"
    );

    multus.stop();
    let multus = Multus::start(&c);
    assert_ready(&c, &PRIMARY, OWN);
    let after = cri
        .run(&c, &Pod::new("vpn", "openvpn-1"))
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", multus.log(), c.log()));
    assert_eq!(sysctl_in(&cri.netns(&after), "net.ipv4.ip_forward"), "1");
    for id in [&before, &after] {
        cri.stop_and_remove(id);
    }
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());

    // The daemon crashed; podgate's file re-rendered (plugins file changed).
    drop(multus);
    change_entries(node);
    install_ok(&c, &PRIMARY);
    assert_not_ready(
        &c,
        &PRIMARY,
        &["loaded 00-multus.conf: Multus's daemon has not re-read 00-podgate.conflist"],
    );
    // Started again and stopped cleanly: Multus's file goes with it.
    Multus::start(&c).stop();
    assert!(!node.conf_dir().join("00-multus.conf").exists());
    assert_ready(&c, &PRIMARY, OWN);
}

/// A primary whose installer rewrites its file in place at every start
/// (Calico): pods keep going through podgate's file (it sorts first), and
/// readiness is false from the rewrite until podgate re-renders.
#[test]
fn a_primary_rewritten_at_start_is_not_ready_until_podgate_re_renders_it() {
    let c = start("co-calico", false);
    let node = c.node();
    let conf = node.conf_dir();
    let template = node.root().join("calico-template.conflist");
    let calico = |list: &Value| {
        std::fs::write(&template, serde_json::to_vec_pretty(list).unwrap()).unwrap();
        let out = Command::new("python3")
            .arg(fixture("calico_install.py"))
            .arg(&conf)
            .env("CNI_NETWORK_CONFIG_FILE", &template)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", output_text(&out));
    };
    calico(&primary(node, "10.23.0.0/16"));
    install_ok(&c, &[]);
    assert_ready(&c, &[], OWN);
    // Reboot: Calico's install-cni runs before podgate's agent is back.
    let mut pool = primary(node, "10.24.0.0/16");
    pool["plugins"][0]["bridge"] = json!("pgbr-rebooted");
    calico(&pool);
    assert_not_ready(
        &c,
        &[],
        &["00-podgate.conflist is not the current chain of 10-calico.conflist"],
    );
    install_ok(&c, &[]);
    assert_ready(&c, &[], OWN);
}

/// Forwarding of a fresh netns on this machine (what a sandbox starts with).
fn fresh_forwarding() -> String {
    podgate_integration::Netns::new("co-probe").sysctl_get("net.ipv4.ip_forward")
}

/// `podgate install --watch` asking this containerd; SIGKILLed on drop.
struct Watcher(Child);

impl Watcher {
    fn start(c: &Containerd, args: &[&str]) -> Watcher {
        let node = c.node();
        let mut cmd = podgate_command();
        let child = podgate_integration::agent::install_watch(
            &mut cmd,
            node,
            &node.root().join("plugins.json"),
        )
        .args(["--debounce-ms", "50", "--resync-secs", "1"])
        .arg("--runtime-endpoint")
        .arg(c.endpoint())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(node.root().join("watch.log")).unwrap())
        .spawn()
        .unwrap();
        Watcher(child)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn now_ns() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap()
}

/// The history once `done` holds for it (within [`RELOAD`]).
fn history_until(c: &Containerd, done: impl Fn(&Value) -> bool) -> Value {
    let node = c.node();
    let log = node.root().join("watch.log");
    podgate_integration::agent::history_until(node, &log, RELOAD, "the history", done)
}

/// The installer's watch records in its state dir, per boot, when it first
/// saw the runtime serve podgate-router and each period it saw it missing
/// (another file loaded first), the first one back to the boot since
/// podgate's file was not in the conf dir when the watch started; and,
/// apart, the same for an enforcing tunnel guard (this one is `required:
/// never`: never seen enforcing). A restarted watch keeps both.
#[test]
fn the_installer_records_when_the_runtime_served_the_chain_and_keeps_it_across_restarts() {
    // The order check is against the file podgate renders from, so another
    // file sorting first does not stop the watcher.
    const PRIMARY: [&str; 2] = ["--primary", "10-podnet.conflist"];
    let c = start("co-history", true);
    let before = now_ns();
    let watcher = Watcher::start(&c, &PRIMARY);
    let h = history_until(&c, |h| h["router"]["firstLoaded"].is_u64());
    let first = h["router"]["firstLoaded"].as_u64().unwrap();
    assert!(before <= first && first <= now_ns(), "{h}");
    assert_eq!(h["version"], 2);
    assert_eq!(
        h["bootId"],
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap()
            .trim()
    );
    let since_boot = &h["router"]["missing"][0];
    assert!(since_boot["lastSeenLoaded"].is_null(), "{h}");
    assert!(
        since_boot["firstSeenMissing"].as_u64().unwrap() >= before,
        "{h}"
    );
    assert_eq!(since_boot["seenLoadedAgain"], first, "{h}");
    assert_eq!(h["router"]["missing"].as_array().unwrap().len(), 1, "{h}");
    assert!(h["guard"]["firstLoaded"].is_null(), "{h}");
    assert!(h["guard"]["missing"][0]["seenLoadedAgain"].is_null(), "{h}");

    let gone = now_ns();
    c.node()
        .write_conflist("00-aaa", &primary(c.node(), "10.30.0.0/16"));
    let h = history_until(&c, |h| {
        h["router"]["missing"]
            .as_array()
            .is_some_and(|m| m.len() == 2)
    });
    let m = &h["router"]["missing"][1];
    assert!(m["seenLoadedAgain"].is_null(), "{h}");
    let (last, missing) = (
        m["lastSeenLoaded"].as_u64().unwrap(),
        m["firstSeenMissing"].as_u64().unwrap(),
    );
    assert!(first <= last && last <= missing && gone <= missing, "{h}");

    std::fs::remove_file(c.node().conf_dir().join("00-aaa.conflist")).unwrap();
    let h = history_until(&c, |h| {
        h["router"]["missing"][1]["seenLoadedAgain"].is_u64()
    });
    assert!(
        h["router"]["missing"][1]["seenLoadedAgain"]
            .as_u64()
            .unwrap()
            >= missing
    );

    drop(watcher);
    let _watcher = Watcher::start(&c, &PRIMARY);
    std::thread::sleep(Duration::from_secs(2));
    let after = history_until(&c, |_| true);
    assert_eq!(after, h, "a restarted watch keeps the record");
}
