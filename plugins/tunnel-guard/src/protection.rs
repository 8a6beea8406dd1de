//! The agent's public node interface (`pkg/ipsec/protection_endpoint.go`):
//! `--protection-dir` (default `/run/kube-ovn-ipsec-protection`), a root-owned
//! 0750 directory holding `protection.sock` (0660, HTTP) and the durable
//! intent file `required` (`agent_protection.go` `ensureProtection`).
//!
//! `GET /armed?ovs-uuid=<Open_vSwitch _uuid>` is 200 (empty body) only while
//! the agent's live readback of its guards and of OVSDB passes for that
//! database; `GET /startup?ovs-uuid=` is 200 only during the controller's
//! initial preparation. Like the agent's own client
//! (`checkProtectionEndpoint`), the guard refuses a server whose
//! `SO_PEERCRED` uid is not 0; before connecting it also refuses a path that
//! is not a root-owned socket in a root-owned directory no one else may write.

use crate::io::{self, Deadline, IoError};
use nix::sys::socket::{getsockopt, sockopt};
use serde::Serialize;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

pub const SOCKET: &str = "protection.sock";
pub const REQUIRED_FILE: &str = "required";
/// What the agent writes into `required` (the version of the OVN extension).
pub const REQUIRED_CONTENT: &str = "IPsec output protection version 1\n";

/// Whether a path exists, without following a final symlink. Only "no such
/// file" is absence: any other error (e.g. EACCES) counts as present, so it
/// cannot turn `required: auto` into "not required" (fail closed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Presence {
    Absent,
    Present,
    Unreadable(String),
}

impl Presence {
    pub fn of(path: &Path) -> Presence {
        match path.symlink_metadata() {
            Ok(_) => Presence::Present,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Presence::Absent,
            Err(e) => Presence::Unreadable(e.to_string()),
        }
    }

    pub fn exists(&self) -> bool {
        *self != Presence::Absent
    }
}

/// Why the protection directory or its socket is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum EndpointRefused {
    #[error("protection directory {}: {source}", .path.display())]
    DirUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("protection directory {} is a symlink", .0.display())]
    DirSymlink(PathBuf),
    #[error("protection directory {} is not a directory", .0.display())]
    NotDir(PathBuf),
    #[error("protection directory {} is owned by uid {uid}, not root", .path.display())]
    DirOwner { path: PathBuf, uid: u32 },
    #[error("protection directory {} is group/other-writable (mode {mode:04o})", .path.display())]
    DirWritable { path: PathBuf, mode: u32 },
    #[error("{}: {source}", .path.display())]
    SocketUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is a symlink, not the agent's socket", .0.display())]
    SocketSymlink(PathBuf),
    #[error("{} is not a socket", .0.display())]
    NotSocket(PathBuf),
    #[error("{} is owned by uid {uid}, not root", .path.display())]
    SocketOwner { path: PathBuf, uid: u32 },
    #[error("{} is writable by others (mode {mode:04o})", .path.display())]
    SocketWritable { path: PathBuf, mode: u32 },
}

/// The directory must be a real directory owned by root with no group or
/// other write bit (the agent creates it 0750 and refuses anything looser).
pub fn check_dir(dir: &Path) -> Result<(), EndpointRefused> {
    let path = dir.to_path_buf();
    let md = match dir.symlink_metadata() {
        Ok(md) => md,
        Err(source) => return Err(EndpointRefused::DirUnreadable { path, source }),
    };
    if md.file_type().is_symlink() {
        return Err(EndpointRefused::DirSymlink(path));
    }
    if !md.is_dir() {
        return Err(EndpointRefused::NotDir(path));
    }
    if md.uid() != 0 {
        let uid = md.uid();
        return Err(EndpointRefused::DirOwner { path, uid });
    }
    if md.mode() & 0o022 != 0 {
        let mode = md.mode() & 0o7777;
        return Err(EndpointRefused::DirWritable { path, mode });
    }
    Ok(())
}

/// The socket must be a socket (not a symlink, not a regular file) owned by
/// root and not writable by others. Group write is accepted: the agent makes
/// it 0660 for its own group (Kube-OVN's manifests run it with group 65534 so
/// the OVS and CNI pods can connect), and connecting is all group write
/// grants; replacing the socket needs write on the directory, which is
/// checked, and the server itself is proven by `SO_PEERCRED`.
pub fn check_socket(socket: &Path) -> Result<(), EndpointRefused> {
    let path = socket.to_path_buf();
    let md = match socket.symlink_metadata() {
        Ok(md) => md,
        Err(source) => return Err(EndpointRefused::SocketUnreadable { path, source }),
    };
    let ft = md.file_type();
    if ft.is_symlink() {
        return Err(EndpointRefused::SocketSymlink(path));
    }
    if !ft.is_socket() {
        return Err(EndpointRefused::NotSocket(path));
    }
    if md.uid() != 0 {
        let uid = md.uid();
        return Err(EndpointRefused::SocketOwner { path, uid });
    }
    if md.mode() & 0o002 != 0 {
        let mode = md.mode() & 0o7777;
        return Err(EndpointRefused::SocketWritable { path, mode });
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum ProtectionError {
    #[error("{0}")]
    Io(#[from] IoError),
    #[error("protection.sock is served by uid {0}, not root (SO_PEERCRED)")]
    NotRoot(u32),
    #[error("protection.sock peer credentials: {0}")]
    PeerCred(nix::errno::Errno),
}

/// The two endpoints the guard asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    Armed,
    Startup,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Armed => "/armed",
            Endpoint::Startup => "/startup",
        }
    }
}

