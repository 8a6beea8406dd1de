//! The sysctl broker: one process that holds a writable `/proc/sys/net`
//! and opens a `net.*` sysctl for writing, in the network namespace of the
//! asking thread, only where that is a pod's sysctl or one the caller's
//! policy names for the broker's own (the node's) namespace.
//!
//! A node agent in a container has `/proc/sys` read-only; a writable mount
//! of the node's `/proc/sys/net` in the agent itself would let the agent
//! write any knob of the node's namespace, including the ones that exist
//! only there (`net.core.bpf_jit_harden`, `rmem_max`). So the writable
//! mount lives in another container, the broker, and the agent asks it:
//!
//! * **Request**: the sysctl's name (`{"name": "net.ipv4.ip_forward"}`) and,
//!   as `SCM_RIGHTS`, the asking thread's netns (`/proc/thread-self/ns/net`,
//!   opened after it entered the pod's namespace).
//! * **Answer**: `{"ok": true}` with the sysctl file opened read-write in
//!   that namespace (`SCM_RIGHTS`: a /proc/sys file keeps writing the value
//!   of the namespace it was opened in, whoever writes it later), or
//!   `{"refused": why}`, or `{"errno": n}` when opening failed.
//!
//! One request per connection; the client shuts its side down after the
//! request and the broker closes after the answer. The broker enters the
//! namespace it was given (`setns`) on its own thread and comes back, so a
//! namespace is the kernel's answer, never the client's word: the node's
//! namespace is recognised by its identity (the broker's own), and a
//! knob that exists only in the node's namespace does not exist in any
//! other.

use super::{path_under, SysctlFile};
use crate::error::{Error, Result};
use crate::netns::NetNs;
use nix::sys::socket::{
    recvmsg, sendmsg, shutdown, ControlMessage, ControlMessageOwned, MsgFlags, Shutdown,
};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The calling thread's network namespace.
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";
/// Bound on a request or an answer.
const MAX_MESSAGE: usize = 4096;
/// Bound on one exchange, either side: a wedged peer is an error.
const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    name: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refused: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    errno: Option<i32>,
}

fn io_err(e: nix::errno::Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Takes ownership of every fd a message carried: the first is returned,
/// the others are closed.
fn take_fds(msg_cmsgs: impl Iterator<Item = ControlMessageOwned>) -> Option<OwnedFd> {
    let mut fds = msg_cmsgs
        .filter_map(|c| match c {
            ControlMessageOwned::ScmRights(fds) => Some(fds),
            _ => None,
        })
        .flatten()
        // SAFETY: SCM_RIGHTS just installed these descriptors in this
        // process for this message; nothing else refers to them.
        .map(|fd: RawFd| unsafe { OwnedFd::from_raw_fd(fd) });
    let first = fds.next();
    fds.for_each(drop);
    first
}

/// One message: its bytes (at most [`MAX_MESSAGE`], the rest read until the
/// peer's EOF) and the first fd it carried.
fn receive(stream: &UnixStream) -> io::Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut cmsg = nix::cmsg_space!([RawFd; 2]);
    let (n, fd) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(io_err)?;
        let fd = take_fds(msg.cmsgs().map_err(io_err)?);
        (msg.bytes, fd)
    };
    buf.truncate(n);
    let mut rest = Vec::new();
    stream
        .take((MAX_MESSAGE + 1 - n) as u64)
        .read_to_end(&mut rest)?;
    buf.extend(rest);
    if buf.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message too long",
        ));
    }
    Ok((buf, fd))
}

fn send(stream: &UnixStream, bytes: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let fds: Vec<RawFd> = fd.into_iter().collect();
    let cmsgs: Vec<ControlMessage> = match fds.is_empty() {
        true => Vec::new(),
        false => vec![ControlMessage::ScmRights(&fds)],
    };
    let sent = sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io_err)?;
    if sent != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    shutdown(stream.as_raw_fd(), Shutdown::Write).map_err(io_err)
}

fn connect(socket: &Path) -> io::Result<UnixStream> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    Ok(stream)
}

