//! `podgate inspect`: what podgate-router applied per attachment (from its
//! state store) and whether it still holds.

use crate::attachment::{self, Attachment, State};
use crate::error::{Error, Found, Result};
use crate::output;
use crate::progress::Progress;
use crate::routes::RouteText;
use crate::select::{pick_container, Target};
use clap::Args;
use podgate_kit::link::{self, Link};
use podgate_kit::netlink::RouteSocket;
use podgate_kit::route::{RouteProtocol, RouteSpec};
use podgate_router::claims::{self, IndexClaim};
use podgate_router::record::{Here, Status};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// Every attachment in the state store (the default without --container).
    #[arg(long, conflicts_with_all = ["container", "k8s_pod"])]
    pub all: bool,
    /// Instead: the ready sandboxes that may have been wired without the
    /// tunnel guard (created while it was not in the chain the runtime
    /// served), while the node requires IPsec; exit 2 when there are any.
    #[arg(long, conflicts_with_all = ["all", "container", "k8s_pod"])]
    pub unguarded: bool,
    /// With --unguarded: podgate's entries (the tunnel guard's config).
    #[arg(long, value_name = "FILE", default_value = podgate_install::DEFAULT_PLUGINS_FILE)]
    pub plugins: PathBuf,
    /// With --unguarded: the installer's state dir (its runtime-chain.json).
    #[arg(long, value_name = "DIR", default_value = podgate_install::DEFAULT_STATE_DIR)]
    pub installer_state_dir: PathBuf,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Unguarded {
    namespace: String,
    name: String,
    sandbox_id: String,
    created_at_ns: i64,
}

fn run_unguarded(a: &InspectArgs, target: &Target, json: bool) -> Result<Found> {
    let list = podgate_install::unguarded(
        target.runtime_endpoint.as_deref(),
        &a.installer_state_dir,
        &a.plugins,
    )?;
    let rows: Vec<Unguarded> = list
        .iter()
        .flatten()
        .map(|s| Unguarded {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            sandbox_id: s.id.clone(),
            created_at_ns: s.created_at,
        })
        .collect();
    if json {
        output::json(&rows)?;
    } else {
        let mut s = match &list {
            None => "no tunnel guard in the plugins file, or IPsec not required on this node: nothing is unguarded\n".to_string(),
            Some(l) if l.is_empty() => "no unguarded sandboxes\n".to_string(),
            Some(_) => String::new(),
        };
        for r in &rows {
            s += &format!(
                "unguarded {}/{} sandbox {} (created {} ns)\n",
                r.namespace, r.name, r.sandbox_id, r.created_at_ns
            );
        }
        output::text(s)?;
    }
    Ok(Found::problem_if(!rows.is_empty()))
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Inspect {
    state_dir: String,
    attachments: Vec<Attachment>,
    /// Records that could not be read.
    corrupt: Vec<String>,
    /// The claims index: each routed pool, route table and strict slot
    /// with the record it names.
    claims: Vec<IndexClaim>,
}

pub fn run(a: &InspectArgs, target: &Target, json: bool) -> Result<Found> {
    if a.unguarded {
        return run_unguarded(a, target, json);
    }
    let (all, corrupt) = target.all_records()?;
    let mut records = match (&target.container, target.k8s_sandbox_id()?) {
        (Some(id), _) => pick_container(all, id).map_err(Error::Msg)?,
        // A pod podgate never touched has no records: an empty report.
        (None, Some(sandbox)) => all
            .into_iter()
            .filter(|r| r.key.container_id == sandbox)
            .collect(),
        (None, None) => all,
    };
    records.sort_by(|x, y| {
        (&x.key.network, &x.key.container_id, &x.key.ifname).cmp(&(
            &y.key.network,
            &y.key.container_id,
            &y.key.ifname,
        ))
    });
    let (node_ns, _) = target.node()?;
    let (mut node, node_err) = match RouteSocket::in_netns(&node_ns) {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let links = node
        .as_mut()
        .and_then(|s| link::list(s).ok())
        .unwrap_or_default();
    // Records are judged against the node they were written on: the
    // --node-netns one, not necessarily the namespace podgate runs in.
    let here = Here {
        boot_id: podgate_kit::netns::boot_id().ok(),
        node: node_ns.identity().ok(),
    };
    let mut progress = Progress::new();
    let mut out = Vec::new();
    for rec in records {
        progress.step(&format!(
            "checking {}/{}/{} ...",
            rec.key.network, rec.key.container_id, rec.key.ifname
        ));
        let (state, drift) = attachment::status_of(&rec, &here, &mut node, &node_err);
        out.push(Attachment {
            record: rec,
            state,
            drift,
        });
    }
    progress.done();
    let problem = out.iter().any(|a| a.state != State::Holds) || !corrupt.is_empty();
    let index_claims = match podgate_kit::state::StateStore::existing(&target.state_dir)? {
        Some(store) => claims::index_claims(&store)?,
        None => Vec::new(),
    };
    if json {
        output::json(&Inspect {
            state_dir: target.state_dir.display().to_string(),
            attachments: out,
            corrupt,
            claims: index_claims,
        })?;
    } else {
        let mut s = String::new();
        if out.is_empty() {
            s += &format!("no podgate attachments in {}\n", target.state_dir.display());
        }
        for a in &out {
            s += &render(a, &links);
        }
        for c in &corrupt {
            s += &format!("corrupt record: {c}\n");
        }
        for c in &index_claims {
            let owner = c.owner.as_ref().map_or("-".to_string(), |k| {
                format!("{}/{}/{}", k.network, k.container_id, k.ifname)
            });
            let ignored = if c.trusted {
                ""
            } else {
                " (ignored: no record holds it)"
            };
            s += &format!("claim: {} -> {owner}{ignored}\n", c.claim);
        }
        output::text(s)?;
    }
    Ok(Found::problem_if(problem))
}

fn node_route(r: &RouteSpec, links: &[Link]) -> String {
    let dev = crate::routes::dev_name(links, r.oif);
    RouteText {
        dst: r.dst.to_string(),
        gateway: r.gateway,
        dev: dev.as_deref(),
        onlink: r.onlink,
        proto: Some(RouteProtocol(r.protocol).to_string()),
        ..RouteText::default()
    }
    .to_string()
}

fn list_or_dash(v: Vec<String>) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join("\n               ")
    }
}

