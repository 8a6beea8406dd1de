//! Adoption: the agent applies podgate-router's profile to sandboxes that
//! started without podgate's chain.
//!
//! The evidence is time: the installer's `runtime-chain.json` ([`History`])
//! records the periods the watch saw the runtime serve a network without
//! podgate-router (and, apart, without an enforcing tunnel guard). A
//! candidate is a ready sandbox with its own netns created (CRI
//! `createdAt`) inside such a period; never one created while the chain
//! was served (a policy change must not switch on forwarding in pods
//! already running), never a host-network one, and none at all while the
//! history holds no observation (a lost or new file is no evidence). Each
//! candidate goes through [`podgate_router::plugin::adopt`]: the router's own selection, plan,
//! refusals and write-ahead record, as ADD. A sandbox stopped while it was
//! adopted (the runtime's DEL may have come before the record existed) is
//! undone through the router's DEL.
//!
//! Scans run only while the runtime serves the chain (so the sandbox's
//! later DEL comes to podgate), and are idempotent: what has a record is
//! skipped, and a sandbox judged once is not looked at again by this
//! process.

use crate::history::{History, HistoryFile};
use crate::logging::info;
use crate::runtime::Runtime;
use crate::{ChainProbe, Readiness};
use podgate_cri::{ReadySandbox, SandboxNetns};
use podgate_router::plugin::adopt::{self, Adoption, Sandbox};
use podgate_tunnel_guard::{GuardConfig, Verdict};
use serde_json::Value;
use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Whether a sandbox created at `created` (Unix ns) may lack podgate-router:
/// created inside a period the runtime was seen serving a network without
/// it (from the last time it was seen served; still open: up to now).
pub fn candidate(h: &History, created: i64) -> bool {
    h.router.lacked(created)
}

/// Whether a sandbox created at `created` may have been wired without the
/// tunnel guard checking it: created inside a period the runtime was seen
/// serving a network without an enforcing guard (absent, audit mode,
/// `required: never`, or only podgate-router there).
pub fn unguarded_at(h: &History, created: i64) -> bool {
    h.guard.lacked(created)
}

/// The chain's tunnel guard, when it has one and the node requires IPsec
/// now (the guard's own evaluation: no signal, nothing is unguarded).
fn guard_required(probe: &ChainProbe) -> Option<GuardConfig> {
    guard_of(&probe.entries().ok()?)
}

fn guard_of(entries: &[Value]) -> Option<GuardConfig> {
    let entry = entries
        .iter()
        .find(|e| e.get("type").and_then(Value::as_str) == Some("podgate-tunnel-guard"))?;
    let cfg = GuardConfig::from_value(entry).ok()?;
    let verdict = podgate_tunnel_guard::evaluate(&cfg, std::time::SystemTime::now()).verdict;
    (verdict != Verdict::NotRequired).then_some(cfg)
}

/// The sandboxes of `sandboxes` that may have been wired without guard
/// `g`: created at an [`unguarded_at`] time, with a netns of their own
/// (host network is never wired by CNI), not in an excluded namespace.
fn unguarded_of<'a>(
    h: &History,
    g: &GuardConfig,
    sandboxes: &'a [ReadySandbox],
) -> Vec<&'a ReadySandbox> {
    sandboxes
        .iter()
        .filter(|s| unguarded_at(h, s.created_at))
        .filter(|s| matches!(s.netns, SandboxNetns::Path(_)))
        .filter(|s| !g.excluded(Some(&s.namespace)))
        .collect()
}

/// `podgate inspect --unguarded`: the agent's count, as a list. None when
/// the plugins file has no tunnel guard or the node does not require IPsec
/// now.
pub fn unguarded(
    endpoint: Option<&str>,
    installer_state_dir: &std::path::Path,
    plugins: &std::path::Path,
) -> Result<Option<Vec<ReadySandbox>>, crate::Error> {
    let entries: Vec<Value> = crate::reconcile::load_entries(plugins)?
        .iter()
        .filter_map(|j| j.to_value().ok())
        .collect();
    let Some(g) = guard_of(&entries) else {
        return Ok(None);
    };
    let file = installer_state_dir.join(crate::history::FILE);
    if !file.exists() {
        return Err(crate::Error::NoHistory(file));
    }
    let h = HistoryFile::new(installer_state_dir)?.load()?;
    let (_, sandboxes) =
        podgate_cri::ready_sandboxes(endpoint, |c| unguarded_at(&h, c)).map_err(|source| {
            crate::Error::Cri {
                daemon: crate::Daemon::Agent,
                source,
            }
        })?;
    Ok(Some(
        unguarded_of(&h, &g, &sandboxes)
            .into_iter()
            .cloned()
            .collect(),
    ))
}

