//! The kernel operations ADD's apply and its removal use, behind one
//! small trait: the real implementation goes through the kit (netlink in the
//! node's namespace, `/proc/sys`), and unit tests use `fake::Fake`, which
//! keeps routes, rules and sysctls in memory, records every call and can be
//! told to fail the Nth one with a given errno. The netns integration tests
//! still run the real thing.

use ipnet::IpNet;
use podgate_kit::link::{self, Link};
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::{self, NetNs};
use podgate_kit::nft::{ListedMss, ListedRule, NftSocket, SnatFinding, TableRules};
use podgate_kit::route::{self, RouteEntry, RouteSpec};
use podgate_kit::rule::{self, RuleSpec};
use podgate_kit::sysctl::SysctlFile;
use podgate_kit::{sysctl, Error};

/// Route, rule, sysctl and nf_tables operations in one namespace.
pub trait Kernel {
    /// Add a route; `replace` overwrites one with the same key.
    fn route_add(&mut self, r: &RouteSpec, replace: bool) -> Result<(), Error>;
    /// Delete a route; Ok(false) when it was already gone.
    fn route_del(&mut self, r: &RouteSpec) -> Result<bool, Error>;
    /// Routes of one family in every table.
    fn route_list(&mut self, v6: bool) -> Result<Vec<RouteEntry>, Error>;
    /// Routes of one family in `table` alone.
    fn route_list_table(&mut self, v6: bool, table: u32) -> Result<Vec<RouteEntry>, Error> {
        let mut rows = self.route_list(v6)?;
        rows.retain(|r| r.table == table);
        Ok(rows)
    }
    fn rule_list(&mut self, v6: bool) -> Result<Vec<RuleSpec>, Error>;
    fn rule_add(&mut self, r: &RuleSpec) -> Result<(), Error>;
    /// Delete a rule; Ok(false) when it was already gone.
    fn rule_del(&mut self, r: &RuleSpec) -> Result<bool, Error>;
    fn sysctl_read(&mut self, name: &str) -> Result<String, Error>;
    /// Write `value` unless already there; the previous value when changed.
    fn sysctl_ensure(&mut self, name: &str, value: &str) -> Result<Option<String>, Error>;
    /// Write `value` (the caller has just read a different one).
    fn sysctl_write(&mut self, name: &str, value: &str) -> Result<(), Error>;
    /// Create or atomically replace podgate's `inet <table>`.
    fn nft_replace(&mut self, table: &str, rules: &TableRules<'_>, tag: &str) -> Result<(), Error>;
    /// Delete `inet <table>`; Ok(false) when it was already gone.
    fn nft_delete(&mut self, table: &str) -> Result<bool, Error>;
    /// podgate's `inet` tables whose name starts with `prefix`, with their
    /// ownership tags.
    fn nft_list_tagged(&mut self, prefix: &str) -> Result<Vec<(String, Option<String>)>, Error>;
    /// Chain `postrouting` of `inet <table>`; None when the table is missing.
    fn nft_list_masquerade(&mut self, table: &str) -> Result<Option<Vec<ListedRule>>, Error>;
    /// Chain `forward` (MSS clamp) of `inet <table>`; None when the table is
    /// missing.
    fn nft_list_mss(&mut self, table: &str) -> Result<Option<Vec<ListedMss>>, Error>;
    /// The addresses of one family on every interface.
    fn address_list(&mut self, v6: bool) -> Result<Vec<IpNet>, Error>;
    /// Every interface (index and name).
    fn link_list(&mut self) -> Result<Vec<Link>, Error>;
    /// Source NAT rules in the namespace's nat postrouting chains (any table).
    fn nft_find_snat(&mut self) -> Result<Vec<SnatFinding>, Error>;
    /// The namespace it acts in, as error messages name it.
    fn netns(&self) -> &str;
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

/// What the pod side needs opened in the pod's namespace.
#[derive(Debug, Clone, Copy)]
pub struct PodWants<'a> {
    /// An nf_tables socket (masquerade or MSS clamp).
    pub nft: bool,
    /// A route socket (pod routes, the interface's index).
    pub route: bool,
    /// The sysctls, as /proc/sys files opened read-write.
    pub sysctls: &'a [String],
    /// The namespace's cookie (from the nf_tables or route socket when one
    /// is opened, a throwaway socket otherwise).
    pub cookie: bool,
}

impl PodWants<'_> {
    /// Nothing to open: no trip into the namespace at all.
    pub fn is_empty(&self) -> bool {
        !self.nft && !self.route && self.sysctls.is_empty() && !self.cookie
    }
}

