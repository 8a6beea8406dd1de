//! Test-only helpers for the podgate-tunnel-guard integration tests: a node
//! with a real `ovsdb-server`, the fixture IPsec agent
//! (`integration/fixtures/ipsec_agent.py`) and XFRM policies made with
//! `ip xfrm` inside the node netns. Every process is killed on drop.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use podgate_integration::{
    output_text, require_root, workspace_root, CniOutcome, Netns, TestNode, Verb,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const PLUGIN: &str = "podgate-tunnel-guard";
pub const MARK: u32 = 759_815;
pub const SUBNET: &str = "10.244.7.0/24";
const VSWITCH_SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";

/// The plugin binary, built first if missing or stale.
pub fn ensure_plugin() -> PathBuf {
    podgate_integration::built(&[PLUGIN], &["-p", PLUGIN]).remove(0)
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

/// The status a healthy, armed agent reports.
pub fn good_status(chassis: &str) -> Value {
    json!({
        "phase": "Running",
        "reason": "",
        "nodeUID": "8d3c1c1e-0000-4000-8000-000000000001",
        "chassis": chassis,
        "generation": 4,
        "certificateHash": "sha256:1111111111111111111111111111111111111111111111111111111111111111",
        "trustHash": "sha256:2222222222222222222222222222222222222222222222222222222222222222",
        "configurationApplied": true,
        "runtimeHealthy": true,
        "protectionArmed": true,
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

/// The fixture agent serving the status socket from a state file.
pub struct Agent {
    child: Child,
    pub socket: PathBuf,
    state: PathBuf,
}

impl Agent {
    pub fn start(ns: &Netns, dir: &Path, status: Value) -> Agent {
        let socket = dir.join("ipsec-status.sock");
        let state = dir.join("ipsec-agent-state.json");
        let script = workspace_root().join("integration/fixtures/ipsec_agent.py");
        // Write the state before the first connection can read it.
        agent_state_write(&state, "normal", &status);
        let child = ns
            .command(python())
            .arg(&script)
            .arg(&socket)
            .arg(&state)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning the fixture agent");
        let mut a = Agent {
            child,
            socket,
            state,
        };
        wait_for_socket(&a.socket, &mut a.child, "fixture agent");
        a
    }

    /// Switch mode ("normal", "503", "hang", "garbage", "huge", "notHttp") and status.
    pub fn set(&self, mode: &str, status: &Value) {
        agent_state_write(&self.state, mode, status);
    }

    /// Stop the agent and remove its socket (as if it were not deployed).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn agent_state_write(state: &Path, mode: &str, status: &Value) {
    let tmp = state.with_extension("tmp");
    std::fs::write(&tmp, json!({"mode": mode, "status": status}).to_string()).unwrap();
    std::fs::rename(&tmp, state).unwrap();
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A real ovsdb-server with the vswitch schema on a private unix socket.
pub struct Ovsdb {
    child: Child,
    pub socket: PathBuf,
}

impl Ovsdb {
    pub fn start(ns: &Netns, dir: &Path, system_id: &str, mark: Option<&str>) -> Ovsdb {
        let db = dir.join("conf.db");
        let socket = dir.join("db.sock");
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{cmd:?}\n{}", output_text(&out));
        };
        run(Command::new("ovsdb-tool")
            .arg("create")
            .arg(&db)
            .arg(VSWITCH_SCHEMA));
        let child = ns
            .command("ovsdb-server")
            .arg(&db)
            .arg(format!("--remote=punix:{}", socket.display()))
            .arg(format!("--unixctl={}", dir.join("ovsdb.ctl").display()))
            .arg(format!("--log-file={}", dir.join("ovsdb.log").display()))
            .args(["--no-chdir", "-vconsole:off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning ovsdb-server");
        let mut o = Ovsdb { child, socket };
        wait_for_socket(&o.socket, &mut o.child, "ovsdb-server");
        o.vsctl(&["init"]);
        o.vsctl(&[
            "set",
            "Open_vSwitch",
            ".",
            &format!("external_ids:system-id={system_id}"),
        ]);
        if let Some(m) = mark {
            o.vsctl(&[
                "set",
                "Open_vSwitch",
                ".",
                &format!("external_ids:ovn-ipsec-protection-mark={m}"),
            ]);
        }
        o
    }

    pub fn vsctl(&self, args: &[&str]) {
        let out = Command::new("ovs-vsctl")
            .arg(format!("--db=unix:{}", self.socket.display()))
            .args(["--no-wait", "--timeout=10"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ovs-vsctl {args:?}\n{}",
            output_text(&out)
        );
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Ovsdb {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A node with ovsdb, the agent, the IPv4 guard and a conflist
/// bridge + host-local + podgate-tunnel-guard (cniVersion 1.0.0).
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
        require_root();
        ensure_plugin();
        let node = TestNode::new(&format!("tg-{name}"));
        let chassis = format!("chassis-{name}");
        let ovsdb = Ovsdb::start(&node.ns, node.root(), &chassis, Some(&MARK.to_string()));
        let agent = Agent::start(&node.ns, node.root(), good_status(&chassis));
        let g = GuardNode {
            net: format!("tg-{name}"),
            log: node.root().join("tunnel-guard.log"),
            agent,
            ovsdb,
            node,
            chassis,
        };
        g.install_guard("", MARK);
        g.configure(json!({}));
        g
    }

    /// The plugin's conflist entry: defaults for this node, overridden by `extra`.
    pub fn guard_conf(&self, extra: Value) -> Value {
        let mut c = json!({
            "type": PLUGIN,
            "agentSocket": self.agent.socket,
            "ovsdbSocket": self.ovsdb.socket,
            "minCertValidity": "10m",
            "timeoutMs": 500,
            "logFile": self.log,
        });
        if let (Some(c), Value::Object(extra)) = (c.as_object_mut(), extra) {
            c.extend(extra);
        }
        c
    }

    /// (Re)write the conflist with `extra` merged into the guard's entry.
    pub fn configure(&self, extra: Value) {
        let conflist =
            self.node
                .bridge_conflist(&self.net, "1.0.0", SUBNET, vec![self.guard_conf(extra)]);
        self.node.write_conflist("10-tg", &conflist);
    }

    /// `ip <args>` in the node netns (`-6 xfrm ...` etc.).
    pub fn ip(&self, args: &str) {
        let mut argv = vec!["ip"];
        argv.extend(args.split_whitespace());
        self.node.ns.exec_ok(&argv);
    }

    /// Install the guard; `family` is "" (IPv4) or "-6".
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

    pub fn cni(&self, verb: Verb, pod: &Netns, id: &str) -> CniOutcome {
        self.node.cni(verb, &self.net, pod, id, "eth0", None, None)
    }

    /// ADD a new pod; returns the pod netns and the outcome.
    pub fn add(&self, pod: &str) -> (Netns, CniOutcome) {
        let ns = self.node.pod(pod);
        let out = self.cni(Verb::Add, &ns, &format!("ctr-{pod}"));
        (ns, out)
    }

    /// ADD must fail with code 11 and a message containing every `needle`;
    /// libcni must not have cached a result; the runtime's DEL then succeeds.
    pub fn expect_not_ready(&self, pod: &str, needles: &[&str]) -> String {
        let (ns, out) = self.add(pod);
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
        self.cni(Verb::Del, &ns, &id).assert_ok();
        msg
    }

    pub fn expect_ready(&self, pod: &str) -> Value {
        let (ns, out) = self.add(pod);
        out.assert_ok();
        let result = out.result.clone().expect("ADD result");
        self.cni(Verb::Check, &ns, &format!("ctr-{pod}"))
            .assert_ok();
        self.cni(Verb::Del, &ns, &format!("ctr-{pod}")).assert_ok();
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
}

/// Run the plugin binary directly (as a runtime would) inside `ns`, for verbs
/// libcni 1.1.2 cannot send (STATUS needs cniVersion 1.1.0).
pub fn run_plugin(ns: &Netns, command: &str, conf: &Value) -> (i32, Value) {
    use std::io::Write;
    let mut child = ns
        .command(ensure_plugin().to_str().unwrap())
        .env("CNI_COMMAND", command)
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v)
}