/// `--repair-unguarded`: stop unguarded sandboxes through CRI so the
/// kubelet recreates them through the chain; at most `per_minute` a
/// minute; with `dry_run` only say so.
pub struct Repair {
    pub dry_run: bool,
    pub per_minute: usize,
    stopped: VecDeque<Instant>,
    /// Said once per sandbox (dry run).
    said: BTreeSet<String>,
}

impl Repair {
    pub fn new(dry_run: bool, per_minute: usize) -> Repair {
        Repair {
            dry_run,
            per_minute,
            stopped: VecDeque::new(),
            said: BTreeSet::new(),
        }
    }

    fn stop(&mut self, endpoint: &str, unguarded: &[&ReadySandbox], out: &mut Scan) {
        let now = Instant::now();
        while self
            .stopped
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
        {
            self.stopped.pop_front();
        }
        for sb in unguarded {
            let pod = format!("{}/{} (sandbox {})", sb.namespace, sb.name, sb.id);
            if self.dry_run {
                if self.said.insert(sb.id.clone()) {
                    info(format!(
                        "dry run: would stop unguarded {pod}: created while the tunnel guard was not in the chain the runtime served"
                    ));
                }
                continue;
            }
            if self.stopped.len() >= self.per_minute {
                info(format!(
                    "repair: {} a minute reached; {pod} waits",
                    self.per_minute
                ));
                break;
            }
            self.stopped.push_back(now);
            match podgate_cri::stop_sandbox(endpoint, &sb.id) {
                Ok(()) => {
                    info(format!(
                        "stopped unguarded {pod}: created while the tunnel guard was not in the chain; the kubelet recreates it through the chain"
                    ));
                    out.stopped.push(sb.id.clone());
                }
                Err(e) => out.errors.push(format!("stopping unguarded {pod}: {e}")),
            }
        }
    }
}

/// What one scan did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scan {
    /// (`namespace/name (sandbox id)`, profile) adopted by this scan.
    pub adopted: Vec<(String, String)>,
    /// Candidates stopped while this scan judged them, and what was done
    /// (undone, or nothing applied), one line each.
    pub stopped_meanwhile: Vec<String>,
    /// The rule of each candidate refused by policy (its line is in
    /// `errors`), as `podgate_refusals` counts it: ADD's rules, and
    /// `adoption` for a sandbox whose interface does not hold exactly the
    /// addresses the runtime reports for it.
    pub refused: Vec<String>,
    /// Why adoption did not run (the runtime does not serve the chain, or
    /// the history does not say it does).
    pub skipped: Option<String>,
    /// Ready sandboxes (own netns, namespace not excluded) that may have
    /// been wired without the tunnel guard; None: no guard in the chain,
    /// or IPsec not required now.
    pub unguarded: Option<u64>,
    /// Unguarded sandboxes stopped by `--repair-unguarded`.
    pub stopped: Vec<String>,
    /// The runtime could not list its sandboxes (the unguarded count is
    /// then unknown, not 0).
    pub runtime_failed: bool,
    /// Why the scan did not run, or what failed.
    pub errors: Vec<String>,
}

/// The agent's adoption state: which sandboxes it has judged.
pub struct Adopter {
    history: HistoryFile,
    done: BTreeSet<String>,
    /// Adopt (false: only count the unguarded, and repair).
    adopt: bool,
    repair: Option<Repair>,
}

impl Adopter {
    pub fn new(history: HistoryFile, adopt: bool, repair: Option<Repair>) -> Adopter {
        Adopter {
            history,
            done: BTreeSet::new(),
            adopt,
            repair,
        }
    }

