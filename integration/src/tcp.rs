//! Traffic helpers between harness namespaces: ping and a tiny TCP service.
//!
//! The TCP helpers need no external tool: a dedicated thread enters the
//! namespace with `setns(2)` (only that thread; the test's own threads never
//! change namespace) and opens its socket there. Sockets stay bound to the
//! namespace they were created in.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::Netns;

/// `ping -c <count>` from `from` to `ip` (IPv4 or IPv6); true if it got
/// replies (exit status 0).
pub fn ping(from: &Netns, ip: &str, count: u32) -> bool {
    from.exec(&[
        "ping",
        "-n",
        "-q",
        "-c",
        &count.to_string(),
        "-i",
        "0.2",
        "-W",
        "1",
        ip,
    ])
    .status
    .success()
}

/// Runs `f` on a fresh thread that has joined the network namespace at
/// `ns_path`. Sockets `f` opens stay in that namespace wherever they are
/// used afterwards.
pub fn in_netns<T, F>(ns_path: PathBuf, f: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> io::Result<T> + Send + 'static,
{
    std::thread::spawn(move || {
        enter_netns(&ns_path)?;
        f()
    })
    .join()
    .map_err(|_| io::Error::other("netns helper thread panicked"))?
}

fn enter_netns(ns_path: &Path) -> io::Result<()> {
    let file = File::open(ns_path)?;
    // SAFETY: setns on a valid namespace fd; affects only the calling thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A TCP server running inside a namespace. Every accepted connection gets
/// the greeting `"<netns name>\n"` and is closed. Stops on drop.
pub struct TcpServer {
    port: u16,
    greeting: String,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    /// The bound port (useful with port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the server writes to every client (`"<netns name>\n"`).
    pub fn greeting(&self) -> &str {
        &self.greeting
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Listens on `[::]:port` (dual-stack; falls back to `0.0.0.0:port`) inside
/// `ns`. Port 0 picks a free port, see [`TcpServer::port`].
pub fn tcp_listen(ns: &Netns, port: u16) -> TcpServer {
    listen(ns, port, Reply::Greeting)
}

/// Like [`tcp_listen`], but every client gets `bytes` bytes of `x` (a bulk
/// transfer: full-size segments towards the client).
pub fn tcp_listen_bulk(ns: &Netns, port: u16, bytes: usize) -> TcpServer {
    listen(ns, port, Reply::Bulk(bytes))
}

#[derive(Clone, Copy)]
enum Reply {
    Greeting,
    PeerEcho,
    Bulk(usize),
}

/// Like [`tcp_listen`], but every client is answered with the source address
/// the server saw (`"10.8.0.2\n"`): shows whether traffic was masqueraded.
pub fn tcp_listen_peer_echo(ns: &Netns, port: u16) -> TcpServer {
    listen(ns, port, Reply::PeerEcho)
}

fn listen(ns: &Netns, port: u16, reply: Reply) -> TcpServer {
    let greeting = format!("{}\n", ns.name());
    let listener = in_netns(ns.path().to_path_buf(), move || {
        let l =
            TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .unwrap_or_else(|e| panic!("tcp_listen in {} port {port}: {e}", ns.name()));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(port);
    let accepted = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (accepted, stop, greeting) = (accepted.clone(), stop.clone(), greeting.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut conn, peer)) => {
                        accepted.fetch_add(1, Ordering::SeqCst);
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
                        let text = match reply {
                            Reply::PeerEcho => {
                                let ip = match peer.ip() {
                                    std::net::IpAddr::V6(v6) => v6
                                        .to_ipv4_mapped()
                                        .map(std::net::IpAddr::V4)
                                        .unwrap_or(peer.ip()),
                                    v4 => v4,
                                };
                                format!("{ip}\n")
                            }
                            Reply::Greeting => greeting.clone(),
                            Reply::Bulk(n) => "x".repeat(n),
                        };
                        let _ = conn.write_all(text.as_bytes());
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        })
    };
    TcpServer {
        port,
        greeting,
        accepted,
        stop,
        thread: Some(thread),
    }
}

/// `ip:port` as a socket address, where `ip` may carry an IPv6 scope
/// (`fe80::1%eth0`): resolve it on a thread inside the namespace the
/// interface is in.
pub(crate) fn socket_addr(ip: &str, port: u16) -> io::Result<SocketAddr> {
    let bad = |e: String| io::Error::new(io::ErrorKind::InvalidInput, format!("{ip}: {e}"));
    let (addr, scope) = match ip.split_once('%') {
        Some((a, ifname)) => {
            let c = std::ffi::CString::new(ifname).map_err(|e| bad(e.to_string()))?;
            // SAFETY: a valid NUL-terminated name; returns 0 if unknown.
            let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
            if index == 0 {
                return Err(io::Error::last_os_error());
            }
            (a, index)
        }
        None => (ip, 0),
    };
    let addr: IpAddr = addr.parse().map_err(|e| bad(format!("{e}")))?;
    Ok(match addr {
        IpAddr::V6(v6) => SocketAddr::V6(std::net::SocketAddrV6::new(v6, port, 0, scope)),
        v4 => SocketAddr::new(v4, port),
    })
}

/// Connects from `from` to `ip:port` and reads until EOF; returns what the
/// server sent (for a [`TcpServer`]: its netns name plus newline). `ip` may
/// carry a scope (`fe80::1%eth0`, an interface in `from`).
pub fn tcp_request(from: &Netns, ip: &str, port: u16, timeout: Duration) -> io::Result<String> {
    let ip = ip.to_string();
    in_netns(from.path().to_path_buf(), move || {
        let addr = socket_addr(&ip, port)?;
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        let mut buf = String::new();
        stream.read_to_string(&mut buf)?;
        Ok(buf)
    })
}

/// Whether a TCP connection from `from` to `ip:port` is established within
/// `timeout` (nothing is read or written). `ip` may carry a scope
/// (`fe80::1%eth0`, an interface in `from`).
pub fn tcp_connect_ok(from: &Netns, ip: &str, port: u16, timeout: Duration) -> bool {
    let ip = ip.to_string();
    in_netns(from.path().to_path_buf(), move || {
        TcpStream::connect_timeout(&socket_addr(&ip, port)?, timeout).map(drop)
    })
    .is_ok()
}

/// `GET path` over HTTP/1.1 from inside `from` to `ip:port`; returns
/// `(status code, body)`. Reads until the server closes (the request says
/// `Connection: close`).
pub fn http_get(
    from: &Netns,
    ip: &str,
    port: u16,
    path: &str,
    timeout: Duration,
) -> io::Result<(u16, String)> {
    let ip: IpAddr = ip
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{ip}: {e}")))?;
    let addr = SocketAddr::new(ip, port);
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let raw = in_netns(from.path().to_path_buf(), move || {
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(request.as_bytes())?;
        let mut buf = String::new();
        stream.read_to_string(&mut buf)?;
        Ok(buf)
    })?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response");
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    Ok((status, body.to_string()))
}
