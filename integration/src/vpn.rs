//! The "OpenVPN pod forwards nothing" scenario (forwarding off in the VPN
//! pod's own netns) as reusable pieces: a VPN client
//! outside the cluster (its own netns, linked to the node by a veth), a
//! static key, and `openvpn` processes on both ends (Debian's `openvpn`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use crate::{Netns, TestNode};

/// The client's uplink address and the node's side of it.
pub const NODE_UPLINK_IP: &str = "192.168.77.1";
pub const CLIENT_UPLINK_IP: &str = "192.168.77.2";
/// The tunnel: the server (the VPN pod) holds .1, the client .2.
pub const TUN_SERVER_IP: &str = "10.8.0.1";
pub const TUN_CLIENT_IP: &str = "10.8.0.2";
pub const CLIENT_POOL: &str = "10.8.0.0/24";
pub const OPENVPN_PORT: u16 = 1194;

pub struct VpnClient {
    pub client: Netns,
    /// Static key shared by server and client; logs are written beside it.
    pub key: PathBuf,
}

/// A client netns linked to `node` (`192.168.77.2` ↔ node `192.168.77.1`);
/// it reaches the server through the node's hostPort.
pub fn client(node: &TestNode, ifname_tag: &str) -> VpnClient {
    let client = Netns::new("vpnclient");
    client.set_forwarding(false);
    let host_if = format!("pg{}{}", ifname_tag, std::process::id() % 100_000);
    let host_if: String = host_if.chars().take(15).collect();
    node.ns.exec_ok(&[
        "ip",
        "link",
        "add",
        &host_if,
        "type",
        "veth",
        "peer",
        "name",
        "uplink0",
        "netns",
        client.name(),
    ]);
    node.ns.exec_ok(&[
        "ip",
        "addr",
        "add",
        &format!("{NODE_UPLINK_IP}/24"),
        "dev",
        &host_if,
    ]);
    node.ns.exec_ok(&["ip", "link", "set", &host_if, "up"]);
    client.exec_ok(&[
        "ip",
        "addr",
        "add",
        &format!("{CLIENT_UPLINK_IP}/24"),
        "dev",
        "uplink0",
    ]);
    client.exec_ok(&["ip", "link", "set", "uplink0", "up"]);
    let key = node.root().join("static.key");
    let out = Command::new("openvpn")
        .args(["--genkey", "secret"])
        .arg(&key)
        .output()
        .expect("running openvpn --genkey (apt-get install openvpn)");
    assert!(out.status.success(), "openvpn --genkey: {out:?}");
    VpnClient { client, key }
}

fn log_path(key: &Path, server: bool) -> PathBuf {
    key.with_file_name(if server { "server.log" } else { "client.log" })
}

/// The server (in the VPN pod): `--ifconfig 10.8.0.1 10.8.0.2`, port 1194.
pub fn server(ns: &Netns, key: &Path) -> Child {
    spawn(ns, key, true, 0, &[], &[])
}

/// [`server`] with extra `openvpn` options (e.g. `["--mssfix", "0"]`).
pub fn server_with(ns: &Netns, key: &Path, extra: &[&str]) -> Child {
    spawn(ns, key, true, 0, &[], extra)
}

/// [`server`] in a netns that is only a file (a runtime's sandbox netns):
/// `nsenter --net=<path> openvpn ...`, null stdio.
pub fn server_in(netns: &Path, key: &Path) -> Child {
    Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(openvpn_args(key, true, 0, &[], &[]))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawning nsenter openvpn")
}

/// The client: connects to the node's hostPort from local port `lport` (use a
/// fresh one per round: the node's conntrack remembers the previous server
/// pod) and routes each of `routes` (`("10.22.0.0", "255.255.0.0")`) into the
/// tunnel, as a server would push them.
pub fn connect(ns: &Netns, key: &Path, lport: u16, routes: &[(&str, &str)]) -> Child {
    spawn(ns, key, false, lport, routes, &[])
}

/// [`connect`] with extra `openvpn` options.
pub fn connect_with(
    ns: &Netns,
    key: &Path,
    lport: u16,
    routes: &[(&str, &str)],
    extra: &[&str],
) -> Child {
    spawn(ns, key, false, lport, routes, extra)
}

fn spawn(
    ns: &Netns,
    key: &Path,
    server: bool,
    lport: u16,
    routes: &[(&str, &str)],
    extra: &[&str],
) -> Child {
    let args = openvpn_args(key, server, lport, routes, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ns.spawn(&args)
}

fn openvpn_args(
    key: &Path,
    server: bool,
    lport: u16,
    routes: &[(&str, &str)],
    extra: &[&str],
) -> Vec<String> {
    let log = log_path(key, server);
    let log = log.to_str().expect("utf-8 temp path");
    let key = key.to_str().expect("utf-8 temp path");
    let port = OPENVPN_PORT.to_string();
    let lport = lport.to_string();
    // --ping keeps the static-key tunnel talking, so it comes up without traffic.
    let mut args: Vec<&str> = vec![
        "openvpn",
        "--dev",
        "tun0",
        "--secret",
        key,
        "--cipher",
        "AES-256-CBC",
        "--proto",
        "udp",
        "--ping",
        "1",
        "--verb",
        "3",
        "--log",
        log,
    ];
    if server {
        args.extend(["--ifconfig", TUN_SERVER_IP, TUN_CLIENT_IP, "--port", &port]);
    } else {
        args.extend([
            "--ifconfig",
            TUN_CLIENT_IP,
            TUN_SERVER_IP,
            "--remote",
            NODE_UPLINK_IP,
            &port,
            "--lport",
            &lport,
        ]);
        for (net, mask) in routes {
            args.extend(["--route", net, mask]);
        }
    }
    args.extend(extra);
    args.into_iter().map(String::from).collect()
}

/// Both logs, for assertion messages.
pub fn logs(key: &Path) -> String {
    format!(
        "server log:\n{}\nclient log:\n{}",
        std::fs::read_to_string(log_path(key, true)).unwrap_or_default(),
        std::fs::read_to_string(log_path(key, false)).unwrap_or_default()
    )
}

/// Polls `f` every 200 ms for up to `secs` seconds.
pub fn wait_for(mut f: impl FnMut() -> bool, secs: u64) -> bool {
    for _ in 0..secs * 5 {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// Kill and reap.
pub fn stop(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}
