//! Proves the integration harness itself, using only the reference CNI
//! plugins (bridge, host-local, portmap; Debian's 1.1.1 and v1.10.0) driven
//! through the real libcni: upstream cnitool, and the runner where cnitool
//! cannot go.
//!
//! Root only: `cargo test -p podgate-integration --test harness_smoke`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use podgate_integration::{
    assert_same, cnirunner, cnirunner_libcni13, cnitool_container_id, files_below, ping,
    require_root, snapshot, state_files, tcp_connect_ok, tcp_listen, tcp_request, Netns, Primaries,
    TestNode, Verb,
};
use serde_json::json;

fn netns_listed(name: &str) -> bool {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

fn cache_results(node: &TestNode) -> Vec<String> {
    std::fs::read_dir(node.cache_dir().join("results"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// ADD / CHECK / DEL / DEL of a bridge+host-local pod at `version` through
/// cnitool, with the node left exactly as after a warm-up pod's ADD+DEL.
fn bridge_lifecycle(version: &str, primaries: Primaries) {
    require_root();
    let node = TestNode::with_primaries("smoke", primaries);
    let net = format!("smoke-{}", version.replace('.', ""));
    let subnet = "10.244.1.0/24";
    node.write_conflist(
        "10-smoke",
        &node.bridge_conflist(&net, version, subnet, vec![]),
    );

    // Warm-up: the bridge, its gateway address and sysctls persist after DEL.
    let warm = node.pod("warm");
    node.add(&net, &warm);
    node.del(&net, &warm).assert_ok();
    drop(warm);
    let before = snapshot(&node.ns);
    assert!(
        before.links.iter().any(|l| l.starts_with("pgbr")),
        "{before:?}"
    );

    let pod = node.pod("p1");
    let add = node.cni(Verb::Add, &net, &pod, "eth0", None, None);
    add.assert_ok();
    let result = add.result.as_ref().expect("ADD printed a result");
    assert_eq!(result["cniVersion"], version, "{add:?}");
    let ip = add.first_ip().expect("result has an IP");
    assert!(ip.starts_with("10.244.1."), "{ip}");
    assert_eq!(pod.ipv4("eth0").as_deref(), Some(ip.as_str()));
    assert!(ping(&node.ns, &ip, 2), "node cannot ping pod {ip}");
    assert!(ping(&pod, "10.244.1.1", 1), "pod cannot ping its gateway");
    assert_eq!(
        cache_results(&node),
        [format!("{net}-{}-eth0", cnitool_container_id(pod.path()))],
        "libcni cached the result under cnitool's container ID"
    );

    let check = node.check(&net, &pod);
    if version == "0.3.1" {
        // libcni refuses CHECK below 0.4.0 before calling any plugin.
        assert_eq!(check.code(), Some(1), "{check:?}");
        assert!(
            check.stderr.contains("does not support the CHECK command"),
            "{check:?}"
        );
        assert!(check.error.is_none());
    } else {
        check.assert_ok();
    }

    node.del(&net, &pod).assert_ok();
    assert!(!pod.link_exists("eth0"));
    node.del(&net, &pod).assert_ok();
    assert!(
        cache_results(&node).is_empty(),
        "DEL removed the cache entry"
    );

    assert_same(&before, &snapshot(&node.ns));
    assert!(state_files(&node).is_empty());
}

#[test]
fn bridge_lifecycle_cni_1_0_0() {
    bridge_lifecycle("1.0.0", Primaries::Debian);
}

#[test]
fn bridge_lifecycle_cni_0_4_0() {
    bridge_lifecycle("0.4.0", Primaries::Debian);
}

#[test]
fn bridge_lifecycle_cni_0_3_1() {
    bridge_lifecycle("0.3.1", Primaries::Debian);
}

#[test]
fn bridge_lifecycle_upstream_plugins_cni_1_1_0() {
    bridge_lifecycle("1.1.0", Primaries::Upstream);
}

#[test]
fn bridge_lifecycle_upstream_plugins_cni_0_3_1() {
    bridge_lifecycle("0.3.1", Primaries::Upstream);
}

/// CNI_ARGS and runtimeConfig capability args reach the plugins: host-local
/// honours `IP=`, portmap installs a working DNAT for `portMappings`.
#[test]
fn args_and_capability_args_reach_plugins() {
    require_root();
    let node = TestNode::new("caps");
    let net = "caps";
    let portmap = json!({ "type": "portmap", "capabilities": { "portMappings": true } });
    node.write_conflist(
        "10-caps",
        &node.bridge_conflist(net, "1.0.0", "10.244.2.0/24", vec![portmap]),
    );
    let mappings = |host: u16| {
        json!({ "portMappings": [
            { "hostPort": host, "containerPort": 8080, "protocol": "tcp" }
        ]})
    };

    // Warm-up creates the bridge and portmap's long-lived base chains.
    let warm = node.pod("warm");
    node.cni(Verb::Add, net, &warm, "eth0", None, Some(mappings(18081)))
        .assert_ok();
    node.cni(Verb::Del, net, &warm, "eth0", None, Some(mappings(18081)))
        .assert_ok();
    drop(warm);
    let before = node.snapshot();

    let pod = node.pod("web");
    let server = tcp_listen(&pod, 8080);

    // Without IgnoreUnknown the reference plugins reject unknown CNI_ARGS:
    // exercises the runner's CNI_ERROR / exit 2 path, and cnitool's message.
    let rejected = node.runner(
        Verb::Add,
        net,
        pod.path(),
        "web-1",
        "eth0",
        Some("K8S_POD_NAME=web"),
        None,
    );
    rejected.assert_cni_error(999);
    assert!(rejected
        .error_msg()
        .unwrap_or_default()
        .contains("K8S_POD_NAME"));
    assert_eq!(rejected.code(), Some(2));
    node.runner(Verb::Del, net, pod.path(), "web-1", "eth0", None, None)
        .assert_ok();
    let rejected = node.cni(Verb::Add, net, &pod, "eth0", Some("K8S_POD_NAME=web"), None);
    assert_eq!(rejected.code(), Some(1), "{rejected:?}");
    assert!(
        rejected.assert_failed().contains("K8S_POD_NAME"),
        "{rejected:?}"
    );
    node.cni(Verb::Del, net, &pod, "eth0", None, None)
        .assert_ok();

    let args = "IgnoreUnknown=1;K8S_POD_NAME=web;K8S_POD_NAMESPACE=default;IP=10.244.2.77";
    let add = node.cni(
        Verb::Add,
        net,
        &pod,
        "eth0",
        Some(args),
        Some(mappings(18080)),
    );
    add.assert_ok();
    assert_eq!(add.first_ip().as_deref(), Some("10.244.2.77"), "{add:?}");

    let ruleset = node.ns.exec_ok(&["nft", "list", "ruleset"]);
    assert!(ruleset.contains("dport 18080"), "{ruleset}");

    // Pod reachable directly, and through the host port on the gateway IP
    // (locally generated traffic takes portmap's OUTPUT DNAT).
    let t = Duration::from_secs(3);
    assert_eq!(
        tcp_request(&node.ns, "10.244.2.77", 8080, t).unwrap(),
        server.greeting()
    );
    assert_eq!(
        tcp_request(&node.ns, "10.244.2.1", 18080, t).unwrap(),
        server.greeting()
    );
    assert!(server.accepted() >= 2);
    assert!(!tcp_connect_ok(
        &node.ns,
        "10.244.2.1",
        18081,
        Duration::from_secs(1)
    ));

    node.check(net, &pod).assert_ok();
    for _ in 0..2 {
        node.cni(
            Verb::Del,
            net,
            &pod,
            "eth0",
            Some(args),
            Some(mappings(18080)),
        )
        .assert_ok();
    }
    assert!(!tcp_connect_ok(
        &node.ns,
        "10.244.2.1",
        18080,
        Duration::from_secs(1)
    ));
    assert_same(&before, &node.snapshot());
}

struct Leftovers {
    netns: Vec<String>,
    paths: Vec<PathBuf>,
}

impl Leftovers {
    fn record_ns(&mut self, ns: &Netns) {
        self.netns.push(ns.name().to_string());
        self.paths.push(ns.path().to_path_buf());
    }

    fn assert_gone(&self) {
        for name in &self.netns {
            assert!(!netns_listed(name), "netns {name} still listed");
        }
        for p in &self.paths {
            assert!(!Path::new(p).exists(), "{} still exists", p.display());
        }
    }
}

/// Namespaces (with their processes) and temp dirs disappear on drop, also
/// when the test panics.
#[test]
fn everything_is_removed_on_drop() {
    require_root();
    let mut left = Leftovers {
        netns: Vec::new(),
        paths: Vec::new(),
    };
    let mut child;
    {
        let node = TestNode::with_forwarding("drop", false);
        assert_eq!(node.ns.sysctl_get("net.ipv4.ip_forward"), "0");
        node.ns.sysctl_set("net.ipv4.ip_forward", "1");
        assert_eq!(node.ns.sysctl_get("net.ipv4.ip_forward"), "1");
        for d in [
            node.conf_dir(),
            node.cache_dir(),
            node.ipam_dir(),
            node.state_dir(),
        ] {
            assert!(d.is_dir(), "{}", d.display());
        }
        assert!(node.cni_bin_dir().join("bridge").exists());
        assert!(node.cni_bin_dir().join("host-local").exists());
        let pod = node.pod("p");
        assert_eq!(
            pod.exec_ok(&["cat", "/sys/class/net/lo/operstate"]).trim(),
            "unknown"
        );
        child = pod.spawn(&["sleep", "600"]);
        // `ip netns exec` joins the netns and execs `sleep` shortly after spawn.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while pod.pids().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(pod.pids(), vec![child.id() as i32]);
        left.record_ns(&node.ns);
        left.record_ns(&pod);
        left.paths.push(node.root().to_path_buf());
    }
    left.assert_gone();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the process inside was killed: {status}");

    let mut left = Leftovers {
        netns: Vec::new(),
        paths: Vec::new(),
    };
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let node = TestNode::new("panic");
        left.record_ns(&node.ns);
        left.paths.push(node.root().to_path_buf());
        panic!("deliberate panic to test cleanup");
    }));
    assert!(caught.is_err());
    left.assert_gone();
}

#[test]
fn runner_reports_usage_and_config_errors() {
    require_root();
    for runner in [cnirunner(), cnirunner_libcni13()] {
        let out = Command::new(&runner).output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("usage: cnirunner"));
    }

    let node = TestNode::new("errs");
    node.write_conflist(
        "n",
        &node.bridge_conflist("n", "1.0.0", "10.244.9.0/24", vec![]),
    );
    let pod = node.pod("p");
    let missing = node.runner(
        Verb::Add,
        "no-such-net",
        pod.path(),
        "c1",
        "eth0",
        None,
        None,
    );
    assert_eq!(missing.code(), Some(1), "{missing:?}");
    assert!(missing.error.is_none());
    assert!(missing.stderr.contains("no-such-net"), "{missing:?}");
    let missing = node.cni(Verb::Add, "no-such-net", &pod, "eth0", None, None);
    assert_eq!(missing.code(), Some(1), "{missing:?}");
    assert!(
        missing.assert_failed().contains("no-such-net"),
        "{missing:?}"
    );
    // Debian's libcni 1.1.2 has no GC: that runner says so.
    let mut gc = Command::new(cnirunner());
    gc.args(["gc", "--name", "n", "--conf-dir"])
        .arg(node.conf_dir())
        .arg("--cni-path")
        .arg(node.cni_bin_dir());
    let out = gc.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gc and status need libcni >= 1.2"));
}

