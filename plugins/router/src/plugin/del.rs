//! DEL: idempotent, with or without the pod's namespace.

use super::{key_of, load, log_swept, logger, ms, pod_ips_of, require_caps};
use crate::apply::{self, Failures};
use crate::config::RouterConfig;
use crate::error::Error;
use crate::kernel::Live;
use crate::lifecycle::{self, Census, Unreadable};
use crate::record::{self, Depth, Here, ReadError, Record};
use podgate_cni::log::Logger;
use podgate_cni::{CniError, Request};
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_kit::state::{Key, Names, StateStore};
use serde_json::json;

/// One DEL request, as every step of it reads it.
struct Del<'a> {
    req: &'a Request,
    cfg: &'a RouterConfig,
    log: &'a Logger,
    store: &'a StateStore,
    key: &'a Key,
}

pub(super) fn del(req: &Request) -> Result<(), CniError> {
    let cfg = load(&req.conf)?;
    let log = logger(&cfg, req);
    let Some(store) = StateStore::existing(&cfg.state_dir).map_err(Error::State)? else {
        return Ok(());
    };
    let key = key_of(req);
    // No ADD or DEL of this pod runs meanwhile (an ADD past the node
    // side writes its record without the node-wide lock).
    let _pod_lock = store.lock_pod(&key.container_id).map_err(Error::State)?;
    let d = Del {
        req,
        cfg: &cfg,
        log: &log,
        store: &store,
        key: &key,
    };
    // Records are replaced by rename, so reading without the lock is safe.
    match record::read(&store, &key) {
        Ok(Some(rec)) => del_recorded(&d, rec),
        Ok(None) => del_unrecorded(&d),
        Err(e @ ReadError::Newer { .. }) => {
            log.error("record kept", json!({"error": e.to_string()}));
            Err(Error::Record(e).into())
        }
        Err(e @ ReadError::Io(_)) => Err(Error::Record(e).into()),
        Err(e) => del_unreadable(&d, &e.to_string(), Unreadable::Record),
    }
}

/// Nothing recorded: an ADD killed while writing its record may have left
/// a temp file and claims index entries (written ahead of the record); an
/// unreadable record the agent's sweep moved aside is removed by
/// ownership, as where it was.
fn del_unrecorded(d: &Del<'_>) -> Result<(), CniError> {
    let (store, key) = (d.store, d.key);
    let lock = store.lock().map_err(Error::State)?;
    let names = store.names().map_err(Error::State)?;
    lifecycle::sweep_temp_in(store, &names, Some(&key.container_id)).map_err(Error::State)?;
    crate::claims::release(store, key).map_err(Error::State)?;
    if !lifecycle::quarantined(store, &names, key) {
        return Ok(());
    }
    drop(lock);
    let why = "in quarantine (it could not be read)";
    del_unreadable(d, why, Unreadable::Quarantined)
}

/// DEL of a recorded attachment: the pod side outside the node-wide lock,
/// then the node side and the record under it.
fn del_recorded(d: &Del<'_>, rec: Record) -> Result<(), CniError> {
    require_caps()?;
    // A record with a node side needs the node socket anyway: opened now
    // (outside the lock), it also gives the node's netns cookie.
    let mut node = apply::NodeSocket::default();
    let here = match apply::has_node_side(&rec).then(|| node.get()) {
        Some(Ok(n)) => Here::with_socket(n),
        _ => Here::now(),
    };
    let recorded = rec.netns.clone();
    let ns = d
        .req
        .env
        .netns
        .as_deref()
        .or(recorded.as_deref())
        .and_then(|p| NetNs::open(p).ok())
        .filter(|ns| !rec.liveness_opened(&here, Depth::Path, Some(ns)).is_stale());
    if let Some(ns) = &ns {
        remove_pod_side(d, &rec, ns)?;
    }
    remove_node_side(d, ns.as_ref(), &mut node, &here)
}

/// Pod side first, outside the node-wide lock: it touches only this pod's
/// namespace, which may be gone already (pod deleted). One trip there
/// opens the handles (and reads the cookie that tells whether it still is
/// the pod's); the removal runs on this thread.
fn remove_pod_side(d: &Del<'_>, rec: &Record, ns: &NetNs) -> Result<(), CniError> {
    let failures = match apply::removal_handles(rec, ns) {
        Ok(Some(mut pod)) => apply::remove_pod(&mut Live::pod(&mut pod), rec),
        Ok(None) => Failures::default(),
        Err(e) => Failures::of(e),
    };
    if !failures.is_empty() {
        d.log.error(
            "pod-side teardown incomplete",
            json!({"failures": failures}),
        );
        let what = "teardown";
        return Err(Error::Left {
            what,
            left: failures,
        }
        .into());
    }
    Ok(())
}

