//! The kernel operations ADD's apply and its removal use, behind one
//! small trait: the real implementation goes through the kit (netlink in the
//! node's namespace, `/proc/sys`), and unit tests use [`fake::Fake`], which
//! keeps routes, rules and sysctls in memory, records every call and can be
//! told to fail the Nth one with a given errno. The netns integration tests
//! still run the real thing.

use podgate_kit::netlink::RouteSocket;
use podgate_kit::nft::{ListedMss, ListedRule, NftSocket, TableRules};
use podgate_kit::route::{self, RouteEntry, RouteSpec};
use podgate_kit::rule::{self, RuleSpec};
use podgate_kit::{sysctl, Error};

/// Route, rule, sysctl and nf_tables operations in one namespace.
pub trait Kernel {
    /// Add a route; `replace` overwrites one with the same key.
    fn route_add(&mut self, r: &RouteSpec, replace: bool) -> Result<(), Error>;
    /// Delete a route; Ok(false) when it was already gone.
    fn route_del(&mut self, r: &RouteSpec) -> Result<bool, Error>;
    /// Routes of one family in every table.
    fn route_list(&mut self, v6: bool) -> Result<Vec<RouteEntry>, Error>;
    fn rule_list(&mut self, v6: bool) -> Result<Vec<RuleSpec>, Error>;
    fn rule_add(&mut self, r: &RuleSpec) -> Result<(), Error>;
    /// Delete a rule; Ok(false) when it was already gone.
    fn rule_del(&mut self, r: &RuleSpec) -> Result<bool, Error>;
    fn sysctl_read(&mut self, name: &str) -> Result<String, Error>;
    /// Write `value` unless already there; the previous value when changed.
    fn sysctl_ensure(&mut self, name: &str, value: &str) -> Result<Option<String>, Error>;
    /// Create or atomically replace podgate's `inet <table>`.
    fn nft_replace(&mut self, table: &str, rules: &TableRules<'_>, tag: &str) -> Result<(), Error>;
    /// Delete `inet <table>`; Ok(false) when it was already gone.
    fn nft_delete(&mut self, table: &str) -> Result<bool, Error>;
    /// Chain `postrouting` of `inet <table>`; None when the table is missing.
    fn nft_list_masquerade(&mut self, table: &str) -> Result<Option<Vec<ListedRule>>, Error>;
    /// Chain `forward` (MSS clamp) of `inet <table>`; None when the table is
    /// missing.
    fn nft_list_mss(&mut self, table: &str) -> Result<Option<Vec<ListedMss>>, Error>;
}

/// The node-side route socket, opened on first use: a masquerade-only ADD
/// with nothing stale to clear never needs one.
#[derive(Default)]
pub struct NodeSocket(Option<RouteSocket>);

impl NodeSocket {
    pub fn get(&mut self) -> Result<&mut RouteSocket, Error> {
        match &mut self.0 {
            Some(s) => Ok(s),
            slot => Ok(slot.insert(RouteSocket::new()?)),
        }
    }
}

enum Sock<'a> {
    Lazy(&'a mut NodeSocket),
    Open(&'a mut RouteSocket),
    /// In a pod's namespace (the calling thread is inside it), opened on
    /// first use; the label names the namespace in errors.
    Pod(String, Option<RouteSocket>),
}

/// The real kernel: the kit's netlink codecs on sockets of the calling
/// thread's namespace (opened when first needed), sysctls through
/// `/proc/sys`.
pub struct Live<'a> {
    route: Sock<'a>,
    nft: Option<NftSocket>,
}

impl<'a> Live<'a> {
    /// Over a node socket opened on first use.
    pub fn lazy(node: &'a mut NodeSocket) -> Live<'a> {
        Live {
            route: Sock::Lazy(node),
            nft: None,
        }
    }

    /// Over an open socket.
    pub fn on(sock: &'a mut RouteSocket) -> Live<'a> {
        Live {
            route: Sock::Open(sock),
            nft: None,
        }
    }

    /// On a thread inside the pod namespace `label`, reusing a route socket
    /// already opened there.
    pub fn pod(label: &str, route: Option<RouteSocket>) -> Live<'static> {
        Live {
            route: Sock::Pod(label.to_string(), route),
            nft: None,
        }
    }

    fn sock(&mut self) -> Result<&mut RouteSocket, Error> {
        match &mut self.route {
            Sock::Lazy(n) => n.get(),
            Sock::Open(s) => Ok(s),
            Sock::Pod(label, slot) => match slot {
                Some(s) => Ok(s),
                None => Ok(slot.insert(RouteSocket::new_labelled(label.clone())?)),
            },
        }
    }

    fn nft(&mut self) -> Result<&mut NftSocket, Error> {
        match &mut self.nft {
            Some(s) => Ok(s),
            slot => Ok(slot.insert(NftSocket::new()?)),
        }
    }
}

impl Kernel for Live<'_> {
    fn route_add(&mut self, r: &RouteSpec, replace: bool) -> Result<(), Error> {
        route::add(self.sock()?, r, replace)
    }
    fn route_del(&mut self, r: &RouteSpec) -> Result<bool, Error> {
        route::del(self.sock()?, r)
    }
    fn route_list(&mut self, v6: bool) -> Result<Vec<RouteEntry>, Error> {
        route::list(self.sock()?, v6)
    }
    fn rule_list(&mut self, v6: bool) -> Result<Vec<RuleSpec>, Error> {
        rule::list(self.sock()?, v6)
    }
    fn rule_add(&mut self, r: &RuleSpec) -> Result<(), Error> {
        rule::add(self.sock()?, r)
    }
    fn rule_del(&mut self, r: &RuleSpec) -> Result<bool, Error> {
        rule::del(self.sock()?, r)
    }
    fn sysctl_read(&mut self, name: &str) -> Result<String, Error> {
        sysctl::read(name)
    }
    fn sysctl_ensure(&mut self, name: &str, value: &str) -> Result<Option<String>, Error> {
        sysctl::ensure(name, value)
    }
    fn nft_replace(&mut self, table: &str, rules: &TableRules<'_>, tag: &str) -> Result<(), Error> {
        self.nft()?.replace_table(table, rules, tag)
    }
    fn nft_delete(&mut self, table: &str) -> Result<bool, Error> {
        self.nft()?.delete_table(table)
    }
    fn nft_list_masquerade(&mut self, table: &str) -> Result<Option<Vec<ListedRule>>, Error> {
        self.nft()?.list_masquerade(table)
    }
    fn nft_list_mss(&mut self, table: &str) -> Result<Option<Vec<ListedMss>>, Error> {
        self.nft()?.list_mss(table)
    }
}

#[cfg(test)]
pub mod fake {
    //! In-memory kernel for unit tests (youki's fake netlink client is the
    //! model): state as plain data, every call logged as one line.

