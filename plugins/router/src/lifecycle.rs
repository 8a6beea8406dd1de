//! Records across kills, reboots and upgrades: which records describe live
//! pods, removing what stale ones left, and finding podgate's objects by
//! ownership when a record cannot be used. ADD, DEL, GC and the installer
//! daemon's periodic sweep all go through here, with the state lock held.

use crate::apply::{self, Failures};
use crate::claims;
use crate::kernel::{Kernel, ListedOnce, Live};
use crate::record::{self, Depth, Here, Listing, Liveness, ReadError, Record};
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_kit::state::{Key, Names, StateStore};
use std::path::Path;

/// The records of this node, judged.
pub struct Census {
    pub listing: Listing,
    /// Index into `listing.records` and why each is stale.
    pub stale: Vec<(usize, Liveness)>,
}

impl Census {
    /// Read every record and judge each against `here`, each as deep as
    /// `depth` says: deeper checks cost syscalls (and, precise, a trip into
    /// the namespace), so only where the answer decides something.
    pub fn take(
        store: &StateStore,
        here: &Here,
        depth: impl Fn(&Record) -> Depth,
    ) -> Result<Census, podgate_kit::Error> {
        Census::take_in(store, &store.names()?, here, depth)
    }

    /// [`Census::take`] of the records in `names`: a listing of the state
    /// directory this request already made (under the lock, or before it
    /// for a census only [`Census::confirm_stale`] relies on).
    pub fn take_in(
        store: &StateStore,
        names: &Names,
        here: &Here,
        depth: impl Fn(&Record) -> Depth,
    ) -> Result<Census, podgate_kit::Error> {
        Ok(Census::judged(record::list_in(store, names)?, here, depth))
    }

