//! podgate's entries are checked with the plugins' own config code before
//! they go into a chain: an operator mistake is reported by the installer
//! (and its DaemonSet stays unready) instead of failing every pod ADD with
//! code 7.

use super::json::Json;
use crate::Error;
use podgate_router::config::RouterConfig;
use podgate_tunnel_guard::GuardConfig;
use serde::Deserialize;

pub const ROUTER: &str = "podgate-router";
pub const TUNNEL_GUARD: &str = "podgate-tunnel-guard";
/// The plugin binaries the installer ships.
pub const BINARIES: [&str; 2] = [ROUTER, TUNNEL_GUARD];

/// Each entry parses and validates as its plugin would parse it.
pub fn validate_entries(entries: &[Json]) -> Result<(), Error> {
    for (index, entry) in entries.iter().enumerate() {
        let ty = entry
            .as_object()
            .and_then(|o| o.str_field("type"))
            .unwrap_or_default()
            .to_string();
        let invalid = |msg: String| Error::EntryInvalid {
            index,
            ty: ty.clone(),
            msg,
        };
        let value = entry.to_value().map_err(|e| invalid(e.to_string()))?;
        match ty.as_str() {
            ROUTER => {
                let cfg = RouterConfig::deserialize(&value).map_err(|e| invalid(e.to_string()))?;
                cfg.validate().map_err(|e| invalid(e.msg))?;
            }
            TUNNEL_GUARD => {
                GuardConfig::from_value(&value).map_err(|e| invalid(e.to_string()))?;
            }
            _ => return Err(Error::EntryUnknownType { index, ty }),
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod tests {
    use super::super::chain::{self, List};
    use super::*;
    use std::path::PathBuf;

    fn conf_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conf")
    }

    fn podgate_entries(list: &List) -> Vec<Json> {
        list.plugins()
            .iter()
            .filter(|p| chain::is_podgate(p))
            .cloned()
            .collect()
    }

    /// Every example conflist under conf/ is JSON, chainable, ends with
    /// podgate's entries, and those entries pass the plugins' own validation.
    #[test]
    fn example_conflists_are_valid() {
        let mut seen = 0;
        for entry in std::fs::read_dir(conf_dir()).expect("conf/ exists") {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if chain::kind_of(&name) != Some(chain::Kind::List) {
                continue;
            }
            let text = std::fs::read(&path).unwrap();
            let list = List::parse(&name, &text).unwrap_or_else(|e| panic!("{e}"));
            list.check_chainable(&name)
                .unwrap_or_else(|e| panic!("{e}"));
            let ours = podgate_entries(&list);
            assert!(!ours.is_empty(), "{name}: no podgate entry");
            assert!(
                list.merged(&ours).same(&list),
                "{name}: podgate entries must come last, after the primary's plugins"
            );
            validate_entries(&ours).unwrap_or_else(|e| panic!("{name}: {e}"));
            seen += 1;
        }
        assert!(seen >= 3, "expected the example conflists under conf/");
    }

    /// conf/plugins.json is valid and is what the operator's ConfigMap
    /// (podgate-config.yaml) holds.
    #[test]
    fn kubernetes_configmap_entries_are_valid() {
        let path = conf_dir().join("plugins.json");
        let text = std::fs::read(&path).expect("conf/plugins.json");
        let entries = chain::parse_entries(&text).unwrap();
        validate_entries(&entries).unwrap();
        let yaml =
            std::fs::read_to_string(conf_dir().join("kubernetes/podgate-config.yaml")).unwrap();
        // The ConfigMap embeds plugins.json verbatim (indented); compare as JSON.
        let start = yaml
            .find("plugins.json: |")
            .expect("ConfigMap key plugins.json");
        let body: String = yaml[start..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("    ") || l.is_empty())
            .map(|l| l.strip_prefix("    ").unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let embedded: serde_json::Value = serde_json::from_str(&body).unwrap();
        let file: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            embedded, file,
            "podgate-config.yaml's ConfigMap and plugins.json differ"
        );
    }

    /// Seed 000: cert-manager issues the IPsec certificates, so it must
    /// start before IPsec is in place; the shipped guard lets it.
    #[test]
    fn shipped_tunnel_guard_lets_the_certificate_issuer_start_before_ipsec() {
        let text = std::fs::read(conf_dir().join("plugins.json")).unwrap();
        let entries = chain::parse_entries(&text).unwrap();
        let guard = entries
            .iter()
            .map(|e| e.to_value().unwrap())
            .find(|v| v["type"] == TUNNEL_GUARD)
            .expect("a tunnel-guard entry");
        let cfg = GuardConfig::from_value(&guard).unwrap();
        assert!(cfg.excluded(Some("cert-manager")));
        assert!(!cfg.excluded(Some("vpn")));
    }

    #[test]
    fn bad_entries_are_refused() {
        let bad = chain::parse_entries(
            br#"[{"type":"podgate-router","assign":[{"profile":"missing"}]}]"#,
        )
        .unwrap();
        assert!(validate_entries(&bad).is_err());
        let bad =
            chain::parse_entries(br#"[{"type":"podgate-tunnel-guard","timeoutMs":0}]"#).unwrap();
        assert!(validate_entries(&bad).is_err());
        let unknown = chain::parse_entries(br#"[{"type":"podgate-nope"}]"#).unwrap();
        assert!(matches!(
            validate_entries(&unknown),
            Err(Error::EntryUnknownType { .. })
        ));
        let ok =
            chain::parse_entries(br#"[{"type":"podgate-tunnel-guard"},{"type":"podgate-router"}]"#)
                .unwrap();
        validate_entries(&ok).unwrap();
    }
}