    use super::Kernel;
    use podgate_kit::nft::{ListedMss, ListedRule, TableRules};
    use podgate_kit::route::{RouteEntry, RouteSpec};
    use podgate_kit::rule::RuleSpec;
    use podgate_kit::{sysctl, Error};
    use std::collections::BTreeMap;

    #[derive(Debug, Default)]
    pub struct Fake {
        pub routes: Vec<RouteSpec>,
        pub rules: Vec<RuleSpec>,
        pub sysctls: BTreeMap<String, String>,
        /// `inet` tables by name.
        pub tables: BTreeMap<String, Table>,
        /// Every call, in order ("route add ...", "sysctl write n=v", ...).
        pub calls: Vec<String>,
        /// Fail the Nth call (1-based, counting every call) with this errno.
        pub fail: Vec<(usize, i32)>,
    }

    /// An `inet` table: its two chains as they list (a test may add a rule
    /// of a shape podgate does not write: `rule: None`).
    #[derive(Debug, Default, Clone, PartialEq, Eq)]
    pub struct Table {
        pub masquerade: Vec<ListedRule>,
        pub mss: Vec<ListedMss>,
        pub tag: String,
    }

    impl Fake {
        /// Fail the `n`th call from now with `errno`.
        pub fn fail_call(&mut self, n: usize, errno: i32) {
            self.fail.push((self.calls.len() + n, errno));
        }

        fn call(&mut self, what: String) -> Result<(), Error> {
            self.calls.push(what.clone());
            let now = self.calls.len();
            match self.fail.iter().find(|(n, _)| *n == now) {
                Some(&(_, errno)) => Err(self.errno(&what, errno)),
                None => Ok(()),
            }
        }

        fn errno(&self, what: &str, errno: i32) -> Error {
            Error::Kernel {
                family: "fake",
                object: what.to_string(),
                errno,
                message: None,
            }
        }
    }

