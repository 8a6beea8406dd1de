//! CHECK, STATUS and GC.

use super::{key_of, load, log_swept, open_netns, selection};
use crate::apply::{self, Failures};
use crate::config::ConfigError;
use crate::error::Error;
use crate::kernel::Live;
use crate::lifecycle::{self, Census};
use crate::record::{self, Depth, Here, Record};
use podgate_cni::log::Logger;
use podgate_cni::{Attachment, CniError, NetConf, Request};
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_kit::state::{Key, Names, StateStore};
use serde_json::json;

pub(super) fn check(req: &Request) -> Result<(), CniError> {
    let cfg = load(&req.conf)?;
    if req.conf.prev_result.is_none() {
        return Err(ConfigError::from("CHECK needs prevResult").into());
    }
    let sel = selection(&cfg, req)?;
    let key = key_of(req);
    let rec = StateStore::existing(&cfg.state_dir)
        .map_err(Error::State)?
        .map(|s| record::read(&s, &key))
        .transpose()
        .map_err(Error::Record)?
        .flatten();
    let rec = match (sel, rec) {
        (None, None) => return Ok(()),
        (Some(s), None) => return Err(Error::NotRecorded(s.name.to_string()).into()),
        (_, Some(r)) => r,
    };
    let ns = open_netns(req)?;
    let mut node = RouteSocket::new().map_err(Error::kernel("node netlink"))?;
    let drift = apply::check(&rec, &mut node, &ns).map_err(|source| Error::Kernel {
        what: "check",
        source: Box::new(source),
    })?;
    if drift.is_empty() {
        Ok(())
    } else {
        Err(Error::Drift(drift).into())
    }
}

pub(super) fn status(conf: &NetConf) -> Result<(), CniError> {
    let cfg = load(conf)?;
    let unusable = |source| Error::Unavailable {
        what: Some("state dir unusable"),
        source,
    };
    let store = StateStore::open(&cfg.state_dir).map_err(unusable)?;
    store.lock().map_err(unusable)?;
    Ok(())
}

/// One GC request: the attachments the runtime still knows.
struct Gc<'a> {
    conf: &'a NetConf,
    valid: &'a [Attachment],
    store: &'a StateStore,
    log: &'a Logger,
}

impl Gc<'_> {
    fn listed(&self, k: &Key) -> bool {
        self.valid
            .iter()
            .any(|a| a.container_id == k.container_id && a.ifname == k.ifname)
    }

    /// An attachment whose pod lock is held has an ADD or DEL in flight
    /// (an ADD's record is pending until it finishes): that call owns it.
    fn is_valid(&self, k: &Key) -> bool {
        self.listed(k) || self.store.pod_busy(&k.container_id)
    }

    /// A record of this network the runtime no longer lists.
    fn gone(&self, k: &Key) -> bool {
        k.network == self.conf.name && !self.is_valid(k)
    }
}

pub(super) fn gc(conf: &NetConf, valid: &[Attachment]) -> Result<(), CniError> {
    let cfg = load(conf)?;
    let Some(store) = StateStore::existing(&cfg.state_dir).map_err(Error::State)? else {
        return Ok(());
    };
    let log = Logger::new("podgate-router", cfg.log_file.as_deref())
        .limits(&cfg.telemetry)
        .with("cmd", "GC");
    let _lock = store.lock().map_err(Error::State)?;
    // One listing for the sweep of temp and lock files and the census.
    let names = store.names().map_err(Error::State)?;
    lifecycle::sweep_temp_in(&store, &names, None).map_err(Error::State)?;
    let mut node = RouteSocket::new().map_err(Error::kernel("node netlink"))?;
    let here = Here::with_socket(&node);
    let mut census =
        Census::take_in(&store, &names, &here, |_| Depth::Precise).map_err(Error::State)?;
    let g = Gc {
        conf,
        valid,
        store: &store,
        log: &log,
    };
    let mut failures = Failures::default();
    let swept = lifecycle::clear_stale(&census, &mut Live::on(&mut node), &store, &here);
    log_swept(&log, "cleared stale records", &swept);
    failures.extend(swept.failures);
    collect(&g, &mut census, &mut node, &here, &mut failures);
    let keep_unreadable = drop_unreadable(&g, &census, &names, &mut failures)?;
    sweep_unaccounted(&g, &census, &mut node, keep_unreadable, &mut failures)?;
    if failures.is_empty() {
        Ok(())
    } else {
        let what = "gc";
        Err(Error::Left {
            what,
            left: failures,
        }
        .into())
    }
}