/// The agent's answer: status code and the first line of its body
/// (`http.Error` text such as `IPsec protection is not armed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Answer {
    pub code: u16,
    pub text: String,
}

/// `GET <endpoint>?ovs-uuid=<uuid>` on `socket`, after the peer-credential
/// check. `uuid` must already be a validated OVSDB UUID (no escaping needed).
pub fn ask(
    socket: &Path,
    endpoint: Endpoint,
    uuid: &str,
    dl: &Deadline,
) -> Result<Answer, ProtectionError> {
    let s = io::connect(socket, dl)?;
    let cred = getsockopt(&s, sockopt::PeerCredentials).map_err(ProtectionError::PeerCred)?;
    if cred.uid() != 0 {
        return Err(ProtectionError::NotRoot(cred.uid()));
    }
    let target = format!("{}?ovs-uuid={uuid}", endpoint.path());
    let (code, body) = crate::http::get(s, &target, dl)?;
    let text: String = String::from_utf8_lossy(&body)
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .take(120)
        .collect();
    Ok(Answer { code, text })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh directory, removed with the returned guard.
    fn tmp(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let t = tempfile::Builder::new()
            .prefix(&format!("pg-prot-{name}-"))
            .tempdir()
            .unwrap();
        let d = t.path().to_path_buf();
        (t, d)
    }

    #[test]
    fn a_missing_path_is_absent_and_a_dangling_symlink_exists() {
        let (_tmp, d) = tmp("presence");
        assert_eq!(Presence::of(&d.join("nope")), Presence::Absent);
        std::os::unix::fs::symlink("/nonexistent/x", d.join("dangling")).unwrap();
        assert!(Presence::of(&d.join("dangling")).exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn asks_with_the_uuid_and_reads_the_agents_answer() {
        use std::io::{Read, Write};
        let (_tmp, d) = tmp("ask");
        let sock = d.join(SOCKET);
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for body in ["", "IPsec protection is not armed\n"] {
                let (mut c, _) = listener.accept().unwrap();
                let mut req = [0u8; 1024];
                let n = c.read(&mut req).unwrap();
                seen.push(
                    String::from_utf8_lossy(&req[..n])
                        .lines()
                        .next()
                        .unwrap()
                        .to_string(),
                );
                let code = if body.is_empty() {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let resp = format!(
                    "HTTP/1.1 {code}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                c.write_all(resp.as_bytes()).unwrap();
            }
            seen
        });
        let dl = Deadline::after(std::time::Duration::from_secs(2));
        let uuid = "0d9a3c5e-1b2f-4c6d-8e7f-9a0b1c2d3e4f";
        let peer_ok = nix::unistd::geteuid().is_root();
        let a = ask(&sock, Endpoint::Armed, uuid, &dl);
        let b = ask(&sock, Endpoint::Startup, uuid, &dl);
        if peer_ok {
            assert_eq!(
                a.unwrap(),
                Answer {
                    code: 200,
                    text: String::new()
                }
            );
            let b = b.unwrap();
            assert_eq!(
                (b.code, b.text.as_str()),
                (503, "IPsec protection is not armed")
            );
            let seen = server.join().unwrap();
            assert_eq!(
                seen,
                [
                    format!("GET /armed?ovs-uuid={uuid} HTTP/1.1"),
                    format!("GET /startup?ovs-uuid={uuid} HTTP/1.1"),
                ]
            );
        } else {
            // Not root: this very server is not root either, so it is refused.
            assert!(matches!(a, Err(ProtectionError::NotRoot(_))), "{a:?}");
            drop(server);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_root_owned_paths_without_write_for_others_pass_the_endpoint_checks() {
        // File ownership: the assertions mean something only as root (CI).
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root: the endpoint checks want root-owned files"
        );
        let (_tmp, d) = tmp("modes");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o750)).unwrap();
        check_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(check_dir(&d)
            .unwrap_err()
            .to_string()
            .contains("group/other-writable"));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o750)).unwrap();
        let sock = d.join(SOCKET);
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o660)).unwrap();
        check_socket(&sock).unwrap();
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(check_socket(&sock)
            .unwrap_err()
            .to_string()
            .contains("writable by others"));
        let file = d.join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(check_socket(&file)
            .unwrap_err()
            .to_string()
            .contains("is not a socket"));
        let link = d.join("link");
        std::os::unix::fs::symlink(&sock, &link).unwrap();
        assert!(check_socket(&link)
            .unwrap_err()
            .to_string()
            .contains("is a symlink"));
        assert!(check_dir(&file)
            .unwrap_err()
            .to_string()
            .contains("not a directory"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
