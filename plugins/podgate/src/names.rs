//! Names `ip` users know for route tables, protocols, scopes and route types.

use podgate_kit::route::{RTPROT_PODGATE, TABLE_LOCAL, TABLE_MAIN};

pub const TABLE_DEFAULT: u32 = 253;

/// Route protocols as iproute2 names them, plus podgate's own (94).
const PROTOS: [(u8, &str); 21] = [
    (0, "unspec"),
    (1, "redirect"),
    (2, "kernel"),
    (3, "boot"),
    (4, "static"),
    (8, "gated"),
    (9, "ra"),
    (10, "mrt"),
    (11, "zebra"),
    (12, "bird"),
    (13, "dnrouted"),
    (14, "xorp"),
    (15, "ntk"),
    (16, "dhcp"),
    (42, "babel"),
    (RTPROT_PODGATE, "podgate"),
    (186, "bgp"),
    (187, "isis"),
    (188, "ospf"),
    (189, "rip"),
    (192, "eigrp"),
];

const SCOPES: [(u8, &str); 5] = [
    (0, "global"),
    (200, "site"),
    (253, "link"),
    (254, "host"),
    (255, "nowhere"),
];

/// Extra table names from iproute2's config, when present.
fn rt_tables() -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for path in ["/etc/iproute2/rt_tables", "/usr/share/iproute2/rt_tables"] {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            let mut it = line.split_whitespace();
            if let (Some(n), Some(name)) = (it.next(), it.next()) {
                if let Ok(n) = n.parse::<u32>() {
                    out.push((n, name.to_string()));
                }
            }
        }
    }
    out
}

pub fn table_name(t: u32) -> String {
    match t {
        TABLE_MAIN => "main".into(),
        TABLE_LOCAL => "local".into(),
        TABLE_DEFAULT => "default".into(),
        0 => "unspec".into(),
        n => rt_tables()
            .into_iter()
            .find(|(k, _)| *k == n)
            .map(|(_, v)| v)
            .unwrap_or_else(|| n.to_string()),
    }
}

pub fn parse_table(s: &str) -> Result<u32, String> {
    match s {
        "main" => Ok(TABLE_MAIN),
        "local" => Ok(TABLE_LOCAL),
        "default" => Ok(TABLE_DEFAULT),
        _ => s.parse::<u32>().ok().filter(|n| *n != 0).map_or_else(
            || {
                rt_tables()
                    .into_iter()
                    .find(|(_, v)| v == s)
                    .map(|(k, _)| k)
                    .ok_or_else(|| {
                        format!("table {s:?}: not a number (1..2^32-1) or a known name (main, local, default)")
                    })
            },
            Ok,
        ),
    }
}

pub fn proto_name(p: u8) -> String {
    PROTOS
        .iter()
        .find(|(n, _)| *n == p)
        .map_or_else(|| p.to_string(), |(_, s)| s.to_string())
}

pub fn parse_proto(s: &str) -> Result<u8, String> {
    if let Ok(n) = s.parse::<u8>() {
        return Ok(n);
    }
    PROTOS
        .iter()
        .find(|(_, name)| *name == s)
        .map(|(n, _)| *n)
        .ok_or_else(|| format!("proto {s:?}: not a number (0-255) or a known name (kernel, boot, static, podgate, ...)"))
}

pub fn scope_name(s: u8) -> String {
    SCOPES
        .iter()
        .find(|(n, _)| *n == s)
        .map_or_else(|| s.to_string(), |(_, v)| v.to_string())
}

/// Route type (RTN_*).
pub fn type_name(k: u8) -> &'static str {
    match k {
        1 => "unicast",
        2 => "local",
        3 => "broadcast",
        4 => "anycast",
        5 => "multicast",
        6 => "blackhole",
        7 => "unreachable",
        8 => "prohibit",
        9 => "throw",
        10 => "nat",
        _ => "unspec",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for t in ["main", "local", "default", "100"] {
            assert_eq!(table_name(parse_table(t).unwrap()), t);
        }
        assert!(parse_table("0").is_err());
        assert!(parse_table("nope-such-table").is_err());
        assert_eq!(parse_proto("podgate").unwrap(), 94);
        assert_eq!(proto_name(94), "podgate");
        assert_eq!(proto_name(2), "kernel");
        assert_eq!(parse_proto("static").unwrap(), 4);
        assert_eq!(proto_name(77), "77");
        assert_eq!(scope_name(253), "link");
        assert_eq!(type_name(2), "local");
    }
}
