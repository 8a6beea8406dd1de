//! The podgate-tunnel-guard integration tests' node: a node
//! with a real `ovsdb-server` (vswitch schema, OVN tunnel Ports/Interfaces
//! with the agent's options), the fixture agent
//! (`integration/fixtures/ipsec_agent.py`, serving the agent's public
//! protection endpoint and, optionally, its private status socket) and real
//! XFRM policies made with `ip xfrm` inside the node netns: the agent's guards
//! and strongSwan-shaped per-peer ESP policies. Every process is killed on drop.

// The agent's state is test JSON this module builds itself.
#![allow(clippy::indexing_slicing)]

use crate::{
    output_text, require_root, workspace_root, CniOutcome, Netns, Primaries, TestNode, Verb,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const PLUGIN: &str = "podgate-tunnel-guard";
pub const MARK: u32 = 759_815;
pub const REQID: u32 = 31_337;
pub const SUBNET: &str = "10.244.7.0/24";
/// The guard's time budget in these tests (the agent's /startup may take 2 s
/// on a real node; the fixture answers at once).
pub const TIMEOUT_MS: u64 = 1500;
const VSWITCH_SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";

/// The plugin binary, built first if missing or stale.
pub fn ensure_plugin() -> PathBuf {
    crate::built(&[PLUGIN], &["-p", PLUGIN]).remove(0)
}

/// RFC 3339 (UTC) for now + `secs` (may be negative).
pub fn rfc3339_from_now(secs: i64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let t = now + secs;
    let (days, rem) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The agent's public lease (`pkg/ovs` `IPsecProtection`).
pub fn lease(chassis: &str) -> Value {
    json!({"nodeUID": "8d3c1c1e-0000-4000-8000-000000000001", "lease": "TESTLEASEQ2VSX4ZT",
           "mark": MARK, "reqid": REQID, "chassis": chassis})
}

/// The private status of a configured agent (`agent.go` `Status`: digests are
/// bare lowercase hex; the fixture computes protectionArmed and Running).
pub fn good_status(chassis: &str) -> Value {
    json!({
        "phase": "Configured",
        "nodeUID": "8d3c1c1e-0000-4000-8000-000000000001",
        "chassis": chassis,
        "generation": "4".repeat(64),
        "certificateHash": "1".repeat(64),
        "trustHash": "2".repeat(64),
        "configurationApplied": true,
        "runtimeHealthy": true,
        "expires": rfc3339_from_now(86_400),
    })
}

fn wait_for_socket(path: &Path, child: &mut Child, what: &str) {
    let start = Instant::now();
    while !path.exists() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("{what} exited early ({st})");
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: {} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// How the fixture agent is started.
#[derive(Default, Clone)]
pub struct AgentOpts {
    /// Also serve the private status socket (agentSocket), at
    /// `<node>/kube-ovn-ipsec/status.sock` ([`Agent::status_socket`]).
    pub status: bool,
    /// Bind as root, then serve as this uid answering 200 to everything.
    pub impostor_uid: Option<u32>,
}

/// The fixture agent.
pub struct Agent {
    child: Option<Child>,
    pub dir: PathBuf,
    pub state: PathBuf,
    ovsdb_socket: PathBuf,
    opts: AgentOpts,
}

impl Agent {
    pub fn start(
        ns: &Netns,
        dir: &Path,
        ovsdb_socket: &Path,
        state: &Value,
        opts: AgentOpts,
    ) -> Agent {
        let mut a = Agent {
            child: None,
            dir: dir.to_path_buf(),
            state: dir.with_extension("state.json"),
            ovsdb_socket: ovsdb_socket.to_path_buf(),
            opts,
        };
        a.set(state);
        a.restart(ns);
        a
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("protection.sock")
    }

    pub fn required_file(&self) -> PathBuf {
        self.dir.join("required")
    }

    /// The private status socket (`--runtime-dir`/status.sock), when served.
    pub fn status_socket(&self) -> Option<PathBuf> {
        self.opts.status.then(|| {
            self.dir
                .with_file_name("kube-ovn-ipsec")
                .join("status.sock")
        })
    }

    /// (Re)start the process (after [`Agent::stop`]).
    pub fn restart(&mut self, ns: &Netns) {
        self.stop_process();
        let script = workspace_root().join("integration/fixtures/ipsec_agent.py");
        let mut cmd = ns.command(python());
        cmd.arg(&script)
            .arg(&self.state)
            .arg(&self.dir)
            .arg(&self.ovsdb_socket);
        if let Some(p) = self.status_socket() {
            cmd.arg("--status-socket").arg(p);
        }
        if let Some(uid) = self.opts.impostor_uid {
            cmd.arg("--impostor-uid").arg(uid.to_string());
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning the fixture agent");
        wait_for_socket(&self.socket(), &mut child, "fixture agent");
        if let Some(p) = self.status_socket() {
            wait_for_socket(&p, &mut child, "fixture agent status socket");
        }
        self.child = Some(child);
    }

    /// Rewrite the state the fixture reads on every request.
    pub fn set(&self, state: &Value) {
        let tmp = self.state.with_extension("tmp");
        std::fs::write(&tmp, state.to_string()).unwrap();
        std::fs::rename(&tmp, &self.state).unwrap();
    }

    fn stop_process(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop the agent and remove its socket (its container is gone).
    pub fn stop(&mut self) {
        self.stop_process();
        let _ = std::fs::remove_file(self.socket());
        if let Some(p) = self.status_socket() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A real ovsdb-server with the vswitch schema on a private unix socket.
pub struct Ovsdb {
    child: Option<Child>,
    pub socket: PathBuf,
    dir: PathBuf,
}

impl Ovsdb {
    pub fn start(ns: &Netns, dir: &Path, system_id: &str) -> Ovsdb {
        let mut o = Ovsdb {
            child: None,
            socket: dir.join("db.sock"),
            dir: dir.to_path_buf(),
        };
        o.create(ns, system_id);
        o
    }

    /// A fresh database (a new `_uuid`) with `system-id` set, as after a rebuild.
    fn create(&mut self, ns: &Netns, system_id: &str) {
        let db = self.dir.join("conf.db");
        let _ = std::fs::remove_file(&db);
        let out = Command::new("ovsdb-tool")
            .arg("create")
            .arg(&db)
            .arg(VSWITCH_SCHEMA)
            .output()
            .unwrap();
        assert!(out.status.success(), "ovsdb-tool\n{}", output_text(&out));
        let mut child = ns
            .command("ovsdb-server")
            .arg(&db)
            .arg(format!("--remote=punix:{}", self.socket.display()))
            .arg(format!(
                "--unixctl={}",
                self.dir.join("ovsdb.ctl").display()
            ))
            .arg(format!(
                "--log-file={}",
                self.dir.join("ovsdb.log").display()
            ))
            .args(["--no-chdir", "-vconsole:off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning ovsdb-server");
        wait_for_socket(&self.socket, &mut child, "ovsdb-server");
        self.child = Some(child);
        self.vsctl(&["init"]);
        self.vsctl(&[
            "set",
            "Open_vSwitch",
            ".",
            &format!("external_ids:system-id={system_id}"),
        ]);
    }

    /// Stop, delete the database, start a new one (a new `_uuid`).
    pub fn rebuild(&mut self, ns: &Netns, system_id: &str) {
        self.stop();
        let _ = std::fs::remove_file(&self.socket);
        self.create(ns, system_id);
    }

    /// `ovs-vsctl` against this database. `--retry`: the socket file exists a
    /// moment before ovsdb-server listens on it, and without `--retry`
    /// ovs-vsctl gives up on the first refused connection (`--timeout` bounds it).
    pub fn vsctl(&self, args: &[&str]) -> String {
        let out = Command::new("ovs-vsctl")
            .arg(format!("--db=unix:{}", self.socket.display()))
            .args(["--no-wait", "--retry", "--timeout=10"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ovs-vsctl {args:?}\n{}",
            output_text(&out)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The `Open_vSwitch` row's `_uuid`.
    pub fn uuid(&self) -> String {
        self.vsctl(&["get", "Open_vSwitch", ".", "_uuid"])
    }

    /// `PublishIPsecProtection`: the four lease keys.
    pub fn publish_lease(&self, lease: &Value) {
        self.vsctl(&[
            "set",
            "Open_vSwitch",
            ".",
            &format!(
                "external_ids:ovn-ipsec-protection-node-uid={}",
                lease["nodeUID"].as_str().unwrap()
            ),
            &format!(
                "external_ids:ovn-ipsec-protection-lease={}",
                lease["lease"].as_str().unwrap()
            ),
            &format!("external_ids:ovn-ipsec-protection-mark={}", lease["mark"]),
            &format!("external_ids:ovn-ipsec-protection-reqid={}", lease["reqid"]),
        ]);
    }

    /// An OVN tunnel Port/Interface to `peer` (as ovn-controller makes them),
    /// with the agent's marks when `marked`; with `remote_name` (the IPsec
    /// variant) also `ipsec_mark_out` and `ipsec_reqid`.
    pub fn add_tunnel(
        &self,
        name: &str,
        peer: &str,
        remote_ip: &str,
        remote_name: bool,
        marked: bool,
    ) {
        let mut opts = vec![
            format!("options:remote_ip={remote_ip}"),
            "options:key=flow".into(),
        ];
        if remote_name {
            opts.push(format!("options:remote_name={peer}"));
        }
        if marked {
            opts.push(format!("options:egress_pkt_mark={MARK}"));
            if remote_name {
                opts.push(format!("options:ipsec_mark_out=\"{MARK}/0xffffffff\""));
                opts.push(format!("options:ipsec_reqid={REQID}"));
            }
        }
        let mut args: Vec<String> = vec![
            "--may-exist".into(),
            "add-br".into(),
            "br-int".into(),
            "--".into(),
            "add-port".into(),
            "br-int".into(),
            name.into(),
            "--".into(),
            "set".into(),
            "Interface".into(),
            name.into(),
            "type=geneve".into(),
        ];
        args.extend(opts);
        args.extend([
            "--".into(),
            "set".into(),
            "Port".into(),
            name.into(),
            format!("external_ids:ovn-chassis-id={peer}"),
        ]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.vsctl(&refs);
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Ovsdb {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A ready node: ovsdb with the lease and two marked OVN tunnels, both
/// guards, an armed agent, and a conflist bridge + host-local +
/// podgate-tunnel-guard (cniVersion 1.0.0).
/// Drop order: agent, ovsdb, then the node (its netns, then its dir).
pub struct GuardNode {
    pub agent: Agent,
    pub ovsdb: Ovsdb,
    pub node: TestNode,
    pub net: String,
    pub chassis: String,
    pub log: PathBuf,
}

impl GuardNode {
    pub fn new(name: &str) -> GuardNode {
        GuardNode::with_agent(name, AgentOpts::default())
    }

    pub fn with_agent(name: &str, opts: AgentOpts) -> GuardNode {
        GuardNode::with_agent_on(name, opts, Primaries::Debian)
    }

    /// A ready node whose `cni-bin/` holds `primaries`.
    pub fn with_agent_on(name: &str, opts: AgentOpts, primaries: Primaries) -> GuardNode {
        require_root();
        ensure_plugin();
        let node = TestNode::with_primaries(&format!("tg-{name}"), primaries);
        let chassis = format!("chassis-{name}");
        let ovsdb = Ovsdb::start(&node.ns, node.root(), &chassis);
        ovsdb.publish_lease(&lease(&chassis));
        ovsdb.add_tunnel("ovn-b00001-0", "chassis-b", "192.0.2.2", false, true);
        ovsdb.add_tunnel("ovn-c00001-0", "chassis-c", "192.0.2.3", true, true);
        let protection = node.root().join("kube-ovn-ipsec-protection");
        let agent = Agent::start(
            &node.ns,
            &protection,
            &ovsdb.socket,
            &armed_state(&chassis),
            opts,
        );
        let g = GuardNode {
            net: format!("tg-{name}"),
            log: node.root().join("tunnel-guard.log"),
            agent,
            ovsdb,
            node,
            chassis,
        };
        g.install_guard("", MARK);
        g.install_guard("-6", MARK);
        g.configure(json!({}));
        g
    }

    /// A node where IPsec was never armed: no lease in OVSDB, unmarked
    /// tunnels, no guards, an agent without a lease (`preparing`: the
    /// controller's initial Prepare targets this node).
    pub fn unprotected(name: &str, preparing: bool) -> GuardNode {
        require_root();
        ensure_plugin();
        let node = TestNode::new(&format!("tg-{name}"));
        let chassis = format!("chassis-{name}");
        let ovsdb = Ovsdb::start(&node.ns, node.root(), &chassis);
        ovsdb.add_tunnel("ovn-b00001-0", "chassis-b", "192.0.2.2", false, false);
        let protection = node.root().join("kube-ovn-ipsec-protection");
        let mut state = armed_state(&chassis);
        state["lease"] = Value::Null;
        state["preparing"] = json!(preparing);
        state["status"]["phase"] = json!("Prepared");
        let agent = Agent::start(
            &node.ns,
            &protection,
            &ovsdb.socket,
            &state,
            AgentOpts::default(),
        );
        let g = GuardNode {
            net: format!("tg-{name}"),
            log: node.root().join("tunnel-guard.log"),
            agent,
            ovsdb,
            node,
            chassis,
        };
        g.configure(json!({}));
        g
    }

    /// The plugin's conflist entry: defaults for this node, overridden by `extra`.
    pub fn guard_conf(&self, extra: Value) -> Value {
        let mut c = json!({
            "type": PLUGIN,
            "protectionDir": self.agent.dir,
            "ovsdbSocket": self.ovsdb.socket,
            "timeoutMs": TIMEOUT_MS,
            "logFile": self.log,
        });
        if let (Some(c), Value::Object(extra)) = (c.as_object_mut(), extra) {
            c.extend(extra);
        }
        c
    }

    /// (Re)write the conflist (cniVersion 1.0.0) with `extra` merged into
    /// the guard's entry.
    pub fn configure(&self, extra: Value) {
        self.configure_at("1.0.0", extra);
    }

    /// [`GuardNode::configure`] at `cni_version`.
    pub fn configure_at(&self, cni_version: &str, extra: Value) {
        let conflist =
            self.node
                .bridge_conflist(&self.net, cni_version, SUBNET, vec![self.guard_conf(extra)]);
        self.node.write_conflist("10-tg", &conflist);
    }

    /// `ip <args>` in the node netns (`-6 xfrm ...` etc.).
    pub fn ip(&self, args: &str) {
        let mut argv = vec!["ip"];
        argv.extend(args.split_whitespace());
        self.node.ns.exec_ok(&argv);
    }

    /// The agent's guard (`protection.go` `guard`); `family` is "" or "-6".
    pub fn install_guard(&self, family: &str, mark: u32) {
        let any = if family == "-6" { "::/0" } else { "0.0.0.0/0" };
        self.ip(&format!(
            "{family} xfrm policy add dir out src {any} dst {any} action block \
             priority 2147483647 mark {mark} mask 0xffffffff"
        ));
    }

    pub fn remove_guard(&self, family: &str, mark: u32) {
        let any = if family == "-6" { "::/0" } else { "0.0.0.0/0" };
        self.ip(&format!(
            "{family} xfrm policy delete dir out src {any} dst {any} mark {mark} mask 0xffffffff"
        ));
    }

    /// strongSwan's per-peer policy pair for OVN's IPsec tunnels: udp/6081,
    /// the lease mark on output, an ESP template with the lease reqid.
    pub fn add_peer_policies(&self, local: &str, peer: &str) {
        self.ip(&format!(
            "xfrm policy add dir out src {local}/32 dst {peer}/32 proto udp dport 6081 \
             mark {MARK} mask 0xffffffff tmpl src {local} dst {peer} proto esp reqid {REQID} mode transport"
        ));
        self.ip(&format!(
            "xfrm policy add dir in src {peer}/32 dst {local}/32 proto udp dport 6081 \
             tmpl src {peer} dst {local} proto esp reqid {REQID} mode transport"
        ));
    }

    /// `verb` for `pod` through cnitool.
    pub fn cni(&self, verb: Verb, pod: &Netns) -> CniOutcome {
        self.node.cni(verb, &self.net, pod, "eth0", None, None)
    }

    /// `verb` for `pod` as container `id` through the runner: for a test
    /// that asserts the CNI error code (cnitool prints only the message).
    pub fn runner(&self, verb: Verb, pod: &Netns, id: &str) -> CniOutcome {
        self.node
            .runner(verb, &self.net, pod.path(), id, "eth0", None, None)
    }

    /// ADD a new pod through cnitool; returns the pod netns and the outcome.
    pub fn add(&self, pod: &str) -> (Netns, CniOutcome) {
        self.add_in(pod, None)
    }

    /// ADD with CNI_ARGS naming the pod's namespace, through cnitool.
    pub fn add_in(&self, pod: &str, namespace: Option<&str>) -> (Netns, CniOutcome) {
        let ns = self.node.pod(pod);
        let out = self.node.cni(
            Verb::Add,
            &self.net,
            &ns,
            "eth0",
            Self::pod_args(pod, namespace).as_deref(),
            None,
        );
        (ns, out)
    }

    /// [`GuardNode::add_in`] through the runner as container `ctr-<pod>`.
    pub fn add_runner_in(&self, pod: &str, namespace: Option<&str>) -> (Netns, CniOutcome) {
        let ns = self.node.pod(pod);
        let out = self.node.runner(
            Verb::Add,
            &self.net,
            ns.path(),
            &format!("ctr-{pod}"),
            "eth0",
            Self::pod_args(pod, namespace).as_deref(),
            None,
        );
        (ns, out)
    }

    fn pod_args(pod: &str, namespace: Option<&str>) -> Option<String> {
        namespace.map(|n| format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={n};K8S_POD_NAME={pod}"))
    }

    /// ADD must fail with code 11 (the runner's) and a message containing
    /// every `needle`; libcni must not have cached a result; the runtime's
    /// DEL then succeeds.
    pub fn expect_not_ready(&self, pod: &str, needles: &[&str]) -> String {
        let (ns, out) = self.add_runner_in(pod, None);
        out.assert_cni_error(11);
        let msg = out.error_msg().unwrap_or_default().to_string();
        eprintln!("[{}] ADD {pod}: {msg}", self.net);
        assert!(msg.starts_with("ipsec not ready: "), "{msg}");
        for n in needles {
            assert!(msg.contains(n), "{n:?} not in {msg:?}");
        }
        let id = format!("ctr-{pod}");
        assert!(
            !self.cached_results().iter().any(|f| f.contains(&id)),
            "failed ADD was cached: {:?}",
            self.cached_results()
        );
        self.runner(Verb::Del, &ns, &id).assert_ok();
        msg
    }

    /// ADD, CHECK and DEL of a new pod through cnitool, each succeeding;
    /// returns ADD's result.
    pub fn expect_ready(&self, pod: &str) -> Value {
        let (ns, out) = self.add(pod);
        out.assert_ok();
        let result = out.result.clone().expect("ADD result");
        self.cni(Verb::Check, &ns).assert_ok();
        self.cni(Verb::Del, &ns).assert_ok();
        result
    }

    /// libcni's cached results (file names).
    pub fn cached_results(&self) -> Vec<String> {
        std::fs::read_dir(self.node.cache_dir().join("results"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Log lines (JSON) the plugin wrote.
    pub fn log_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The last log line of `command`.
    pub fn last_log(&self, command: &str) -> Value {
        self.log_lines()
            .into_iter()
            .rev()
            .find(|l| l["command"] == command)
            .unwrap_or_else(|| panic!("no {command} logged in {}", self.log.display()))
    }
}

/// The fixture state of an agent holding its lease (armed intent).
pub fn armed_state(chassis: &str) -> Value {
    json!({"lease": lease(chassis), "boundUuid": null, "preparing": false,
           "mode": "normal", "status": good_status(chassis)})
}
