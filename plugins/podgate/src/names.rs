//! Names `ip` users know for route tables, and parsing of protocol names
//! (their display is `podgate_kit::route::RouteProtocol`'s).

use podgate_kit::route::{RouteProtocol, TABLE_LOCAL, TABLE_MAIN};

pub const TABLE_DEFAULT: u32 = 253;

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

pub fn parse_proto(s: &str) -> Result<u8, String> {
    RouteProtocol::parse(s)
        .map(|p| p.0)
        .ok_or_else(|| format!("proto {s:?}: not a number (0-255) or a known name (kernel, boot, static, podgate, ...)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_protocol_names_round_trip_and_unknown_names_are_refused() {
        for t in ["main", "local", "default", "100"] {
            assert_eq!(table_name(parse_table(t).unwrap()), t);
        }
        assert!(parse_table("0").is_err());
        assert!(parse_table("nope-such-table").is_err());
        assert_eq!(parse_proto("podgate").unwrap(), 94);
        assert_eq!(parse_proto("static").unwrap(), 4);
        assert!(parse_proto("nope-such-proto").is_err());
    }
}