    fn judged(listing: Listing, here: &Here, depth: impl Fn(&Record) -> Depth) -> Census {
        let stale = listing
            .records
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let l = r.liveness(here, depth(r));
                l.is_stale().then_some((i, l))
            })
            .collect();
        Census { listing, stale }
    }

    /// A census of only `records` (read by the caller, e.g. the owners of
    /// the pools an ADD overlaps, from the claims index): it claims nothing
    /// else, so only a caller whose plan checks only those records (and no
    /// strict slot) may use it.
    pub fn of(records: Vec<Record>, here: &Here, depth: impl Fn(&Record) -> Depth) -> Census {
        let listing = Listing {
            records,
            newer: Vec::new(),
            unreadable: Vec::new(),
        };
        Census::judged(listing, here, depth)
    }

    /// A census of the records the claims index names for `want`, and of
    /// `own`'s record: the other records hold no claim `want` covers, so
    /// only a caller whose plan checks nothing else may use it. The
    /// records read bring in what removing them (if stale) needs: every
    /// strict record for a strict one, the owners of their pools.
    ///
    /// `None`: the index cannot answer and the caller reads every record:
    /// `own`'s record cannot be read, or strict settings are at stake and
    /// a record could not be read, one the index names or one it does not
    /// know (`unknown`, from [`claims::Index::catch_up`]): fail closed, as
    /// [`Census::last_strict`] does for a full census.
    pub fn indexed(
        store: &StateStore,
        index: &claims::Index,
        unknown: usize,
        want: claims::Wanted<'_>,
        own: &Key,
        here: &Here,
        depth: impl Fn(&Record) -> Depth,
    ) -> Option<Census> {
        let (mut records, mut unreadable) = index.records(store, &want, own);
        match record::read(store, own) {
            Ok(Some(r)) => records.push(r),
            Ok(None) => {}
            Err(_) => return None,
        }
        // What else the records read bring in, until nothing new: a strict
        // one needs every strict record (removing it may put node-wide
        // strict settings back), a stale one the owners of its pools (it
        // is removed with what no live record also describes).
        let mut asked: Vec<ipnet::IpNet> = want.pools.to_vec();
        let mut strict = want.strict;
        loop {
            let more_strict = !strict && records.iter().any(Record::is_strict);
            let pools: Vec<ipnet::IpNet> = records
                .iter()
                .flat_map(|r| r.claim().pools)
                .filter(|p| !asked.contains(p))
                .collect();
            if !more_strict && pools.is_empty() {
                break;
            }
            let next = claims::Wanted {
                pools: &pools,
                tables: false,
                strict: more_strict,
            };
            let (more, u) = index.records(store, &next, own);
            unreadable += u;
            for r in more {
                if !records.iter().any(|x| x.key == r.key) {
                    records.push(r);
                }
            }
            strict |= more_strict;
            asked.extend(pools);
        }
        if strict && unknown + unreadable > 0 {
            return None;
        }
        Some(Census::of(records, here, depth))
    }

    /// The census removing the strict record `own` needs (node-wide
    /// strict settings go back only if no other live strict pod remains):
    /// the strict records and the owners of `own`'s pools the claims index
    /// names, the index caught up first from `names` (the listing taken
    /// under the node-wide lock); every record if the index cannot answer.
    pub fn for_strict(
        store: &StateStore,
        names: &Names,
        here: &Here,
        own: &Record,
        depth: impl Fn(&Record) -> Depth,
    ) -> Result<Census, podgate_kit::Error> {
        let mut index = claims::Index::load(store)?;
        let caught = index.catch_up(store, names)?;
        let pools = own.claim().pools;
        let want = claims::Wanted {
            pools: &pools,
            tables: false,
            strict: true,
        };
        match Census::indexed(store, &index, caught.unknown, want, &own.key, here, &depth) {
            Some(c) => Ok(c),
            None => Census::take_in(store, names, here, depth),
        }
    }

    /// For a census taken before the node-wide lock: re-read, under it, the
    /// records it found stale (rare) and judge them again; one removed or
    /// replaced meanwhile (by another call's sweep, or a new ADD of that
    /// key) is dropped or judged afresh. The live records are left as read:
    /// only a caller whose plan checks no claims, and whose census decides
    /// nothing node-wide (no record in it holds a claim or a node object),
    /// may use such a census; another record may have been written since.
    pub fn confirm_stale(
        self,
        store: &StateStore,
        here: &Here,
        depth: impl Fn(&Record) -> Depth,
    ) -> Census {
        if self.stale.is_empty() {
            return self;
        }
        let Census { listing, stale } = self;
        let Listing {
            records,
            newer,
            unreadable,
        } = listing;
        let mut kept = Vec::with_capacity(records.len());
        let mut still = Vec::new();
        for (i, rec) in records.into_iter().enumerate() {
            if !stale.iter().any(|(s, _)| *s == i) {
                kept.push(rec);
                continue;
            }
            // Gone, or unreadable now: nothing for this call to clear.
            if let Ok(Some(fresh)) = record::read(store, &rec.key) {
                let l = fresh.liveness(here, depth(&fresh));
                if l.is_stale() {
                    still.push((kept.len(), l));
                }
                kept.push(fresh);
            }
        }
        Census {
            listing: Listing {
                records: kept,
                newer,
                unreadable,
            },
            stale: still,
        }
    }

    /// No records looked at: for a DEL that needs none (not strict, its own
    /// record live). Claims nothing, and nothing in it is stale.
    pub fn none() -> Census {
        Census {
            listing: Listing {
                records: Vec::new(),
                newer: Vec::new(),
                unreadable: Vec::new(),
            },
            stale: Vec::new(),
        }
    }

    pub fn is_stale(&self, key: &Key) -> bool {
        self.stale
            .iter()
            .any(|(i, _)| self.listing.records.get(*i).is_some_and(|r| r.key == *key))
    }

    /// `key`'s record was removed by this request: the judgements that
    /// follow (the last strict pod, routes another record describes) no
    /// longer count it as live.
    pub fn forget(&mut self, key: &Key) {
        if let Some(i) = self.listing.records.iter().position(|r| r.key == *key) {
            self.stale.push((
                i,
                Liveness::Stale {
                    reason: "removed by this request".into(),
                    node_gone: false,
                },
            ));
        }
    }

    /// Live records (pending or applied).
    pub fn live(&self) -> impl Iterator<Item = &Record> + '_ {
        self.listing
            .records
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.stale.iter().any(|(s, _)| s == i))
            .map(|(_, r)| r)
    }

    /// Live records (pending or applied) other than `except`.
    pub fn live_except<'a>(&'a self, except: &'a Key) -> impl Iterator<Item = &'a Record> + 'a {
        self.live().filter(move |r| r.key != *except)
    }

    /// No live strict record and no newer one: the node-wide strict
    /// settings are left to the kernel's word ([`restore_unneeded`]).
    pub fn no_live_strict(&self) -> bool {
        self.listing.newer.is_empty() && !self.live().any(Record::is_strict)
    }

    /// Removing `key` may put node-wide strict settings back: no other live
    /// strict pod, and no record of a newer format (fail closed: it may
    /// bound a pod otherwise). A record that cannot be read does not count
    /// here: [`crate::apply::boundary::restore_node`] asks the kernel
    /// whether a strict pod is still bound, which the pod of an unreadable
    /// record is exactly while its netns (and interface) lives.
    pub fn last_strict(&self, key: &Key) -> bool {
        self.listing.newer.is_empty() && !self.live_except(key).any(Record::is_strict)
    }
}