/// libcni's result cache (`/var/lib/cni/results`, cnitool cannot move it)
/// and host-local's default data dir (`/var/lib/cni/networks`) land in the
/// node's own `var-lib/`; the machine's `/var/lib/cni` gets neither.
/// (`test.sh` checks the same two dirs around the whole suite.)
#[test]
fn cnitool_keeps_libcni_cache_and_host_local_default_in_the_node() {
    require_root();
    let node = TestNode::new("varlib");
    let net = format!("varlib-{}", node.ns.name());
    let mut conf = node.bridge_conflist(&net, "1.0.0", "10.244.3.0/24", vec![]);
    // host-local without a dataDir: its default, /var/lib/cni/networks.
    conf["plugins"][0]["ipam"]
        .as_object_mut()
        .unwrap()
        .remove("dataDir");
    node.write_conflist("10-varlib", &conf);
    let pod = node.pod("p");
    let add = node.cni(Verb::Add, &net, &pod, "eth0", None, None);
    add.assert_ok();
    let cid = add.container_id.clone().unwrap();
    let ip = add.first_ip().unwrap();

    let in_node = files_below(&node.cache_dir());
    assert!(
        in_node.contains(&format!("results/{net}-{cid}-eth0")),
        "{in_node:?}"
    );
    assert!(
        in_node.contains(&format!("networks/{net}/{ip}")),
        "{in_node:?}"
    );
    let machine = Path::new("/var/lib/cni");
    let leaked: Vec<String> = files_below(machine)
        .into_iter()
        .filter(|f| f.contains(&net) || f.contains(&cid))
        .collect();
    assert!(
        leaked.is_empty(),
        "written to the machine's /var/lib/cni: {leaked:?}"
    );

    node.del(&net, &pod).assert_ok();
    assert!(!files_below(&node.cache_dir())
        .iter()
        .any(|f| f.contains(&cid)));
}