/// Handles bound to a pod's namespace, opened there by the calling thread
/// moved into it and back ([`NetNs::open_in`]): netlink sockets stay bound to the namespace
/// they were created in, and a /proc/sys file keeps reading and writing the
/// value of the namespace it was opened in, from whichever thread uses
/// them. They also keep that namespace alive until they are dropped (every
/// fd `O_CLOEXEC`, closed on drop).
pub struct PodHandles {
    /// The namespace's path, for error messages.
    pub netns: String,
    nft: Option<NftSocket>,
    route: Option<RouteSocket>,
    sysctls: Vec<(String, Result<SysctlFile, Error>)>,
    cookie: Option<u64>,
}

impl PodHandles {
    /// One trip into `ns`: open what `want` names. A sysctl that cannot be
    /// opened (missing in this namespace) is kept as its error, reported
    /// when it is used; a socket that cannot be opened fails the call.
    pub fn open(ns: &NetNs, want: PodWants<'_>) -> Result<PodHandles, Error> {
        let label = ns.path().display().to_string();
        ns.open_in(|| PodHandles::open_here(label, want))?
    }

    /// On the calling thread while it is inside the pod's namespace.
    fn open_here(netns: String, want: PodWants<'_>) -> Result<PodHandles, Error> {
        let nft = if want.nft {
            Some(NftSocket::new().map_err(|e| labelled(e, &netns))?)
        } else {
            None
        };
        let route = if want.route {
            Some(RouteSocket::new_labelled(netns.clone())?)
        } else {
            None
        };
        let sysctls = want
            .sysctls
            .iter()
            .map(|n| (n.clone(), SysctlFile::open(n, &netns)))
            .collect();
        let cookie = match (&nft, &route) {
            _ if !want.cookie => None,
            (Some(n), _) => n.netns_cookie()?,
            (None, Some(r)) => r.netns_cookie()?,
            (None, None) => netns::current_cookie()?,
        };
        Ok(PodHandles {
            netns,
            nft,
            route,
            sysctls,
            cookie,
        })
    }

    /// The namespace's cookie, when asked for and the kernel has one.
    pub fn cookie(&self) -> Option<u64> {
        self.cookie
    }

    pub fn route(&mut self) -> Result<&mut RouteSocket, Error> {
        let netns = &self.netns;
        self.route
            .as_mut()
            .ok_or_else(|| not_opened("route", netns))
    }

    fn nft(&mut self) -> Result<&mut NftSocket, Error> {
        let netns = &self.netns;
        self.nft
            .as_mut()
            .ok_or_else(|| not_opened("nf_tables", netns))
    }

    /// The handle of sysctl `name`, or why it could not be opened.
    pub fn sysctl(&self, name: &str) -> Result<&SysctlFile, Error> {
        match self.sysctls.iter().find(|(n, _)| n == name) {
            Some((_, Ok(f))) => Ok(f),
            Some((_, Err(e))) => Err(again(e)),
            None => Err(Error::SysctlRefused {
                name: name.to_string(),
                msg: format!("not opened in netns {}", self.netns),
            }),
        }
    }
}

/// An nf_tables socket error, with the pod's namespace named.
fn labelled(e: Error, netns: &str) -> Error {
    match e {
        Error::Socket { family, op, source } => Error::Socket {
            family,
            op: format!("{op} (netns {netns})"),
            source,
        },
        other => other,
    }
}

fn not_opened(family: &'static str, netns: &str) -> Error {
    Error::Socket {
        family,
        op: format!("use (not opened in netns {netns})"),
        source: std::io::Error::from(std::io::ErrorKind::NotConnected),
    }
}

