//! podgate's two node jobs run in a test node's netns: the installer
//! (`podgate install --watch`) and the node agent (`podgate agent`), whose
//! `/metrics` is scraped from there.

use crate::{bin_dir, http_get, TestNode};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the agent serves its metrics, inside the node netns.
pub const METRICS_PORT: u16 = 9750;

/// The flags naming `node`'s chain, the same for the installer and the
/// agent: its conf and bin dirs, the binaries of [`bin_dir`], `plugins` as
/// the plugins file, the installer's state in `<root>/installer`.
fn chain_args<'c>(cmd: &'c mut Command, node: &TestNode, plugins: &Path) -> &'c mut Command {
    cmd.arg("--cni-conf-dir")
        .arg(node.conf_dir())
        .arg("--cni-bin-dir")
        .arg(node.cni_bin_dir())
        .arg("--source-dir")
        .arg(bin_dir())
        .arg("--plugins")
        .arg(plugins)
        .arg("--state-dir")
        .arg(node.root().join("installer"))
}

/// `cmd` (the `podgate` binary) made `podgate install` for `node` (see
/// [`chain_args`]), the node's root a root of the entries' host paths (its
/// `state/`, logs and stand-in sockets).
pub fn install<'c>(cmd: &'c mut Command, node: &TestNode, plugins: &Path) -> &'c mut Command {
    chain_args(cmd.arg("install"), node, plugins)
        .arg("--plugin-path-root")
        .arg(node.root())
}

/// [`install`] with `--watch`.
pub fn install_watch<'c>(cmd: &'c mut Command, node: &TestNode, plugins: &Path) -> &'c mut Command {
    install(cmd, node, plugins).arg("--watch")
}

/// `cmd` (the `podgate` binary, or a wrapper given it) made `podgate agent`
/// for `node` (see [`chain_args`]).
pub fn agent<'c>(cmd: &'c mut Command, node: &TestNode, plugins: &Path) -> &'c mut Command {
    chain_args(cmd.arg("agent"), node, plugins)
}

/// `name`'s stderr, appended to `<root>/<name>.log`.
fn log_file(node: &TestNode, name: &str) -> (PathBuf, std::fs::File) {
    let log = node.root().join(format!("{name}.log"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    (log, file)
}

/// The installer and the agent in `node`'s netns; both SIGKILLed on drop.
pub struct Agent {
    installer: Option<Child>,
    child: Child,
    log: PathBuf,
}

impl Agent {
    /// The installer chains podgate into `node`'s conf dir from
    /// `<root>/plugins.json` (write it and the primary first), state in
    /// `<root>/installer`, stderr in `<root>/installer.log`; the agent
    /// serves metrics on 127.0.0.1:[`METRICS_PORT`] collected every second,
    /// counters in `<root>/agent`, JSON log at `<root>/agent.jsonl`, stderr
    /// in `<root>/agent.log`.
    pub fn start(node: &TestNode) -> Agent {
        Agent::start_with(node, "none")
    }

    /// [`Agent::start`], both asking the CRI runtime at `endpoint` (`none`:
    /// no runtime, readiness is the conf dir's).
    pub fn start_with(node: &TestNode, endpoint: &str) -> Agent {
        Agent::start_with_args(node, endpoint, &[])
    }

    /// [`Agent::start_with`], the agent also given `agent_args`.
    pub fn start_with_args(node: &TestNode, endpoint: &str, agent_args: &[&str]) -> Agent {
        let podgate = bin_dir().join("podgate");
        let plugins = node.root().join("plugins.json");
        let (_, installer_err) = log_file(node, "installer");
        let installer = install_watch(
            &mut node.ns.command(podgate.to_str().unwrap()),
            node,
            &plugins,
        )
        .args(["--runtime-endpoint", endpoint])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(installer_err)
        .spawn()
        .unwrap();
        let mut agent = Agent::start_alone(node, endpoint, agent_args);
        agent.installer = Some(installer);
        agent
    }

    /// The agent alone, without the installer: for a node whose conf dir
    /// the test writes itself (the agent reads podgate's entries from
    /// `<root>/plugins.json` and never writes the conf dir). As
    /// [`Agent::start_with_args`] otherwise.
    pub fn start_alone(node: &TestNode, endpoint: &str, agent_args: &[&str]) -> Agent {
        let podgate = bin_dir().join("podgate");
        let plugins = node.root().join("plugins.json");
        let (log, err) = log_file(node, "agent");
        let mut cmd = node.ns.command(podgate.to_str().unwrap());
        let child = agent(&mut cmd, node, &plugins)
            .args(["--runtime-endpoint", endpoint])
            .args(agent_args)
            .args([
                "--metrics-address",
                &format!("127.0.0.1:{METRICS_PORT}"),
                "--metrics-interval-secs",
                "1",
                "--log-level",
                "debug",
                "--log-max-bytes",
                "65536",
            ])
            .arg("--agent-state-dir")
            .arg(node.root().join("agent"))
            .arg("--log-file")
            .arg(node.root().join("agent.jsonl"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap();
        Agent {
            installer: None,
            child,
            log,
        }
    }

    /// What the agent wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Both processes SIGKILLed.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        for c in std::iter::once(&mut self.child).chain(self.installer.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `podgate inspect --unguarded` for `node`: the runtime at `endpoint`,
/// the installer's history in `installer`, the guard's entry from
/// `plugins`.
pub fn inspect_unguarded(endpoint: &str, installer: &Path, plugins: &Path) -> std::process::Output {
    crate::podgate_command()
        .args(["inspect", "--unguarded", "--runtime-endpoint", endpoint])
        .arg("--installer-state-dir")
        .arg(installer)
        .arg("--plugins")
        .arg(plugins)
        .output()
        .unwrap()
}

/// One `GET /metrics` from inside the node netns; None unless it answers 200.
pub fn scrape(node: &TestNode) -> Option<String> {
    match http_get(
        &node.ns,
        "127.0.0.1",
        METRICS_PORT,
        "/metrics",
        Duration::from_secs(5),
    ) {
        Ok((200, body)) => Some(body),
        _ => None,
    }
}

/// Scrape until `want` holds (the agent collects every second); panics
/// after 60 s with the last scrape and the agent's log.
pub fn wait_for(node: &TestNode, agent: &Agent, what: &str, want: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(60) {
        if let Some(b) = scrape(node) {
            if want(&b) {
                return b;
            }
            last = b;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!(
        "timed out waiting for {what}\n--- last /metrics ---\n{last}\n--- agent log ---\n{}",
        agent.log()
    );
}

/// The installer's `runtime-chain.json` (in `<root>/installer`) once
/// `done` holds for it; panics after `within`, saying `what` was awaited,
/// with the file and the installer's stderr (`log`).
pub fn history_until(
    node: &TestNode,
    log: &Path,
    within: Duration,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let path = node.root().join("installer").join("runtime-chain.json");
    let deadline = Instant::now() + within;
    loop {
        let h: Option<serde_json::Value> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(h) = h.filter(|h| done(h)) {
            return h;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {}: {:?}\n{}",
            path.display(),
            std::fs::read_to_string(&path),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