/// A record's node side, without what another live record also describes
/// (a pool re-claimed by a new pod must keep the new pod's route).
fn node_side_only_mine(rec: &Record, census: &Census) -> Record {
    let mut mine = rec.clone();
    mine.node_routes.retain(|r| {
        !census
            .live_except(&rec.key)
            .any(|o| o.node_routes.iter().any(|x| x == r))
    });
    mine
}

/// Remove what `rec` describes: the node side unless the node namespace it
/// was applied in is gone, the pod side only in its own namespace (`ns`, if
/// it is still that one). Returns failures.
pub fn remove_record(
    rec: &Record,
    census: &Census,
    node: &mut impl Kernel,
    ns: Option<&NetNs>,
    store: &StateStore,
    here: &Here,
) -> Failures {
    let mut failures = Failures::default();
    let liveness = rec.liveness_opened(here, Depth::Path, ns);
    let node_gone = matches!(
        liveness,
        Liveness::Stale {
            node_gone: true,
            ..
        }
    );
    if !node_gone {
        let mine = node_side_only_mine(rec, census);
        failures.extend(apply::remove_node(
            node,
            &mine,
            store,
            census.last_strict(&rec.key),
        ));
    } else if rec.is_strict() && census.last_strict(&rec.key) {
        // The node settings of an earlier boot are gone; drop their file.
        failures.extend(apply::boundary::restore_node(store, node));
    }
    if !liveness.is_stale() {
        // One trip into the namespace: the handles are opened there with its
        // cookie, and used only if it still is the record's namespace.
        if let Some(ns) = ns {
            match apply::removal_handles(rec, ns) {
                Ok(Some(mut pod)) => {
                    failures.extend(apply::remove_pod(&mut Live::pod(&mut pod), rec))
                }
                Ok(None) => {}
                Err(e) => failures.push(e),
            }
        }
    }
    failures
}

/// What a sweep did, for the log.
#[derive(Debug, Default)]
pub struct Swept {
    pub removed: Vec<String>,
    /// Unreadable records moved to `quarantine/`, one line each.
    pub quarantined: Vec<String>,
    pub failures: Failures,
    /// Claims index entries written or removed to match the records
    /// (the node agent's sweep).
    pub index_repaired: usize,
    /// Rules before a live strict pod's boundary that can take its traffic
    /// past it (the node agent's sweep reports them; another agent's rule
    /// is not podgate's to remove).
    pub rules_ahead: Vec<apply::RuleAhead>,
}

