//! `ip route` / `ip rule` style arguments for the common cases, parsed into
//! plain data (no I/O, so it is tested here); and the command-line shape
//! `podgate route` and `podgate rule` share (`-4`/`-6`, then the words).

use crate::names;
use clap::Args;
use ipnet::IpNet;
use std::net::IpAddr;

/// `-4` / `-6`.
#[derive(Debug, Clone, Args)]
pub struct Family {
    /// IPv4 only.
    #[arg(short = '4', conflicts_with = "v6")]
    pub v4: bool,
    /// IPv6 only.
    #[arg(short = '6')]
    pub v6: bool,
}

impl Family {
    /// Some(true) for IPv6, Some(false) for IPv4, None for both.
    pub fn flag(&self) -> Option<bool> {
        if self.v6 {
            Some(true)
        } else if self.v4 {
            Some(false)
        } else {
            None
        }
    }
}

/// What `list` takes: a family and optional selectors, `ip` words.
#[derive(Debug, Clone, Args)]
pub struct Selector {
    #[command(flatten)]
    pub family: Family,
    /// Only what matches these `ip`-style selectors.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "SELECTOR"
    )]
    pub args: Vec<String>,
}

/// What `add` and `del` take: a family and the object, `ip` words.
#[derive(Debug, Clone, Args)]
pub struct Spec {
    #[command(flatten)]
    pub family: Family,
    /// The route or rule, as `ip` words.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "SPEC"
    )]
    pub args: Vec<String>,
}

/// A prefix as `ip` reads it: `default`/`all`, `10.0.0.0/8`, or a bare
/// address (a host route). `None` means "default" of a family not yet known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefix {
    Default,
    Net(IpNet),
}

pub fn parse_prefix(s: &str) -> Result<Prefix, String> {
    if s == "default" || s == "all" || s == "any" {
        return Ok(Prefix::Default);
    }
    if let Ok(n) = s.parse::<IpNet>() {
        return Ok(Prefix::Net(n));
    }
    if let Ok(a) = s.parse::<IpAddr>() {
        return Ok(Prefix::Net(IpNet::from(a)));
    }
    Err(format!(
        "{s:?} is not a prefix (10.8.0.0/24, 10.8.0.1, fd00::/64 or default)"
    ))
}

impl Prefix {
    /// Resolve `default` for a family (v6 when `v6`).
    pub fn resolve(self, v6: bool) -> IpNet {
        match self {
            Prefix::Net(n) => n,
            Prefix::Default if v6 => IpNet::from(IpAddr::from([0u16; 8])).trunc_to(0),
            Prefix::Default => IpNet::from(IpAddr::from([0u8; 4])).trunc_to(0),
        }
    }

    pub fn v6(self) -> Option<bool> {
        match self {
            Prefix::Net(n) => Some(n.addr().is_ipv6()),
            Prefix::Default => None,
        }
    }
}

trait TruncTo {
    fn trunc_to(self, len: u8) -> IpNet;
}

impl TruncTo for IpNet {
    fn trunc_to(self, len: u8) -> IpNet {
        IpNet::new(self.addr(), len)
            .map(|n| n.trunc())
            .unwrap_or(self)
    }
}

/// `[to] PREFIX [via ADDR] [dev IF] [table T] [metric N] [proto P] [onlink] [scope link]`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteArgs {
    /// `-4`/`-6` given among the arguments.
    pub family: Option<bool>,
    pub dst: Option<Prefix>,
    pub via: Option<IpAddr>,
    pub dev: Option<String>,
    /// `None` = main (for add/del); for list, `all` is `Some(0)`.
    pub table: Option<u32>,
    pub metric: Option<u32>,
    pub proto: Option<u8>,
    pub onlink: bool,
    pub scope_link: bool,
}

impl RouteArgs {
    /// The family: explicit flag, else from the prefix or the gateway.
    pub fn v6(&self, flag: Option<bool>) -> Result<bool, String> {
        let from_dst = self.dst.and_then(Prefix::v6);
        let from_via = self.via.map(|a| a.is_ipv6());
        let mut v6 = flag;
        for x in [self.family, from_dst, from_via].into_iter().flatten() {
            match v6 {
                Some(v) if v != x => {
                    return Err(
                        "the prefix, the gateway and -4/-6 disagree on the address family".into(),
                    )
                }
                _ => v6 = Some(x),
            }
        }
        Ok(v6.unwrap_or(false))
    }
}

