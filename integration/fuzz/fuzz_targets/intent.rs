//! The pod's annotations and args (untrusted) against operator policy:
//! `intent::allowed_pools` (comma-separated CIDR lists) and `intent::select`.
//! Invariants checked: every pool that passes lies inside allow.pools, has no
//! host bits, appears once, and there are at most 16 per annotation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podgate_router::config::RouterConfig;
use podgate_router::intent::{allowed_pools, select, PodIntent, ANN_MASQUERADE};
use std::sync::OnceLock;

fn config() -> &'static RouterConfig {
    static CFG: OnceLock<RouterConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        serde_json::from_value(serde_json::json!({
            "stateDir": "/nonexistent",
            "profiles": {
                "vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}, "masquerade": [{"source": "10.8.0.0/24"}]},
                "vpn-routed": {"returnRoutes": [{"dst": "10.8.0.0/24"}, {"dst": "fd00:8::/64"}]}
            },
            "assign": [{"namespace": "vpn", "podNamePrefix": "openvpn-gw", "profile": "vpn-gateway"}],
            "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16", "fd00:8::/48"]}
        }))
        .unwrap_or_else(|e| panic!("fuzz config: {e}"))
    })
}

/// Up to six optional fields separated by 0xff bytes (never valid UTF-8, so
/// any string content can appear inside a field); a field starting with 0xfe is None.
fn fields(data: &[u8]) -> Vec<Option<String>> {
    data.split(|b| *b == 0xff)
        .take(6)
        .map(|f| match f.first() {
            Some(0xfe) => None,
            _ => Some(String::from_utf8_lossy(f).into_owned()),
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    if data.len() > 16 * 1024 {
        return;
    }
    let cfg = config();
    let f = fields(data);
    let get = |i: usize| f.get(i).cloned().flatten();

    if let Some(s) = get(0) {
        if let Ok(pools) = allowed_pools(cfg, ANN_MASQUERADE, &s) {
            assert!(!pools.is_empty() && pools.len() <= 16, "{pools:?}");
            for (i, p) in pools.iter().enumerate() {
                assert_eq!(p.trunc(), *p, "host bits: {p}");
                assert!(
                    cfg.allow.pools.iter().any(|a| a.contains(p)),
                    "outside allow.pools: {p}"
                );
                assert!(!pools[..i].contains(p), "duplicate {p}");
            }
        }
    }
    let intent = PodIntent {
        namespace: get(0),
        name: get(1),
        ann_profile: get(2),
        ann_masquerade: get(3),
        ann_return_routes: get(4),
        args_profile: get(5),
    };
    if let Ok(Some(sel)) = select(cfg, &intent) {
        assert!(cfg.profiles.contains_key(sel.name));
        let asked = intent.ann_profile.is_some()
            || intent.ann_masquerade.is_some()
            || intent.ann_return_routes.is_some()
            || intent.args_profile.is_some();
        if asked {
            assert_eq!(intent.namespace.as_deref(), Some("vpn"), "{intent:?}");
        }
        for p in sel.masquerade.iter().chain(&sel.return_routes) {
            assert_ne!(p.prefix_len(), 0, "default route selected: {intent:?}");
        }
    }
});
