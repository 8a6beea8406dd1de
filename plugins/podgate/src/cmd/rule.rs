//! `podgate rule list|add|del` inside the selected netns, `ip rule` style.

use crate::error::{Error, Found, Result};
use crate::ipargs::{self, RuleArgs, Selector, Spec};
use crate::names;
use crate::output;
use crate::select::{ChangeArgs, Target};
use clap::Subcommand;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::route::{RouteProtocol, TABLE_MAIN};
use podgate_kit::rule::{self, ListedRule, RuleSpec};
use serde::Serialize;

#[derive(Debug, Clone, Subcommand)]
pub enum RuleCmd {
    /// List policy rules (both families unless -4/-6), only those matching
    /// the selectors given (from, to, iif, pref, lookup, proto).
    #[command(visible_aliases = ["show", "ls"])]
    List(Selector),
    /// Add a rule: `podgate rule add --netns ... from 10.8.0.0/24 [to P] [iif IF] [pref N] lookup 100`.
    /// Without `pref`, one below the first non-zero preference (as the kernel picks).
    Add {
        #[command(flatten)]
        change: ChangeArgs,
        #[command(flatten)]
        rule: Spec,
    },
    /// Delete the one rule that is exactly as given, every field (the table
    /// included; `pref` when several differ only in it):
    /// `podgate rule del --netns ... from 10.8.0.0/24 lookup 100 [pref 100]`.
    /// A rule with a field these words cannot name (fwmark, oif, not, tos,
    /// ipproto, an action other than lookup, ...) is never taken for one
    /// without.
    #[command(visible_alias = "delete")]
    Del {
        #[command(flatten)]
        change: ChangeArgs,
        #[command(flatten)]
        rule: Spec,
    },
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleRow {
    pub family: &'static str,
    pub priority: u32,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub invert: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    /// Selectors of the rule besides these (`fwmark 0x10/0xff`, `oif eth1`, ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<String>,
    pub table: u32,
    pub table_name: String,
    /// An action other than looking up the table (`blackhole`, `goto 200`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    pub protocol: u8,
    pub protocol_name: String,
}

pub fn row_of(l: &ListedRule) -> RuleRow {
    let r = &l.spec;
    RuleRow {
        family: if r.v6 { "ipv6" } else { "ipv4" },
        priority: r.priority,
        invert: l.invert,
        from: r.from.map(|n| n.to_string()),
        to: r.to.map(|n| n.to_string()),
        iif: r.iif.clone(),
        selectors: r
            .ip_proto
            .map(|p| format!("ipproto {p}"))
            .into_iter()
            .chain(l.selectors.iter().cloned())
            .collect(),
        table: r.table,
        table_name: names::table_name(r.table),
        action: l.action(),
        protocol: r.protocol,
        protocol_name: RouteProtocol(r.protocol).to_string(),
    }
}

/// A rule podgate writes: nothing beyond its [`RuleSpec`].
fn plain(spec: &RuleSpec) -> ListedRule {
    ListedRule {
        spec: spec.clone(),
        invert: false,
        selectors: Vec::new(),
        goto: None,
    }
}

impl RuleRow {
    /// `100:<TAB>from 10.8.0.0/24 iif tun0 lookup main proto static`, with
    /// `not`, the other selectors and the action where the rule has them.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{}:\t{}from {}",
            self.priority,
            if self.invert { "not " } else { "" },
            self.from.as_deref().unwrap_or("all")
        );
        if let Some(t) = &self.to {
            s += &format!(" to {t}");
        }
        if let Some(i) = &self.iif {
            s += &format!(" iif {i}");
        }
        for w in &self.selectors {
            s += &format!(" {w}");
        }
        match &self.action {
            Some(a) => s += &format!(" {a}"),
            None => s += &format!(" lookup {}", self.table_name),
        }
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

/// Does listed rule `r` match every selector the user gave (`rule list`)?
pub fn matches(r: &RuleSpec, a: &RuleArgs, v6: bool) -> bool {
    r.v6 == v6
        && a.pref.is_none_or(|p| r.priority == p)
        && (a.from.is_none() || r.from.map(|n| n.trunc()) == a.src_net().map(|n| n.trunc()))
        && (a.to.is_none() || r.to.map(|n| n.trunc()) == a.dst_net().map(|n| n.trunc()))
        && (a.iif.is_none() || r.iif == a.iif)
        && a.table.is_none_or(|t| r.table == t)
        && a.proto.is_none_or(|p| r.protocol == p)
}

/// Is listed rule `l` exactly the rule `a` names (`rule del`)? Every field
/// of it as given, an absent one absent (`from all`: no source selector),
/// `pref` and `proto` only where given; a rule with anything the words
/// cannot name never is.
pub fn is_exactly(l: &ListedRule, a: &RuleArgs, table: u32, v6: bool) -> bool {
    let r = &l.spec;
    l.is_plain()
        && r.v6 == v6
        && r.table == table
        && a.pref.is_none_or(|p| r.priority == p)
        && r.from.map(|n| n.trunc()) == a.src_net().map(|n| n.trunc())
        && r.to.map(|n| n.trunc()) == a.dst_net().map(|n| n.trunc())
        && r.iif == a.iif
        && a.proto.is_none_or(|p| r.protocol == p)
        && r.suppress_prefixlen.is_none()
        && r.ip_proto.is_none()
}

pub fn run(cmd: &RuleCmd, target: &Target, json: bool) -> Result<Found> {
    match cmd {
        RuleCmd::List(Selector { family, args }) => {
            let a = ipargs::parse_rule(args).map_err(Error::Usage)?;
            let sel = target.select()?;
            let mut sock = RouteSocket::in_netns(&sel.ns)?;
            let mut rows = Vec::new();
            for v6 in families(a.family.or(family.flag())) {
                let mut listed = rule::list_all_fields(&mut sock, v6)?;
                listed.sort_by_key(|l| l.spec.priority);
                let filter = RuleArgs {
                    family: None,
                    ..a.clone()
                };
                rows.extend(
                    listed
                        .iter()
                        .filter(|l| matches(&l.spec, &filter, v6))
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
        RuleCmd::Add {
            change,
            rule: Spec { family, args },
        } => {
            let a = ipargs::parse_rule(args).map_err(Error::Usage)?;
            let v6 = a.v6(family.flag()).map_err(Error::Usage)?;
            let sel = target.select_to_change("rule add")?;
            let mut sock = RouteSocket::in_netns(&sel.ns)?;
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
            if change.dry_run {
                return done("would add", &plain(&spec), &sel.chosen.label(), json);
            }
            rule::add(&mut sock, &spec)?;
            done("added", &plain(&spec), &sel.chosen.label(), json)
        }
        RuleCmd::Del {
            change,
            rule: Spec { family, args },
        } => {
            let a = ipargs::parse_rule(args).map_err(Error::Usage)?;
            let v6 = a.v6(family.flag()).map_err(Error::Usage)?;
            let table = a.table.ok_or_else(|| {
                Error::usage(
                    "rule del deletes only a rule named whole, its table too: add `lookup TABLE` \
                     (`from all` alone names no rule: it is only the absence of a source selector)",
                )
            })?;
            let sel = target.select_to_change("rule del")?;
            let mut sock = RouteSocket::in_netns(&sel.ns)?;
            let label = sel.chosen.label();
            let listed = rule::list_all_fields(&mut sock, v6)?;
            let found = the_one(&listed, &a, table, v6, &label)?;
            if change.dry_run {
                return done("would delete", found, &label, json);
            }
            if !rule::del(&mut sock, &found.spec)? {
                return Err(Error::msg(format!(
                    "rule {} vanished meanwhile",
                    found.spec.describe()
                )));
            }
            done("deleted", found, &label, json)
        }
    }
}

/// The one rule of `listed` that is exactly `a` ([`is_exactly`]), and that
/// the kernel, which matches a delete only on the fields it is given, will
/// not mistake for another (one with the same fields and more).
fn the_one<'a>(
    listed: &'a [ListedRule],
    a: &RuleArgs,
    table: u32,
    v6: bool,
    ns: &str,
) -> Result<&'a ListedRule> {
    let found: Vec<&ListedRule> = listed
        .iter()
        .filter(|l| is_exactly(l, a, table, v6))
        .collect();
    let one = match found.as_slice() {
        [one] => *one,
        [] => {
            return Err(Error::msg(format!(
                "no rule in {ns} is exactly that (every field as given: a rule that also has a fwmark, oif, \
                 tos, ipproto, not or an action other than lookup is not it; see `podgate rule list`)"
            )))
        }
        many => {
            return Err(Error::msg(format!(
                "{} rules in {ns} are that but for their preference ({}): add `pref N`",
                many.len(),
                many.iter()
                    .map(|l| l.spec.priority.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    };
    if let Some(twin) = listed
        .iter()
        .find(|l| *l != one && one.spec.delete_takes(&l.spec))
    {
        return Err(Error::msg(format!(
            "the kernel would not tell {} from `{}` in {ns} (a delete matches only the fields it names): \
             delete it with `ip rule del` naming every selector",
            one.spec.describe(),
            row_of(twin).line().replace('\t', " ")
        )));
    }
    Ok(one)
}

fn done(what: &str, rule: &ListedRule, ns: &str, json: bool) -> Result<Found> {
    let row = row_of(rule);
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
    use podgate_kit::rule::RuleAction;

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

    fn words(s: &str) -> RuleArgs {
        let w: Vec<String> = s.split_whitespace().map(str::to_string).collect();
        ipargs::parse_rule(&w).unwrap()
    }

    #[test]
    fn list_matches_the_given_selectors_only() {
        let r = spec(100, Some("10.8.0.0/24"), 100);
        assert!(matches(&r, &words("from 10.8.0.0/24"), false));
        assert!(!matches(&r, &words("pref 100 lookup main"), false));
        assert!(!matches(&r, &words("from 10.8.0.0/24"), true));
        assert_eq!(
            row_of(&plain(&r)).line(),
            "100:\tfrom 10.8.0.0/24 lookup 100"
        );
    }

    #[test]
    fn delete_takes_a_rule_only_when_every_field_is_as_given() {
        let r = plain(&spec(100, Some("10.8.0.0/24"), 100));
        assert!(is_exactly(&r, &words("from 10.8.0.0/24"), 100, false));
        assert!(is_exactly(
            &r,
            &words("from 10.8.0.0/24 pref 100"),
            100,
            false
        ));
        assert!(!is_exactly(
            &r,
            &words("from 10.8.0.0/24 pref 99"),
            100,
            false
        ));
        // `from all` is no source selector: not this rule's.
        assert!(!is_exactly(&r, &words("from all"), 100, false));
        assert!(!is_exactly(
            &r,
            &words("from 10.8.0.0/24 iif eth0"),
            100,
            false
        ));
        assert!(!is_exactly(&r, &words("from 10.8.0.0/24"), 254, false));
        assert!(!is_exactly(&r, &words("from 10.8.0.0/24"), 100, true));
        for other in [
            ListedRule {
                invert: true,
                ..r.clone()
            },
            ListedRule {
                selectors: vec!["fwmark 0x10/0xffffffff".into()],
                ..r.clone()
            },
            ListedRule {
                spec: RuleSpec {
                    action: RuleAction::Blackhole,
                    ..r.spec.clone()
                },
                ..r.clone()
            },
            ListedRule {
                spec: RuleSpec {
                    ip_proto: Some(6),
                    ..r.spec.clone()
                },
                ..r.clone()
            },
        ] {
            assert!(
                !is_exactly(&other, &words("from 10.8.0.0/24"), 100, false),
                "{other:?}"
            );
        }
        let local = plain(&spec(0, None, 255));
        let all = words("from all");
        assert!(is_exactly(&local, &all, 255, false));
        assert!(!is_exactly(&local, &all, 254, false));
        assert_eq!(
            row_of(&ListedRule {
                spec: RuleSpec {
                    action: RuleAction::Blackhole,
                    ip_proto: Some(6),
                    ..r.spec.clone()
                },
                invert: true,
                selectors: vec!["fwmark 0x10/0xff".into()],
                ..r
            })
            .line(),
            "100:\tnot from 10.8.0.0/24 ipproto 6 fwmark 0x10/0xff blackhole"
        );
    }

    #[test]
    fn delete_refuses_what_the_kernel_could_mistake() {
        let r = plain(&spec(100, None, 100));
        let twin = ListedRule {
            selectors: vec!["fwmark 0x10/0xffffffff".into()],
            ..r.clone()
        };
        let a = words("from all");
        // The fwmark rule listed first: the kernel, given no mark, would take it.
        let e = the_one(&[twin.clone(), r.clone()], &a, 100, false, "netns x").unwrap_err();
        assert!(e.to_string().contains("would not tell"), "{e}");
        assert!(the_one(&[twin], &a, 100, false, "netns x").is_err());
        // Sent without an ipproto or a source, a delete takes a rule of the
        // same preference that has one.
        for twin in [
            plain(&RuleSpec {
                ip_proto: Some(6),
                ..spec(100, None, 100)
            }),
            plain(&spec(100, Some("10.6.0.0/24"), 100)),
        ] {
            let e = the_one(&[twin.clone(), r.clone()], &a, 100, false, "netns x").unwrap_err();
            assert!(e.to_string().contains("would not tell"), "{twin:?}: {e}");
        }
        // A blackhole rule is not: the kernel compares the action.
        let blackhole = plain(&RuleSpec {
            action: RuleAction::Blackhole,
            ..spec(100, None, 100)
        });
        assert_eq!(
            the_one(&[blackhole, r.clone()], &a, 100, false, "netns x").unwrap(),
            &r
        );
        let two = [r.clone(), plain(&spec(200, None, 100))];
        let e = the_one(&two, &a, 100, false, "netns x").unwrap_err();
        assert!(e.to_string().contains("(100, 200): add `pref N`"), "{e}");
        assert_eq!(
            the_one(&two, &words("pref 200"), 100, false, "netns x")
                .unwrap()
                .spec
                .priority,
            200
        );
    }
}