fn value<'a>(it: &mut std::slice::Iter<'a, String>, key: &str) -> Result<&'a str, String> {
    it.next()
        .map(String::as_str)
        .ok_or_else(|| format!("{key} needs a value"))
}

fn number(s: &str, key: &str) -> Result<u32, String> {
    s.parse::<u32>()
        .map_err(|_| format!("{key} {s:?}: not a number"))
}

/// Parse route arguments; `list` allows `table all` and no prefix.
pub fn parse_route(tokens: &[String], list: bool) -> Result<RouteArgs, String> {
    let mut r = RouteArgs::default();
    let mut it = tokens.iter();
    while let Some(tok) = it.next() {
        match tok.as_str() {
            "-4" => r.family = Some(false),
            "-6" => r.family = Some(true),
            "via" => {
                let v = value(&mut it, "via")?;
                r.via = Some(
                    v.parse()
                        .map_err(|_| format!("via {v:?}: not an address"))?,
                );
            }
            "dev" | "oif" => r.dev = Some(value(&mut it, "dev")?.to_string()),
            "table" => {
                let v = value(&mut it, "table")?;
                r.table = Some(if list && v == "all" {
                    0
                } else {
                    names::parse_table(v)?
                });
            }
            "metric" | "priority" | "preference" => {
                r.metric = Some(number(value(&mut it, "metric")?, "metric")?)
            }
            "proto" | "protocol" => r.proto = Some(names::parse_proto(value(&mut it, "proto")?)?),
            "onlink" => r.onlink = true,
            "scope" => match value(&mut it, "scope")? {
                "link" => r.scope_link = true,
                "global" | "universe" => r.scope_link = false,
                s => return Err(format!("scope {s:?}: only link or global")),
            },
            "to" => {
                let v = value(&mut it, "to")?;
                set_dst(&mut r, v)?;
            }
            other if other.starts_with("--") => return Err(option_after_words(other)),
            other => set_dst(&mut r, other)?,
        }
    }
    if !list && r.dst.is_none() {
        return Err(
            "which prefix? e.g. `10.8.0.0/24 via 10.22.0.5` or `default via 10.22.0.1`".into(),
        );
    }
    Ok(r)
}

/// An option among the route's or rule's words (where everything after the
/// first word is taken as words).
fn option_after_words(opt: &str) -> String {
    format!("{opt}: options go before the route's or rule's words (`podgate route del --node --dry-run 10.8.0.0/24`)")
}

fn set_dst(r: &mut RouteArgs, v: &str) -> Result<(), String> {
    if r.dst.is_some() {
        return Err(format!("unexpected {v:?}: the prefix is already given"));
    }
    r.dst = Some(parse_prefix(v).map_err(|e| format!("unknown keyword or {e}"))?);
    Ok(())
}

/// `[from P] [to P] [iif IF] [pref N] [lookup|table T] [proto P]`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleArgs {
    /// `-4`/`-6` given among the arguments.
    pub family: Option<bool>,
    pub from: Option<Prefix>,
    pub to: Option<Prefix>,
    pub iif: Option<String>,
    pub pref: Option<u32>,
    pub table: Option<u32>,
    pub proto: Option<u8>,
}

impl RuleArgs {
    pub fn v6(&self, flag: Option<bool>) -> Result<bool, String> {
        let mut v6 = flag;
        let given = [self.from, self.to]
            .into_iter()
            .flatten()
            .filter_map(Prefix::v6);
        for x in self.family.into_iter().chain(given) {
            match v6 {
                Some(v) if v != x => {
                    return Err("from, to and -4/-6 disagree on the address family".into())
                }
                _ => v6 = Some(x),
            }
        }
        Ok(v6.unwrap_or(false))
    }

    /// `from all` / `to all` select nothing: same as not given.
    pub fn src_net(&self) -> Option<IpNet> {
        match self.from {
            Some(Prefix::Net(n)) => Some(n),
            _ => None,
        }
    }

