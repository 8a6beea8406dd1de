//! `podgate rule list|add|del` inside the selected netns, `ip rule` style.

use crate::error::{Error, Found, Result};
use crate::ipargs::{self, RuleArgs, Selector, Spec};
use crate::names;
use crate::output;
use crate::select::Target;
use clap::Subcommand;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::route::{RouteProtocol, TABLE_MAIN};
use podgate_kit::rule::{self, RuleSpec};
use serde::Serialize;

#[derive(Debug, Clone, Subcommand)]
pub enum RuleCmd {
    /// List policy rules (both families unless -4/-6), only those matching
    /// the selectors given (from, to, iif, pref, lookup, proto).
    #[command(visible_aliases = ["show", "ls"])]
    List(Selector),
    /// Add a rule: `podgate rule add --netns ... from 10.8.0.0/24 [to P] [iif IF] [pref N] lookup 100`.
    /// Without `pref`, one below the first non-zero preference (as the kernel picks).
    Add(Spec),
    /// Delete the first rule matching the selectors given:
    /// `podgate rule del --netns ... from 10.8.0.0/24 lookup 100` or `... rule del pref 100`.
    #[command(visible_alias = "delete")]
    Del(Spec),
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleRow {
    pub family: &'static str,
    pub priority: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    pub table: u32,
    pub table_name: String,
    pub protocol: u8,
    pub protocol_name: String,
}

pub fn row_of(r: &RuleSpec) -> RuleRow {
    RuleRow {
        family: if r.v6 { "ipv6" } else { "ipv4" },
        priority: r.priority,
        from: r.from.map(|n| n.to_string()),
        to: r.to.map(|n| n.to_string()),
        iif: r.iif.clone(),
        table: r.table,
        table_name: names::table_name(r.table),
        protocol: r.protocol,
        protocol_name: RouteProtocol(r.protocol).to_string(),
    }
}

impl RuleRow {
    /// `100:<TAB>from 10.8.0.0/24 iif tun0 lookup main proto static`
    pub fn line(&self) -> String {
        let mut s = format!(
            "{}:\tfrom {}",
            self.priority,
            self.from.as_deref().unwrap_or("all")
        );
        if let Some(t) = &self.to {
            s += &format!(" to {t}");
        }
        if let Some(i) = &self.iif {
            s += &format!(" iif {i}");
        }
        s += &format!(" lookup {}", self.table_name);
        if self.protocol != 0 {
            s += &format!(" proto {}", self.protocol_name);
        }
        s
    }
}

fn families(flag: Option<bool>) -> Vec<bool> {
    match flag {
        Some(v6) => vec![v6],
        None => vec![false, true],
    }
}

/// The preference the kernel gives a rule added without one: one below the
/// lowest non-zero preference in use.
pub fn default_pref(existing: &[RuleSpec]) -> u32 {
    existing
        .iter()
        .map(|r| r.priority)
        .filter(|p| *p > 0)
        .min()
        .map_or(32765, |p| p.saturating_sub(1).max(1))
}

/// Does listed rule `r` match every selector the user gave?
pub fn matches(r: &RuleSpec, a: &RuleArgs, v6: bool) -> bool {
    r.v6 == v6
        && a.pref.is_none_or(|p| r.priority == p)
        && (a.from.is_none() || r.from.map(|n| n.trunc()) == a.src_net().map(|n| n.trunc()))
        && (a.to.is_none() || r.to.map(|n| n.trunc()) == a.dst_net().map(|n| n.trunc()))
        && (a.iif.is_none() || r.iif == a.iif)
        && a.table.is_none_or(|t| r.table == t)
        && a.proto.is_none_or(|p| r.protocol == p)
}

pub fn run(cmd: &RuleCmd, target: &Target, json: bool) -> Result<Found> {
    let sel = target.select()?;
    let mut sock = RouteSocket::in_netns(&sel.ns)?;
    let label = sel.chosen.label();
    match cmd {
        RuleCmd::List(Selector { family, args }) => {
            let a = ipargs::parse_rule(args).map_err(Error::Usage)?;
            let mut rows = Vec::new();
            for v6 in families(a.family.or(family.flag())) {
                let mut listed = rule::list(&mut sock, v6)?;
                listed.sort_by_key(|r| r.priority);
                let filter = RuleArgs {
                    family: None,
                    ..a.clone()
                };
                rows.extend(
                    listed
                        .iter()
                        .filter(|r| matches(r, &filter, v6))
                        .map(row_of),
                );
            }
            if json {
                output::json(&rows)?;
            } else {
                output::text(rows.iter().map(|r| r.line() + "\n").collect::<String>())?;
            }
            Ok(Found::Ok)
        }
        RuleCmd::Add(Spec { family, args }) => {
            let a = ipargs::parse_rule(args).map_err(Error::Usage)?;
            let v6 = a.v6(family.flag()).map_err(Error::Usage)?;
            let priority = match a.pref {
                Some(p) => p,
                None => default_pref(&rule::list(&mut sock, v6)?),
            };
            let spec = RuleSpec {
                v6,
                priority,
                from: a.src_net(),
                to: a.dst_net(),
                iif: a.iif.clone(),
                table: a.table.unwrap_or(TABLE_MAIN),
                protocol: a.proto.unwrap_or(0),
                suppress_prefixlen: None,
                ..RuleSpec::default()
            };
            rule::add(&mut sock, &spec)?;
            done("added", &spec, &label, json)
        }
        RuleCmd::Del(Spec { family, args }) => {
            let a = ipargs::parse_rule(args).map_err(Error::Usage)?;
            let v6 = a.v6(family.flag()).map_err(Error::Usage)?;
            let mut listed = rule::list(&mut sock, v6)?;
            listed.sort_by_key(|r| r.priority);
            let spec = listed
                .into_iter()
                .find(|r| matches(r, &a, v6))
                .ok_or_else(|| Error::msg(format!("no matching rule in {label}")))?;
            if !rule::del(&mut sock, &spec)? {
                return Err(Error::msg(format!(
                    "rule {} vanished meanwhile",
                    spec.describe()
                )));
            }
            done("deleted", &spec, &label, json)
        }
    }
}

fn done(what: &str, spec: &RuleSpec, ns: &str, json: bool) -> Result<Found> {
    let row = row_of(spec);
    if json {
        output::json(&serde_json::json!({ "action": what, "rule": row }))?;
    } else {
        output::text(format!(
            "{what}: {} ({ns})\n",
            row.line().replace('\t', " ")
        ))?;
    }
    Ok(Found::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(p: u32, from: Option<&str>, table: u32) -> RuleSpec {
        RuleSpec {
            v6: false,
            priority: p,
            from: from.map(|f| f.parse().unwrap()),
            to: None,
            iif: None,
            table,
            protocol: 0,
            suppress_prefixlen: None,
            ..RuleSpec::default()
        }
    }

    #[test]
    fn kernel_like_default_pref() {
        let std = [
            spec(0, None, 255),
            spec(32766, None, 254),
            spec(32767, None, 253),
        ];
        assert_eq!(default_pref(&std), 32765);
        assert_eq!(default_pref(&[spec(0, None, 255), spec(100, None, 7)]), 99);
    }

    #[test]
    fn delete_matches_given_selectors_only() {
        let r = spec(100, Some("10.8.0.0/24"), 100);
        let a = ipargs::parse_rule(&["from".into(), "10.8.0.0/24".into()]).unwrap();
        assert!(matches(&r, &a, false));
        let b = ipargs::parse_rule(&["pref".into(), "100".into(), "lookup".into(), "main".into()])
            .unwrap();
        assert!(!matches(&r, &b, false));
        assert!(!matches(&r, &a, true));
        assert_eq!(row_of(&r).line(), "100:\tfrom 10.8.0.0/24 lookup 100");
    }
}
