//! The node agent's HTTP endpoint under a pod that tries to starve it, run
//! against the real `podgate agent` in a test node netns, bound to the
//! node's address on a veth to a test pod netns (as the DaemonSet binds
//! `$(HOST_IP)`): from the pod, idle connections held open, request heads
//! sent a byte at a time, and a flood of connections past the cap. A scrape
//! from the node must answer within a second throughout, and the agent's
//! open file descriptors must stay bounded by its connection cap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::{bin_dir, http_get, in_netns, require_root, Netns, TempDir};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PORT: u16 = 9750;
const NODE_IP: [u8; 4] = [10, 250, 0, 1];
const POD_IP: &str = "10.250.0.2/24";
/// The agent's connection cap (`metrics::http::LIMITS.max_connections`).
const CAP: usize = 64;
/// The agent's descriptors besides its connections: stdio, the listener,
/// the runtime's epoll/eventfd/signal pipe, the worker's transient files
/// and netlink sockets. Generous: the point is that 200 or thousands of
/// clients do not show up here.
const OTHER_FDS: usize = 32;
const SCRAPE_WITHIN: Duration = Duration::from_secs(1);

/// One test at a time: each measures how fast the agent answers, and
/// siblings flooding at once on a two-core CI machine would measure the
/// machine instead.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn addr() -> SocketAddr {
    SocketAddr::from((NODE_IP, PORT))
}

/// `podgate agent` in its own node netns, on empty CNI dirs (readiness 0,
/// no records: the endpoint is what is under test), and a pod netns
/// wired to the node by a veth. SIGKILLed on drop.
struct Agent {
    ns: Netns,
    pod: Netns,
    child: Child,
    _dir: TempDir,
    _alone: std::sync::MutexGuard<'static, ()>,
}

/// A node netns and a pod netns joined by a veth (node 10.250.0.1/24, pod
/// 10.250.0.2/24).
fn node_and_pod(name: &str) -> (Netns, Netns) {
    let ns = Netns::new(name);
    let pod = Netns::new(&format!("{name}-pod"));
    let node_ip = std::net::Ipv4Addr::from(NODE_IP);
    ns.sh_ok(&format!(
        "ip link add pgab0 type veth peer name eth0 netns {pod} && \
         ip addr add {node_ip}/24 dev pgab0 && ip link set pgab0 up && \
         ip -n {pod} addr add {POD_IP} dev eth0 && ip -n {pod} link set eth0 up",
        pod = pod.name()
    ));
    (ns, pod)
}

