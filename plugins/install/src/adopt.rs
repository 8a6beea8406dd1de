//! Adoption: the agent applies podgate-router's profile to sandboxes that
//! started without podgate's chain.
//!
//! The evidence is time: the installer's `runtime-chain.json` ([`History`])
//! says when the runtime was first seen serving the chain this boot and the
//! periods it was seen missing. A candidate is a ready sandbox with its own
//! netns created (CRI `createdAt`) before that first time or inside such a
//! period; never one created while the chain was served (a policy change
//! must not switch on forwarding in pods already running), never a
//! host-network one. Each candidate goes through
//! [`podgate_router::plugin::adopt`]: the router's own selection, plan,
//! refusals and write-ahead record, as ADD. A sandbox stopped while it was
//! adopted (the runtime's DEL may have come before the record existed) is
//! undone through the router's DEL.
//!
//! Scans run only while the runtime serves the chain (so the sandbox's
//! later DEL comes to podgate), and are idempotent: what has a record is
//! skipped, and a sandbox judged once is not looked at again by this
//! process.

use crate::history::{History, HistoryFile};
use crate::runtime::Runtime;
use crate::{log, ChainProbe};
use podgate_cri::{ReadySandbox, SandboxNetns};
use podgate_router::plugin::adopt::{self, Adoption, Sandbox};
use podgate_tunnel_guard::{GuardConfig, Verdict};
use serde_json::Value;
use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Whether a sandbox created at `created` (Unix ns) may lack podgate: before
/// the chain was first seen served, or inside a period it was seen missing
/// (from the last time it was seen served; still open: up to now).
pub fn candidate(h: &History, created: i64) -> bool {
    let Ok(created) = u64::try_from(created) else {
        return false;
    };
    let Some(first) = h.first_loaded else {
        return false;
    };
    created < first
        || h.missing.iter().any(|m| {
            m.last_seen_loaded < created && m.seen_loaded_again.is_none_or(|again| created < again)
        })
}

/// Whether a sandbox created at `created` may have been wired without the
/// tunnel guard: a [`candidate`], or any sandbox while the chain has never
/// been seen served this boot.
pub fn unguarded_at(h: &History, created: i64) -> bool {
    h.first_loaded.is_none() || candidate(h, created)
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
        return Err(crate::Error::Agent(format!(
            "{} does not exist: no installer (install --watch) recorded when the runtime served the chain there",
            file.display()
        )));
    }
    let h = HistoryFile::new(installer_state_dir)?.load()?;
    let (_, sandboxes) = podgate_cri::ready_sandboxes(endpoint, |c| unguarded_at(&h, c))
        .map_err(|e| crate::Error::Agent(e.to_string()))?;
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
                    log(format!(
                        "dry run: would stop unguarded {pod}: created while the tunnel guard was not in the chain the runtime served"
                    ));
                }
                continue;
            }
            if self.stopped.len() >= self.per_minute {
                log(format!(
                    "repair: {} a minute reached; {pod} waits",
                    self.per_minute
                ));
                break;
            }
            self.stopped.push_back(now);
            match podgate_cri::stop_sandbox(endpoint, &sb.id) {
                Ok(()) => {
                    log(format!(
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
        let served = ready.is_ok()
            && h.first_loaded.is_some()
            && h.missing.iter().all(|m| m.seen_loaded_again.is_some());
        if self.adopt && !served {
            out.skipped = Some(match ready {
                Err(why) => format!("the runtime does not serve podgate's chain: {why}"),
                Ok(_) if h.first_loaded.is_none() => format!(
                    "{} does not record the runtime serving podgate's chain yet",
                    crate::history::FILE
                ),
                Ok(_) => format!(
                    "{} records the chain missing since it was last seen served",
                    crate::history::FILE
                ),
            });
        }
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
            if let (Some(r), true) = (self.repair.as_mut(), served) {
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
                        log(format!(
                            "adopted {pod}: profile {profile:?} (selected by {source}); it was created without podgate's chain"
                        ));
                        out.adopted.push((pod, profile));
                        Ok(())
                    }
                    Ok(false) => match adopt::undo(entry, &ifname, &sandbox) {
                        Ok(()) => {
                            let line = format!("{pod}: stopped while it was adopted: undone");
                            log(&line);
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
                    log(&line);
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
    use crate::history::Missing;

    #[test]
    fn candidates_are_created_before_the_chain_was_served_or_while_it_was_missing() {
        let mut h = History {
            version: 1,
            boot_id: "b".into(),
            first_loaded: None,
            missing: Vec::new(),
        };
        assert!(!candidate(&h, 5), "never served: nothing is judged yet");
        h.first_loaded = Some(100);
        assert!(candidate(&h, 99));
        assert!(!candidate(&h, 100));
        assert!(!candidate(&h, 150), "created while served");
        assert!(!candidate(&h, -1));
        h.missing.push(Missing {
            last_seen_loaded: 200,
            first_seen_missing: 210,
            seen_loaded_again: Some(300),
        });
        assert!(!candidate(&h, 200));
        assert!(candidate(&h, 205), "may have begun any time after 200");
        assert!(candidate(&h, 299));
        assert!(!candidate(&h, 300));
        h.missing.push(Missing {
            last_seen_loaded: 400,
            first_seen_missing: 410,
            seen_loaded_again: None,
        });
        assert!(candidate(&h, 1_000), "still missing");
    }
}