    impl Kernel for Fake {
        fn route_add(&mut self, r: &RouteSpec, replace: bool) -> Result<(), Error> {
            let what = format!("route add {}", r.describe());
            self.call(what.clone())?;
            let same = |x: &RouteSpec| x.dst == r.dst && x.table == r.table;
            match self.routes.iter().position(same) {
                Some(i) if replace => self.routes[i] = r.clone(),
                Some(_) => return Err(self.errno(&what, libc::EEXIST)),
                None => self.routes.push(r.clone()),
            }
            Ok(())
        }
        fn route_del(&mut self, r: &RouteSpec) -> Result<bool, Error> {
            self.call(format!("route del {}", r.describe()))?;
            // By key, as the kernel deletes.
            let before = self.routes.len();
            self.routes
                .retain(|x| !(x.dst == r.dst && x.table == r.table));
            Ok(self.routes.len() != before)
        }
        fn route_list(&mut self, v6: bool) -> Result<Vec<RouteEntry>, Error> {
            self.call(format!("route list v6={v6}"))?;
            Ok(self
                .routes
                .iter()
                .filter(|r| r.dst.addr().is_ipv6() == v6)
                .map(RouteEntry::from)
                .collect())
        }
        fn rule_list(&mut self, v6: bool) -> Result<Vec<RuleSpec>, Error> {
            self.call(format!("rule list v6={v6}"))?;
            Ok(self.rules.iter().filter(|r| r.v6 == v6).cloned().collect())
        }
        fn rule_add(&mut self, r: &RuleSpec) -> Result<(), Error> {
            self.call(format!("rule add {}", r.describe()))?;
            self.rules.push(r.clone());
            Ok(())
        }
        fn rule_del(&mut self, r: &RuleSpec) -> Result<bool, Error> {
            self.call(format!("rule del {}", r.describe()))?;
            match self.rules.iter().position(|x| x.matches(r)) {
                Some(i) => {
                    self.rules.remove(i);
                    Ok(true)
                }
                None => Ok(false),
            }
        }
        fn sysctl_read(&mut self, name: &str) -> Result<String, Error> {
            let what = format!("sysctl read {name}");
            self.call(what.clone())?;
            match self.sysctls.get(name) {
                Some(v) => Ok(v.clone()),
                None => Err(self.errno(&what, libc::ENOENT)),
            }
        }
        fn sysctl_ensure(&mut self, name: &str, value: &str) -> Result<Option<String>, Error> {
            let what = format!("sysctl write {name}={value}");
            self.call(what.clone())?;
            match self.sysctls.get_mut(name) {
                Some(cur) if sysctl::normalize(cur) == sysctl::normalize(value) => Ok(None),
                Some(cur) => Ok(Some(std::mem::replace(cur, value.to_string()))),
                None => Err(self.errno(&what, libc::ENOENT)),
            }
        }
        fn nft_replace(
            &mut self,
            table: &str,
            rules: &TableRules<'_>,
            tag: &str,
        ) -> Result<(), Error> {
            self.call(format!("nft replace {table}"))?;
            let handles = 1u64..;
            let masquerade = rules
                .masquerade
                .unwrap_or_default()
                .iter()
                .zip(handles.clone())
                .map(|(r, handle)| ListedRule {
                    rule: Some(r.clone()),
                    tag: Some(tag.into()),
                    handle,
                })
                .collect();
            let mss = rules
                .mss
                .iter()
                .zip(handles)
                .map(|(r, handle)| ListedMss {
                    rule: Some(r.clone()),
                    tag: Some(tag.into()),
                    handle,
                })
                .collect();
            let t = Table {
                masquerade,
                mss,
                tag: tag.into(),
            };
            self.tables.insert(table.into(), t);
            Ok(())
        }
        fn nft_delete(&mut self, table: &str) -> Result<bool, Error> {
            self.call(format!("nft delete {table}"))?;
            Ok(self.tables.remove(table).is_some())
        }
        fn nft_list_masquerade(&mut self, table: &str) -> Result<Option<Vec<ListedRule>>, Error> {
            self.call(format!("nft list {table} postrouting"))?;
            Ok(self.tables.get(table).map(|t| t.masquerade.clone()))
        }
        fn nft_list_mss(&mut self, table: &str) -> Result<Option<Vec<ListedMss>>, Error> {
            self.call(format!("nft list {table} forward"))?;
            Ok(self.tables.get(table).map(|t| t.mss.clone()))
        }
    }
}