/// Remove the records of this network the runtime no longer lists (and
/// that are not stale: cleared already), each under its pod lock.
fn collect(
    g: &Gc<'_>,
    census: &mut Census,
    node: &mut RouteSocket,
    here: &Here,
    failures: &mut Failures,
) {
    let (store, log) = (g.store, g.log);
    let collect: Vec<Record> = census
        .listing
        .records
        .iter()
        .filter(|r| r.key.network == g.conf.name && !g.listed(&r.key) && !census.is_stale(&r.key))
        .cloned()
        .collect();
    for rec in &collect {
        // Its pod lock held while it goes, not only looked at: an ADD of
        // the pod that began after a look would read the pod's sysctls
        // before this restores them, and find no record after.
        let _pod = match store.try_lock_pod(&rec.key.container_id) {
            Ok(Some(l)) => l,
            Ok(None) => continue,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let ns = rec.netns.as_deref().and_then(|p| NetNs::open(p).ok());
        let f =
            lifecycle::remove_record(rec, census, &mut Live::on(node), ns.as_ref(), store, here);
        if f.is_empty() {
            // Its claims index entries go in the one prune below.
            match store.remove(&rec.key) {
                Ok(_) => {
                    // Gone for the next one's judgement: the last strict
                    // pod collected puts the node-wide settings back.
                    census.forget(&rec.key);
                    log.info(
                        "collected",
                        json!({"containerID": rec.key.container_id, "ifname": rec.key.ifname, "status": rec.status}),
                    )
                }
                Err(e) => failures.push(e),
            }
        } else {
            failures.extend(f);
        }
    }
}

/// Unreadable records (and quarantined ones) of attachments that are
/// gone: their objects are found by ownership afterwards. Returns whether
/// an unreadable record is kept (then that sweep is skipped).
fn drop_unreadable(
    g: &Gc<'_>,
    census: &Census,
    names: &Names,
    failures: &mut Failures,
) -> Result<bool, Error> {
    let (store, log) = (g.store, g.log);
    // Unreadable records of attachments that are gone: their objects are
    // found by ownership below.
    let mut keep_unreadable = false;
    for (key, e) in &census.listing.unreadable {
        match key {
            Some(k) if g.gone(k) => {
                log.warn(
                    "removing unreadable record",
                    json!({"error": e.to_string()}),
                );
                if let Err(e) = crate::claims::remove(store, k) {
                    failures.push(e);
                }
            }
            _ => keep_unreadable = true,
        }
    }
    // Those the agent's sweep moved to quarantine/, the same way.
    if names.contains(lifecycle::QUARANTINE) {
        let quarantine = lifecycle::quarantine_listing(store).map_err(Error::State)?;
        for (key, file) in quarantine {
            match key {
                Some(k) if g.gone(&k) => {
                    log.warn("removing quarantined record", json!({"file": file}));
                    if let Err(e) = lifecycle::remove_quarantined(store, &k) {
                        failures.push(e);
                    }
                }
                _ => keep_unreadable = true,
            }
        }
    }
    Ok(keep_unreadable)
}

/// The ownership sweep of what no remaining record accounts for, and the
/// claims index made to match the remaining records.
fn sweep_unaccounted(
    g: &Gc<'_>,
    census: &Census,
    node: &mut RouteSocket,
    keep_unreadable: bool,
    failures: &mut Failures,
) -> Result<(), Error> {
    let (store, log) = (g.store, g.log);
    // Records are created and removed only under the node-wide lock,
    // which this GC holds (an ADD finishing outside it renames its
    // pending record to the applied one, same node side): the records
    // left are the census's whose files are still listed, without
    // reading each file again.
    let names = store.names().map_err(Error::State)?;
    let remaining: Vec<Record> = census
        .listing
        .records
        .iter()
        .filter(|r| names.contains(&r.key.file_name()))
        .cloned()
        .collect();
    // Ownership sweep: podgate's node routes and rules that no remaining
    // record accounts for. Not while some record cannot be judged (a
    // newer release's, an unreadable one still valid): its objects would
    // look unaccounted for.
    if census.listing.newer.is_empty() && !keep_unreadable {
        let (removed, f) = apply::sweep_node(&mut Live::on(node), &remaining, None);
        if !removed.is_empty() {
            log.info("removed by ownership", json!({"removed": removed}));
        }
        failures.extend(f);
    } else {
        log.warn(
            "ownership sweep skipped: some records cannot be judged",
            json!({"newer": census.listing.newer.iter().map(|(_, e)| e.to_string()).collect::<Vec<_>>()}),
        );
    }
    // Claims index entries of records that are gone (collected above, or
    // left by a killed ADD or DEL), and the index made to hold what the
    // remaining records claim.
    let indexed = crate::claims::prune(store, &names)
        .and_then(|()| crate::claims::reconcile(store, &remaining));
    match indexed {
        Ok(0) => {}
        Ok(n) => log.info("claims index repaired", json!({"entries": n})),
        Err(e) => failures.push(e),
    }
    Ok(())
}
