//! Capability checks that say which capability is missing and why it is needed.

use crate::error::{Error, Result};

pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_SYS_ADMIN: u32 = 21;

fn name(cap: u32) -> &'static str {
    match cap {
        CAP_NET_ADMIN => "CAP_NET_ADMIN",
        CAP_SYS_ADMIN => "CAP_SYS_ADMIN",
        _ => "CAP_?",
    }
}

/// The effective capability set of the calling thread: one capget(2), not a
/// parse of /proc/self/status (an open and eight reads, on every ADD).
pub fn effective() -> Option<u64> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: a version-3 header and the two data words that version fills.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut Header,
            data.as_mut_ptr(),
        )
    };
    (rc == 0).then(|| u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

pub fn has(cap: u32) -> bool {
    effective().is_some_and(|set| set & (1u64 << cap) != 0)
}

/// Fail with a message naming the capability and the operation that needs it.
pub fn require(cap: u32, why: &str) -> Result<()> {
    require_all(&[(cap, why)])
}

/// [`require`] for several capabilities (each with why it is needed) from
/// one capget(2): the first missing one is named.
pub fn require_all(needs: &[(u32, &str)]) -> Result<()> {
    check(effective(), needs)
}

fn check(set: Option<u64>, needs: &[(u32, &str)]) -> Result<()> {
    match needs
        .iter()
        .find(|(cap, _)| set.is_none_or(|s| s & (1u64 << cap) == 0))
    {
        None => Ok(()),
        Some((cap, why)) => Err(Error::MissingCapability {
            cap: name(*cap),
            why: why.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_missing_capability_is_named() {
        let needs = [(CAP_NET_ADMIN, "routes"), (CAP_SYS_ADMIN, "setns")];
        assert!(check(Some(1 << CAP_NET_ADMIN | 1 << CAP_SYS_ADMIN), &needs).is_ok());
        let e = check(Some(1 << CAP_NET_ADMIN), &needs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("CAP_SYS_ADMIN") && e.contains("setns"), "{e}");
        let e = check(Some(1 << CAP_SYS_ADMIN), &needs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("CAP_NET_ADMIN") && e.contains("routes"), "{e}");
        // Unknown set (capget failed): fail closed.
        assert!(check(None, &needs).is_err());
    }

    #[test]
    fn capget_agrees_with_proc_status() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
        let want = u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).unwrap();
        assert_eq!(effective(), Some(want));
    }
}
