//! An attachment podgate-router recorded, judged against the node and pod
//! as they are now (what `podgate inspect` shows).

use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_router::apply;
use podgate_router::record::{Depth, Here, Liveness, Record, Status};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum State {
    /// Everything recorded is still in place.
    Holds,
    /// Something changed since ADD (see `drift`).
    Drift,
    /// The pod's netns no longer exists: the record outlived its pod.
    NetnsGone,
    /// ADD has not finished: running now, or killed half-way (DEL or GC
    /// removes whatever of it exists).
    Pending,
    /// The record describes a dead pod (earlier boot, netns gone or another
    /// namespace now): it claims nothing, and the next ADD, DEL or GC
    /// removes what remains of it.
    Stale,
    /// Could not be checked (see `drift` for why).
    Unknown,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(flatten)]
    pub record: Record,
    pub state: State,
    pub drift: Vec<String>,
}

/// Whether what `rec` describes still holds, and the drift found.
pub fn status_of(
    rec: &Record,
    here: &Here,
    node: &mut Option<RouteSocket>,
    node_err: &Option<String>,
) -> (State, Vec<String>) {
    if let Liveness::Stale { reason, .. } = rec.liveness(here, Depth::Precise) {
        return (
            State::Stale,
            vec![format!("{reason}: the pod is dead; the next ADD, DEL or GC (or the installer's sweep) removes what remains of it")],
        );
    }
    let Some(path) = &rec.netns else {
        return (State::Unknown, vec!["the record has no netns".into()]);
    };
    let ns = match NetNs::open(path) {
        Ok(ns) => ns,
        Err(e) if e.is_not_found() => {
            return (
                State::NetnsGone,
                vec![format!("netns {} is gone: the pod is deleted but DEL never removed this record (its node routes may linger)", path.display())],
            )
        }
        Err(e) => return (State::Unknown, vec![e.to_string()]),
    };
    let Some(sock) = node.as_mut() else {
        return (
            State::Unknown,
            vec![format!(
                "node netns: {}",
                node_err.as_deref().unwrap_or("unavailable")
            )],
        );
    };
    match apply::check(rec, sock, &ns) {
        Ok(d) if rec.status == Status::Pending => (State::Pending, d),
        Ok(d) if d.is_empty() => (State::Holds, d),
        Ok(d) => (State::Drift, d),
        Err(e) => (State::Unknown, vec![e.to_string()]),
    }
}