/// Under the node-wide lock: the record read again (a concurrent DEL may
/// have finished it), its node side removed, then the record, and the
/// stale records the census found cleared.
fn remove_node_side(
    d: &Del<'_>,
    ns: Option<&NetNs>,
    node: &mut apply::NodeSocket,
    here: &Here,
) -> Result<(), CniError> {
    let (store, key, log) = (d.store, d.key, d.log);
    let lock = store.lock().map_err(Error::State)?;
    // One listing for the sweep and, when it is needed, the census.
    let names = store.names().map_err(Error::State)?;
    lifecycle::sweep_temp_in(store, &names, Some(&key.container_id)).map_err(Error::State)?;
    let rec = match record::read(store, key) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(()), // a concurrent DEL finished it
        Err(e) => return Err(Error::Record(e).into()),
    };
    let census = census_for(d, &rec, &names, ns, here)?;
    // Nothing on the node (a masquerade-only pod, no stale record to
    // clear): no node socket either.
    let failures = if apply::has_node_side(&rec) || !census.stale.is_empty() {
        match node.get() {
            Ok(n) => lifecycle::remove_record(&rec, &census, &mut Live::on(n), None, store, here),
            Err(e) => Failures::of(e),
        }
    } else {
        Failures::default()
    };
    if !failures.is_empty() {
        log.error("teardown incomplete", json!({"failures": failures}));
        let what = "teardown";
        return Err(Error::Left {
            what,
            left: failures,
        }
        .into());
    }
    crate::claims::remove(store, key).map_err(Error::State)?;
    log.info(
        "removed",
        json!({
            "profile": rec.profile,
            "status": rec.status,
            "lockWaitMs": ms(lock.waited()),
            "lockHeldMs": ms(lock.held()),
        }),
    );
    if !census.stale.is_empty() {
        match node.get() {
            Ok(n) => log_swept(
                log,
                "cleared stale records",
                &lifecycle::clear_stale(&census, &mut Live::on(n), store, here),
            ),
            Err(e) => log.warn(
                "cleared stale records: incomplete",
                json!({"failures": [e.to_string()]}),
            ),
        }
    }
    Ok(())
}

/// The other records DEL reads: they matter only for a strict pod
/// (whether node-wide settings go back) or a stale one (a live pod may
/// have re-claimed its pool); otherwise DEL does not read them.
fn census_for(
    d: &Del<'_>,
    rec: &Record,
    names: &Names,
    ns: Option<&NetNs>,
    here: &Here,
) -> Result<Census, Error> {
    // Without a node side and strict settings, whether this record is
    // stale only decides whether other stale records are cleared now (or
    // by the next call): the namespace opened above answers that without
    // opening its path again. With a node side it is judged afresh.
    let reuse = (!apply::has_node_side(rec) && !rec.is_strict())
        .then_some(ns)
        .flatten();
    let stale = rec.liveness_opened(here, Depth::Path, reuse).is_stale();
    let depth = |r: &Record| {
        if r.is_strict() {
            Depth::Precise
        } else if r.node_routes.is_empty() {
            Depth::Boot
        } else {
            Depth::Path
        }
    };
    // A live strict pod asks the claims index for the other strict
    // records (and its pools' owners) instead of reading every record.
    Ok(if stale {
        Census::take_in(d.store, names, here, depth).map_err(Error::State)?
    } else if rec.is_strict() {
        Census::for_strict(d.store, names, here, rec, depth).map_err(Error::State)?
    } else {
        Census::none()
    })
}

/// DEL of an attachment whose record does not parse (`at`: where its file
/// is): clean up by ownership (its tagged tables in CNI_NETNS, podgate's
/// node routes and rules for its prevResult addresses that no other
/// record accounts for), then drop the record, and put the node-wide
/// strict settings back if no strict pod needs them (it may have been the
/// last). The failure to parse is logged.
fn del_unreadable(d: &Del<'_>, why: &str, at: Unreadable) -> Result<(), CniError> {
    let Del {
        req,
        cfg,
        log,
        store,
        key,
    } = *d;
    log.warn(
        "unreadable record: removing by ownership",
        json!({"error": why}),
    );
    require_caps()?;
    // The caller (DEL) holds the pod lock.
    let _lock = store.lock().map_err(Error::State)?;
    let names = store.names().map_err(Error::State)?;
    lifecycle::sweep_temp_in(store, &names, Some(&key.container_id)).map_err(Error::State)?;
    let mut node = RouteSocket::new().map_err(Error::kernel("node netlink"))?;
    let here = Here::now();
    // Strict records judged by their netns too: whether a live strict pod
    // is left decides the node-wide settings below.
    let depth = |r: &Record| match r.is_strict() {
        true => Depth::Path,
        false => Depth::Boot,
    };
    let census = Census::take_in(store, &names, &here, depth).map_err(Error::State)?;
    let ns = req.env.netns.as_deref().and_then(|p| NetNs::open(p).ok());
    let orphan = lifecycle::Orphan {
        key,
        at,
        ns: ns.as_ref(),
        pod_ips: &pod_ips_of(req),
        table_prefix: &format!("{}-", cfg.nft_table),
    };
    let mut node = Live::on(&mut node);
    let mut s = lifecycle::remove_unreadable(&orphan, &census, &mut node, store);
    if s.failures.is_empty() {
        s.failures = lifecycle::restore_unneeded(store, &census, &mut node);
    }
    log_swept(log, "removed by ownership", &s);
    if s.failures.is_empty() {
        Ok(())
    } else {
        let what = "teardown by ownership";
        let left = s.failures;
        Err(Error::Left { what, left }.into())
    }
}