/// The same error once more (a failed open is reported at each use).
fn again(e: &Error) -> Error {
    match e {
        Error::Sysctl { name, op, source } => Error::Sysctl {
            name: name.clone(),
            op,
            source: match source.raw_os_error() {
                Some(errno) => std::io::Error::from_raw_os_error(errno),
                None => std::io::Error::new(source.kind(), source.to_string()),
            },
        },
        Error::SysctlRefused { name, msg } => Error::SysctlRefused {
            name: name.clone(),
            msg: msg.clone(),
        },
        other => Error::SysctlRefused {
            name: "-".into(),
            msg: other.to_string(),
        },
    }
}

enum Sock<'a> {
    Lazy(&'a mut NodeSocket),
    Open(&'a mut RouteSocket),
    /// Handles opened in a pod's namespace, used from this thread.
    Pod(&'a mut PodHandles),
}

/// The real kernel: the kit's netlink codecs on sockets of the calling
/// thread's namespace (opened when first needed) and sysctls through
/// `/proc/sys`, or on the handles opened in a pod's namespace.
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

    /// Over handles opened in a pod's namespace (from any thread).
    pub fn pod(handles: &'a mut PodHandles) -> Live<'a> {
        Live {
            route: Sock::Pod(handles),
            nft: None,
        }
    }

    fn sock(&mut self) -> Result<&mut RouteSocket, Error> {
        match &mut self.route {
            Sock::Lazy(n) => n.get(),
            Sock::Open(s) => Ok(s),
            Sock::Pod(h) => h.route(),
        }
    }

    fn nft(&mut self) -> Result<&mut NftSocket, Error> {
        if let Sock::Pod(h) = &mut self.route {
            return h.nft();
        }
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
    fn route_list_table(&mut self, v6: bool, table: u32) -> Result<Vec<RouteEntry>, Error> {
        route::list_table(self.sock()?, v6, table)
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
        match &self.route {
            Sock::Pod(h) => h.sysctl(name)?.read(),
            _ => sysctl::read(name),
        }
    }
    fn sysctl_ensure(&mut self, name: &str, value: &str) -> Result<Option<String>, Error> {
        match &self.route {
            Sock::Pod(h) => h.sysctl(name)?.ensure(value),
            _ => sysctl::ensure(name, value),
        }
    }
    fn sysctl_write(&mut self, name: &str, value: &str) -> Result<(), Error> {
        match &self.route {
            Sock::Pod(h) => h.sysctl(name)?.write(value),
            _ => sysctl::ensure(name, value).map(|_| ()),
        }
    }
    fn nft_replace(&mut self, table: &str, rules: &TableRules<'_>, tag: &str) -> Result<(), Error> {
        self.nft()?.replace_table(table, rules, tag)
    }
    fn nft_delete(&mut self, table: &str) -> Result<bool, Error> {
        self.nft()?.delete_table(table)
    }
    fn nft_list_tagged(&mut self, prefix: &str) -> Result<Vec<(String, Option<String>)>, Error> {
        self.nft()?.list_inet_tables_tagged(prefix)
    }
    fn nft_list_masquerade(&mut self, table: &str) -> Result<Option<Vec<ListedRule>>, Error> {
        self.nft()?.list_masquerade(table)
    }
    fn nft_list_mss(&mut self, table: &str) -> Result<Option<Vec<ListedMss>>, Error> {
        self.nft()?.list_mss(table)
    }
    fn address_list(&mut self, v6: bool) -> Result<Vec<IpNet>, Error> {
        Ok(link::addresses_of(self.sock()?, v6)?
            .into_iter()
            .map(|a| a.addr)
            .collect())
    }
    fn link_list(&mut self) -> Result<Vec<Link>, Error> {
        link::list(self.sock()?)
    }
    fn nft_find_snat(&mut self) -> Result<Vec<SnatFinding>, Error> {
        self.nft()?.find_snat_rules(None)
    }
    fn netns(&self) -> &str {
        match &self.route {
            Sock::Pod(h) => &h.netns,
            _ => "of the node",
        }
    }
}

/// `K` with its route and rule dumps taken once per family and reused until
/// a change goes through it: checking many records against one namespace
/// (the agent's drift check of every attachment, `podgate inspect`) then
/// dumps the node's routes once, not once a record, which made a
/// collection grow with the square of the attachments.
pub struct ListedOnce<K> {
    inner: K,
    /// IPv4, IPv6.
    routes: [Option<Vec<RouteEntry>>; 2],
    rules: [Option<Vec<RuleSpec>>; 2],
}

impl<K: Kernel> ListedOnce<K> {
    pub fn new(inner: K) -> ListedOnce<K> {
        ListedOnce {
            inner,
            routes: [None, None],
            rules: [None, None],
        }
    }

    /// A change goes through: what was listed may be out of date.
    fn changed(&mut self) -> &mut K {
        self.routes = [None, None];
        self.rules = [None, None];
        &mut self.inner
    }
}

/// The IPv4 or the IPv6 slot.
fn family<T>(slots: &mut [Option<Vec<T>>; 2], v6: bool) -> &mut Option<Vec<T>> {
    let [four, six] = slots;
    if v6 {
        six
    } else {
        four
    }
}

impl<K: Kernel> Kernel for ListedOnce<K> {
    fn route_add(&mut self, r: &RouteSpec, replace: bool) -> Result<(), Error> {
        self.changed().route_add(r, replace)
    }
    fn route_del(&mut self, r: &RouteSpec) -> Result<bool, Error> {
        self.changed().route_del(r)
    }
    fn route_list(&mut self, v6: bool) -> Result<Vec<RouteEntry>, Error> {
        let slot = family(&mut self.routes, v6);
        if slot.is_none() {
            *slot = Some(self.inner.route_list(v6)?);
        }
        Ok(slot.clone().unwrap_or_default())
    }
    fn rule_list(&mut self, v6: bool) -> Result<Vec<RuleSpec>, Error> {
        let slot = family(&mut self.rules, v6);
        if slot.is_none() {
            *slot = Some(self.inner.rule_list(v6)?);
        }
        Ok(slot.clone().unwrap_or_default())
    }
    fn rule_add(&mut self, r: &RuleSpec) -> Result<(), Error> {
        self.changed().rule_add(r)
    }
    fn rule_del(&mut self, r: &RuleSpec) -> Result<bool, Error> {
        self.changed().rule_del(r)
    }
    fn sysctl_read(&mut self, name: &str) -> Result<String, Error> {
        self.inner.sysctl_read(name)
    }
    fn sysctl_ensure(&mut self, name: &str, value: &str) -> Result<Option<String>, Error> {
        self.inner.sysctl_ensure(name, value)
    }
    fn sysctl_write(&mut self, name: &str, value: &str) -> Result<(), Error> {
        self.inner.sysctl_write(name, value)
    }
    fn nft_replace(&mut self, table: &str, rules: &TableRules<'_>, tag: &str) -> Result<(), Error> {
        self.inner.nft_replace(table, rules, tag)
    }
    fn nft_delete(&mut self, table: &str) -> Result<bool, Error> {
        self.inner.nft_delete(table)
    }
    fn nft_list_tagged(&mut self, prefix: &str) -> Result<Vec<(String, Option<String>)>, Error> {
        self.inner.nft_list_tagged(prefix)
    }
    fn nft_list_masquerade(&mut self, table: &str) -> Result<Option<Vec<ListedRule>>, Error> {
        self.inner.nft_list_masquerade(table)
    }
    fn nft_list_mss(&mut self, table: &str) -> Result<Option<Vec<ListedMss>>, Error> {
        self.inner.nft_list_mss(table)
    }
    fn address_list(&mut self, v6: bool) -> Result<Vec<IpNet>, Error> {
        self.inner.address_list(v6)
    }
    fn link_list(&mut self) -> Result<Vec<Link>, Error> {
        self.inner.link_list()
    }
    fn nft_find_snat(&mut self) -> Result<Vec<SnatFinding>, Error> {
        self.inner.nft_find_snat()
    }
    fn netns(&self) -> &str {
        self.inner.netns()
    }
}

#[cfg(test)]
pub mod fake {
    //! In-memory kernel for unit tests (youki's fake netlink client is the
    //! model): state as plain data, every call logged as one line.

    use super::Kernel;
    use ipnet::IpNet;
    use podgate_kit::link::Link;
    use podgate_kit::nft::{ListedMss, ListedRule, SnatFinding, TableRules};
    use podgate_kit::route::{RouteEntry, RouteSpec};
    use podgate_kit::rule::RuleSpec;
    use podgate_kit::{sysctl, Error};
    use std::collections::BTreeMap;

    /// The namespace every fake acts in, as its errors name it.
    pub const NETNS: &str = "/var/run/netns/pg-unit";

    #[derive(Debug, Default)]
    pub struct Fake {
        pub routes: Vec<RouteSpec>,
        pub rules: Vec<RuleSpec>,
        pub sysctls: BTreeMap<String, String>,
        /// `inet` tables by name.
        pub tables: BTreeMap<String, Table>,
        /// Interface addresses (both families).
        pub addresses: Vec<IpNet>,
        pub links: Vec<Link>,
        /// What a SNAT search of the nat chains finds.
        pub snat: Vec<SnatFinding>,
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
        fn route_list_table(&mut self, v6: bool, table: u32) -> Result<Vec<RouteEntry>, Error> {
            self.call(format!("route list v6={v6} table={table}"))?;
            Ok(self
                .routes
                .iter()
                .filter(|r| r.dst.addr().is_ipv6() == v6 && r.table == table)
                .map(RouteEntry::from)
                .collect())
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
            // Where the kernel puts it: after every rule of its priority
            // or lower (the order a walk, and a listing, takes).
            let at = self
                .rules
                .iter()
                .position(|x| x.priority > r.priority)
                .unwrap_or(self.rules.len());
            self.rules.insert(at, r.clone());
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
        fn sysctl_write(&mut self, name: &str, value: &str) -> Result<(), Error> {
            let what = format!("sysctl write {name}={value}");
            self.call(what.clone())?;
            match self.sysctls.get_mut(name) {
                Some(cur) => {
                    *cur = value.to_string();
                    Ok(())
                }
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
        fn nft_list_tagged(
            &mut self,
            prefix: &str,
        ) -> Result<Vec<(String, Option<String>)>, Error> {
            self.call(format!("nft list tagged {prefix}"))?;
            Ok(self
                .tables
                .iter()
                .filter(|(name, _)| name.starts_with(prefix))
                .map(|(name, t)| (name.clone(), Some(t.tag.clone())))
                .collect())
        }
        fn nft_list_masquerade(&mut self, table: &str) -> Result<Option<Vec<ListedRule>>, Error> {
            self.call(format!("nft list {table} postrouting"))?;
            Ok(self.tables.get(table).map(|t| t.masquerade.clone()))
        }
        fn nft_list_mss(&mut self, table: &str) -> Result<Option<Vec<ListedMss>>, Error> {
            self.call(format!("nft list {table} forward"))?;
            Ok(self.tables.get(table).map(|t| t.mss.clone()))
        }
        fn address_list(&mut self, v6: bool) -> Result<Vec<IpNet>, Error> {
            self.call(format!("address list v6={v6}"))?;
            Ok(self
                .addresses
                .iter()
                .filter(|a| a.addr().is_ipv6() == v6)
                .copied()
                .collect())
        }
        fn link_list(&mut self) -> Result<Vec<Link>, Error> {
            self.call("link list".into())?;
            Ok(self.links.clone())
        }
        fn nft_find_snat(&mut self) -> Result<Vec<SnatFinding>, Error> {
            self.call("nft find snat".into())?;
            Ok(self.snat.clone())
        }
        fn netns(&self) -> &str {
            NETNS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::Fake;
    use super::{Kernel, ListedOnce};
    use podgate_kit::route::RouteSpec;

    fn lists(k: &ListedOnce<Fake>) -> usize {
        k.inner
            .calls
            .iter()
            .filter(|c| c.contains(" list "))
            .count()
    }

    #[test]
    fn a_listed_view_dumps_each_family_once_until_a_change_goes_through_it() {
        let mut k = ListedOnce::new(Fake::default());
        let r = RouteSpec::new("10.100.0.0/24".parse().unwrap());
        k.inner.routes.push(r.clone());
        for _ in 0..3 {
            assert_eq!(k.route_list(false).unwrap().len(), 1);
            assert!(k.route_list(true).unwrap().is_empty());
            assert!(k.rule_list(false).unwrap().is_empty());
        }
        assert_eq!(lists(&k), 3);
        // A change through the view: the next listing is fresh.
        k.route_del(&r).unwrap();
        assert!(k.route_list(false).unwrap().is_empty());
        assert_eq!(lists(&k), 4);
    }
}
