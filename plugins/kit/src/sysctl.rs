//! Namespaced sysctls through /proc/sys, read before write.
//!
//! /proc/sys/net resolves against the network namespace of the task that
//! opens the file, so callers run these inside `NetNs::run`, or open a
//! [`SysctlFile`] inside `NetNs::open_in` and use it from any thread: a
//! /proc/sys file keeps reading and writing the value of the namespace it was
//! opened in, whoever reads or writes it later.
//!
//! Reads always go through this process's /proc/sys. Writes do too, unless
//! [`use_broker`] said otherwise (the node agent, whose container's
//! /proc/sys is read-only): then the file is opened for writing by the
//! [`broker`], in the calling thread's namespace. The plugins never set it.

use crate::error::{Error, Result};
use std::fs::{self, File};
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub mod broker;

const PROC_SYS: &str = "/proc/sys";

/// The socket of the sysctl broker that opens this process's sysctl writes,
/// once [`use_broker`] set it.
static BROKER: OnceLock<PathBuf> = OnceLock::new();

/// Open every sysctl write through the [`broker`] listening on `socket`
/// from now on (once per process).
pub fn use_broker(socket: PathBuf) -> bool {
    BROKER.set(socket).is_ok()
}

/// Validate a `net.*` sysctl name and map it to its /proc/sys path.
/// Refuses anything outside `net.` (node-wide knobs such as `kernel.*` or
/// `vm.*` are not per pod), path tricks (`..`, `/`), and empty segments.
pub fn path_of(name: &str) -> Result<PathBuf> {
    path_under(Path::new(PROC_SYS), name)
}

/// [`path_of`] under `root` in place of /proc/sys (the broker's writable
/// mount).
pub fn path_under(root: &Path, name: &str) -> Result<PathBuf> {
    let refuse = |msg: &str| Error::SysctlRefused {
        name: name.to_string(),
        msg: msg.to_string(),
    };
    if name.len() > 256 {
        return Err(refuse("name too long"));
    }
    if !name.starts_with("net.") {
        return Err(refuse(
            "only namespaced net.* sysctls can be set per pod; this one is node-wide",
        ));
    }
    let segments: Vec<&str> = name.split('.').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(refuse("empty segment (\"..\" or a trailing dot)"));
    }
    if segments.iter().any(|s| {
        !s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }) {
        return Err(refuse(
            "segments may hold only letters, digits, '_' and '-' (no '/')",
        ));
    }
    let mut p = root.to_path_buf();
    p.extend(segments);
    Ok(p)
}

/// Substitute `IFNAME` segments with the pod's interface name.
pub fn expand_ifname(name: &str, ifname: &str) -> String {
    name.split('.')
        .map(|s| if s == "IFNAME" { ifname } else { s })
        .collect::<Vec<_>>()
        .join(".")
}

pub fn read(name: &str) -> Result<String> {
    let p = path_of(name)?;
    fs::read_to_string(&p)
        .map(|s| s.trim().to_string())
        .map_err(|source| Error::Sysctl {
            name: name.to_string(),
            op: "read",
            source,
        })
}

/// Write `value` unless it is already there. Returns the previous value when
/// it changed something.
pub fn ensure(name: &str, value: &str) -> Result<Option<String>> {
    let current = read(name)?;
    if normalize(&current) == normalize(value) {
        return Ok(None);
    }
    let p = path_of(name)?;
    let written = match BROKER.get() {
        Some(socket) => broker::open_rw(socket, name)?.write_all_at(value.as_bytes(), 0),
        None => fs::write(&p, value.as_bytes()),
    };
    written.map_err(|source| Error::Sysctl {
        name: name.to_string(),
        op: if source.kind() == ErrorKind::PermissionDenied {
            "write (read-only here: not namespaced, or /proc/sys mounted read-only)"
        } else {
            "write"
        },
        source,
    })?;
    Ok(Some(current))
}

/// Whether the sysctl exists in the current namespace (IPv6 may be disabled).
pub fn exists(name: &str) -> bool {
    path_of(name).is_ok_and(|p| p.exists())
}

/// One sysctl of the namespace it was opened in, readable and writable from
/// any thread (`pread`/`pwrite` at offset 0; the fd is `O_CLOEXEC`, closed
/// on drop). Opened `O_RDWR` (by the broker, with [`use_broker`]); where
/// the file is read-only (a read-only sysctl, /proc/sys mounted read-only,
/// the broker refused) it is opened for reading and a write fails as
/// [`ensure`] does.
#[derive(Debug)]
pub struct SysctlFile {
    name: String,
    netns: String,
    file: File,
    writable: bool,
    /// Why the broker did not open it for writing.
    refused: Option<String>,
}