    /// One scan. Adoption and repair only while the runtime serves
    /// podgate's chain as configured (the readiness test; so the sandbox's
    /// DEL, or its recreation, goes through podgate) and the history says
    /// so too; the unguarded count whenever the chain has a tunnel guard
    /// and the node requires IPsec now.
    pub fn scan(&mut self, probe: &ChainProbe) -> Scan {
        let mut out = Scan::default();
        let endpoint = match &probe.runtime {
            Runtime::FileOnly => return out,
            Runtime::Default => None,
            Runtime::At(e) => Some(e.as_str()),
        };
        let h = match self.history.load() {
            Ok(h) => h,
            Err(e) => {
                out.errors.push(e.to_string());
                return out;
            }
        };
        let ready = probe.ready();
        let served = ready.is_chained() && h.router.served_now();
        if self.adopt && !served {
            out.skipped = Some(match &ready {
                Readiness::NotReady(why) => {
                    format!("the runtime does not serve podgate's chain: {why}")
                }
                Readiness::Chained(_) if !h.router.observed() => format!(
                    "{} holds no observation of the runtime yet (a new or lost record is no evidence: nothing is adopted until the installer's watch has looked)",
                    crate::history::FILE
                ),
                Readiness::Chained(_) if h.router.first_loaded.is_none() => format!(
                    "{} does not record the runtime serving podgate's chain yet",
                    crate::history::FILE
                ),
                Readiness::Chained(_) => format!(
                    "{} records the chain missing since it was last seen served",
                    crate::history::FILE
                ),
            });
        }
        // Stopped sandboxes are recreated through the chain: only while it
        // is served with the guard enforcing, or they come back unguarded.
        let guarded = ready.is_chained() && h.guard.served_now();
        let guard = guard_required(probe);
        let entry = if served && self.adopt {
            match router_entry(probe) {
                Ok(e) => e,
                Err(e) => {
                    out.errors.push(e);
                    None
                }
            }
        } else {
            None
        };
        if entry.is_none() && guard.is_none() {
            return out;
        }
        let keep = |c: i64| {
            (entry.is_some() && candidate(&h, c)) || (guard.is_some() && unguarded_at(&h, c))
        };
        let (endpoint, sandboxes) = match podgate_cri::ready_sandboxes(endpoint, keep) {
            Ok(r) => r,
            Err(e) => {
                out.errors.push(e.to_string());
                out.runtime_failed = true;
                return out;
            }
        };
        if let Some(entry) = &entry {
            for sb in sandboxes.iter().filter(|s| candidate(&h, s.created_at)) {
                if self.done.contains(&sb.id) {
                    continue;
                }
                if let Err(e) = self.one(entry, &endpoint, sb, &mut out) {
                    out.errors.push(e);
                }
            }
        }
        if let Some(g) = guard {
            let unguarded = unguarded_of(&h, &g, &sandboxes);
            out.unguarded = Some(unguarded.len() as u64);
            if let (Some(r), true) = (self.repair.as_mut(), guarded) {
                r.stop(&endpoint, &unguarded, &mut out);
            }
        }
        out
    }