/// Remove what stale records (dead pods) left on the node, and the records.
pub fn clear_stale(
    census: &Census,
    node: &mut impl Kernel,
    store: &StateStore,
    here: &Here,
) -> Swept {
    let mut out = Swept::default();
    for (i, why) in &census.stale {
        let Some(rec) = census.listing.records.get(*i) else {
            continue;
        };
        let f = remove_record(rec, census, node, None, store, here);
        let reason = match why {
            Liveness::Stale { reason, .. } => reason.as_str(),
            Liveness::Live => "",
        };
        if f.is_empty() {
            match store.remove(&rec.key) {
                Ok(_) => out.removed.push(format!(
                    "stale record {}/{}/{} ({reason})",
                    rec.key.network, rec.key.container_id, rec.key.ifname
                )),
                Err(e) => out.failures.push(e),
            }
        } else {
            out.failures.extend(f);
        }
    }
    // The removed records' claims index entries, in one pass over the index
    // after them (entries go after their record, as a DEL removes them): a
    // pass per record made a sweep grow with stale records x attachments.
    if !out.removed.is_empty() {
        if let Err(e) = store
            .names()
            .and_then(|names| crate::claims::prune(store, &names))
        {
            out.failures.push(e);
        }
    }
    out
}

/// The state dir's subdirectory that records which cannot be read are
/// moved to, with their bytes (see [`quarantine_unreadable`]).
pub const QUARANTINE: &str = "quarantine";

/// What podgate-router makes in its state dir besides the store's own
/// files (records, locks, temp files): the uninstall purge removes these
/// and leaves any other name.
pub const STATE_DIR_NAMES: [&str; 4] = [
    claims::FILE,
    claims::V1_DIR,
    crate::strict_node::DIR,
    QUARANTINE,
];

/// Where an unreadable record's file is: among the records, or moved to
/// [`QUARANTINE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    Record,
    Quarantined,
}

/// Is `key`'s record in [`QUARANTINE`]? Only asked where the state dir's
/// listing (`names`) shows the directory.
pub fn quarantined(store: &StateStore, names: &Names, key: &Key) -> bool {
    names.contains(QUARANTINE)
        && matches!(store.sub(QUARANTINE), Ok(Some(q)) if q.handle().exists(key.file_name()))
}

/// Remove `key`'s file from [`QUARANTINE`], then its claims index entries.
pub fn remove_quarantined(store: &StateStore, key: &Key) -> Result<(), podgate_kit::Error> {
    if let Some(q) = store.sub(QUARANTINE)? {
        q.remove(key)?;
    }
    claims::release(store, key)
}

/// The files in [`QUARANTINE`], with the key each is named after.
pub fn quarantine_listing(
    store: &StateStore,
) -> Result<Vec<(Option<Key>, String)>, podgate_kit::Error> {
    let Some(q) = store.sub(QUARANTINE)? else {
        return Ok(Vec::new());
    };
    Ok(q.names()?
        .iter()
        .map(|n| {
            let n = n.to_string_lossy().into_owned();
            (Key::from_file_name(&n), n)
        })
        .collect())
}

/// What is known of an attachment whose record cannot be parsed: what
/// [`remove_unreadable`] removes by ownership.
pub struct Orphan<'a> {
    pub key: &'a Key,
    /// Where its record is.
    pub at: Unreadable,
    /// Its pod netns, if it is still there.
    pub ns: Option<&'a NetNs>,
    /// Its addresses (prevResult).
    pub pod_ips: &'a [std::net::IpAddr],
    /// The prefix of podgate's nf_tables tables in the pod.
    pub table_prefix: &'a str,
}

