//! Namespaced sysctls through /proc/sys, read before write.
//!
//! /proc/sys/net resolves against the network namespace of the task that
//! opens the file, so callers run these inside `NetNs::run`.

use crate::error::{Error, Result};
use std::fs;
use std::io::ErrorKind;
use std::path::PathBuf;

/// Validate a `net.*` sysctl name and map it to its /proc/sys path.
/// Refuses anything outside `net.` (node-wide knobs such as `kernel.*` or
/// `vm.*` are not per pod), path tricks (`..`, `/`), and empty segments.
pub fn path_of(name: &str) -> Result<PathBuf> {
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
    let mut p = PathBuf::from("/proc/sys");
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
    fs::write(&p, value.as_bytes()).map_err(|source| Error::Sysctl {
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
    fn normalize_whitespace() {
        assert_eq!(normalize("4096\t87380  6291456\n"), "4096 87380 6291456");
    }
}