/// Snapshots see routes, rules, nftables objects, links and addresses, and
/// ignore counters.
#[test]
fn snapshot_detects_changes() {
    require_root();
    let ns = Netns::new("snap");
    let before = snapshot(&ns);
    assert_same(&before, &snapshot(&ns));

    ns.sh_ok(
        "ip link add pgdummy0 type veth peer name pgdummy1 && ip link set pgdummy0 up && ip link set pgdummy1 up && \
         ip addr add 192.0.2.1/24 dev pgdummy0 && \
         ip route add 198.51.100.0/24 via 192.0.2.2 table 100 && \
         ip rule add fwmark 0x10 lookup 100 priority 1000 && \
         nft add table inet pgtest && \
         nft add chain inet pgtest out '{ type filter hook output priority 0; }' && \
         nft add rule inet pgtest out counter accept",
    );
    let changed = snapshot(&ns);
    let diff = before.diff(&changed);
    for needle in [
        "pgdummy0",
        "192.0.2.1/24",
        "198.51.100.0/24",
        "fwmark",
        "pgtest",
    ] {
        assert!(diff.contains(needle), "diff lacks {needle}:\n{diff}");
    }
    let caught = std::panic::catch_unwind(|| assert_same(&before, &changed));
    assert!(caught.is_err());

    // Counters move, the snapshot doesn't.
    assert!(ping(&ns, "192.0.2.1", 1));
    assert_same(&changed, &snapshot(&ns));
}

