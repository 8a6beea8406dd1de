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

/// The effective capability set of this process (from /proc/self/status).
pub fn effective() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
}

pub fn has(cap: u32) -> bool {
    effective().is_some_and(|set| set & (1u64 << cap) != 0)
}

/// Fail with a message naming the capability and the operation that needs it.
pub fn require(cap: u32, why: &str) -> Result<()> {
    if has(cap) {
        Ok(())
    } else {
        Err(Error::MissingCapability {
            cap: name(cap),
            why: why.to_string(),
        })
    }
}
