//! A UDP request/answer pair, DNS-style: one datagram out, one back.
//! Same model as the TCP helpers: a thread joins the namespace to open its
//! socket, the socket stays bound there.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::tcp::in_netns;
use crate::Netns;

/// Answers every datagram with `"<netns name> <sender address>\n"`. Stops on drop.
pub struct UdpServer {
    port: u16,
    answered: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpServer {
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Datagrams answered so far (counted when the answer is sent).
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }
}

impl Drop for UdpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Listens on `bind:port` inside `ns` (port 0: any free port). Bind to a
/// specific address where the answer must come from it, as DNS servers do
/// (an answer from `0.0.0.0` takes whatever source its route picks).
pub fn udp_answer(ns: &Netns, bind: &str, port: u16) -> UdpServer {
    let name = ns.name().to_string();
    let bind: IpAddr = bind
        .parse()
        .unwrap_or_else(|e| panic!("udp_answer: bind address {bind}: {e}"));
    let sock = in_netns(ns.path().to_path_buf(), move || {
        let s = UdpSocket::bind((bind, port))?;
        s.set_read_timeout(Some(Duration::from_millis(50)))?;
        Ok(s)
    })
    .unwrap_or_else(|e| panic!("udp_answer in {name} port {port}: {e}"));
    let port = sock.local_addr().map(|a| a.port()).unwrap_or(port);
    let answered = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (answered, stop) = (answered.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !stop.load(Ordering::SeqCst) {
                if let Ok((_, peer)) = sock.recv_from(&mut buf) {
                    let text = format!("{name} {}\n", peer.ip());
                    // Counted before sending: a client that got the answer sees the count.
                    answered.fetch_add(1, Ordering::SeqCst);
                    let _ = sock.send_to(text.as_bytes(), peer);
                }
            }
        })
    };
    UdpServer {
        port,
        answered,
        stop,
        thread: Some(thread),
    }
}

/// Sends one datagram from `from` to `ip:port` and waits up to `timeout` for
/// the answer; returns it. `ip` may carry a scope (`ff02::1%eth0`, an
/// interface in `from`).
pub fn udp_request(from: &Netns, ip: &str, port: u16, timeout: Duration) -> io::Result<String> {
    let ip = ip.to_string();
    in_netns(from.path().to_path_buf(), move || {
        let addr = crate::tcp::socket_addr(&ip, port)?;
        let any: IpAddr = if addr.is_ipv6() {
            Ipv6Addr::UNSPECIFIED.into()
        } else {
            Ipv4Addr::UNSPECIFIED.into()
        };
        let s = UdpSocket::bind((any, 0))?;
        s.set_read_timeout(Some(timeout))?;
        s.send_to(b"query", addr)?;
        let mut buf = [0u8; 1500];
        let (n, _) = s.recv_from(&mut buf)?;
        Ok(String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned())
    })
}
