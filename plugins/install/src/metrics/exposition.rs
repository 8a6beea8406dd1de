//! One [`Snapshot`] in the Prometheus text format (version 0.0.4), encoded
//! by the `prometheus-client` crate: names, HELP/TYPE lines, label escaping,
//! `_total` on counters and cumulative histogram buckets are the crate's.
//!
//! The values are not the crate's metric types: counters come from the
//! plugins' event channel (persisted across restarts in `events`) and the
//! gauges are read afresh on every collection, so a [`Collector`] writes
//! each collection's values as constants.

use super::events::BUCKETS;
use super::Snapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

type Labels<'a> = Vec<(&'static str, &'a str)>;

#[derive(Debug)]
struct Collection(Snapshot);

/// A gauge's value: the exposition writes integers as integers.
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn flag(b: bool) -> i64 {
    i64::from(b)
}

/// One family: its HELP and TYPE, then each series (unlabelled when its
/// labels are empty) written by `encode`.
fn family<V>(
    enc: &mut DescriptorEncoder<'_>,
    (name, help, kind): (&str, &str, MetricType),
    values: &[(Labels<'_>, V)],
    encode: impl Fn(&mut MetricEncoder<'_>, &V) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in values {
        if labels.is_empty() {
            encode(&mut m, v)?;
        } else {
            encode(&mut m.encode_family(labels)?, v)?;
        }
    }
    Ok(())
}

fn gauges(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    values: &[(Labels<'_>, i64)],
) -> std::fmt::Result {
    family(enc, (name, help, MetricType::Gauge), values, |m, v| {
        m.encode_gauge(v)
    })
}

/// `name` without its `_total`: the encoder appends it to counters.
fn counters(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    values: &[(Labels<'_>, u64)],
) -> std::fmt::Result {
    family(enc, (name, help, MetricType::Counter), values, |m, v| {
        m.encode_counter::<NoLabelSet, u64, u64>(v, None)
    })
}

fn split3(k: &str) -> (&str, &str, &str) {
    let mut it = k.splitn(3, '|');
    (
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
    )
}

impl Collector for Collection {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        encode_install(&mut enc, s)?;
        encode_records(&mut enc, s)?;
        encode_requests(&mut enc, s)?;
        encode_ipsec(&mut enc, s)?;
        encode_errors(&mut enc, s)
    }
}

/// The agent's build and whether the chain is in place.
fn encode_install(enc: &mut DescriptorEncoder<'_>, s: &Snapshot) -> std::fmt::Result {
    gauges(
        enc,
        "podgate_build_info",
        "podgate version of the running agent (always 1).",
        &[(vec![("version", env!("CARGO_PKG_VERSION"))], 1)],
    )?;
    gauges(
        enc,
        "podgate_install_ready",
        "1 while podgate's binaries and chain entries are in place as configured, else 0.",
        &[(vec![], flag(s.install_ready))],
    )?;
    Ok(())
}

/// podgate-router's records: attachments, and those stale, pending,
/// unreadable, drifted.
fn encode_records(enc: &mut DescriptorEncoder<'_>, s: &Snapshot) -> std::fmt::Result {
    let attachments: Vec<_> = s
        .attachments
        .iter()
        .map(|((network, profile, routing), n)| {
            (
                vec![
                    ("network", network.as_str()),
                    ("profile", profile.as_str()),
                    ("routing", routing.as_str()),
                ],
                count(*n),
            )
        })
        .collect();
    gauges(
        enc,
        "podgate_attachments",
        "Attachments podgate-router has a record of, by network, profile and routing mode.",
        &attachments,
    )?;
    for (name, help, n) in [
        (
            "podgate_records_stale",
            "Records whose pod network namespace no longer exists (DEL never came).",
            s.stale,
        ),
        (
            "podgate_records_pending",
            "Records of changes begun and not yet completed (write-ahead).",
            s.pending,
        ),
        (
            "podgate_records_corrupt",
            "Record files that could not be read.",
            s.corrupt,
        ),
        (
            "podgate_records_quarantined",
            "Records that could not be read, moved to quarantine/ by the sweep (they count nowhere; the attachment's DEL removes each).",
            s.quarantined,
        ),
        (
            "podgate_attachment_drift",
            "Live attachments whose recorded state no longer holds (periodic CHECK).",
            s.drift,
        ),
        (
            "podgate_attachment_drift_unchecked",
            "Live attachments the periodic CHECK could not examine (netns not enterable, netlink error).",
            s.drift_unchecked,
        ),
        (
            "podgate_strict_rules_ahead",
            "Node policy rules before a strict pod's boundary rules that can take its traffic past them (each also drift of that pod; the agent's sweep logs each; podgate never removes them).",
            s.strict_rules_ahead,
        ),
    ] {
        gauges(enc, name, help, &[(vec![], count(n))])?;
    }
    Ok(())
}

/// The plugins' requests from the event channel: outcomes, refusals,
/// adoptions, warnings, durations.
fn encode_requests(enc: &mut DescriptorEncoder<'_>, s: &Snapshot) -> std::fmt::Result {
    let requests: Vec<_> = s
        .counters
        .requests
        .iter()
        .map(|(k, n)| {
            let (plugin, command, outcome) = split3(k);
            (
                vec![
                    ("plugin", plugin),
                    ("command", command),
                    ("outcome", outcome),
                ],
                *n,
            )
        })
        .collect();
    counters(
        enc,
        "podgate_cni_requests",
        "CNI requests the podgate plugins answered, by plugin, command and outcome (ok, refused, error, crashed).",
        &requests,
    )?;
    let refusals: Vec<_> = s
        .counters
        .refusals
        .iter()
        .map(|(rule, n)| (vec![("rule", rule.as_str())], *n))
        .collect();
    counters(
        enc,
        "podgate_refusals",
        "Requests refused by operator policy, by the rule that refused.",
        &refusals,
    )?;
    let adopted: Vec<_> = s
        .counters
        .adopted
        .iter()
        .map(|(profile, n)| (vec![("profile", profile.as_str())], *n))
        .collect();
    counters(
        enc,
        "podgate_adopted",
        "Sandboxes that started without podgate's chain and got their profile from the agent, by profile.",
        &adopted,
    )?;
    let warnings: Vec<_> = s
        .counters
        .warnings
        .iter()
        .map(|(k, n)| {
            let (plugin, warning, _) = split3(k);
            (vec![("plugin", plugin), ("warning", warning)], *n)
        })
        .collect();
    counters(
        enc,
        "podgate_cni_warnings",
        "Requests that met a condition the operator should know about, by plugin and warning (noAnnotations: a pod that may choose its profile by annotation got none, because the runtime delivered no annotations).",
        &warnings,
    )?;
    let durations: Vec<_> = s
        .counters
        .durations
        .iter()
        .map(|(k, h)| {
            let (plugin, command, _) = split3(k);
            (vec![("plugin", plugin), ("command", command)], h)
        })
        .collect();
    family(
        enc,
        (
            "podgate_cni_request_duration_seconds",
            "Time from a plugin's start to its answer.",
            MetricType::Histogram,
        ),
        &durations,
        |m, h| {
            // Per-bucket counts; the encoder accumulates them and adds +Inf.
            let buckets: Vec<(f64, u64)> = BUCKETS
                .iter()
                .zip(h.counts.iter().chain(std::iter::repeat(&0)))
                .map(|(b, c)| (*b, *c))
                .collect();
            let total = h.counts.iter().sum::<u64>();
            m.encode_histogram::<NoLabelSet>(h.sum, total, &buckets, None)
        },
    )?;
    Ok(())
}

/// Unguarded sandboxes and the tunnel guard's view of IPsec.
fn encode_ipsec(enc: &mut DescriptorEncoder<'_>, s: &Snapshot) -> std::fmt::Result {
    // Nothing is unguarded without a guard in the chain, without IPsec
    // required, or without a runtime to list sandboxes from; while the
    // runtime cannot list them the count is unknown: no sample, and
    // the collection error `runtime` says why.
    if !s.errors.contains_key("runtime") {
        let n = s.unguarded.unwrap_or(0);
        gauges(
            enc,
            "podgate_unguarded_sandboxes",
            "Ready sandboxes created while no enforcing tunnel guard was in the chain the runtime served, while the node requires IPsec (excluded namespaces and host network not counted; 0 without a guard, without IPsec required or without a runtime; absent while the runtime cannot list its sandboxes).",
            &[(vec![], i64::try_from(n).unwrap_or(i64::MAX))],
        )?;
    }
    if let Some(ip) = &s.ipsec {
        gauges(
            enc,
            "podgate_ipsec_ready",
            "1 while the tunnel guard would let pods through (ready or not required), else 0.",
            &[(vec![], flag(ip.ready))],
        )?;
        let checks: Vec<_> = ip
            .checks
            .iter()
            .map(|(check, failed)| (vec![("check", check.as_str())], flag(*failed)))
            .collect();
        gauges(
            enc,
            "podgate_ipsec_checks_failed",
            "1 for each tunnel-guard check that fails, 0 for those that pass or are skipped.",
            &checks,
        )?;
        if let Some(secs) = ip.expires_in_secs {
            gauges(
                enc,
                "podgate_ipsec_certificate_expiry_seconds",
                "Seconds until the IPsec agent's certificate expires (negative: expired).",
                &[(vec![], secs)],
            )?;
        }
    }
    Ok(())
}

/// The sources the collection could not read.
fn encode_errors(enc: &mut DescriptorEncoder<'_>, s: &Snapshot) -> std::fmt::Result {
    let errors: Vec<_> = s
        .errors
        .iter()
        .map(|(what, n)| (vec![("source", *what)], count(*n)))
        .collect();
    gauges(
        enc,
        "podgate_metrics_collect_errors",
        "Sources the last collection could not read (see the agent log at debug level).",
        &errors,
    )
}

/// The exposition text of one collection.
pub fn render(s: Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Collection(s)));
    let mut out = String::new();
    // Writing into a String cannot fail; an encoder error would be a bug
    // in a label value, and an empty page shows it.
    if prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::collect::IpsecState;

    #[test]
    fn every_family_keeps_its_name_type_labels_and_help() {
        let mut s = Snapshot {
            install_ready: true,
            ..Snapshot::default()
        };
        s.counters
            .requests
            .insert("podgate-router|ADD|ok".into(), 3);
        s.counters.refusals.insert("allow.pools".into(), 1);
        s.counters.adopted.insert("vpn".into(), 2);
        s.counters
            .warnings
            .insert("podgate-router|noAnnotations".into(), 4);
        s.unguarded = Some(1);
        let h = crate::metrics::events::Histogram {
            counts: vec![2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4],
            sum: 9.5,
        };
        s.counters.durations.insert("podgate-router|ADD".into(), h);
        s.attachments
            .insert(("n".into(), "p\"q".into(), "none".into()), 2);
        s.ipsec = Some(IpsecState {
            ready: false,
            checks: [("agent".to_string(), true)].into(),
            expires_in_secs: Some(-5),
        });
        s.errors.insert("drift", 1);
        s.strict_rules_ahead = 2;
        let out = render(s);
        for line in [
            "# HELP podgate_install_ready 1 while podgate's binaries and chain entries are in place as configured, else 0.\n",
            "# TYPE podgate_install_ready gauge\npodgate_install_ready 1\n",
            "podgate_build_info{version=\"",
            "# TYPE podgate_cni_requests_total counter\n",
            "podgate_cni_requests_total{plugin=\"podgate-router\",command=\"ADD\",outcome=\"ok\"} 3\n",
            "podgate_refusals_total{rule=\"allow.pools\"} 1\n",
            "podgate_adopted_total{profile=\"vpn\"} 2\n",
            "podgate_cni_warnings_total{plugin=\"podgate-router\",warning=\"noAnnotations\"} 4\n",
            "podgate_unguarded_sandboxes 1\n",
            "podgate_attachments{network=\"n\",profile=\"p\\\"q\",routing=\"none\"} 2\n",
            "# TYPE podgate_cni_request_duration_seconds histogram\n",
            "podgate_cni_request_duration_seconds_bucket{plugin=\"podgate-router\",command=\"ADD\",le=\"0.002\"} 2\n",
            "podgate_cni_request_duration_seconds_bucket{plugin=\"podgate-router\",command=\"ADD\",le=\"0.01\"} 3\n",
            "podgate_cni_request_duration_seconds_bucket{plugin=\"podgate-router\",command=\"ADD\",le=\"+Inf\"} 7\n",
            "podgate_cni_request_duration_seconds_sum{plugin=\"podgate-router\",command=\"ADD\"} 9.5\n",
            "podgate_cni_request_duration_seconds_count{plugin=\"podgate-router\",command=\"ADD\"} 7\n",
            "podgate_ipsec_ready 0\n",
            "podgate_ipsec_checks_failed{check=\"agent\"} 1\n",
            "podgate_ipsec_certificate_expiry_seconds -5\n",
            "podgate_metrics_collect_errors{source=\"drift\"} 1\n",
            "# TYPE podgate_attachment_drift_unchecked gauge\npodgate_attachment_drift_unchecked 0\n",
            "# TYPE podgate_strict_rules_ahead gauge\npodgate_strict_rules_ahead 2\n",
            "# TYPE podgate_records_quarantined gauge\npodgate_records_quarantined 0\n",
        ] {
            assert!(out.contains(line), "missing {line:?} in\n{out}");
        }
        assert_eq!(out.matches("# TYPE ").count(), 20, "{out}");
    }

    /// A scan whose runtime could not list its sandboxes (a listing past
    /// the CRI message limit, a dead socket): the unguarded count is not
    /// shown as 0 but left out, and the collection error says `runtime`.
    #[test]
    fn a_runtime_that_cannot_list_its_sandboxes_is_a_collection_error_not_a_zero() {
        let mut s = Snapshot::default();
        let scan = crate::adopt::Scan {
            unguarded: None,
            runtime_failed: true,
            ..Default::default()
        };
        s.take_scan(&scan);
        let out = render(s);
        assert!(!out.contains("podgate_unguarded_sandboxes"), "{out}");
        assert!(
            out.contains("podgate_metrics_collect_errors{source=\"runtime\"} 1\n"),
            "{out}"
        );
    }
}