    pub fn dst_net(&self) -> Option<IpNet> {
        match self.to {
            Some(Prefix::Net(n)) => Some(n),
            _ => None,
        }
    }
}

pub fn parse_rule(tokens: &[String]) -> Result<RuleArgs, String> {
    let mut r = RuleArgs::default();
    let mut it = tokens.iter();
    while let Some(tok) = it.next() {
        match tok.as_str() {
            "-4" => r.family = Some(false),
            "-6" => r.family = Some(true),
            "from" => r.from = Some(parse_prefix(value(&mut it, "from")?)?),
            "to" => r.to = Some(parse_prefix(value(&mut it, "to")?)?),
            "iif" | "dev" => r.iif = Some(value(&mut it, "iif")?.to_string()),
            "pref" | "priority" | "order" => {
                r.pref = Some(number(value(&mut it, "pref")?, "pref")?)
            }
            "lookup" | "table" => r.table = Some(names::parse_table(value(&mut it, "lookup")?)?),
            "proto" | "protocol" => r.proto = Some(names::parse_proto(value(&mut it, "proto")?)?),
            other if other.starts_with("--") => return Err(option_after_words(other)),
            other => {
                return Err(format!(
                    "unknown keyword {other:?} (from, to, iif, pref, lookup, proto)"
                ))
            }
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn route_add_like_ip() {
        let r = parse_route(
            &toks("10.8.0.0/24 via 10.22.0.5 dev eth0 table 100 metric 7 proto podgate onlink"),
            false,
        )
        .unwrap();
        assert_eq!(r.dst, Some(Prefix::Net("10.8.0.0/24".parse().unwrap())));
        assert_eq!(r.via, Some("10.22.0.5".parse().unwrap()));
        assert_eq!(r.dev.as_deref(), Some("eth0"));
        assert_eq!((r.table, r.metric, r.proto), (Some(100), Some(7), Some(94)));
        assert!(r.onlink);
        assert!(!r.v6(None).unwrap());

        let d = parse_route(&toks("default via fd00::1"), false).unwrap();
        assert!(d.v6(None).unwrap());
        assert_eq!(d.dst.unwrap().resolve(true).to_string(), "::/0");
        let h = parse_route(&toks("to 10.9.9.9 dev tun0 scope link"), false).unwrap();
        assert_eq!(h.dst, Some(Prefix::Net("10.9.9.9/32".parse().unwrap())));
        assert!(h.scope_link);
    }

    #[test]
    fn route_words_missing_a_value_unknown_mixed_or_table_all_outside_list_are_refused() {
        assert!(parse_route(&toks("via 10.0.0.1"), false).is_err());
        assert!(parse_route(&toks("10.0.0.0/8 via"), false).is_err());
        assert!(parse_route(&toks("10.0.0.0/8 bogus"), false).is_err());
        assert!(parse_route(&toks("10.0.0.0/8 table 0"), false).is_err());
        let mixed = parse_route(&toks("10.0.0.0/8 via fd00::1"), false).unwrap();
        assert!(mixed.v6(None).is_err());
        assert_eq!(
            parse_route(&toks("table all"), true).unwrap().table,
            Some(0)
        );
        assert!(parse_route(&toks("table all"), false).is_err());
    }

    #[test]
    fn rules_like_ip() {
        let r = parse_rule(&toks(
            "from 10.8.0.0/24 to 10.22.0.0/16 iif tun0 pref 100 lookup 200",
        ))
        .unwrap();
        assert_eq!(r.src_net().unwrap().to_string(), "10.8.0.0/24");
        assert_eq!(r.dst_net().unwrap().to_string(), "10.22.0.0/16");
        assert_eq!((r.pref, r.table), (Some(100), Some(200)));
        assert_eq!(r.iif.as_deref(), Some("tun0"));
        let all = parse_rule(&toks("from all lookup main priority 5")).unwrap();
        assert_eq!(all.src_net(), None);
        assert_eq!(all.table, Some(254));
        assert!(parse_rule(&toks("fwmark 0x1")).is_err());
        assert!(parse_rule(&toks("from fd00::/64"))
            .unwrap()
            .v6(None)
            .unwrap());
    }
}