impl SysctlFile {
    /// Open `name` in the calling thread's namespace; `netns` names that
    /// namespace in errors. A sysctl the namespace lacks (IPv6 disabled, an
    /// interface of another name in `conf/<ifname>/`) fails here with
    /// `ENOENT`, before anything was changed.
    pub fn open(name: &str, netns: &str) -> Result<SysctlFile> {
        let p = path_of(name)?;
        if let Some(socket) = BROKER.get() {
            return SysctlFile::open_brokered(socket, name, netns, &p);
        }
        let err = |op, source| Error::Sysctl {
            name: format!("{name} in netns {netns}"),
            op,
            source,
        };
        let (file, writable) = match File::options().read(true).write(true).open(&p) {
            Ok(f) => (f, true),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EACCES | libc::EROFS | libc::EPERM)
                ) =>
            {
                (File::open(&p).map_err(|e| err("open", e))?, false)
            }
            Err(e) => return Err(err("open", e)),
        };
        Ok(SysctlFile {
            name: name.to_string(),
            netns: netns.to_string(),
            file,
            writable,
            refused: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn err(&self, op: &'static str, source: io::Error) -> Error {
        Error::Sysctl {
            name: format!("{} in netns {}", self.name, self.netns),
            op,
            source,
        }
    }

    /// The current value, trimmed (`pread` from offset 0).
    pub fn read(&self) -> Result<String> {
        let mut buf = [0u8; 512];
        let mut out = Vec::new();
        loop {
            let n = self
                .file
                .read_at(&mut buf, out.len() as u64)
                .map_err(|e| self.err("read", e))?;
            out.extend_from_slice(buf.get(..n).unwrap_or(&buf));
            // /proc/sys hands out the whole (remaining) value per read: a
            // short read is the end, no second pread for EOF.
            if n < buf.len() {
                break;
            }
            if out.len() > 64 * 1024 {
                return Err(self.err("read", io::Error::from(ErrorKind::InvalidData)));
            }
        }
        String::from_utf8(out)
            .map(|s| s.trim().to_string())
            .map_err(|_| self.err("read", io::Error::from(ErrorKind::InvalidData)))
    }

    /// Write `value` (`pwrite` at offset 0), unconditionally.
    pub fn write(&self, value: &str) -> Result<()> {
        if let Some(why) = &self.refused {
            return Err(Error::SysctlRefused {
                name: format!("{} in netns {}", self.name, self.netns),
                msg: why.clone(),
            });
        }
        if !self.writable {
            return Err(self.err(
                "write (read-only here: not namespaced, or /proc/sys mounted read-only)",
                io::Error::from_raw_os_error(libc::EACCES),
            ));
        }
        self.file.write_all_at(value.as_bytes(), 0).map_err(|e| {
            let op = if e.kind() == ErrorKind::PermissionDenied {
                "write (read-only here: not namespaced, or /proc/sys mounted read-only)"
            } else {
                "write"
            };
            self.err(op, e)
        })
    }

    /// [`ensure`] through this handle: write `value` unless it is already
    /// there; the previous value when it changed something.
    pub fn ensure(&self, value: &str) -> Result<Option<String>> {
        let current = self.read()?;
        if normalize(&current) == normalize(value) {
            return Ok(None);
        }
        self.write(value)?;
        Ok(Some(current))
    }
}

/// Multi-value sysctls print tabs; compare by whitespace-separated fields.
pub fn normalize(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(
            path_of("net.ipv4.ip_forward").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/ip_forward")
        );
        assert!(path_of("net.ipv4.conf.eth0.rp_filter").is_ok());
        for bad in [
            "kernel.pid_max",
            "vm.swappiness",
            "net..ipv4",
            "net.ipv4.",
            "net.ipv4/../../kernel",
            "net.ipv4.conf.a b.rp_filter",
            "net",
        ] {
            assert!(path_of(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ifname_expands_only_whole_segments() {
        assert_eq!(
            expand_ifname("net.ipv4.conf.IFNAME.rp_filter", "eth0"),
            "net.ipv4.conf.eth0.rp_filter"
        );
        assert_eq!(expand_ifname("net.IFNAMEX.a", "eth0"), "net.IFNAMEX.a");
    }

    #[test]
    fn a_handle_reads_and_refuses_what_is_missing() {
        let f = SysctlFile::open("net.ipv4.ip_forward", "test").unwrap();
        assert_eq!(f.read().unwrap(), read("net.ipv4.ip_forward").unwrap());
        let e = SysctlFile::open("net.ipv4.conf.nosuchif0.rp_filter", "pod-x").unwrap_err();
        assert!(e.is_not_found(), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("pod-x") && msg.contains("nosuchif0"), "{msg}");
        assert!(SysctlFile::open("kernel.pid_max", "test").is_err());
    }

    #[test]
    fn values_compare_with_runs_of_whitespace_as_one_space() {
        assert_eq!(normalize("4096\t87380  6291456\n"), "4096 87380 6291456");
    }
}