/// The containerd harness's cgroup cleanup removes a tree with a process
/// still in it (a shim or container its netns kills missed, or one still
/// exiting): the process is killed and every directory removed.
#[test]
fn a_cgroup_tree_with_a_live_process_in_it_is_removed() {
    require_root();
    use podgate_integration::containerd::{cgroup_tree_exists, remove_cgroup_tree};
    let parent = format!("podgate-it-rmtree-{}", std::process::id());
    let v1 = Path::new("/sys/fs/cgroup/pids");
    let hierarchy = if v1.is_dir() {
        v1
    } else {
        Path::new("/sys/fs/cgroup")
    };
    let inner = hierarchy.join(&parent).join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    let mut sleeper = Command::new("sleep").arg("600").spawn().unwrap();
    std::fs::write(inner.join("cgroup.procs"), sleeper.id().to_string()).unwrap();

    remove_cgroup_tree(&parent);
    let gone = !cgroup_tree_exists(&parent);
    // Removed only once the process left it: it has exited by then.
    let killed = sleeper.try_wait().unwrap().is_some();
    if !killed {
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
    }
    if !gone {
        let _ = std::fs::remove_dir(&inner);
        let _ = std::fs::remove_dir(hierarchy.join(&parent));
    }
    assert!(gone, "{parent} left in {}", hierarchy.display());
    assert!(killed, "the process in {parent} was left running");
}