impl Agent {
    fn start(name: &str) -> Agent {
        let alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        podgate_integration::built(&["podgate"], &["-p", "podgate"]);
        let (ns, pod) = node_and_pod(name);
        let dir = TempDir::new(name);
        let d = dir.path();
        let mut cmd = ns.command(bin_dir().join("podgate").to_str().unwrap());
        cmd.args(["agent", "--metrics-address", &addr().to_string()])
            .args(["--metrics-interval-secs", "1", "--sweep-secs", "0"]);
        for (flag, sub) in [
            ("--cni-conf-dir", "net.d"),
            ("--cni-bin-dir", "bin"),
            ("--state-dir", "installer"),
            ("--plugins", "plugins.json"),
            ("--agent-state-dir", "agent"),
            ("--router-state-dir", "state"),
        ] {
            cmd.arg(flag).arg(d.join(sub));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let agent = Agent {
            ns,
            pod,
            child,
            _dir: dir,
            _alone: alone,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while agent.get("/healthz").map(|(s, _)| s) != Some(200) {
            assert!(Instant::now() < deadline, "the agent never became healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
        agent
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        let ip = std::net::Ipv4Addr::from(NODE_IP).to_string();
        http_get(&self.ns, &ip, PORT, path, SCRAPE_WITHIN).ok()
    }

    /// A scrape, answered with the metrics within [`SCRAPE_WITHIN`].
    fn assert_scrape(&self, during: &str) {
        let start = Instant::now();
        let got = self.get("/metrics");
        let took = start.elapsed();
        match got {
            Some((200, body)) if body.contains("\npodgate_install_ready 0\n") => {}
            other => panic!(
                "{during}: scrape after {took:?}: {other:?}\n{}",
                self.listen_drops()
            ),
        }
        assert!(
            took < SCRAPE_WITHIN,
            "{during}: scrape took {took:?}\n{}",
            self.listen_drops()
        );
    }

    /// The node netns's counters of SYNs dropped for a full accept queue
    /// (a scrape's dropped SYN is retried only after a second).
    fn listen_drops(&self) -> String {
        let out = self
            .ns
            .exec(&["nstat", "-az", "TcpExtListenOverflows", "TcpExtListenDrops"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count()
    }

    fn assert_fds_bounded(&self, during: &str) -> usize {
        let n = self.fds();
        assert!(
            n <= CAP + OTHER_FDS,
            "{during}: the agent has {n} descriptors open (cap {CAP} + {OTHER_FDS})"
        );
        n
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `n` connections to the agent opened from inside `ns`.
fn connect(ns: &Netns, n: usize) -> Vec<TcpStream> {
    in_netns(ns.path().to_path_buf(), move || {
        (0..n)
            .map(|_| TcpStream::connect_timeout(&addr(), Duration::from_secs(2)))
            .collect()
    })
    .unwrap()
}

#[test]
fn a_scrape_answers_within_a_second_while_200_idle_connections_are_held_open() {
    require_root();
    let agent = Agent::start("mab-idle");
    let idle = connect(&agent.pod, 200);
    std::thread::sleep(Duration::from_millis(300));
    for round in 0..5 {
        agent.assert_scrape(&format!("200 idle connections, scrape {round}"));
        agent.assert_fds_bounded("200 idle connections");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(agent.get("/healthz").map(|(s, _)| s), Some(200));
    drop(idle);
}

#[test]
fn a_scrape_answers_within_a_second_while_clients_send_their_heads_a_byte_at_a_time() {
    require_root();
    let agent = Agent::start("mab-slow");
    let mut slow = connect(&agent.pod, 100);
    let head = b"GET /metrics HTTP/1.1\r\nHost: agent\r\nX-Pad: ";
    // A byte every 200 ms for 6 s: past the agent's 5 s header timeout.
    let start = Instant::now();
    for round in 0..30 {
        let byte = [head.get(round).copied().unwrap_or(b'a')];
        for s in &mut slow {
            let _ = s.write_all(&byte);
        }
        if round % 2 == 0 {
            agent.assert_scrape(&format!("slow clients, {:?} in", start.elapsed()));
            agent.assert_fds_bounded("slow clients");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every slow client was closed: taken over at the cap or timed out.
    for (i, s) in slow.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = Vec::new();
        let closed = match s.read_to_end(&mut buf) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        let answer = String::from_utf8_lossy(&buf);
        assert!(
            closed && !answer.contains(" 200 OK"),
            "slow client {i} still open or answered after {:?}: {answer}",
            start.elapsed()
        );
    }
    agent.assert_scrape("after the slow clients");
}

#[test]
fn a_scrape_answers_within_a_second_during_a_flood_of_connections_past_the_cap() {
    require_root();
    let agent = Agent::start("mab-flood");
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    // Two flooders, each holding up to 150 connections (4.5x the cap in
    // all, plus the churn), for at most 4 s or 10000 connections each.
    let flooders: Vec<_> = (0..2)
        .map(|_| {
            let (ns, stop, opened) = (agent.pod.path().to_path_buf(), stop.clone(), opened.clone());
            std::thread::spawn(move || {
                in_netns(ns, move || {
                    let mut held = std::collections::VecDeque::new();
                    let until = Instant::now() + Duration::from_secs(4);
                    for _ in 0..10000 {
                        if stop.load(Ordering::Relaxed) || Instant::now() > until {
                            break;
                        }
                        if let Ok(s) = TcpStream::connect_timeout(&addr(), Duration::from_secs(1)) {
                            opened.fetch_add(1, Ordering::Relaxed);
                            held.push_back(s);
                        }
                        if held.len() > 150 {
                            held.pop_front();
                        }
                    }
                    Ok(())
                })
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut most = 0;
    for round in 0..10 {
        agent.assert_scrape(&format!("flood, scrape {round}"));
        most = most.max(agent.assert_fds_bounded("flood"));
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap().unwrap();
    }
    let opened = opened.load(Ordering::Relaxed);
    assert!(
        opened > 4 * CAP,
        "the flood opened only {opened} connections: not past the cap"
    );
    eprintln!("flood: {opened} connections, at most {most} agent descriptors");
    agent.assert_scrape("after the flood");
    assert_eq!(agent.get("/healthz").map(|(s, _)| s), Some(200));
}

#[test]
fn the_agent_stops_on_sigterm_within_its_grace_even_with_connections_open() {
    require_root();
    let mut agent = Agent::start("mab-term");
    let _idle = connect(&agent.pod, 20);
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill(2) of the child we spawned.
    assert_eq!(
        unsafe { libc::kill(agent.child.id() as i32, libc::SIGTERM) },
        0
    );
    let start = Instant::now();
    let status = loop {
        if let Some(s) = agent.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "still running 5 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}