    /// One candidate, into `out` when adopted (and still running) or
    /// stopped meanwhile. Judged (remembered) unless the failure may pass
    /// (I/O, try again).
    fn one(
        &mut self,
        entry: &Value,
        endpoint: &str,
        sb: &ReadySandbox,
        out: &mut Scan,
    ) -> Result<(), String> {
        let pod = format!("{}/{} (sandbox {})", sb.namespace, sb.name, sb.id);
        let SandboxNetns::Path(netns) = &sb.netns else {
            // Host network: never (an assign rule matching it would switch
            // on the node's own forwarding); unknown: nothing to enter.
            self.done.insert(sb.id.clone());
            return Ok(());
        };
        let sandbox = Sandbox {
            id: sb.id.clone(),
            namespace: sb.namespace.clone(),
            name: sb.name.clone(),
            annotations: sb.annotations.clone(),
            netns: netns.clone(),
            ips: sb.ips.clone(),
        };
        match adopt::adopt(entry, &sandbox) {
            Ok(Adoption::NotSelected | Adoption::Recorded) => {
                self.done.insert(sb.id.clone());
                Ok(())
            }
            Ok(Adoption::Applied {
                profile,
                source,
                ifname,
            }) => {
                self.done.insert(sb.id.clone());
                // Stopped meanwhile: its DEL may have come before the record.
                match podgate_cri::is_ready(endpoint, &sb.id) {
                    Ok(true) => {
                        info(format!(
                            "adopted {pod}: profile {profile:?} (selected by {source}); it was created without podgate's chain"
                        ));
                        out.adopted.push((pod, profile));
                        Ok(())
                    }
                    Ok(false) => match adopt::undo(entry, &ifname, &sandbox) {
                        Ok(()) => {
                            let line = format!("{pod}: stopped while it was adopted: undone");
                            info(&line);
                            out.stopped_meanwhile.push(line);
                            Ok(())
                        }
                        Err(e) => Err(format!(
                            "{pod} stopped while it was adopted; undoing: {} (the stale sweep removes the record)",
                            e.msg
                        )),
                    },
                    Err(e) => Err(format!("{pod}: adopted, then: {e}")),
                }
            }
            Err(e) => {
                let passing = matches!(
                    e.code,
                    podgate_cni::code::IO_FAILURE | podgate_cni::code::TRY_AGAIN_LATER
                );
                if !passing {
                    self.done.insert(sb.id.clone());
                }
                // Stopped between the listing and now: ADD refused (and
                // rolled back) when its netns or interface was gone.
                let gone = e.code == podgate_cni::code::UNKNOWN_CONTAINER
                    || matches!(podgate_cri::is_ready(endpoint, &sb.id), Ok(false));
                if gone {
                    let line = format!(
                        "{pod}: stopped before it was adopted: nothing applied ({})",
                        e.msg
                    );
                    info(&line);
                    out.stopped_meanwhile.push(line);
                    return Ok(());
                }
                if e.code == podgate_cni::code::POLICY_REFUSED {
                    out.refused.push(podgate_cni::event::refusal_rule(&e.msg));
                }
                Err(format!("not adopting {pod}: {}", e.msg))
            }
        }
    }
}

/// podgate-router's entry of podgate's conflist as the runtime passes it
/// (the conflist's `name` and `cniVersion` in it); None when the chain has
/// no podgate-router.
fn router_entry(probe: &ChainProbe) -> Result<Option<Value>, String> {
    let path = probe.node.conf_dir.join(&probe.node.own_file);
    let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let list: Value =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let plugins = list.get("plugins").and_then(Value::as_array);
    let Some(mut entry) = plugins
        .into_iter()
        .flatten()
        .find(|p| p.get("type").and_then(Value::as_str) == Some("podgate-router"))
        .cloned()
    else {
        return Ok(None);
    };
    if let Some(o) = entry.as_object_mut() {
        for k in ["name", "cniVersion"] {
            if let Some(v) = list.get(k) {
                o.insert(k.into(), v.clone());
            }
        }
    }
    Ok(Some(entry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{LastServed, Seen};

    /// The router served from 100 while the guard was in audit mode (or
    /// absent), enforcing from 300 on: a sandbox created at 150 went
    /// through podgate-router (no adoption) but no guard checked it.
    #[test]
    fn adoption_follows_the_router_and_the_unguarded_judgement_the_enforcing_guard() {
        let mut h = History {
            version: 2,
            boot_id: "b".into(),
            router: Default::default(),
            guard: Default::default(),
        };
        assert!(
            !candidate(&h, 5) && !unguarded_at(&h, 5),
            "no observation: no evidence"
        );
        h.absent_since_boot(50);
        let seen = |router, guard| Seen { router, guard };
        let mut last = LastServed::default();
        h.observe(seen(true, false), 100, last);
        last.update(seen(true, false), 100);
        h.observe(seen(true, true), 300, last);
        for (created, adopt, unguarded) in [
            (10, true, true),
            (150, false, true),
            (299, false, true),
            (350, false, false),
        ] {
            assert_eq!(candidate(&h, created), adopt, "{created}");
            assert_eq!(unguarded_at(&h, created), unguarded, "{created}");
        }
    }
}
