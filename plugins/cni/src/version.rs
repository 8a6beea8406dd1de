//! Spec versions podgate implements, and comparisons between them.

use crate::error::CniError;

/// Exactly the versions whose result format and verbs podgate implements.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const LATEST: &str = "1.1.0";

/// A parsed `major.minor.patch` version. The one parser of the workspace
/// (the plugins' config and the installer's conflist alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u16, pub u16, pub u16);

impl Version {
    pub const V0_4_0: Version = Version(0, 4, 0);
    pub const V1_0_0: Version = Version(1, 0, 0);
    pub const V1_1_0: Version = Version(1, 1, 0);

    /// As libcni's `version.ParseVersion`: a missing minor or patch is 0,
    /// more than three parts is not a version.
    pub fn parse(s: &str) -> Option<Version> {
        let mut parts = s.split('.');
        let major = parts.next()?.parse().ok()?;
        let mut rest = || parts.next().map_or(Some(0), |p| p.parse().ok());
        let (minor, patch) = (rest()?, rest()?);
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
    fn versions_order_by_major_then_minor_then_patch() {
        assert_eq!(Version::parse("0.3.1"), Some(Version(0, 3, 1)));
        assert!(Version::parse("0.3.1") < Version::parse("0.4.0"));
        assert!(Version::parse("0.4.0") < Version::parse("1.0.0"));
        assert!(Version::parse("1.0.0") < Version::parse("1.1.0"));
    }

    #[test]
    fn a_missing_minor_or_patch_counts_as_zero_as_in_libcni() {
        assert_eq!(Version::parse("1.0"), Some(Version(1, 0, 0)));
        assert_eq!(Version::parse("1"), Some(Version(1, 0, 0)));
    }

    #[test]
    fn four_parts_an_empty_part_or_a_word_is_not_a_version() {
        for bad in ["1.0.0.0", "1..0", "", "x.0.0", "1.x", "latest"] {
            assert_eq!(Version::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn every_implemented_version_is_accepted() {
        for v in SUPPORTED_VERSIONS {
            assert!(require_supported(v).is_ok(), "{v}");
        }
    }

    #[test]
    fn a_version_podgate_does_not_implement_is_refused_with_code_1() {
        for v in ["0.1.0", "0.2.0", "1.2.0", "1.0", "", "latest"] {
            assert_eq!(require_supported(v).unwrap_err().code, 1, "{v:?}");
        }
    }
}
