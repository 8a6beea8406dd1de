//! The diagnosis document: the checks table, one row per hop, and the
//! verdict naming the first broken hop and the layer to look at next. A pure
//! function of (facts, probe results): [`super::rules`] decides,
//! [`super::wording`] phrases, [`judge`] puts the two together.

use super::facts::Facts;
pub use super::finding::{HopState, Status};
use super::rules;
use super::wording;
use super::{ProbeRun, Role, Target};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hop {
    pub role: Role,
    pub target: String,
    pub method: &'static str,
    pub state: HopState,
    /// What the probes saw.
    pub result: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hop: Option<String>,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    pub checks: Vec<Check>,
    pub hops: Vec<Hop>,
    pub verdict: Verdict,
    /// Caveats on how to read the probes.
    pub notes: Vec<String>,
}

/// The whole diagnosis. `runs` are the probes made, in target order; targets
/// after the first broken hop are reported as not probed.
pub fn judge(f: &Facts, targets: &[Target], runs: &[ProbeRun]) -> Diagnosis {
    let findings = rules::checks(f, targets);
    let checks: Vec<Check> = findings
        .iter()
        .map(|c| Check {
            name: wording::check_name(c),
            status: c.status(),
            detail: wording::check_detail(c),
        })
        .collect();
    let ctx = rules::client_context(f, targets);
    let mut hops = Vec::new();
    let mut verdict: Option<Verdict> = None;
    let mut answered: Vec<String> = Vec::new();
    for t in targets {
        let run = runs.iter().find(|r| &r.target == t);
        let (Some(run), None) = (run, &verdict) else {
            hops.push(Hop {
                role: t.role,
                target: t.addr_text(),
                method: t.method(),
                state: HopState::NotProbed,
                result: wording::NOT_PROBED.into(),
                reason: None,
                next: None,
            });
            continue;
        };
        let finding = rules::hop(f, ctx, run);
        let state = finding.state();
        let reason = wording::hop_reason(&finding);
        let next = wording::hop_next(&finding);
        if state != HopState::Ok {
            let mut message = reason.clone().unwrap_or_default();
            if t.role == Role::Dns && answered.iter().any(|a| !a.starts_with("peer")) {
                message += &wording::dns_not_forwarding(&answered);
            }
            verdict = Some(Verdict {
                ok: false,
                hop: Some(t.label()),
                message,
                next: next.clone(),
            });
        } else {
            answered.push(t.label());
        }
        let own_peer = t.role == Role::Peer && rules::is_local(f, t.addr);
        let masq = run
            .bound
            .as_ref()
            .is_some_and(|(src, _)| rules::masqueraded(f, src));
        hops.push(Hop {
            role: t.role,
            target: t.addr_text(),
            method: t.method(),
            state,
            result: wording::probe_result(run, own_peer, masq),
            reason,
            next,
        });
    }
    let fails: Vec<_> = findings
        .iter()
        .filter(|c| c.status() == Status::Fail)
        .collect();
    let verdict = verdict.unwrap_or_else(|| match (targets.is_empty(), fails.is_empty()) {
        (true, true) => Verdict {
            ok: true,
            hop: None,
            message: wording::NOTHING_PROBED.into(),
            next: None,
        },
        (true, false) => Verdict {
            ok: false,
            hop: None,
            message: wording::checks_failed(&fails),
            next: Some(wording::PROBE_THE_HOPS.into()),
        },
        (false, true) => Verdict {
            ok: true,
            hop: None,
            message: wording::all_answer(targets.len(), &answered),
            next: None,
        },
        (false, false) => Verdict {
            ok: false,
            hop: None,
            message: wording::all_answer_but(&fails),
            next: None,
        },
    });
    let notes = rules::probe_note(f)
        .map(wording::note)
        .into_iter()
        .collect();
    Diagnosis {
        checks,
        hops,
        verdict,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::super::facts::{MasqFact, NodeTarget, RouteFact};
    use super::super::finding::ReturnPath;
    use super::super::primary::PrimaryFact;
    use super::super::rules::return_path;
    use super::*;
    use crate::probe::Outcome;

    fn rf(dst: &str, gw: Option<&str>, dev: &str) -> RouteFact {
        RouteFact {
            dst: dst.parse().unwrap(),
            gateway: gw.map(|g| g.parse().unwrap()),
            dev: Some(dev.into()),
            protocol: 0,
        }
    }

    /// The OpenVPN-pod scenario's VPN pod: eth0 10.22.0.5, tun0 10.8.0.1 peer
    /// 10.8.0.2.
    fn vpn_pod(forwarding: &str) -> Facts {
        Facts {
            pools: vec!["10.8.0.0/24".parse().unwrap()],
            from: Some("10.8.0.1".parse().unwrap()),
            pod_addrs: vec![
                "10.22.0.5/16".parse().unwrap(),
                "10.8.0.1/32".parse().unwrap(),
            ],
            forwarding_v4: Some(forwarding.into()),
            forwarding_v6: Some("0".into()),
            rp_filter: vec![("all".into(), "0".into()), ("eth0".into(), "0".into())],
            pod_routes: vec![
                rf("0.0.0.0/0", Some("10.22.0.1"), "eth0"),
                rf("10.22.0.0/16", None, "eth0"),
                rf("10.8.0.2/32", None, "tun0"),
            ],
            ..Facts::default()
        }
    }

    fn targets() -> Vec<Target> {
        vec![
            Target {
                role: Role::Peer,
                addr: "10.8.0.2".parse().unwrap(),
                port: None,
                name: None,
            },
            Target {
                role: Role::Pod,
                addr: "10.22.0.3".parse().unwrap(),
                port: None,
                name: None,
            },
            Target {
                role: Role::Service,
                addr: "10.96.0.10".parse().unwrap(),
                port: Some(80),
                name: None,
            },
        ]
    }

    fn answered() -> Outcome {
        Outcome::Answered {
            rtt_ms: 0.2,
            detail: String::new(),
        }
    }

    fn silent() -> Outcome {
        Outcome::Silent { timeout_ms: 1500 }
    }

    fn run(t: &Target, direct: Outcome, bound: Option<Outcome>) -> ProbeRun {
        ProbeRun {
            target: t.clone(),
            direct,
            bound: bound.map(|b| ("10.8.0.1".parse().unwrap(), b)),
        }
    }

    #[test]
    fn state1_forwarding_off_blocks_the_pod_hop_even_though_the_pod_reaches_it() {
        let f = vpn_pod("0");
        let ts = targets();
        let runs = vec![
            run(&ts[0], answered(), None),
            run(&ts[1], answered(), Some(answered())),
        ];
        let d = judge(&f, &ts, &runs);
        assert!(!d.verdict.ok);
        assert_eq!(d.verdict.hop.as_deref(), Some("pod 10.22.0.3"));
        assert!(
            d.verdict
                .message
                .contains("forwarding is off in the pod netns (net.ipv4.ip_forward = 0)"),
            "{}",
            d.verdict.message
        );
        assert_eq!(d.hops[0].state, HopState::Ok);
        assert_eq!(d.hops[1].state, HopState::Blocked);
        assert_eq!(d.hops[2].state, HopState::NotProbed);
        let fwd = d
            .checks
            .iter()
            .find(|c| c.name == "forwarding ipv4")
            .unwrap();
        assert_eq!(fwd.status, Status::Fail);
        let rp = d
            .checks
            .iter()
            .find(|c| c.name == "return path 10.8.0.0/24")
            .unwrap();
        assert_eq!(rp.status, Status::Fail);
    }

    #[test]
    fn state2_forwarding_on_but_no_return_path() {
        let f = vpn_pod("1");
        let ts = targets();
        let runs = vec![
            run(&ts[0], answered(), None),
            run(&ts[1], answered(), Some(silent())),
        ];
        let d = judge(&f, &ts, &runs);
        assert!(!d.verdict.ok);
        assert_eq!(
            d.verdict.message,
            "pod 10.22.0.3 silent: forwarding is on; no masquerade for 10.8.0.0/24 and no return route on the node: replies cannot find the tunnel"
        );
        assert!(d.verdict.next.as_deref().unwrap().contains("returnRoutes"));
        // A return route via another pod is named.
        let mut g = vpn_pod("1");
        g.node_routes = vec![rf("10.8.0.0/24", Some("10.22.0.9"), "br0")];
        let d = judge(&g, &ts, &runs);
        assert!(
            d.verdict.message.contains(
                "the node's route 10.8.0.0/24 via 10.22.0.9 dev br0 does not go via this pod"
            ),
            "{}",
            d.verdict.message
        );
    }

    #[test]
    fn state3_all_fixed_all_hops_answer() {
        let mut f = vpn_pod("1");
        f.masquerade = vec![MasqFact {
            table: "podgate-eth0".into(),
            source: "10.8.0.0/24".parse().unwrap(),
            oifname: "eth0".into(),
        }];
        let ts = targets();
        let runs: Vec<ProbeRun> = ts
            .iter()
            .map(|t| run(t, answered(), t.transit().then(answered)))
            .collect();
        let d = judge(&f, &ts, &runs);
        assert!(d.verdict.ok, "{:?}", d.verdict);
        assert!(d.verdict.message.starts_with("all 3 hops answer"));
        assert!(d.hops.iter().all(|h| h.state == HopState::Ok));
        assert!(d.hops[1].result.contains("masqueraded"));
        assert!(
            d.checks.iter().all(|c| c.status != Status::Fail),
            "{:?}",
            d.checks
        );

        // A return route via this pod is as good as masquerade.
        let mut r = vpn_pod("1");
        r.node_routes = vec![RouteFact {
            protocol: 94,
            ..rf("10.8.0.0/24", Some("10.22.0.5"), "br0")
        }];
        assert!(matches!(
            return_path(&r, &"10.8.0.0/24".parse().unwrap()),
            ReturnPath::Route(_)
        ));
        assert!(judge(&r, &ts, &runs).verdict.ok);
    }

    /// Node A of a host-gw cluster: the pool routed back via the VPN pod
    /// (10.22.0.5) on this node only; 10.22.0.3 is a pod on this node's
    /// bridge, 10.23.0.3 one on node B (via 192.168.100.2).
    fn routed_on_node_a() -> Facts {
        let mut f = vpn_pod("1");
        f.node_routes = vec![RouteFact {
            protocol: 94,
            ..rf("10.8.0.0/24", Some("10.22.0.5"), "br0")
        }];
        let node_target = |addr: &str, route: RouteFact| NodeTarget {
            addr: addr.parse().unwrap(),
            route: Some(route),
            default_dev: Some("eth0".into()),
            node_own: false,
            node_addr: Some("192.168.100.1".parse().unwrap()),
        };
        f.node_targets = vec![
            node_target("10.22.0.3", rf("10.22.0.0/16", None, "br0")),
            node_target(
                "10.23.0.3",
                rf("10.23.0.0/16", Some("192.168.100.2"), "eth0"),
            ),
        ];
        f.primary = Some(PrimaryFact {
            plugin: Some("flannel".into()),
            file: Some("10-flannel.conflist".into()),
            ..PrimaryFact::default()
        });
        f
    }

    fn pod_target(addr: &str) -> Target {
        Target {
            role: Role::Pod,
            addr: addr.parse().unwrap(),
            port: None,
            name: None,
        }
    }

    #[test]
    fn a_pod_on_another_node_silent_from_the_tunnel_names_the_node_local_return_route() {
        let f = routed_on_node_a();
        let t = pod_target("10.23.0.3");
        let d = judge(
            &f,
            std::slice::from_ref(&t),
            &[run(&t, answered(), Some(silent()))],
        );
        assert_eq!(d.hops[0].state, HopState::Blocked);
        assert!(
            d.verdict.message.contains(
                "10.23.0.3 is not served by this node (the node's route 10.23.0.0/16 via 192.168.100.2 dev eth0): the return route 10.8.0.0/24 via 10.22.0.5 exists only on this node"
            ),
            "{}",
            d.verdict.message
        );
        let next = d.verdict.next.unwrap();
        assert!(
            next.starts_with("masquerade 10.8.0.0/24 in the pod")
                && next.contains(
                    "route 10.8.0.0/24 to this node (192.168.100.1) on every node or on the fabric"
                )
                && next.contains("flannel routes only each node's pod CIDR"),
            "{next}"
        );
    }

    #[test]
    fn a_pod_on_this_node_or_one_silent_even_from_the_pod_does_not_blame_the_return_route() {
        let f = routed_on_node_a();
        let here = pod_target("10.22.0.3");
        let d = judge(
            &f,
            std::slice::from_ref(&here),
            &[run(&here, answered(), Some(silent()))],
        );
        assert!(
            !d.verdict.message.contains("exists only on this node"),
            "{d:?}"
        );
        let away = pod_target("10.23.0.3");
        let d = judge(
            &f,
            std::slice::from_ref(&away),
            &[run(&away, silent(), None)],
        );
        assert!(
            d.verdict.message.contains("even from the VPN pod itself"),
            "{d:?}"
        );
        assert!(
            !d.verdict.message.contains("exists only on this node"),
            "{d:?}"
        );
        // Masquerade needs no route anywhere: not named either.
        let mut m = routed_on_node_a();
        m.masquerade = vec![MasqFact {
            table: "podgate-eth0".into(),
            source: "10.8.0.0/24".parse().unwrap(),
            oifname: "eth0".into(),
        }];
        let d = judge(
            &m,
            std::slice::from_ref(&away),
            &[run(&away, answered(), Some(silent()))],
        );
        assert!(
            !d.verdict.message.contains("exists only on this node"),
            "{d:?}"
        );
    }

    #[test]
    fn silent_peer_and_silence_past_the_pod() {
        let f = vpn_pod("1");
        let ts = targets();
        let d = judge(&f, &ts, &[run(&ts[0], silent(), None)]);
        assert_eq!(d.verdict.hop.as_deref(), Some("peer 10.8.0.2"));
        assert!(d.verdict.message.contains("the tunnel itself is down"));

        let mut g = vpn_pod("1");
        g.pod_routes.retain(|r| r.dst.prefix_len() > 0);
        let public = Target {
            role: Role::Public,
            addr: "203.0.113.7".parse().unwrap(),
            port: None,
            name: None,
        };
        let d = judge(
            &g,
            std::slice::from_ref(&public),
            &[run(
                &public,
                Outcome::Unreachable {
                    detail: "no route".into(),
                },
                None,
            )],
        );
        assert!(
            d.verdict.message.contains("no route to 203.0.113.7"),
            "{}",
            d.verdict.message
        );

        let d = judge(
            &f,
            &ts,
            &[
                run(&ts[0], answered(), None),
                run(&ts[1], silent(), Some(silent())),
            ],
        );
        assert!(
            d.verdict.message.contains("even from the VPN pod itself"),
            "{}",
            d.verdict.message
        );
    }

    #[test]
    fn dns_failing_while_ip_hops_answer_is_dns() {
        let mut f = vpn_pod("1");
        f.masquerade = vec![MasqFact {
            table: "t".into(),
            source: "10.8.0.0/16".parse().unwrap(),
            oifname: "eth0".into(),
        }];
        f.from = None;
        let mut ts = targets();
        ts.push(Target {
            role: Role::Dns,
            addr: "10.96.0.10".parse().unwrap(),
            port: None,
            name: Some("kubernetes.default".into()),
        });
        let mut runs: Vec<ProbeRun> = ts
            .iter()
            .take(3)
            .map(|t| run(t, answered(), None))
            .collect();
        runs.push(run(
            &ts[3],
            Outcome::BadAnswer {
                detail: "kubernetes.default: NXDOMAIN".into(),
            },
            None,
        ));
        let d = judge(&f, &ts, &runs);
        assert_eq!(
            d.verdict.hop.as_deref(),
            Some("dns kubernetes.default @10.96.0.10")
        );
        assert!(
            d.verdict.message.contains("so this is DNS, not forwarding"),
            "{}",
            d.verdict.message
        );
    }

    #[test]
    fn without_client_context_only_probes_count() {
        let f = Facts {
            forwarding_v4: Some("0".into()),
            ..Facts::default()
        };
        let t = Target {
            role: Role::Public,
            addr: "203.0.113.7".parse().unwrap(),
            port: Some(443),
            name: None,
        };
        let d = judge(&f, std::slice::from_ref(&t), &[run(&t, answered(), None)]);
        assert!(d.verdict.ok, "{:?}", d.verdict);
    }

    #[test]
    fn ipv6_forwarding_off_names_the_ipv6_sysctl_in_the_fix() {
        let f = Facts {
            pools: vec!["fd00:8::/64".parse().unwrap()],
            pod_addrs: vec!["fd00:22::5/64".parse().unwrap()],
            forwarding_v4: Some("1".into()),
            forwarding_v6: Some("0".into()),
            masquerade: vec![MasqFact {
                table: "podgate-eth0".into(),
                source: "fd00:8::/64".parse().unwrap(),
                oifname: "eth0".into(),
            }],
            ..Facts::default()
        };
        let t = Target {
            role: Role::Pod,
            addr: "fd00:22::3".parse().unwrap(),
            port: None,
            name: None,
        };
        let d = judge(&f, std::slice::from_ref(&t), &[run(&t, answered(), None)]);
        assert_eq!(d.hops[0].state, HopState::Blocked);
        assert!(
            d.verdict
                .message
                .contains("(net.ipv6.conf.all.forwarding = 0)"),
            "{}",
            d.verdict.message
        );
        let next = d.verdict.next.unwrap();
        assert!(
            next.contains("sysctls {\"net.ipv6.conf.all.forwarding\": \"1\"}")
                && next.contains(
                    "podgate sysctl set --netns <that netns> net.ipv6.conf.all.forwarding=1"
                ),
            "{next}"
        );
        assert!(!next.contains("ipv4"), "{next}");
        // IPv4 keeps its own sysctl in the fix.
        let g = vpn_pod("0");
        let ts = targets();
        let d = judge(
            &g,
            &ts,
            &[run(&ts[0], answered(), None), run(&ts[1], answered(), None)],
        );
        assert!(d
            .verdict
            .next
            .unwrap()
            .contains("podgate sysctl set --netns <that netns> net.ipv4.ip_forward=1"),);
    }
}
