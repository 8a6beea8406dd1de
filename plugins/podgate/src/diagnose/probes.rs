//! The probes of a diagnosis: each target from inside the pod's netns, in
//! order (inside out), stopping at the first broken hop.

use super::facts::Facts;
use super::finding::HopState;
use super::rules;
use super::{ProbeRun, Role, Target};
use crate::probe::{dns, icmp, tcp, Outcome};
use podgate_kit::netns::NetNs;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// One probe of `t` from inside `ns` (bound to `bind` when given): DNS for a
/// name, TCP connect with a port, else ICMP echo.
fn probe(ns: &NetNs, t: &Target, bind: Option<IpAddr>, timeout: Duration) -> Outcome {
    match (t.role, t.port, &t.name) {
        (Role::Dns, _, Some(name)) => {
            dns::ask(ns, SocketAddr::new(t.addr, 53), name, bind, timeout)
        }
        (_, Some(p), _) => tcp::connect(ns, SocketAddr::new(t.addr, p), bind, timeout),
        _ => icmp::echo(ns, t.addr, bind, timeout),
    }
}

/// Probe the targets in order (inside out) and stop at the first broken hop:
/// each transit target that answers is probed again from `from` when given.
/// `step` is told what is being probed (for progress).
pub fn probe_hops(
    ns: &NetNs,
    f: &Facts,
    targets: &[Target],
    from: Option<IpAddr>,
    timeout: Duration,
    step: &mut dyn FnMut(&str),
) -> Vec<ProbeRun> {
    let ctx = rules::client_context(f, targets);
    let mut runs = Vec::new();
    for t in targets {
        step(&format!("probing {} ({}) ...", t.label(), t.method()));
        let direct = probe(ns, t, None, timeout);
        let bound = match from {
            Some(src) if t.transit() && direct.reached() => {
                step(&format!("probing {} from {src} ...", t.label()));
                Some((src, probe(ns, t, Some(src), timeout)))
            }
            _ => None,
        };
        let r = ProbeRun {
            target: t.clone(),
            direct,
            bound,
        };
        let stop = rules::hop(f, ctx, &r).state() != HopState::Ok;
        runs.push(r);
        if stop {
            break;
        }
    }
    runs
}
