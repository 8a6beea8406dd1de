//! Spec versions podgate implements, and comparisons between them.

use crate::error::CniError;

/// Exactly the versions whose result format and verbs podgate implements.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const LATEST: &str = "1.1.0";

/// A parsed `major.minor.patch` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u16, pub u16, pub u16);

impl Version {
    pub const V0_4_0: Version = Version(0, 4, 0);
    pub const V1_0_0: Version = Version(1, 0, 0);
    pub const V1_1_0: Version = Version(1, 1, 0);

    pub fn parse(s: &str) -> Option<Version> {
        let mut parts = s.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(Version(major, minor, patch))
    }

    /// 0.3.x and 0.4.0 results carry `"version"` on each IP; 1.x results do not.
    pub fn has_ip_version_field(self) -> bool {
        self < Version::V1_0_0
    }
}

/// Accept only a version we implement, with a spec code-1 error otherwise.
pub fn require_supported(v: &str) -> Result<Version, CniError> {
    if !SUPPORTED_VERSIONS.contains(&v) {
        return Err(CniError::incompatible_version(format!(
            "incompatible CNI versions: config is {v:?}, plugin supports [{}]",
            SUPPORTED_VERSIONS.join(", ")
        )));
    }
    Version::parse(v).ok_or_else(|| CniError::incompatible_version(format!("bad cniVersion {v:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_orders() {
        assert!(Version::parse("0.3.1") < Version::parse("0.4.0"));
        assert!(Version::parse("1.0.0") < Version::parse("1.1.0"));
        assert_eq!(Version::parse("1.0"), None);
        assert_eq!(Version::parse("1.0.0.0"), None);
        assert_eq!(Version::parse("x.0.0"), None);
    }

    #[test]
    fn only_implemented_versions_pass() {
        for v in SUPPORTED_VERSIONS {
            assert!(require_supported(v).is_ok());
        }
        for v in ["0.1.0", "0.2.0", "1.2.0", "", "latest"] {
            assert_eq!(require_supported(v).unwrap_err().code, 1);
        }
    }
}
