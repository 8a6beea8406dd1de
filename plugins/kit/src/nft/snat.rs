//! The node SNAT scan: source NAT in tables that are not podgate's, as typed
//! findings (strict routing refuses on them, `podgate diagnose` reports them).

use super::socket::protocol_err;
use super::*;

/// A netfilter hook of the ip/ip6/inet families (`NF_INET_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
    Other(u32),
}

impl From<u32> for Hook {
    fn from(hooknum: u32) -> Hook {
        match hooknum {
            sys::NF_INET_PRE_ROUTING => Hook::Prerouting,
            sys::NF_INET_LOCAL_IN => Hook::Input,
            sys::NF_INET_FORWARD => Hook::Forward,
            sys::NF_INET_LOCAL_OUT => Hook::Output,
            sys::NF_INET_POST_ROUTING => Hook::Postrouting,
            other => Hook::Other(other),
        }
    }
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hook::Prerouting => f.write_str("prerouting"),
            Hook::Input => f.write_str("input"),
            Hook::Forward => f.write_str("forward"),
            Hook::Output => f.write_str("output"),
            Hook::Postrouting => f.write_str("postrouting"),
            Hook::Other(n) => write!(f, "hook{n}"),
        }
    }
}

/// Which source NAT a rule performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SnatKind {
    /// nf_tables `masq`.
    Masquerade,
    /// nf_tables `nat snat`.
    Snat,
    /// iptables-nft's xtables `MASQUERADE` target.
    XtMasquerade,
    /// iptables-nft's xtables `SNAT` target.
    XtSnat,
}

impl std::fmt::Display for SnatKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SnatKind::Masquerade => "masquerade",
            SnatKind::Snat => "snat",
            SnatKind::XtMasquerade => "masquerade (xt MASQUERADE)",
            SnatKind::XtSnat => "snat (xt SNAT)",
        })
    }
}

/// One rule doing source NAT. Displays as `nft` users read it, e.g.
/// `ip nat KUBE-POSTROUTING (reached from POSTROUTING): snat (handle 7)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnatFinding {
    pub family: Family,
    pub table: String,
    /// The chain holding the rule.
    pub chain: String,
    /// The base chain `chain` is reached from by jump/goto; `None` when
    /// `chain` is that base chain itself.
    pub reached_from: Option<String>,
    /// The hook of the base chain (the scan looks at postrouting only).
    pub hook: Hook,
    pub kind: SnatKind,
    /// Kernel rule handle.
    pub handle: u64,
}

impl SnatFinding {
    /// Whether the rule sits in `chain` or is reached from a base chain of
    /// that name.
    pub fn in_chain(&self, chain: &str) -> bool {
        self.chain == chain || self.reached_from.as_deref() == Some(chain)
    }
}

impl std::fmt::Display for SnatFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.family, self.table, self.chain)?;
        if let Some(base) = &self.reached_from {
            write!(f, " (reached from {base})")?;
        }
        write!(f, ": {} (handle {})", self.kind, self.handle)
    }
}

/// What kind of source NAT an expression performs, if any.
fn snat_kind(expr: &Expr) -> Option<SnatKind> {
    match expr {
        Expr::Masq { .. } => Some(SnatKind::Masquerade),
        Expr::Nat { nat_type } if *nat_type == sys::NFT_NAT_SNAT => Some(SnatKind::Snat),
        Expr::Target { name } if name == "MASQUERADE" => Some(SnatKind::XtMasquerade),
        Expr::Target { name } if name == "SNAT" => Some(SnatKind::XtSnat),
        _ => None,
    }
}

impl NftSocket {
    /// Finds source NAT in other tables: every ip/ip6/inet chain of type nat
    /// hooked at postrouting (and, best effort, regular chains reached from it
    /// via jump/goto) is scanned for `masq`, `nat snat` and iptables-nft's
    /// `MASQUERADE`/`SNAT` targets.
    ///
    /// `exclude_table` skips the inet table of that name (our own). Rules of
    /// legacy (non-nft) iptables are invisible to nf_tables and not reported.
    pub fn find_snat_rules(
        &mut self,
        exclude_table: Option<&str>,
    ) -> Result<Vec<SnatFinding>, NftError> {
        let object = "list chains";
        let msgs = self.dump(sys::NFT_MSG_GETCHAIN, sys::NFPROTO_UNSPEC, object, |_| {})?;
        // (family, table) → base chains of interest.
        let mut candidates: BTreeMap<(u8, String), Vec<(String, u32)>> = BTreeMap::new();
        for msg in &msgs {
            let chain = decode_chain(msg).map_err(protocol_err(object))?;
            let relevant_family = matches!(
                chain.family,
                sys::NFPROTO_INET | sys::NFPROTO_IPV4 | sys::NFPROTO_IPV6
            );
            let ours =
                chain.family == sys::NFPROTO_INET && Some(chain.table.as_str()) == exclude_table;
            if relevant_family
                && !ours
                && chain.hooknum == Some(sys::NF_INET_POST_ROUTING)
                && chain.chain_type.as_deref() == Some("nat")
            {
                candidates
                    .entry((chain.family, chain.table))
                    .or_default()
                    .push((chain.name, sys::NF_INET_POST_ROUTING));
            }
        }

        let mut found = Vec::new();
        for ((family, table), base_chains) in candidates {
            let object = format!("list rules of table {} {table}", family_name(family));
            let msgs = self.dump(sys::NFT_MSG_GETRULE, family, &object, |w| {
                w.attr_str(sys::NFTA_RULE_TABLE, &table);
            })?;
            let mut by_chain: BTreeMap<String, Vec<RuleInfo>> = BTreeMap::new();
            for msg in &msgs {
                let rule = decode_rule(msg).map_err(protocol_err(&object))?;
                by_chain.entry(rule.chain.clone()).or_default().push(rule);
            }
            // Breadth-first over jump/goto targets so that e.g. kube-proxy's
            // POSTROUTING → KUBE-POSTROUTING → MASQUERADE is found too.
            let mut seen: BTreeSet<String> = BTreeSet::new();
            let mut queue: VecDeque<(String, Option<String>, u32)> = base_chains
                .into_iter()
                .map(|(c, hook)| (c, None, hook))
                .collect();
            while let Some((chain, via, hook)) = queue.pop_front() {
                if !seen.insert(chain.clone()) {
                    continue;
                }
                let origin = via.clone().unwrap_or_else(|| chain.clone());
                for rule in by_chain.get(&chain).map(Vec::as_slice).unwrap_or_default() {
                    for expr in &rule.exprs {
                        if let Some(kind) = snat_kind(expr) {
                            found.push(SnatFinding {
                                family: Family::from(family),
                                table: table.clone(),
                                chain: chain.clone(),
                                reached_from: via.clone(),
                                hook: Hook::from(hook),
                                kind,
                                handle: rule.handle,
                            });
                        }
                        if let Expr::Immediate {
                            dreg: sys::NFT_REG_VERDICT,
                            verdict: Some((code, Some(target))),
                        } = expr
                        {
                            if *code == sys::NFT_JUMP || *code == sys::NFT_GOTO {
                                queue.push_back((target.clone(), Some(origin.clone()), hook));
                            }
                        }
                    }
                }
            }
        }
        Ok(found)
    }
}