/// DEL (or a repeated ADD) of an attachment whose record cannot be parsed:
/// remove by ownership what carries its tag in its pod netns, and the node's
/// podgate routes and rules for its addresses that no other record accounts
/// for; then the record (from `at`).
pub fn remove_unreadable(
    orphan: &Orphan<'_>,
    census: &Census,
    node: &mut impl Kernel,
    store: &StateStore,
) -> Swept {
    let Orphan {
        key,
        at,
        ns,
        pod_ips,
        table_prefix,
    } = *orphan;
    let mut out = Swept::default();
    if let Some(ns) = ns {
        let wants = apply::PodWants {
            nft: true,
            route: true,
            sysctls: &[],
            cookie: false,
        };
        match apply::PodHandles::open(ns, wants) {
            Ok(mut pod) => {
                let (r, f) = apply::sweep_pod(&mut Live::pod(&mut pod), key, table_prefix);
                out.removed.extend(r);
                out.failures.extend(f);
            }
            Err(e) => out.failures.push(e),
        }
    }
    if !pod_ips.is_empty() {
        let records = &census.listing.records;
        let (r, f) = apply::sweep_node(node, records, Some(pod_ips));
        out.removed.extend(r);
        out.failures.extend(f);
    }
    if out.failures.is_empty() {
        let removed = match at {
            Unreadable::Record => crate::claims::remove(store, key).map(|_| ()),
            Unreadable::Quarantined => remove_quarantined(store, key),
        };
        match removed {
            Ok(()) => out
                .removed
                .push(format!("unreadable record {}", key.file_name())),
            Err(e) => out.failures.push(e),
        }
    }
    out
}

