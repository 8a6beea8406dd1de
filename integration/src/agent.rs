//! The node agent, `podgate install --watch --metrics-address`, run in a
//! test node's netns, and its `/metrics` scraped from there.

use crate::{bin_dir, http_get, TestNode};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the agent serves its metrics, inside the node netns.
pub const METRICS_PORT: u16 = 9750;

/// `cmd` (the `podgate` binary) made `podgate install` for `node`: its conf
/// and bin dirs, the binaries of [`bin_dir`], `plugins` as the plugins file,
/// state in `<root>/installer`.
pub fn install<'c>(cmd: &'c mut Command, node: &TestNode, plugins: &Path) -> &'c mut Command {
    cmd.arg("install")
        .arg("--cni-conf-dir")
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

/// [`install`] with `--watch`.
pub fn install_watch<'c>(cmd: &'c mut Command, node: &TestNode, plugins: &Path) -> &'c mut Command {
    install(cmd, node, plugins).arg("--watch")
}

/// The agent in `node`'s netns; SIGKILLed on drop.
pub struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    /// Chains podgate into `node`'s conf dir from `<root>/plugins.json`
    /// (write it and the primary first), state in `<root>/installer`,
    /// metrics on 127.0.0.1:[`METRICS_PORT`] collected every second, JSON
    /// log at `<root>/agent.jsonl`, stderr in `<root>/agent.log`.
    pub fn start(node: &TestNode) -> Agent {
        let log = node.root().join("agent.log");
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut cmd = node.ns.command(bin_dir().join("podgate").to_str().unwrap());
        let child = install_watch(&mut cmd, node, &node.root().join("plugins.json"))
            // No runtime on this node: readiness is the conf dir's.
            .args(["--runtime-endpoint", "none"])
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
            .arg("--log-file")
            .arg(node.root().join("agent.jsonl"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap();
        Agent { child, log }
    }

    /// What the agent wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