pub fn render(a: &Attachment, node_links: &[Link]) -> String {
    let r = &a.record;
    let p = r;
    let state = match a.state {
        State::Holds => "holds".to_string(),
        State::Drift => format!("DRIFT: {}", a.drift.join("; ")),
        State::NetnsGone => format!("NETNS GONE: {}", a.drift.join("; ")),
        State::Pending => format!("PENDING: {}", a.drift.join("; ")),
        State::Stale => format!("STALE: {}", a.drift.join("; ")),
        State::Unknown => format!("unknown: {}", a.drift.join("; ")),
    };
    let sysctls: Vec<String> = p
        .sysctls
        .iter()
        .map(|s| match &s.previous {
            Some(prev) => format!("{} = {} (was {prev})", s.name, s.value),
            None => format!("{} = {} (already so)", s.name, s.value),
        })
        .collect();
    let masq: Vec<String> = p
        .masquerade
        .iter()
        .map(|m| {
            format!(
                "inet {}: {} out {}",
                p.nft_table.as_deref().unwrap_or("?"),
                m.source,
                m.oifname
            )
        })
        .collect();
    let mss: Vec<String> = p
        .mss_clamp
        .iter()
        .map(|m| {
            format!(
                "inet {} forward: {}",
                p.nft_table.as_deref().unwrap_or("?"),
                podgate_kit::nft::describe_mss(&m.rule())
            )
        })
        .collect();
    let node_routes: Vec<String> = p
        .node_routes
        .iter()
        .map(|n| node_route(&n.spec(), node_links))
        .collect();
    let pod_routes: Vec<String> = r.pod_routes.iter().map(|x| x.spec().describe()).collect();
    let ips: Vec<String> = p.pod_ips.iter().map(ToString::to_string).collect();
    let routing: Vec<String> =
        match &p.routing {
            None => Vec::new(),
            Some(rp) => {
                let mode = serde_json::to_value(rp.mode)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                let mut v = vec![format!(
                    "{mode}: table {} via {} on {} for {}",
                    crate::names::table_name(rp.table),
                    rp.gateway,
                    rp.uplink,
                    rp.pod_ip
                )];
                v.extend(
                    rp.rules
                        .iter()
                        .map(|r| format!("rule {}", r.spec().describe())),
                );
                v.extend(rp.host_if_sysctls.iter().map(
                    |s| match rp.host_if_previous.get(&s.name) {
                        Some(prev) => format!("node sysctl {} = {} (was {prev})", s.name, s.value),
                        None => format!("node sysctl {} = {} (already so)", s.name, s.value),
                    },
                ));
                v.extend(
                    rp.table_routes
                        .iter()
                        .map(|r| format!("route {}", node_route(&r.spec(), node_links))),
                );
                v
            }
        };
    format!(
        "attachment {}/{}/{}\n  record:      version {}, {}\n  netns:       {}\n  created:     {}{}\n  profile:     {} (selected by {})\n  pod ips:     {}\n  sysctls:     {}\n  masquerade:  {}\n  mss clamp:   {}\n  node routes: {}\n  pod routes:  {}\n  routing:     {}\n  warnings:    {}\n  status:      {state}\n\n",
        r.key.network,
        r.key.container_id,
        r.key.ifname,
        r.version,
        match r.status {
            Status::Pending => "pending",
            Status::Applied => "applied",
        },
        r.netns.as_ref().map_or("-".to_string(), |n| n.display().to_string()),
        r.created,
        if r.adopted {
            " (adopted: the node agent applied it to a sandbox that started without podgate's chain)"
        } else {
            ""
        },
        p.profile,
        p.source,
        list_or_dash(ips),
        list_or_dash(sysctls),
        list_or_dash(masq),
        list_or_dash(mss),
        list_or_dash(node_routes),
        list_or_dash(pod_routes),
        list_or_dash(routing),
        list_or_dash(r.warnings.clone()),
    )
}