/// Client: sysctl `name` of the calling thread's namespace, opened for
/// writing by the broker listening on `socket`.
pub fn open_rw(socket: &Path, name: &str) -> Result<File> {
    let transport = |source: io::Error| Error::Sysctl {
        name: name.to_string(),
        op: "open through the sysctl broker",
        source,
    };
    let ns = File::open(THREAD_NETNS).map_err(transport)?;
    let stream = connect(socket).map_err(|e| {
        transport(io::Error::new(
            e.kind(),
            format!("connecting to {}: {e}", socket.display()),
        ))
    })?;
    let request = serde_json::to_vec(&Request { name: name.into() })
        .map_err(|e| transport(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    send(&stream, &request, Some(ns.as_raw_fd())).map_err(transport)?;
    let (bytes, fd) = receive(&stream).map_err(transport)?;
    let answer: Answer = serde_json::from_slice(&bytes)
        .map_err(|e| transport(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    match (answer, fd) {
        (Answer { ok: true, .. }, Some(fd)) => Ok(File::from(fd)),
        (
            Answer {
                refused: Some(why), ..
            },
            _,
        ) => Err(Error::SysctlRefused {
            name: name.to_string(),
            msg: format!("the sysctl broker refused: {why}"),
        }),
        (
            Answer {
                errno: Some(errno), ..
            },
            _,
        ) => Err(Error::Sysctl {
            name: name.to_string(),
            op: "open (by the sysctl broker)",
            source: io::Error::from_raw_os_error(errno),
        }),
        _ => Err(transport(io::Error::new(
            io::ErrorKind::InvalidData,
            "answer without a file or a reason",
        ))),
    }
}

/// What the broker did with one request, for its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Opened and handed over; `node`: in the broker's own namespace.
    Granted { name: String, node: bool },
    /// Refused by the rules (named in `why`).
    Refused { name: String, why: String },
    /// The request could not be read or answered, or the open failed.
    Failed(String),
}

/// The broker's side: where the writable `/proc/sys` is, its own (the
/// node's) namespace, and which sysctls may be opened there.
pub struct Broker {
    root: PathBuf,
    node: NetNs,
    node_allowed: fn(&str) -> bool,
}

impl Broker {
    /// `root`: a writable procfs `sys` dir (`DIR/net/...`); the node's
    /// namespace is the calling thread's; `node_allowed` says which
    /// sysctls may be opened in it.
    pub fn new(root: PathBuf, node_allowed: fn(&str) -> bool) -> Result<Broker> {
        Ok(Broker {
            root,
            node: NetNs::current()?,
            node_allowed,
        })
    }

    /// Answer the one request of `stream`.
    pub fn serve(&self, stream: UnixStream) -> Outcome {
        let _ = stream.set_read_timeout(Some(TIMEOUT));
        let _ = stream.set_write_timeout(Some(TIMEOUT));
        let (bytes, ns) = match receive(&stream) {
            Ok(m) => m,
            Err(e) => return Outcome::Failed(format!("reading a request: {e}")),
        };
        let (answer, file, outcome) = self.answer(&bytes, ns);
        if let Err(e) = send(
            &stream,
            &serde_json::to_vec(&answer).unwrap_or_default(),
            file.as_ref().map(AsRawFd::as_raw_fd),
        ) {
            return Outcome::Failed(format!("answering: {e}"));
        }
        outcome
    }

    fn answer(&self, bytes: &[u8], ns: Option<OwnedFd>) -> (Answer, Option<File>, Outcome) {
        let refuse = |name: &str, why: String| {
            (
                Answer {
                    refused: Some(why.clone()),
                    ..Answer::default()
                },
                None,
                Outcome::Refused {
                    name: name.into(),
                    why,
                },
            )
        };
        let name = match serde_json::from_slice::<Request>(bytes) {
            Ok(r) => r.name,
            Err(e) => return refuse("?", format!("not a request: {e}")),
        };
        let Some(ns) = ns else {
            return refuse(&name, "no network namespace passed with the request".into());
        };
        let path = match path_under(&self.root, &name) {
            Ok(p) => p,
            Err(e) => return refuse(&name, e.to_string()),
        };
        let ns = match NetNs::open(Path::new(&format!("/proc/self/fd/{}", ns.as_raw_fd()))) {
            Ok(n) => n,
            Err(e) => return refuse(&name, e.to_string()),
        };
        let node = ns.same_as(&self.node);
        if node && !(self.node_allowed)(&name) {
            return refuse(
                &name,
                "not a sysctl podgate writes in the node's network namespace (only a pod's own namespace takes any net.* sysctl)".into(),
            );
        }
        let opened = ns.open_in(|| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(&path)
        });
        match opened {
            Ok(Ok(file)) => (
                Answer {
                    ok: true,
                    ..Answer::default()
                },
                Some(file),
                Outcome::Granted { name, node },
            ),
            Ok(Err(e)) => {
                let failed = format!("opening {name}: {e}");
                (
                    Answer {
                        errno: Some(e.raw_os_error().unwrap_or(libc::EIO)),
                        ..Answer::default()
                    },
                    None,
                    Outcome::Failed(failed),
                )
            }
            Err(e) => refuse(&name, e.to_string()),
        }
    }
}

impl SysctlFile {
    /// [`SysctlFile::open`] through the broker at `socket`: read-only here
    /// (the sysctl must exist in this namespace), read-write from the
    /// broker; a refusal leaves it read-only, the reason kept for a write.
    pub(super) fn open_brokered(
        socket: &Path,
        name: &str,
        netns: &str,
        here: &Path,
    ) -> Result<SysctlFile> {
        let local = File::open(here).map_err(|source| Error::Sysctl {
            name: format!("{name} in netns {netns}"),
            op: "open",
            source,
        })?;
        let (file, refused) = match open_rw(socket, name) {
            Ok(f) => (f, None),
            Err(Error::SysctlRefused { msg, .. }) => (local, Some(msg)),
            Err(e) => (local, Some(e.to_string())),
        };
        Ok(SysctlFile {
            name: name.to_string(),
            netns: netns.to_string(),
            writable: refused.is_none(),
            refused,
            file,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::NamedNetns;
    use std::os::unix::fs::FileExt;
    use std::os::unix::net::UnixListener;

    fn value_in(ns: &NetNs, name: &str) -> String {
        ns.open_in(|| super::super::read(name).unwrap()).unwrap()
    }

    #[test]
    fn a_pods_sysctl_opens_in_its_netns_and_the_nodes_only_where_allowed() {
        let node = NamedNetns::add("broker-node");
        let pod = NamedNetns::add("broker-pod");
        let node_ns = NetNs::open(Path::new(&node.0)).unwrap();
        let pod_ns = NetNs::open(Path::new(&pod.0)).unwrap();
        let (_tmp, dir) = crate::testing::scratch_dir("pg-kit-broker-");
        let socket = dir.join("broker.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let node_path = node.0.clone();
        const REQUESTS: usize = 7;
        // The broker's thread stays in the "node" netns.
        let server = std::thread::spawn(move || {
            let f = File::open(&node_path).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let b = Broker::new(PathBuf::from("/proc/sys"), |n| {
                n == "net.ipv4.tcp_early_demux"
            })
            .unwrap();
            (0..REQUESTS)
                .map(|_| b.serve(listener.accept().unwrap().0))
                .collect::<Vec<_>>()
        });
        let ask = |ns: &NetNs, name: &str| ns.open_in(|| open_rw(&socket, name)).unwrap();

        // A pod's: any net.* sysctl, written in the pod's own netns.
        let f = ask(&pod_ns, "net.ipv4.ip_forward").unwrap();
        f.write_all_at(b"1", 0).unwrap();
        assert_eq!(value_in(&pod_ns, "net.ipv4.ip_forward"), "1");
        assert_eq!(value_in(&node_ns, "net.ipv4.ip_forward"), "0");
        // The node's: only what the rule allows.
        for name in ["net.ipv4.ip_forward", "net.core.somaxconn"] {
            let e = ask(&node_ns, name).unwrap_err();
            assert!(matches!(e, Error::SysctlRefused { .. }), "{name}: {e}");
        }
        let before = value_in(&node_ns, "net.ipv4.tcp_early_demux");
        let f = ask(&node_ns, "net.ipv4.tcp_early_demux").unwrap();
        f.write_all_at(if before == "1" { b"0" } else { b"1" }, 0)
            .unwrap();
        assert_ne!(value_in(&node_ns, "net.ipv4.tcp_early_demux"), before);
        // Not net.*: refused; missing in this netns: the kernel's ENOENT.
        let e = ask(&pod_ns, "kernel.pid_max").unwrap_err();
        assert!(matches!(e, Error::SysctlRefused { .. }), "{e}");
        let e = ask(&pod_ns, "net.ipv4.conf.nosuch0.rp_filter").unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOENT), "{e}");
        // A request without a namespace: refused.
        let s = connect(&socket).unwrap();
        send(&s, br#"{"name": "net.ipv4.ip_forward"}"#, None).unwrap();
        let (answer, fd) = receive(&s).unwrap();
        assert!(fd.is_none());
        assert!(String::from_utf8_lossy(&answer).contains("no network namespace"));

        let outcomes = server.join().unwrap();
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| matches!(o, Outcome::Granted { node: true, .. }))
                .count(),
            1,
            "{outcomes:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