/// Move the records of `listing` that cannot be read (not those of a newer
/// format: a newer release reads them) into [`QUARANTINE`], each under its
/// pod's lock and read again there (an ADD of the pod may have replaced
/// it meanwhile), so that they no longer count anywhere: nothing can be
/// undone from them, a strict pod among them keeps the node-wide settings
/// through the kernel ([`crate::apply::boundary::restore_node`]), and the
/// runtime's DEL of the attachment still finds it there and removes what
/// carries its tag or addresses. Node-wide lock held. Returns a line per
/// record moved, and failures.
pub fn quarantine_unreadable(store: &StateStore, listing: &Listing) -> (Vec<String>, Failures) {
    let (mut moved, mut failures) = (Vec::new(), Failures::default());
    for (key, err) in &listing.unreadable {
        let Some(name) = key.as_ref().map(Key::file_name).or_else(|| file_of(err)) else {
            continue;
        };
        // A pod with a call in flight owns its record; the next sweep looks again.
        let _pod = match key.as_ref().map(|k| store.try_lock_pod(&k.container_id)) {
            Some(Ok(None)) => continue,
            Some(Err(e)) => {
                failures.push(e);
                continue;
            }
            Some(Ok(Some(l))) => Some(l),
            None => None,
        };
        let still = match key {
            Some(k) => !matches!(record::read(store, k), Ok(_) | Err(ReadError::Newer { .. })),
            None => true,
        };
        if !still {
            continue;
        }
        let q = match store.create_sub(QUARANTINE) {
            Ok(q) => q,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        match store.handle().rename_to(&name, q.handle(), &name) {
            Ok(()) => moved.push(format!(
                "quarantined unreadable record {name} (to {}): {err}",
                q.dir().display()
            )),
            Err(source) => failures.push(podgate_kit::Error::File {
                op: "quarantining",
                path: store.dir().join(&name),
                source,
            }),
        }
    }
    (moved, failures)
}

/// The file name an unreadable record's error names.
fn file_of(err: &ReadError) -> Option<String> {
    let path = match err {
        ReadError::Unreadable { path, .. } | ReadError::Newer { path, .. } => path,
        ReadError::Io(podgate_kit::Error::State { path, .. }) => path,
        ReadError::Io(_) => return None,
    };
    path.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Put the node-wide strict settings back when nothing needs them any
/// more: `census` (every record, under the node-wide lock) has no live
/// strict record and no newer one, and the kernel shows no strict pod
/// bound (restore_node asks it). What this covers: the last strict pod's
/// record was unreadable (removed by ownership at its DEL, or
/// quarantined), so no removal of a strict record put them back.
pub fn restore_unneeded(store: &StateStore, census: &Census, node: &mut impl Kernel) -> Failures {
    if !census.no_live_strict() {
        return Failures::default();
    }
    match crate::strict_node::read_shared(store) {
        Ok(Some(_)) => apply::boundary::restore_node(store, node),
        Ok(None) => Failures::default(),
        Err(e) => Failures::of(e),
    }
}

/// Remove orphaned temp files of killed writers (node-wide lock held;
/// `own`: the pod whose lock the caller holds, whose temp files are then
/// orphaned too).
///
/// Without `own` (GC, the periodic sweep) also the pod lock files of killed
/// holders; ADD and DEL leave those to them, as checking each pod lock
/// costs two syscalls per pod in flight under the node-wide lock.
pub fn sweep_temp(store: &StateStore, own: Option<&str>) -> Result<usize, podgate_kit::Error> {
    match store.names() {
        Ok(names) => sweep_temp_in(store, &names, own),
        Err(podgate_kit::Error::State { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(0)
        }
        Err(e) => Err(e),
    }
}

/// [`sweep_temp`] over a listing of the state directory this request made
/// (and reads its records from too: one listing instead of two).
pub fn sweep_temp_in(
    store: &StateStore,
    names: &Names,
    own: Option<&str>,
) -> Result<usize, podgate_kit::Error> {
    let locks = if own.is_none() {
        store.sweep_pod_locks_in(names)
    } else {
        0
    };
    let node = if names.contains(crate::strict_node::DIR) {
        crate::strict_node::sweep_temp(store)?
    } else {
        0
    };
    Ok(store.sweep_temp_in(names, own)? + node + locks)
}

/// The periodic sweep (the node agent, `podgate agent --sweep-secs`):
/// under the state lock, remove what stale records left and the records,
/// move records that cannot be read to `quarantine/`, remove what strict
/// pods without a readable record left once their netns went, and put the
/// node-wide strict settings back when no strict pod is left. The caller
/// runs in the node's network namespace (node routes of a dead pod are
/// removed there). A missing state dir is nothing to do.
pub fn sweep_stale(state_dir: &Path) -> Result<Swept, podgate_kit::Error> {
    let Some(store) = StateStore::existing(state_dir)? else {
        return Ok(Swept::default());
    };
    let _lock = store.lock()?;
    let mut out = Swept::default();
    let names = store.names()?;
    let temps = sweep_temp_in(&store, &names, None)?;
    if temps > 0 {
        out.removed.push(format!("{temps} orphaned temp file(s)"));
    }
    // The node netns never changes within a boot on a real node, and a
    // daemon started in another namespace by mistake must not call every
    // record stale: only the boot ID and the pods' namespaces judge here.
    let here = Here {
        node: None,
        ..Here::now()
    };
    let census = Census::take_in(&store, &names, &here, |_| Depth::Precise)?;
    let (moved, failed) = quarantine_unreadable(&store, &census.listing);
    out.failures.extend(failed);
    if !moved.is_empty() {
        claims::prune(&store, &store.names()?)?;
    }
    out.quarantined = moved;
    // Every record was just read: the claims index is made to hold what
    // they claim (what an index-unaware writer changed is repaired).
    out.index_repaired = claims::reconcile(&store, &census.listing.records)?;
    let mut sock = RouteSocket::new()?;
    let mut node = Live::on(&mut sock);
    let s = clear_stale(&census, &mut node, &store, &here);
    out.removed.extend(s.removed);
    out.failures.extend(s.failures);
    // What strict pods without a readable record left once their netns
    // went (not beside a newer release's record: its objects may look
    // unaccounted for), then the node-wide settings if no strict pod is
    // left.
    if census.listing.newer.is_empty() {
        let live: Vec<Record> = census.live().cloned().collect();
        let (removed, failed) = apply::sweep_detached(&mut node, &live);
        out.removed.extend(removed);
        out.failures.extend(failed);
    }
    out.failures
        .extend(restore_unneeded(&store, &census, &mut node));
    // Then what comes before the boundary of the strict pods left.
    let mut k = ListedOnce::new(node);
    for rec in census.live() {
        match apply::rules_ahead(&mut k, rec) {
            Ok(found) => out.rules_ahead.extend(found),
            Err(e) => out.failures.push(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::kernel::fake::Fake;

    /// A store in a temporary directory (removed with the guard) holding
    /// the golden vpn-full record of a pod whose netns is gone: stale, its
    /// node still this one (its node route is there to remove).
    fn stale_pod() -> (tempfile::TempDir, StateStore, Record) {
        let tmp = tempfile::Builder::new()
            .prefix("pg-lifecycle-unit-")
            .tempdir()
            .unwrap();
        let store = StateStore::open(&tmp.path().join("state")).unwrap();
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/records/v1-vpn-full.json");
        let mut rec = record::parse(&p, &std::fs::read(&p).unwrap()).unwrap();
        rec.netns = Some(tmp.path().join("gone-netns"));
        store.write(&rec.key, &rec).unwrap();
        (tmp, store, rec)
    }

    fn census(store: &StateStore, here: &Here) -> Census {
        Census::take(store, here, |_| Depth::Path).unwrap()
    }

    #[test]
    fn clear_stale_removes_a_dead_pods_node_route_and_record_and_keeps_both_on_a_failed_call() {
        let here = Here {
            boot_id: None,
            node: None,
        };
        let (_tmp, store, rec) = stale_pod();
        let route = rec.node_routes[0].spec();
        let mut k = Fake {
            routes: vec![route.clone()],
            ..Fake::default()
        };
        k.fail_call(1, libc::EPERM);
        let c = census(&store, &here);
        assert_eq!(c.stale.len(), 1, "the pod's netns is gone");
        let s = clear_stale(&c, &mut k, &store, &here);
        assert!(s.removed.is_empty(), "{s:?}");
        assert_eq!(s.failures.len(), 1, "{s:?}");
        let (e, _) = s.failures.iter().next().unwrap().kit();
        assert_eq!(e.errno(), Some(libc::EPERM), "{e}");
        assert!(e.to_string().contains("route del"), "{e}");
        assert_eq!(k.routes, [route], "the route is still there");
        assert!(record::read(&store, &rec.key).unwrap().is_some());
        // As GC reports it: the failed call's errno and object reach the
        // CNI error's details.
        let what = "gc";
        let e: podgate_cni::CniError = crate::error::Error::Left {
            what,
            left: s.failures,
        }
        .into();
        assert_eq!(e.code, podgate_cni::code::APPLY_FAILED);
        let d: serde_json::Value = serde_json::from_str(&e.details)
            .unwrap_or_else(|err| panic!("details {:?}: {err}", e.details));
        assert_eq!(d["errnoName"], "EPERM", "{d}");
        assert_eq!(
            d["object"], "route del 10.9.0.0/24 via 10.22.0.5 oif 7",
            "{d}"
        );

        // The next sweep, nothing failing: the route and the record go.
        let s = clear_stale(&census(&store, &here), &mut k, &store, &here);
        assert!(s.failures.is_empty(), "{s:?}");
        assert_eq!(s.removed.len(), 1, "{s:?}");
        assert!(k.routes.is_empty(), "{:?}", k.routes);
        assert!(record::read(&store, &rec.key).unwrap().is_none());
    }
}
